"""Tests over requests for the acceptance signatures: an effect counts only when it is beyond what
request-to-request variation explains. Steps of one request are not independent (the same prompt,
the same text being continued), so requests, never steps, are what is permuted or resampled.
Deterministic: a fixed seed, so a run's diagnosis does not change from one refresh to the next."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ROUNDS = 2000  # permutations or bootstrap resamples
SEED = 0
CELLS = 2_000_000  # rounds x requests drawn at a time: bounded memory on runs of 100,000 requests


def pooled(units: Sequence[tuple[int, int]]) -> float:
    """Accepted over steps, pooled over ``(steps, accepted)`` units."""
    steps = sum(n for n, _ in units)
    return sum(a for _, a in units) / steps if steps else 0.0


def _chunks(n: int) -> list[int]:
    size = max(1, min(ROUNDS, CELLS // max(n, 1)))
    return [min(size, ROUNDS - i) for i in range(0, ROUNDS, size)]


def fall_p(early: Sequence[tuple[int, int, str]], late: Sequence[tuple[int, int, str]]) -> float:
    """One-sided permutation p-value that the late requests' pooled acceptance is lower than the early
    ones' by chance. Units ``(steps, accepted, stratum)``: labels are exchanged only within a stratum
    (the same prompt), so like is compared with like. (1 + hits) / (1 + rounds)."""
    observed = pooled([u[:2] for u in early]) - pooled([u[:2] for u in late])
    units = sorted([(u[2], 1, u[0], u[1]) for u in late] + [(u[2], 0, u[0], u[1]) for u in early])
    keys = sorted({u[0] for u in units})
    stratum = np.array([keys.index(u[0]) for u in units])
    late_slot = np.zeros(len(units), dtype=bool)  # per stratum's stretch, as many late slots as late units
    for s, key in enumerate(keys):
        late_slot[np.flatnonzero(stratum == s)[:sum(1 for u in units if u[0] == key and u[1])]] = True
    steps = np.array([u[2] for u in units], dtype=float)
    accepted = np.array([u[3] for u in units], dtype=float)
    rng, hits = np.random.default_rng(SEED), 0
    for size in _chunks(len(units)):
        order = np.argsort(stratum + rng.random((size, len(units))), axis=1, kind="stable")
        n, a = steps[order], accepted[order]
        n_l, a_l = (n * late_slot).sum(1), (a * late_slot).sum(1)
        n_e, a_e = n.sum(1) - n_l, a.sum(1) - a_l
        diff = a_e / np.maximum(n_e, 1) - a_l / np.maximum(n_l, 1)
        hits += int((diff >= observed - 1e-12).sum())
    return (1 + hits) / (1 + ROUNDS)


def drop_p(units: Sequence[tuple[int, int, int, int]]) -> float:
    """Bootstrap over requests of a fall of acceptance from one side to the other. Units
    ``(steps before, accepted before, steps after, accepted after)``, one per request; the p-value
    is the share of resamples (requests drawn with replacement) in which the pooled rate after is
    not below the pooled rate before. (1 + hits) / (1 + rounds)."""
    table = np.array(units, dtype=float).reshape(-1, 4)
    rng, hits = np.random.default_rng(SEED), 0
    for size in _chunks(len(table)):
        sums = table[rng.integers(0, len(table), (size, len(table)))].sum(1)
        before = sums[:, 1] / np.maximum(sums[:, 0], 1)
        after = sums[:, 3] / np.maximum(sums[:, 2], 1)
        hits += int(((sums[:, 0] == 0) | (sums[:, 2] == 0) | (after >= before)).sum())
    return (1 + hits) / (1 + ROUNDS)
