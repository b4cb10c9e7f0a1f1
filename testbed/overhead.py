"""What the tracer-overhead measurements share (``bench/tracer_overhead.py``, the GPU bed's throughput
phases in ``testbed/gpu/throughput.py``): request ids the tracer samples or not, by choice, and the
bootstrap interval of a median cost."""

from __future__ import annotations

import random
import statistics
from typing import Callable

from draftscope_tracer.engine.sampling import request_sampled


def request_id(name: str, sampled: bool, rate: float = 1 / 16, seen: Callable[[str], str] = str) -> str:
    """A request id starting with ``name`` that the tracer samples at ``rate`` exactly when ``sampled``; ``seen(id)``:
    the id the tracer sees for it (vLLM's OpenAI server wraps the id a client gives)."""
    j = 0
    while request_sampled(seen(f"{name}-{j}"), rate) != sampled:
        j += 1
    return f"{name}-{j}"


def bootstrap_interval(groups: list[list[float]], resamples: int = 4000,
                       clusters: list[list[int]] | None = None) -> tuple[float, float]:
    """2.5th and 97.5th percentiles of the median, resampling groups, then values within each (seeded).
    ``clusters`` (indices into ``groups``) are resampled whole instead of single groups, each of their groups'
    values within that group: server pairs started in opposite orders stay together, so the order's edge,
    which a pair of them cancels, does not widen the interval (``bench/tracer_overhead.py``)."""
    rng = random.Random(0)
    clusters = clusters if clusters is not None else [[i] for i in range(len(groups))]

    def resample() -> list[float]:
        return [x for c in rng.choices(clusters, k=len(clusters)) for i in c
                for x in rng.choices(groups[i], k=len(groups[i]))]

    medians = sorted(statistics.median(resample()) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples)]
