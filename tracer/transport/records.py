"""The records built from each hook's summaries: functions the recorder process runs (no torch).

Each hook queues one call of a function below with plain arguments and summary handles
(``stats.RowCopies``, a device ``Pending`` or ``HostInts``, pickled as ``stats.Resolved``); the relay
pickles the call to the recorder, whose writer runs it. Each returns wire records by table.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

from draftscope_tracer.stats import merged_stats
from draftscope_tracer.transport.writer import Records


def sample_record(point: str, phase: str, at: float, rid: Optional[str], step: Optional[int],
                  shape: List[int], dtype: str, stats: dict) -> dict:
    return {"point": point, "phase": phase, "at": at, "rid": rid, "step_index": step, "shape": shape,
            "dtype": dtype, **stats}


def topk_list(topk: Sequence[Tuple[int, float]], id_map: Optional[List[int]] = None) -> List[list]:
    """``[[target id, prob], ...]`` of one row's top-k, draft ids mapped through ``id_map``; probabilities
    to 6 decimals (a NaN one is written as JSON null by ``wire.to_json``)."""
    if id_map is not None:
        return [[id_map[i], round(p, 6)] for i, p in topk]
    return [[i, round(p, 6)] for i, p in topk]


def features(p_in, p_fc, rows: list, groups: list, fc_groups: list, phase: str, now: float, width: int, dtype: str,
             H: int, chunks: int, with_aux: bool, input_every: int, fc_dtype: Optional[str]) -> Records:
    """draft.input (+ target.aux[i] chunks) of each sampled request's rows ``groups`` of ``p_in``, and
    draft.fc.out of its rows ``fc_groups`` of ``p_fc`` (None: not recomputed at this step)."""
    s_in = p_in.result() if p_in is not None else None
    s_fc = p_fc.result() if p_fc is not None else None
    out = []
    for (_, rid, step), pos, fc_pos in zip(rows, groups, fc_groups):
        if not pos:
            continue
        if s_in is not None and step % input_every == 0:
            out.append(sample_record("draft.input", phase, now, rid, step, [len(pos), width], dtype,
                                     merged_stats(s_in, pos)))
            for c in range(chunks if with_aux and chunks > 1 else 0):
                out.append(sample_record(f"target.aux[{c}]", phase, now, rid, step, [len(pos), H], dtype,
                                         merged_stats(s_in, pos, [c])))
        if s_fc is not None and fc_pos:
            out.append(sample_record("draft.fc.out", phase, now, rid, step,
                                     [len(fc_pos), s_fc.rows[0].chunks[0].width], fc_dtype, merged_stats(s_fc, fc_pos)))
    return {"samples": out}


def draft_logits(pending, rows: list, periodic: list, phase: str, now: float, V: int) -> Records:
    """``draft.logits`` statistics of the rows at positions ``periodic`` of ``rows``."""
    s = pending.result()
    return {"samples": [sample_record("draft.logits", phase, now, rows[j][1], rows[j][2], [1, V], "float32",
                                      merged_stats(s, [j])) for j in periodic]}


class VerifyShape(NamedTuple):
    """What a verify step's records need besides its values."""

    draft_tokens: int  # N: tree nodes per request (the verified prefix's last token, then N - 1 drafts)
    aux_chunks: int  # target.aux[i] chunks in the verify's hidden states (0: no aux hidden states)
    aux_width: Optional[int]
    aux_dtype: Optional[str]


class StepTokens(NamedTuple):
    """One request's tokens in a verify step."""

    nodes: List[int]  # the verified prefix's last token, then the drafts
    target: List[int]  # the target's token at each node
    seq_pos: int
    accept_len: int


def step_tokens(values: List[int], requests: int, n: int) -> List[StepTokens]:
    """Per request, the flat ``HostInts`` values of a verify step: draft tokens, then target tokens (``n``
    per request), then sequence lengths, then accept lengths (one per request)."""
    nodes, target = values[:requests * n], values[requests * n:2 * requests * n]
    seq, accept = values[2 * requests * n:2 * requests * n + requests], values[2 * requests * n + requests:]
    return [StepTokens(nodes[j * n:(j + 1) * n], target[j * n:(j + 1) * n], seq[j], accept[j])
            for j in range(requests)]


class GatheredInts:
    """A verify's token ids as the summary gathered them on the device (``Summary.ints``, 4 per node), in
    ``HostInts``' order: draft tokens, target tokens, then sequence and accept lengths per request. Pickled
    with the summary it reads (the same object in one payload: decoded once)."""

    def __init__(self, pending, requests: int, n: int):
        self.pending, self.requests, self.n = pending, requests, n

    def result(self) -> List[int]:
        rows = self.pending.result().ints[:self.requests * self.n]
        firsts = rows[::self.n]
        return [r[0] for r in rows] + [r[1] for r in rows] + [r[2] for r in firsts] + [r[3] for r in firsts]


def verify(ints, pending, rows: list, shape: VerifyShape, now: float, drafts: dict,
           hot: Optional[List[int]]) -> Records:
    """One step record per sampled request (tokens, acceptance, target and draft top-k) and its
    target.aux[i] samples. ``ints``: the step's ``HostInts`` or ``GatheredInts`` (see :func:`step_tokens`); ``pending``: the
    summary of its ``N`` rows per request (aux statistics, target top-k); ``drafts``: rid -> (seed, steps),
    the draft's top-k at position 1 as ``(summary, row, mapped)`` and at positions 2.. as
    ``(StepTopk, row, mapped)`` (either None), ``mapped`` when its ids go through ``hot``."""
    N = shape.draft_tokens
    s = pending.result() if pending is not None else None
    out = {"steps": [], "samples": []}
    for j, ((_, rid, step), t) in enumerate(zip(rows, step_tokens(ints.result(), len(rows), N))):
        a, base = t.accept_len, j * N
        rec = {"rid": rid, "step_index": step, "at": now, "seq_pos": t.seq_pos, "drafted_tokens": t.nodes[1:],
               "accept_len": a, "accept_flags": [p <= a - 1 for p in range(1, N)], "bonus_token": t.target[a - 1]}
        if s is not None:
            rec["target_topk"] = [topk_list(s.rows[base + p].topk) for p in range(N - 1)]
            for c in range(shape.aux_chunks):
                out["samples"].append(sample_record(f"target.aux[{c}]", "verify", now, rid, step, [N, shape.aux_width],
                                                    shape.aux_dtype, merged_stats(s, range(base, base + N), [c])))
        seed, steps = drafts.get(rid) or (None, None)
        if seed is not None or steps is not None:
            rec["draft_topk"] = [topk_list(seed[0].result().rows[seed[1]].topk, hot if seed[2] else None)
                                 if seed is not None else []]
            if steps is not None:
                rec["draft_topk"] += [topk_list(pos[steps[1]], hot if steps[2] else None) for pos in steps[0].result()]
            rec["draft_topk"] = rec["draft_topk"][:N - 1]
        out["steps"].append(rec)
    return out


def finished(requests: list) -> Records:
    return {"requests": requests}


class Call:
    """One queued call of a function above: what the hooks submit and the recorder's writer runs.
    ``pendings`` (the summary handles among ``args``) are released when the call is dropped; they
    do not travel, the arguments do."""

    def __init__(self, probe: str, fn, args: tuple, pendings: tuple = ()):
        self.probe, self.fn, self.args, self.pendings = probe, fn, args, pendings

    def __call__(self) -> Records:
        return self.fn(*self.args)

    def __reduce__(self):
        return Call, (self.probe, self.fn, self.args)

    def known(self) -> Records:
        """The records this call makes that are known before it runs: a finish call's."""
        return self.fn(*self.args) if self.fn is finished else {}

    def release(self) -> None:
        for p in self.pendings:
            if p is not None:
                p.release()
