"""Sizes and ages as people write them in settings and flags: ``10GB``, ``500MiB``, ``7d``, ``12h``."""

from __future__ import annotations

import re

_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_size(text: str | int) -> int:
    """Bytes from ``10GB``, ``500MiB``, ``2000000`` (decimal and binary units); ValueError otherwise."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size: use bytes or a unit, e.g. 10GB, 500MB, 2GiB")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_age(text: str) -> float:
    """Seconds from ``7d``, ``12h``, ``30m``, ``90s``, ``2w``; ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not m:
        raise ValueError(f"{text!r} is not an age: use a number and s, m, h, d or w, e.g. 7d, 12h")
    return float(m.group(1)) * _AGE_UNITS[m.group(2)]
