"""Validity of the draft's vocabulary maps: ``d2t`` (offsets) and ``t2d`` (membership)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class VocabMapCheck:
    """What ``d2t``/``t2d`` say, checked against the target vocabulary.

    ``d2t[i]`` is an offset: the target id of draft id ``i`` is ``i + d2t[i]`` (SGLang:
    ``hot_token_id = d2t + arange``). ``t2d`` is a boolean mask over target ids, ``sum == V_d``.
    """

    d2t_present: bool
    d2t_size: int | None = None
    d2t_all_zero: bool | None = None
    target_id_min: int | None = None  # of i + d2t[i]
    target_id_max: int | None = None
    target_ids_in_range: bool | None = None  # 0 <= i + d2t[i] < V_t
    target_ids_unique: bool | None = None
    looks_absolute: bool | None = None  # d2t itself reads as a sorted list of target ids
    t2d_present: bool = False
    t2d_size: int | None = None
    t2d_sum: int | None = None
    t2d_matches_d2t: bool | None = None  # t2d[i + d2t[i]] for every i


def check_vocab_map(d2t: np.ndarray | None, t2d: np.ndarray | None,
                    target_vocab: int | None) -> VocabMapCheck:
    """Check the maps; ``target_vocab`` None skips the range test."""
    check = VocabMapCheck(d2t_present=d2t is not None, t2d_present=t2d is not None)
    mask = None
    if t2d is not None:
        mask = np.asarray(t2d).reshape(-1).astype(bool)
        check.t2d_size, check.t2d_sum = int(mask.size), int(mask.sum())
    if d2t is None:
        return check
    offsets = np.asarray(d2t).reshape(-1).astype(np.int64)
    ids = offsets + np.arange(offsets.size, dtype=np.int64)
    check.d2t_size = int(offsets.size)
    check.d2t_all_zero = bool(offsets.size and not offsets.any())
    if offsets.size:
        check.target_id_min, check.target_id_max = int(ids.min()), int(ids.max())
    check.target_ids_unique = bool(np.unique(ids).size == ids.size)
    if target_vocab is not None:
        check.target_ids_in_range = bool(offsets.size == 0 or (ids.min() >= 0 and ids.max() < target_vocab))
    sorted_ids = bool(offsets.size > 1 and (np.diff(offsets) > 0).all() and offsets.min() >= 0)
    absolute_in_range = target_vocab is None or (offsets.size > 0 and offsets.max() < target_vocab)
    absolute_fits_t2d = True
    if mask is not None and offsets.size and offsets.max() < mask.size and offsets.min() >= 0:
        absolute_fits_t2d = bool(mask[offsets].all())
    if mask is not None:
        inside = (ids >= 0) & (ids < mask.size)
        check.t2d_matches_d2t = bool(inside.all() and mask[ids[inside]].all())
    # Absolute ids: strictly increasing non-negative ids within the vocabulary, the offset reading
    # fails (out of range or against t2d) and, when t2d is there, t2d agrees with the absolute one.
    offset_reading_fails = (check.target_ids_in_range is False) or (check.t2d_matches_d2t is False)
    check.looks_absolute = bool(sorted_ids and absolute_in_range and absolute_fits_t2d
                                and offset_reading_fails and not check.d2t_all_zero)
    return check
