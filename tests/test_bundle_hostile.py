"""Hostile bundles: each refused before anything is stored, with a message naming the problem.

The valid bundle they start from is exported from a real recording of the CPU test bed
(``demo/aux-off.jsonl``); the store they are imported into already holds another run, and must
hold exactly that afterwards.
"""

from __future__ import annotations

import base64
import io
import json
import stat
import struct
import time
import zipfile
import zlib

import orjson
import pytest
import sqlalchemy as sa

from draftscope.bundle.loader import store_bundle
from draftscope.bundle.reader import BundleError, read_bundle
from draftscope.store import db
from draftscope.store.ingest import BatchWriter
from tests.fixtures.bundles import members, rezip, snapshot

# 1,048,576,000 zero bytes, bzip2-compressed to 753 bytes (a "1 KB -> 1 GB" member). Made by:
#   c = bz2.BZ2Compressor(9); b"".join(c.compress(bytes(1 << 20)) for _ in range(1000)) + c.flush()
BOMB = base64.b64decode(
    "QlpoOTFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkm"
    "U1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3wFf"
    "jkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAgg"
    "ADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAl"
    "qQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkm"
    "U1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3wFf"
    "jkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAgg"
    "ADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkmU1kOCeLfAV+OQADAAAAIIAAwgE1GQqAl"
    "qQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZDgni3wFfjkAAwAAACCAAMIBNRkKgJakKgJcxQVkm"
    "U1kOCeLfAV+OQADAAAAIIAAwgE1GQqAlqQqAlzFBWSZTWQ4J4t8BX45AAMAAAAggADCATUZCoCWpCoCXMUFZJlNZQCxKTwEp"
    "IEAIwAAAEAAIIAAwzAUppgIiRsQIiR4u5IpwoSEiv+rq")
BOMB_SIZE, BOMB_CRC = 1000 << 20, 1693044840


def _raw_zip(entries: list[tuple[str, int, bytes, int, int]]) -> bytes:
    """A zip written by hand: (name, method, data, crc32, declared uncompressed size) per member,
    so that declared sizes can be anything."""
    body, directory = b"", b""
    for name, method, data, crc, size in entries:
        encoded = name.encode()
        directory += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 46, 46, 0, method, 0, 0x21, crc,
                                 len(data), size, len(encoded), 0, 0, 0, 0, 0o100644 << 16,
                                 len(body)) + encoded
        body += struct.pack("<4s5H3L2H", b"PK\x03\x04", 46, 0, method, 0, 0x21, crc, len(data),
                            size, len(encoded), 0) + encoded + data
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries),
                      len(directory), len(body), 0)
    return body + directory + end


def _with_member(good: bytes, name: str, data: bytes, method: int, crc: int, size: int) -> bytes:
    """The good bundle's members stored as they are, plus (or instead of) ``name`` as given."""
    entries = [(n, zipfile.ZIP_STORED, b, zlib.crc32(b), len(b))
               for n, b in members(good).items() if n != name]
    return _raw_zip(entries + [(name, method, data, crc, size)])


def _symlink(good: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in members(good).items():
            info = zipfile.ZipInfo(name)
            if name == "README.md":
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
                data = b"/etc/passwd"
            zf.writestr(info, data)
    return out.getvalue()


def _duplicate(good: bytes) -> bytes:
    parts = members(good)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf, pytest.warns(UserWarning, match="Duplicate name"):
        for name, data in parts.items():
            zf.writestr(name, data)
        zf.writestr("verify_steps.jsonl", b"")
    return out.getvalue()


def _edit_manifest(good: bytes, change) -> bytes:
    parts = members(good)
    manifest = json.loads(parts["manifest.json"])
    change(manifest)
    parts["manifest.json"] = json.dumps(manifest).encode()
    return rezip(parts, fix_manifest=False)


def _edit_line(good: bytes, name: str, change) -> bytes:
    """``name``'s first line (``run.json``: the record) changed by ``change``, written by ``json`` (which
    writes any integer)."""
    parts = members(good)
    lines = parts[name].splitlines() if name.endswith(".jsonl") else [parts[name]]
    record = orjson.loads(lines[0])
    change(record)
    lines[0] = json.dumps(record).encode()
    parts[name] = b"\n".join(lines) + (b"\n" if name.endswith(".jsonl") else b"")
    return rezip(parts)


HOSTILE = {
    "truncated zip": (lambda g: g[: len(g) // 2], "truncated"),
    "wrong checksum": (lambda g: rezip({**members(g), "verify_steps.jsonl":
                                        members(g)["verify_steps.jsonl"].replace(b'"accept_len":1', b'"accept_len":4', 1)},
                                       fix_manifest=False), "does not match its sha256"),
    "dot-dot member name": (lambda g: rezip({**members(g), "../evil.jsonl": b"x"}),
                            "leads outside the bundle"),
    "absolute member name": (lambda g: rezip({**members(g), "/etc/cron.d/evil": b"x"}),
                             "absolute path"),
    "symlink member": (_symlink, "symbolic link"),
    "oversized member": (lambda g: _with_member(g, "tensor_samples.jsonl", b"{}\n", zipfile.ZIP_STORED,
                                                zlib.crc32(b"{}\n"), 3_000_000_000),
                         "over the limit of 2,147,483,648 bytes per member"),
    "1 KB to 1 GB member": (lambda g: _with_member(g, "tensor_samples.jsonl", BOMB, zipfile.ZIP_BZIP2,
                                                   BOMB_CRC, BOMB_SIZE), "likely zip bomb"),
    "unknown schema version": (lambda g: _edit_manifest(g, lambda m: m.update(bundle_schema_version=99)),
                               "Unsupported bundle_schema_version 99"),
    "missing manifest": (lambda g: rezip({n: b for n, b in members(g).items() if n != "manifest.json"},
                                         fix_manifest=False), "No manifest.json"),
    "duplicate member names": (_duplicate, "appears twice"),
    "record not matching the schema": (
        lambda g: _edit_line(g, "verify_steps.jsonl", lambda r: r.update(accept_len="two")),
        "verify_steps.jsonl line 1 does not match the verify_steps record schema"),
    "integer past 64 bits in a finding's evidence": (
        lambda g: _edit_line(g, "findings.jsonl", lambda r: r["evidence"].update(big=2**64)),
        r"findings.jsonl line 1, evidence.big: integer 18446744073709551616 does not fit in 64 bits\. "
        "Ingest refuses this value from a tracer too"),
    "NUL in the server arguments": (
        lambda g: _edit_line(g, "run.json", lambda r: r["server_args"].update(note="a\x00b")),
        "run.json.server_args.note: holds a NUL character"),
    "a time a year ahead": (
        lambda g: _edit_line(g, "verify_steps.jsonl", lambda r: r.update(at=time.time() + 365 * 86400)),
        "verify_steps.jsonl line 1, at: .* is more than a day ahead of the dashboard's clock"),
    "manifest not matching the schema": (
        lambda g: _edit_manifest(g, lambda m: m.pop("counts")), "manifest.json does not match the bundle schema: counts"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_bundle_is_refused_and_nothing_changes(case, good_bundle, bundle_store) -> None:
    make, message = HOSTILE[case]
    before = snapshot(bundle_store)
    with pytest.raises(BundleError, match=message):
        store_bundle(BatchWriter(bundle_store), read_bundle(io.BytesIO(make(good_bundle))), origin=case)
    assert snapshot(bundle_store) == before


def test_a_failure_while_storing_rolls_everything_back(good_bundle, bundle_store) -> None:
    """A bundle that passes every check but conflicts in the store half way (one verify step
    twice): the run, its requests and the batches already written are all rolled back."""
    parts = members(good_bundle)
    first = parts["verify_steps.jsonl"].splitlines()[0]
    parts["verify_steps.jsonl"] += first + b"\n"
    manifest = json.loads(parts["manifest.json"])
    manifest["counts"]["verify_steps"] += 1
    parts["manifest.json"] = json.dumps(manifest).encode()
    before = snapshot(bundle_store)
    with pytest.raises(BundleError, match="sent twice"):
        store_bundle(BatchWriter(bundle_store), read_bundle(io.BytesIO(rezip(parts))), origin="conflict")
    assert snapshot(bundle_store) == before


def test_the_good_bundle_imports_once(good_bundle, bundle_store) -> None:
    writer = BatchWriter(bundle_store)
    first = store_bundle(writer, read_bundle(io.BytesIO(good_bundle)), origin="good.zip")
    after = snapshot(bundle_store)
    again = store_bundle(writer, read_bundle(io.BytesIO(good_bundle)), origin="good.zip")
    assert (first.status, again.status) == ("imported", "already imported")
    assert snapshot(bundle_store) == after and len(after["runs"]) == 2
    source = [row for row in after["runs"] if row.id == first.run_id][0].source
    assert source == "bundle" and after["bundle_imports"][0].origin == "good.zip"


def test_the_upload_form_needs_the_ingest_token_when_one_is_set(good_bundle, store_url, make_client):
    """A dashboard on a non-loopback address has an ingest token; an upload writes to the store,
    so it needs the token too."""
    client = make_client(ingest_token="s3cret-import-token-5c1d")
    files = {"bundle": ("aux-off.zip", good_bundle, "application/zip")}
    assert 'name="token"' in client.get("/import").text
    refused = client.post("/import", files=files, data={"token": "wrong"})
    assert refused.status_code == 401 and "ingest token" in refused.text
    engine = db.make_engine(store_url)
    try:
        assert snapshot(engine)["runs"] == []
        accepted = client.post("/import", files=files, data={"token": "s3cret-import-token-5c1d"})
        assert accepted.status_code == 200 and "Imported" in accepted.text
        assert len(snapshot(engine)["runs"]) == 1
    finally:
        engine.dispose()


def test_facts_the_rules_cannot_read_are_imported_with_a_finding_saying_so(good_bundle, bundle_store) -> None:
    """Facts are the writer's: a key list holding a null (no tracer writes one) is stored, and the run's
    runtime findings say they could not read it instead of failing the import."""
    def odd(run: dict) -> None:
        run["facts"]["draft"]["weights"] = {"checkpoint_keys_unused": [None]}

    result = store_bundle(BatchWriter(bundle_store), read_bundle(io.BytesIO(_edit_line(good_bundle, "run.json", odd))),
                          origin="odd facts")
    with bundle_store.connect() as conn:
        found = conn.execute(sa.text("SELECT rule_id, message FROM findings WHERE run_id = :r AND source = 'runtime'"),
                             {"r": result.run_id}).all()
    assert result.status == "imported"
    assert [f.rule_id for f in found] == ["run-facts-unreadable"], found
    assert "AttributeError" in found[0].message
