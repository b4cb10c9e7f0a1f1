"""Read safetensors headers (and single small tensors) without loading a checkpoint.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping tensor names to
``{"dtype", "shape", "data_offsets"}``, then the raw bytes. Parsing it directly never unpickles
anything and costs one small read per file, however many GB the file holds.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftscope.spec.errors import SpecError

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit
_NUMPY_DTYPES = {"I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
                 "F64": "<f8", "F32": "<f4", "F16": "<f2"}


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives and what it looks like, from the header alone."""

    name: str
    dtype: str  # safetensors dtype code: F32, BF16, I64, BOOL, ...
    shape: tuple[int, ...]
    file: Path
    begin: int  # absolute byte offsets in ``file``
    end: int


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Tensor name -> TensorInfo for one ``.safetensors`` file; SpecError when it is not one."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise SpecError(path, "is not a safetensors file: shorter than the 8-byte header "
                                "length. Re-download or re-export the checkpoint.")
            (length,) = struct.unpack("<Q", head)
            if length == 0 or length > MAX_HEADER_BYTES:
                raise SpecError(path, f"is not a safetensors file: header length {length} is "
                                "impossible. Re-download or re-export the checkpoint.")
            raw = fh.read(length)
    except OSError as exc:
        raise SpecError(path, f"cannot be read ({exc.strerror or exc}).") from exc
    if len(raw) < length:
        raise SpecError(path, f"is truncated: the header says {length} bytes, the file has "
                        f"{len(raw)} after the length. Re-download the checkpoint.")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(path, f"has a corrupt safetensors header (not JSON: {exc}). "
                        "Re-download or re-export the checkpoint.") from exc
    if not isinstance(header, dict):
        raise SpecError(path, "has a corrupt safetensors header (not a JSON object).")
    base = 8 + length
    tensors = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = meta["data_offsets"]
            tensors[name] = TensorInfo(name, str(meta["dtype"]), tuple(int(d) for d in meta["shape"]),
                                       Path(path), base + int(begin), base + int(end))
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecError(path, f"has a corrupt safetensors header entry for {name!r} "
                            f"({exc!r}).") from exc
    return tensors


def read_tensor(info: TensorInfo) -> np.ndarray:
    """The values of one (small) tensor, read by its byte range; SpecError on an unknown dtype."""
    dtype = _NUMPY_DTYPES.get(info.dtype)
    if dtype is None:
        raise SpecError(info.file, f"tensor {info.name!r} has dtype {info.dtype}, which draftscope "
                        "does not read values of.")
    with open(info.file, "rb") as fh:
        fh.seek(info.begin)
        data = fh.read(info.end - info.begin)
    expected = int(np.prod(info.shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if len(data) != expected:
        raise SpecError(info.file, f"tensor {info.name!r} is truncated ({len(data)} of {expected} "
                        "bytes). Re-download the checkpoint.")
    return np.frombuffer(data, dtype=dtype).reshape(info.shape)
