"""Uploaded bundles fuzzed: whatever a bundle's members hold, the upload answers below 500; a refused
bundle says why and changes nothing; an accepted one is stored whole and every page of it renders.

Each case starts from a valid bundle of a real recording (``good_bundle``) and changes one to three
things in its JSON members: a value replaced (mostly by one of the same JSON type, so that many records
still pass the schema and reach the store and the pages), a key dropped, a line duplicated, dropped,
taken from another member or replaced by raw bytes. The manifest's sizes and sha256 then follow the
members, and mostly its counts too, as an exporter's would: what is left to refuse is the content.
Hypothesis is derandomized and bounded, so a run is the same every time.
"""

from __future__ import annotations

import json
import time

import orjson
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from draftscope.bundle import format as fmt
from draftscope.store.retention import delete_run
from tests.fixtures.bundles import members, rezip, snapshot
from tests.fixtures.store import render_every_stored_run, settle

EXAMPLES = 300
JSON = st.recursive(st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=12), c, max_size=4),
                    max_leaves=6)
INTS = st.integers(-2**64, 2**64) | st.sampled_from([0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, -2**63, 2**63])
FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324])
TEXT = st.text(max_size=60) | st.sampled_from(["<script>alert(1)</script>", "\u202e", "a" * 5000, "\x00", "../x", ""])
RAW = st.sampled_from([b"NaN", b"Infinity", b"1e999", b"{", b"", b"null", b"[]", b'"\\ud800"', b"\xff\xfe",
                       b'{"a":1}{"b":2}', b"123456789012345678901234567890"])
LINE_OPS = ("set", "set", "set", "drop", "raw", "dup", "del", "swap")


def like(value) -> st.SearchStrategy:
    """Values of ``value``'s JSON type."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return INTS
    if isinstance(value, float):
        return FLOATS | INTS
    if isinstance(value, str):
        return TEXT
    if isinstance(value, list):
        return st.lists(like(value[0]) if value else JSON, max_size=2 * len(value) + 2)
    if isinstance(value, dict):
        return st.fixed_dictionaries({k: like(v) for k, v in value.items()})
    return JSON


def _paths(value, at: tuple = ()):
    """Every key path inside ``value`` (dict keys and list indices), ``()`` first."""
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*at, i))


def _changed(draw, record, op: str, said: list):
    """``record`` with one value replaced (``set``) or one key or item dropped (``drop``)."""
    paths = [p for p in _paths(record) if p or op == "set"]
    if not paths:  # nothing to drop from a scalar
        return record
    path = draw(st.sampled_from(paths))
    parent = record
    for k in path[:-1]:
        parent = parent[k]
    if op == "drop":
        said.append(("drop", path))
        del parent[path[-1]]
        return record
    old = parent[path[-1]] if path else record
    new = draw(like(old) | JSON if draw(st.integers(0, 4)) == 0 else like(old))
    said.append(("set", path, new))
    if not path:
        return new
    parent[path[-1]] = new
    return record


def mutated(draw, good: bytes, said: list) -> bytes:
    """``good`` with one to three changes to its JSON members (module docstring), each told in ``said``."""
    parts = members(good)
    jsonl = sorted(n for n in parts if n.endswith(".jsonl"))
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(sorted(n for n in parts if n.endswith((".json", ".jsonl")))))
        lines = parts[name].splitlines() if name in jsonl else [parts[name]]
        if not lines:
            continue
        i, op = draw(st.integers(0, len(lines) - 1)), draw(st.sampled_from(LINE_OPS))
        said.append((name, i, op))
        if op == "raw":
            lines[i] = draw(RAW)
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "del":
            del lines[i]
        elif op == "swap":
            pool = parts[draw(st.sampled_from(jsonl))].splitlines() or [b""]
            lines[i] = draw(st.sampled_from(pool))
        else:
            try:
                record = orjson.loads(lines[i])
            except orjson.JSONDecodeError:
                continue
            lines[i] = json.dumps(_changed(draw, record, op, said)).encode()  # ints past 64 bits too
        parts[name] = b"\n".join(lines) + (b"\n" if name in jsonl and lines else b"")
    try:
        manifest = json.loads(parts[fmt.MANIFEST])
        for table, name in fmt.TABLE_MEMBERS.items():
            if draw(st.integers(0, 9)):  # mostly the counts follow the members
                manifest["counts"][table] = len(parts[name].splitlines())
        parts[fmt.MANIFEST] = json.dumps(manifest).encode()
        return rezip(parts)
    except (ValueError, TypeError, KeyError, AttributeError):  # the manifest itself changed past reading
        return rezip(parts, fix_manifest=False)


def test_any_uploaded_bundle_is_refused_whole_or_stored_and_shown(good_bundle, bundle_store, store_url,
                                                                   make_client) -> None:
    client, seen = make_client(), {"stored": 0, "refused": 0}

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def check(data) -> None:
        said: list = []
        bundle = mutated(data.draw, good_bundle, said)
        before = snapshot(bundle_store)
        response = client.post("/import", files={"bundle": ("fuzzed.zip", bundle, "application/zip")})
        assert response.status_code in (200, 422), (said, response.status_code, response.text[:3000])
        if response.status_code == 422:
            seen["refused"] += 1
            assert "Nothing was imported." in response.text, (said, response.text[:3000])
            assert snapshot(bundle_store) == before, said
            return
        seen["stored"] += 1
        with bundle_store.connect() as conn:
            stored = {r for (r,) in conn.execute(sa.text("SELECT id FROM runs"))} - {r.id for r in before["runs"]}
        assert len(stored) == 1, (said, stored)
        settle(client)
        assert render_every_stored_run(client, store_url, {}, only=stored) == 1, said
        assert delete_run(bundle_store, stored.pop(), now=time.time() + 86400), said  # "being written" until then

    check()
    assert seen["stored"] >= EXAMPLES // 5 and seen["refused"] >= EXAMPLES // 5, seen
