"""Open a trace bundle and check all of it before anything is stored.

The zip's directory is checked first (member names, links, sizes and compression ratios against
``Limits``) so that nothing is decompressed from a hostile archive; then the manifest (schema
version, then schema); then every member's size and sha256 against the manifest; then every
record against the wire schema and ingest's own checks (``store.ingest_checks``: no time over a day
ahead, free-form JSON without NUL, deep nesting or integers past 64 bits), as a tracer's batch. Any
problem raises ``BundleError`` naming it.
"""

from __future__ import annotations

import gc
import hashlib
import stat
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import IO, Any, get_args

import msgspec
import orjson
import pydantic
import pydantic_core

from draftscope.bundle import format as fmt
from draftscope.store.ingest_checks import Refused, check_records, check_run, latest_time
from draftscope.store.wire_schema import Batch, FastBatch, SUPPORTED_SCHEMA_VERSIONS

_COMPRESSIONS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}
_FAST = {f.name: f.type for f in msgspec.structs.fields(FastBatch)}
_FAST_RUN = get_args(_FAST["run"])[0]
_FAST_RECORDS = {t: get_args(_FAST[k])[0] for t, k in fmt.BATCH_KEYS.items()}
_MODELS = {t: get_args(Batch.model_fields[k].annotation)[0] for t, k in fmt.BATCH_KEYS.items()}
_RUN_MODEL = get_args(Batch.model_fields["run"].annotation)[0]


class BundleError(Exception):
    """A bundle that cannot be imported; the message names the problem and what to do."""


@dataclass
class Bundle:
    """A validated bundle: its manifest and run record; ``chunks`` reads its records again."""

    sha256: str
    manifest: fmt.Manifest
    run: Any  # the wire RunRecord (msgspec struct)
    file: IO[bytes]  # the bundle, kept open by the caller until it is stored

    @property
    def run_id(self) -> str:
        return self.manifest.run_id

    def chunks(self, size: int) -> Iterator[tuple[str, list[Any]]]:
        """(store table, up to ``size`` wire records) for every record, table by table, read and
        checked against the manifest again (the file is read twice; memory holds one chunk)."""
        with _open(self.file) as archive:
            for table, name in fmt.TABLE_MEMBERS.items():
                yield from ((table, chunk) for chunk in
                            _records(archive, archive.getinfo(name), self.manifest, table, size))


def read_bundle(file: IO[bytes], limits: fmt.Limits | None = None) -> Bundle:
    """Validate the bundle in the seekable binary ``file`` (all of it: every record is decoded
    and checked, then let go); raises BundleError."""
    limits = limits or fmt.Limits()
    sha256 = _file_sha256(file)
    with _open(file) as archive:
        infos = _check_directory(archive, limits)
        manifest = _read_manifest(archive, infos, limits)
        _check_listing(infos, manifest)
        for name in sorted(set(infos) - {fmt.MANIFEST, fmt.RUN, *fmt.TABLE_MEMBERS.values()}):
            _member(archive, infos[name], manifest)  # README.md, text.jsonl: checked, not stored
        run = _parse_run(_member(archive, infos[fmt.RUN], manifest))
        for table, name in fmt.TABLE_MEMBERS.items():
            count = sum(len(chunk) for chunk in _records(archive, infos[name], manifest, table))
            if manifest.counts.get(table) != count:
                raise BundleError(f"{name} holds {count} records but the manifest counts "
                                  f"{manifest.counts.get(table)}: the bundle is inconsistent. "
                                  "Export it again.")
    return Bundle(sha256, manifest, run, file)


def _open(file: IO[bytes]) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(file)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as exc:
        raise BundleError(f"Not a readable zip archive ({exc}): the file is truncated or is not a "
                          "draftscope bundle. Download or export it again.") from None


def _file_sha256(file: IO[bytes]) -> str:
    digest = hashlib.sha256()
    file.seek(0)
    while block := file.read(1 << 20):
        digest.update(block)
    file.seek(0)
    return digest.hexdigest()


def _check_directory(archive: zipfile.ZipFile, limits: fmt.Limits) -> dict[str, zipfile.ZipInfo]:
    """The members by name, once names, types, sizes and ratios are known to be safe."""
    infos = archive.infolist()
    if len(infos) > limits.max_members:
        raise BundleError(f"The archive holds {len(infos)} members; a bundle has at most "
                          f"{limits.max_members}. This is not a draftscope bundle.")
    by_name: dict[str, zipfile.ZipInfo] = {}
    total = 0
    for info in infos:
        name = info.filename
        _check_name(name)
        if name in by_name:
            raise BundleError(f"Member {name!r} appears twice in the archive; a reader could "
                              "take either copy, so the bundle is refused. Export it again.")
        if stat.S_ISLNK(info.external_attr >> 16):
            raise BundleError(f"Member {name!r} is a symbolic link; bundles hold regular files only.")
        if info.flag_bits & 0x1:
            raise BundleError(f"Member {name!r} is encrypted; bundles are not encrypted.")
        if info.compress_type not in _COMPRESSIONS:
            raise BundleError(f"Member {name!r} uses zip compression method {info.compress_type}, "
                              "which this reader does not accept (stored, deflate, bzip2, lzma).")
        if name not in fmt.KNOWN_MEMBERS:
            raise BundleError(f"Unexpected member {name!r}; a bundle holds only "
                              f"{', '.join(fmt.KNOWN_MEMBERS)}.")
        if info.file_size > limits.max_member_bytes:
            raise BundleError(f"Member {name!r} is {info.file_size:,} bytes uncompressed, over the "
                              f"limit of {limits.max_member_bytes:,} bytes per member. Export fewer "
                              "requests (draftscope export --requests ...).")
        total += info.file_size
        if total > limits.max_total_bytes:
            raise BundleError(f"The members total more than {limits.max_total_bytes:,} bytes "
                              "uncompressed, over the limit. Export fewer requests.")
        if info.file_size > limits.ratio_floor_bytes and \
                info.file_size > limits.max_ratio * max(info.compress_size, 1):
            raise BundleError(f"Member {name!r} would expand from {info.compress_size:,} to "
                              f"{info.file_size:,} bytes (ratio over {limits.max_ratio:g}): refused "
                              "as a likely zip bomb.")
        by_name[name] = info
    return by_name


def _check_name(name: str) -> None:
    path = PurePosixPath(name)
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise BundleError(f"Member name {name!r} is an absolute path; bundle members are plain "
                          "file names.")
    if ".." in path.parts or "\\" in name:
        raise BundleError(f"Member name {name!r} leads outside the bundle ('..' or '\\'); refused.")
    if name.endswith("/") or "/" in name:
        raise BundleError(f"Member {name!r} is in a folder; bundle members are plain file names.")


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    try:
        data = archive.read(info)
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError) as exc:
        raise BundleError(f"Member {info.filename!r} cannot be read ({exc}): the bundle is "
                          "corrupt or truncated. Export it again.") from None
    if len(data) != info.file_size:
        raise BundleError(f"Member {info.filename!r} holds {len(data)} bytes, not the "
                          f"{info.file_size} its zip entry declares: the bundle is corrupt.")
    return data


def _read_manifest(archive: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo],
                   limits: fmt.Limits) -> fmt.Manifest:
    info = infos.get(fmt.MANIFEST)
    if info is None:
        raise BundleError(f"No {fmt.MANIFEST} in the archive: it is not a draftscope bundle (or "
                          "was repacked without it). Export it again with draftscope export.")
    if info.file_size > limits.max_manifest_bytes:
        raise BundleError(f"{fmt.MANIFEST} is {info.file_size:,} bytes, over the limit of "
                          f"{limits.max_manifest_bytes:,}.")
    try:
        raw = orjson.loads(_read(archive, info))
    except orjson.JSONDecodeError as exc:
        raise BundleError(f"{fmt.MANIFEST} is not valid JSON ({exc}).") from None
    version = raw.get("bundle_schema_version") if isinstance(raw, dict) else None
    if version not in fmt.SUPPORTED_BUNDLE_VERSIONS:
        supported = ", ".join(map(str, fmt.SUPPORTED_BUNDLE_VERSIONS))
        raise BundleError(f"Unsupported bundle_schema_version {version!r}; this draftscope reads "
                          f"version {supported}. Import it with the draftscope that made it "
                          f"({raw.get('created_by') if isinstance(raw, dict) else 'unknown'}), or "
                          "upgrade draftscope.")
    try:
        manifest = fmt.Manifest.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise BundleError(f"{fmt.MANIFEST} does not match the bundle schema: "
                          f"{_errors(exc)}.") from None
    if manifest.wire_schema_version not in SUPPORTED_SCHEMA_VERSIONS:
        raise BundleError(f"The bundle's records use wire schema_version "
                          f"{manifest.wire_schema_version}; this draftscope reads "
                          f"{', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))}. Upgrade draftscope.")
    return manifest


def _check_listing(infos: dict[str, zipfile.ZipInfo], manifest: fmt.Manifest) -> None:
    """The archive holds the required members, and exactly the members the manifest lists."""
    present = set(infos) - {fmt.MANIFEST}
    listed = set(manifest.members)
    for name in sorted(set(fmt.REQUIRED_MEMBERS) - {fmt.MANIFEST} - present):
        raise BundleError(f"Member {name!r} is missing from the archive.")
    for name in sorted(present ^ listed):
        where = "the manifest lists it but the archive lacks it" if name in listed \
            else "the archive holds it but the manifest does not list it"
        raise BundleError(f"Member {name!r}: {where}. The bundle was altered; export it again.")


def _member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, manifest: fmt.Manifest) -> bytes:
    """A member's bytes, once they match its size and sha256 in the manifest."""
    body, expected = _read(archive, info), manifest.members[info.filename]
    if len(body) != expected.size or hashlib.sha256(body).hexdigest() != expected.sha256:
        raise BundleError(f"Member {info.filename!r} does not match its sha256 in the manifest "
                          f"({len(body)} bytes, manifest says {expected.size}): the bundle was "
                          "altered or damaged. Export it again.")
    return body


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a block that builds many objects and no cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _errors(exc: pydantic.ValidationError, shown: int = 5) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    text = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}"
                     for e in errors[:shown])
    return text + (f" (and {len(errors) - shown} more)" if len(errors) > shown else "")


def _parse_run(body: bytes) -> Any:
    try:
        run = msgspec.json.decode(body, type=_FAST_RUN)
    except msgspec.DecodeError:
        try:
            _RUN_MODEL.model_validate_json(body)
            run = msgspec.convert(pydantic_core.from_json(body, allow_inf_nan=True), _FAST_RUN)
        except (pydantic.ValidationError, msgspec.ValidationError) as exc:
            detail = _errors(exc) if isinstance(exc, pydantic.ValidationError) else str(exc)
            raise BundleError(f"{fmt.RUN} does not match the run record schema "
                              f"(draftscope_tracer/transport/wire.py RunRecord): {detail}.") from None
    with _ingest_checks():
        check_run(run, fmt.RUN, latest_time())
    return run


@contextmanager
def _ingest_checks() -> Iterator[None]:
    """``ingest_checks``' refusals as BundleError: a value ingest would not take from a tracer."""
    try:
        yield
    except Refused as exc:
        raise BundleError(f"{exc}. Ingest refuses this value from a tracer too, so the bundle was not "
                          "made by a draftscope export or was altered: export the run again.") from None


def _records(archive: zipfile.ZipFile, info: zipfile.ZipInfo, manifest: fmt.Manifest, table: str,
             size: int = 20_000) -> Iterator[list[Any]]:
    """The records of one JSON-lines member, ``size`` lines at a time; a bad line is named by its
    number. The member's size and sha256 are checked against the manifest once it is read."""
    digest, total, number, lines = hashlib.sha256(), 0, 0, []
    try:
        with archive.open(info) as member:
            for line in member:
                digest.update(line)
                total += len(line)
                if line.strip():
                    lines.append(line)
                if len(lines) == size:
                    yield _decode(info.filename, lines, number, table)
                    number += len(lines)
                    lines = []
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as exc:
        raise BundleError(f"Member {info.filename!r} cannot be read ({exc}): the bundle is "
                          "corrupt or truncated. Export it again.") from None
    expected = manifest.members[info.filename]
    if total != expected.size or digest.hexdigest() != expected.sha256:
        raise BundleError(f"Member {info.filename!r} does not match its sha256 in the manifest "
                          f"({total} bytes, manifest says {expected.size}): the bundle was "
                          "altered or damaged. Export it again.")
    if lines:
        yield _decode(info.filename, lines, number, table)


def _decode(name: str, lines: list[bytes], before: int, table: str) -> list[Any]:
    """Lines ``before + 1 ...`` of member ``name`` as wire records of ``table``."""
    struct = _FAST_RECORDS[table]
    with gc_paused():  # many small objects and no cycles: the collector would rescan them all
        try:
            return _checked(name, msgspec.json.decode(b"[" + b",".join(lines) + b"]", type=list[struct]),
                            before, table)
        except msgspec.DecodeError:
            pass
    records = []
    for number, line in enumerate(lines, start=before + 1):
        try:
            records.append(msgspec.json.decode(line, type=struct))
            continue
        except msgspec.DecodeError:
            pass
        try:
            _MODELS[table].model_validate_json(line)
            records.append(msgspec.convert(pydantic_core.from_json(line, allow_inf_nan=True), struct))
        except pydantic.ValidationError as exc:
            raise BundleError(f"{name} line {number} does not match the {table} record schema "
                              f"(draftscope_tracer/transport/wire.py): {_errors(exc)}.") from None
        except msgspec.ValidationError as exc:
            raise BundleError(f"{name} line {number}: {exc}.") from None
    return _checked(name, records, before, table)


def _checked(name: str, records: list[Any], before: int, table: str) -> list[Any]:
    """``records`` (lines ``before + 1 ...`` of member ``name``) once ingest's own checks pass them."""
    with _ingest_checks():
        check_records(fmt.BATCH_KEYS[table], records, lambda i, sub: f"{name} line {before + 1 + i}, {sub}",
                      latest_time())
    return records
