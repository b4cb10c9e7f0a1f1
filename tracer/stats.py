"""Summaries as plain data, and the arithmetic the recorder process does on them (numpy, no torch).

A summary handle crosses from the scheduler process to the recorder process (``recorder.py``) by
pickling: a device :class:`~draftscope_tracer.device.summarize.Pending` is read on the relay thread and
travels as a :class:`Resolved` :class:`Summary`; a CPU launch travels as :class:`RowCopies` (the
copied rows and their top-k), which the recorder reduces. Nothing here imports torch, so the recorder
starts fast and small.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np


class ChunkStats(NamedTuple):
    """Statistics of one row of one aux chunk (plain Python numbers)."""

    l2: float
    mean: float
    std: float
    absmax: float
    nan_count: int
    inf_count: int
    width: int


class RowSummary(NamedTuple):
    """One selected row: its index into the input, its chunks, and its target top-k."""

    row: int
    chunks: list[ChunkStats]
    topk: Optional[list[tuple[int, float]]]  # (target token id, probability), best first


@dataclass(frozen=True)
class Summary:
    """A decoded summary of one launch; padding rows (``-1``) are left out."""

    tag: Any
    rows: list[RowSummary]
    # per selected position (padding included), when the launch gathered a verify's token ids:
    # [draft token, target token, sequence length, accept length] (-1 for padding)
    ints: Optional[list] = None

    def sample(self, chunk: int, rows: Optional[Sequence[int]] = None) -> dict[str, Any]:
        """Statistics of ``chunk`` over several summarised rows (positions in :attr:`rows`, default
        all), as ``SampleRecord`` fields: see :func:`merged_stats`."""
        return merged_stats(self, range(len(self.rows)) if rows is None else rows, [chunk])


def merged_stats(summary: Summary, positions: Sequence[int], chunks: Optional[Sequence[int]] = None) -> dict:
    """``SampleRecord`` statistics over whole rows made of ``chunks`` (default: all) of ``positions``.

    Mean and std are those of all the values together; ``l2_mean`` / ``l2_max`` are over the rows'
    L2 norms. A statistic made undefined by NaN/Inf values is ``None`` (the counts say why). One pass
    over the cells: the recorder runs this for every sample record.
    """
    rows = summary.rows
    total = wsum = nan = inf = 0
    absmax = -math.inf
    sq: list[float] = []
    for p in positions:
        row_sq = 0.0
        for c in (rows[p].chunks if chunks is None else [rows[p].chunks[i] for i in chunks]):
            total += c.width
            wsum += c.mean * c.width
            row_sq += c.l2 * c.l2
            if not c.absmax <= absmax:  # NaN wins
                absmax = c.absmax
            nan += c.nan_count
            inf += c.inf_count
        sq.append(row_sq)
    if not sq:
        raise ValueError("merged_stats needs at least one row")
    n, mean = len(sq), wsum / total
    var = sum(sq) / total - mean * mean
    l2 = [math.sqrt(v) for v in sq]
    return {"rows": n, "width": total // n, "l2_mean": _finite(sum(l2) / n), "l2_max": _finite(max(l2)),
            "mean": _finite(mean), "std": _finite(math.sqrt(max(var, 0.0)) if var == var else math.nan),
            "absmax": _finite(absmax), "nan_count": nan, "inf_count": inf}


def _finite(value: float) -> Optional[float]:
    return value if math.isfinite(value) else None


class Resolved:
    """A value that is already on the host (a read summary, host ints): ``result()`` returns it."""

    def __init__(self, value: Any):
        self.value = value

    def result(self) -> Any:
        return self.value


class DeviceBytes:
    """A Summarizer launch's result bytes as they cross to the recorder process, decoded there (with numpy):
    the scheduler process only waits for the copy and copies the bytes, so the decoding takes none of its
    GIL. ``fields``: ``(name, numpy dtype, shape, byte offset)`` of the layout."""

    def __init__(self, fields: list, data: bytes, chunk_width: int, tag: Any):
        self._fields, self._data, self.chunk_width, self.tag = fields, data, chunk_width, tag
        self._summary: Optional[Summary] = None

    def result(self) -> Summary:
        if self._summary is None:
            views = {name: np.frombuffer(self._data, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape)
                     for name, dtype, shape, offset in self._fields}
            self._summary = decode(views, self.chunk_width, self.tag)
            self._data = b""
        return self._summary


class ArrayBytes:
    """Small host arrays as they cross to the recorder process: the scheduler's relay thread copies their
    bytes (no decoding under the scheduler's GIL); ``result()`` decodes them there, once, with ``decode``
    (``"step_topk"`` or ``"ints"``) over ``arrays`` = ``[(bytes, numpy dtype, shape), ...]``."""

    def __init__(self, decode: str, arrays: list, extra: Any):
        self._decode, self._arrays, self._extra = decode, arrays, extra
        self._value: Any = None

    def result(self) -> Any:
        if self._value is None:
            arrays = [np.frombuffer(data, dtype=dtype).reshape(shape) for data, dtype, shape in self._arrays]
            self._value = DECODERS[self._decode](arrays, self._extra)
            self._arrays = []
        return self._value


class DraftSteps(NamedTuple):
    """What one draft's step tap read: ``positions[step][row]`` = ``[(id, prob), ...]`` best first (ties by id;
    ids < 0, nothing written, left out), rows ``request * branches + branch``; and for a tree (``branches`` >
    1) each request's ints (its verify nodes' candidate indices, then ``parent_list``), else None."""

    positions: list
    tree: Optional[list]
    branches: int


def draft_steps(arrays: list, extra: tuple) -> DraftSteps:
    """The step tap's probs/ids ``[steps, rows, k]`` (and tree ints ``[requests, width]``) as a
    :class:`DraftSteps` for the first ``n`` requests; ``extra`` = ``(n, branches)``."""
    probs, ids, tree = arrays
    n, branches = extra
    rows = n * branches
    positions = [[sorted(((t, q) for t, q in zip(i, p) if t >= 0), key=lambda e: (-e[1], e[0]))
                  for i, p in zip(step_ids[:rows], step_probs[:rows])]
                 for step_ids, step_probs in zip(ids.tolist(), probs.tolist())]
    return DraftSteps(positions, tree[:n].tolist() if branches > 1 else None, branches)


def indexed_ints(arrays: list, parts: list) -> list:
    """``flat[offset + index]`` for each ``(offset, index list)`` of ``parts``, ``flat`` the one array of
    ``arrays`` (the joined tensors), as one flat list of ints."""
    flat = arrays[0].astype(np.int64)
    return np.concatenate([flat[offset + np.asarray(index, dtype=np.int64)] for offset, index in parts]).tolist()


DECODERS = {"draft_steps": draft_steps, "ints": indexed_ints}


def decode(h: dict, chunk_width: int, tag: Any) -> Summary:
    """A launch's result views (numpy arrays or tensors) as a ``Summary``: padding rows (-1) left out, only
    rows up to the last used one read (a Summarizer's capacity may be far above what a launch uses), top-k
    best first, ties by id. ``sums`` holds sum, NaN count, non-finite count, sum of squares."""
    rows = h["rows"].tolist()
    n = max((i + 1 for i, r in enumerate(rows) if r >= 0), default=0)
    rows = rows[:n]
    sums, nan, nonfinite, sumsq = h["sums"][:, :n].tolist()
    absmax = h["absmax"][:n].tolist()
    topk = None
    if "topk_id" in h:  # unsorted on the device
        topk = [sorted(zip(i, p), key=lambda e: (-e[1], e[0])) for i, p in zip(h["topk_id"][:n].tolist(),
                                                                              h["topk_p"][:n].tolist())]
    out, H = [], chunk_width
    for r, row in enumerate(rows):
        if row < 0:
            continue
        chunks = []
        for c in range(len(sums[r])):
            mean, ss = sums[r][c] / H, sumsq[r][c]
            var = max(ss / H - mean * mean, 0.0) if math.isfinite(ss) and math.isfinite(mean) else math.nan
            chunks.append(ChunkStats(l2=math.sqrt(ss) if ss >= 0 else math.nan, mean=mean,
                                     std=math.sqrt(var) if var == var else math.nan, absmax=absmax[r][c],
                                     nan_count=int(nan[r][c]), inf_count=int(nonfinite[r][c] - nan[r][c]), width=H))
        out.append(RowSummary(row=row, chunks=chunks, topk=None if topk is None else topk[r]))
    return Summary(tag=tag, rows=out, ints=h["ints"][:n].tolist() if "ints" in h else None)


class RowCopies:
    """Host copies of some rows (``x``, float32/64) and their top-k (``probs``/``ids``, best-first by
    probability, not yet tie-broken), reduced to a :class:`Summary` by :meth:`result` on whichever
    thread or process asks first. Pickles as the bytes of its arrays."""

    def __init__(self, rows: list, chunk_width: int, x: Optional[np.ndarray], probs: Optional[np.ndarray],
                 ids: Optional[np.ndarray], tag: Any = None):
        self._rows, self.chunk_width, self.tag = rows, chunk_width, tag
        self._x, self._probs, self._ids = x, probs, ids
        self._summary: Optional[Summary] = None
        self._released = False
        self._lock = threading.Lock()

    def __reduce__(self):
        self._check_readable()
        return _row_copies, (self._rows, self.chunk_width, _raw(self._x), _raw(self._probs), _raw(self._ids),
                             self.tag)

    def result(self) -> Summary:
        """The summary (computed once)."""
        with self._lock:
            if self._summary is None:
                self._check_readable()
                topk = None if self._ids is None else best_first(self._probs, self._ids)
                cells = [[] for _ in self._rows] if self._x is None else chunk_stats(self._x, self.chunk_width)
                self._summary = Summary(tag=self.tag, rows=[
                    RowSummary(row=row, chunks=cells[r], topk=None if topk is None else topk[r])
                    for r, row in enumerate(self._rows)])
                self._x = self._probs = self._ids = None
            return self._summary

    def release(self) -> None:
        with self._lock:
            if self._summary is None:
                self._released = True
                self._x = self._probs = self._ids = None

    def _check_readable(self) -> None:
        if self._released:
            raise RuntimeError("these rows were released without being read")


def _raw(a: Optional[np.ndarray]) -> Optional[tuple]:
    """An array as bytes, shape and dtype: pickles in a fifth of the time numpy's own reduction takes."""
    return None if a is None else (a.tobytes(), a.shape, a.dtype.str)


def _array(raw: Optional[tuple]) -> Optional[np.ndarray]:
    return None if raw is None else np.frombuffer(raw[0], dtype=raw[2]).reshape(raw[1])


def _row_copies(rows, chunk_width, x, probs, ids, tag) -> RowCopies:
    return RowCopies(rows, chunk_width, _array(x), _array(probs), _array(ids), tag)


def chunk_stats(x: np.ndarray, H: int) -> list:
    """Per row, the :class:`ChunkStats` of each ``H``-wide chunk (float64; NaN/Inf values make the
    statistics they enter NaN/Inf, as on the device)."""
    n, K = x.shape[0], x.shape[1] // H
    v = x.reshape(n, K, H).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        mean = v.sum(-1) / H
        sumsq = np.einsum("rkh,rkh->rk", v, v)
        absmax = np.abs(v).max(-1)
        var = sumsq / H - mean * mean
        if np.isfinite(sumsq).all():  # every value finite
            nan = inf = [0] * (n * K)
            np.maximum(var, 0.0, out=var)
        else:
            nan, inf = np.isnan(v).sum(-1).ravel().tolist(), np.isinf(v).sum(-1).ravel().tolist()
            var = np.where(np.isfinite(sumsq) & np.isfinite(mean), np.maximum(var, 0.0), np.nan)
        l2, std = np.sqrt(sumsq), np.sqrt(var)
    cells = list(map(ChunkStats, *(a.ravel().tolist() for a in (l2, mean, std, absmax)), nan, inf, [H] * (n * K)))
    return [cells[r * K:(r + 1) * K] for r in range(n)]


def best_first(probs: np.ndarray, ids: np.ndarray) -> list:
    """Per row: ``(id, probability)`` pairs by probability, then id (``topk`` sorts by value only)."""
    out = []
    for i, p in zip(ids.tolist(), probs.tolist()):
        if len(set(p)) == len(p):  # no ties: topk's order is the order
            out.append(list(zip(i, p)))
        else:
            out.append([(t, -q) for q, t in sorted(zip([-q for q in p], i))])
    return out
