"""Sampling decisions, identical on every rank: derived from the request id and a step counter only."""

from __future__ import annotations

import hashlib


def request_fraction(rid: str) -> float:
    """A stable number in [0, 1) for ``rid`` (the same in every process, unlike ``hash``)."""
    digest = hashlib.blake2b(rid.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def request_sampled(rid: str, rate: float) -> bool:
    """Whether ``rid`` is traced in detail at per-request ``rate``."""
    return rate >= 1.0 or request_fraction(rid) < rate


def step_sampled(step_index: int, stride: int) -> bool:
    """Whether verify step ``step_index`` (0-based) of a sampled request is recorded."""
    return step_index % stride == 0
