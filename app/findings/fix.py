"""Apply findings' mechanical fixes (``Finding.patch``) to a copy of a draft checkpoint.

The input directory is never written. Config edits go to the copy's config.json; tensor edits
rewrite safetensors headers and bytes directly (no torch, no unpickling); server flags are
collected and returned, with a ready ``sglang_flags.txt`` in the copy.
"""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftscope.findings.model import Finding
from draftscope.spec.checkpoint import INDEX_NAME
from draftscope.spec.sglang import format_server_args

FLAGS_FILE = "sglang_flags.txt"


class FixError(ValueError):
    """The fix cannot be written (bad output directory); the message says what to do."""


@dataclass
class FixResult:
    out_dir: Path
    changes: list[str] = field(default_factory=list)  # one line per edit, for printing
    server_args: dict[str, Any] = field(default_factory=dict)  # flag name (underscored) -> value
    applied: list[str] = field(default_factory=list)  # rule ids whose patch was applied
    skipped: list[str] = field(default_factory=list)  # rule ids whose fix needs a human

    def flags(self) -> str:
        """The server flags to launch with, e.g. ``--speculative-algorithm EAGLE3 --speculative-draft-model-path OUT``."""
        return format_server_args({**self.server_args, "speculative_draft_model_path": str(self.out_dir)})


def apply_fixes(draft_dir: Path, out_dir: Path, findings: list[Finding],
                server_args: dict[str, Any] | None = None) -> FixResult:
    """Copy ``draft_dir`` to ``out_dir`` (which must not exist or be empty) and apply every patch;
    ``server_args`` (the flags given) are kept in the result's flags unless a patch changes them."""
    draft_dir, out_dir = Path(draft_dir).resolve(), Path(out_dir).resolve()
    if out_dir == draft_dir or draft_dir in out_dir.parents or out_dir in draft_dir.parents:
        raise FixError(f"{out_dir} overlaps the draft directory {draft_dir}; doctor --fix never "
                       "edits the input. Give a new directory outside it.")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FixError(f"{out_dir} already exists and is not an empty directory; give a new one.")
    out_dir.mkdir(parents=True, exist_ok=True)
    for item in draft_dir.iterdir():
        if item.is_dir():
            shutil.copytree(item, out_dir / item.name)
        else:
            shutil.copy2(item, out_dir / item.name)
    result = FixResult(out_dir, server_args=dict(server_args or {}))
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    for f in findings:
        if not f.patch:
            if f.severity != "info":
                result.skipped.append(f.rule_id)
            continue
        for op in f.patch:
            result.changes.append(f"{f.rule_id}: " + _apply(op, config, out_dir, result))
        result.applied.append(f.rule_id)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / FLAGS_FILE).write_text(result.flags() + "\n")
    return result


def _apply(op: dict[str, Any], config: dict, out_dir: Path, result: FixResult) -> str:
    kind = op["op"]
    if kind == "config_set":
        *parents, leaf = op["path"].split(".")
        node = config
        for key in parents:
            node = node.setdefault(key, {})
        old = node.get(leaf, "<absent>")
        node[leaf] = op["value"]
        return f"config.json {op['path']}: {json.dumps(old)} -> {json.dumps(op['value'])}"
    if kind == "config_delete":
        *parents, leaf = op["path"].split(".")
        node = config
        for key in parents:
            node = node.get(key) or {}
        old = node.pop(leaf, "<absent>")
        return f"config.json {op['path']}: {json.dumps(old)} removed"
    if kind == "server_arg":
        result.server_args[op["name"]] = op["value"]
        return f"server flag --{op['name'].replace('_', '-')} {op['value']}"
    if kind == "strip_key_prefix":
        count = _rename_keys(out_dir, op["prefix"])
        return f"{count} tensor keys renamed without the prefix '{op['prefix']}'"
    if kind == "d2t_to_offsets":
        size = _d2t_to_offsets(out_dir)
        return f"d2t ({size} entries) rewritten as offsets: d2t[i] - i"
    raise ValueError(f"unknown patch op {kind!r}")


def _files(out_dir: Path) -> list[Path]:
    return sorted(out_dir.glob("*.safetensors"))


def _read_raw_header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(length)), 8 + length


def _rename_keys(out_dir: Path, prefix: str) -> int:
    """Rewrite each safetensors header without ``prefix``; tensor bytes are copied unchanged."""
    count = 0
    for path in _files(out_dir):
        header, data_start = _read_raw_header(path)
        renamed = {}
        for name, entry in header.items():
            new = name[len(prefix):] if name.startswith(prefix) else name
            count += new != name
            renamed[new] = entry
        raw = json.dumps(renamed).encode()
        raw += b" " * (-len(raw) % 8)
        tmp = path.with_suffix(".tmp")
        with open(path, "rb") as src, open(tmp, "wb") as dst:
            dst.write(struct.pack("<Q", len(raw)) + raw)
            src.seek(data_start)
            shutil.copyfileobj(src, dst, 1 << 20)
        tmp.replace(path)
    index = out_dir / INDEX_NAME
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {(k[len(prefix):] if k.startswith(prefix) else k): v
                              for k, v in data["weight_map"].items()}
        index.write_text(json.dumps(data, indent=2) + "\n")
    return count


def _d2t_to_offsets(out_dir: Path) -> int:
    """Overwrite d2t's bytes in place (same dtype and size): absolute ids -> offsets."""
    for path in _files(out_dir):
        header, data_start = _read_raw_header(path)
        name = next((n for n in header if n == "d2t" or n.endswith(".d2t")), None)
        if name is None:
            continue
        entry = header[name]
        dtype = {"I64": "<i8", "I32": "<i4"}[entry["dtype"]]
        begin, end = (data_start + o for o in entry["data_offsets"])
        with open(path, "r+b") as fh:
            fh.seek(begin)
            ids = np.frombuffer(fh.read(end - begin), dtype=dtype)
            fh.seek(begin)
            fh.write((ids - np.arange(ids.size)).astype(dtype).tobytes())
        return int(ids.size)
    raise ValueError("no d2t tensor in the checkpoint")
