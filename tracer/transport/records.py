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
    tree: bool = False  # tree drafting (topk > 1): nodes are not positions


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


def draft_tree(chosen: List[int], parent_list: List[int], branches: int) -> List[tuple]:
    """Per drafted node ``1..N-1`` of a tree, ``(parent node, source)`` from ``draft_forward``'s
    ``top_scores_index`` (``chosen``: node ``n`` is candidate ``chosen[n - 1]``) and ``parent_list``. A
    candidate ``c`` of group ``g = c // branches`` hangs under the root when ``g == 0`` (its top-k is the
    seed's, ``source`` None), else under the node holding candidate ``parent_list[g]``, and was proposed by
    branch ``(g - 1) % branches`` of draft step ``(g - 1) // branches`` (``source``). A parent that is not
    among the nodes (never seen: a parent outscores its children) is read as the root."""
    node_of = {c: n for n, c in enumerate(chosen, start=1)}
    out = []
    for c in chosen:
        g = c // branches
        if g == 0:
            out.append((0, None))
        else:
            out.append((node_of.get(parent_list[g], 0), divmod(g - 1, branches)))
    return out


def accepted_path(parents: List[int], drafted: List[int], target: List[int], accept_len: int) -> set:
    """The accepted nodes of a tree: from the root, at each depth the child whose drafted token is the
    target's token there (``target``: the accepted path's tokens first, as SGLang compacts them)."""
    children: dict = {}
    for n, parent in enumerate(parents, start=1):
        children.setdefault(parent, []).append(n)
    path, node = set(), 0
    for d in range(accept_len - 1):
        node = next((c for c in children.get(node, ()) if drafted[c - 1] == target[d]), None)
        if node is None:
            break
        path.add(node)
    return path


def _draft_topk(seed, steps, hot, n: int, row: int) -> tuple:
    """(the draft's top-k per drafted node, the tree's parents or None) of one request's step: a chain's
    positions in order; a tree's nodes through :func:`draft_tree`."""
    first = (topk_list(seed[0].result().rows[seed[1]].topk, hot if seed[2] else None) if seed is not None else [])
    read = steps[0].result() if steps is not None else None
    if read is None or read.tree is None:
        out = [first] + ([topk_list(pos[row], hot if steps[2] else None) for pos in read.positions]
                         if read is not None else [])
        return out[:n], None
    ints, b = read.tree[row], read.branches
    shape = draft_tree(ints[:n], ints[n:], b)
    out = [first if source is None else topk_list(read.positions[source[0]][row * b + source[1]],
                                                  hot if steps[2] else None)
           for _, source in shape]
    return out, [parent for parent, _ in shape]


def verify(ints, pending, rows: list, shape: VerifyShape, now: float, drafts: dict,
           hot: Optional[List[int]]) -> Records:
    """One step record per sampled request (tokens, acceptance, target and draft top-k; a tree's parents) and
    its target.aux[i] samples. ``ints``: the step's ``HostInts`` or ``GatheredInts`` (see :func:`step_tokens`);
    ``pending``: the summary of its ``N`` rows per request (aux statistics, target top-k); ``drafts``: rid ->
    (seed, steps), the draft's top-k at position 1 as ``(summary, row, mapped)`` and the step tap's read as
    ``(StepTopk, row, mapped)`` (either None), ``mapped`` when its ids go through ``hot``. A tree's accept
    flags are per node (the accepted path); without its shape (the step tap was not read) they are empty."""
    N = shape.draft_tokens
    s = pending.result() if pending is not None else None
    out = {"steps": [], "samples": []}
    for j, ((_, rid, step), t) in enumerate(zip(rows, step_tokens(ints.result(), len(rows), N))):
        a, base = t.accept_len, j * N
        rec = {"rid": rid, "step_index": step, "at": now, "seq_pos": t.seq_pos, "drafted_tokens": t.nodes[1:],
               "accept_len": a, "accept_flags": [p <= a - 1 for p in range(1, N)], "bonus_token": t.target[a - 1]}
        seed, steps = drafts.get(rid) or (None, None)
        parents = None
        if seed is not None or steps is not None:
            rec["draft_topk"], parents = _draft_topk(seed, steps, hot, N - 1, steps[1] if steps is not None else 0)
        if shape.tree:
            if parents is None:
                rec["accept_flags"] = []
            else:
                path = accepted_path(parents, t.nodes[1:], t.target, a)
                rec["accept_flags"], rec["tree_parents"] = [n in path for n in range(1, N)], parents
        if s is not None:
            # the target's distribution over each drafted token: at the node before it (a tree: its parent)
            before = parents if parents is not None else range(N - 1)
            if not shape.tree or parents is not None:
                rec["target_topk"] = [topk_list(s.rows[base + p].topk) for p in before]
            for c in range(shape.aux_chunks):
                out["samples"].append(sample_record(f"target.aux[{c}]", "verify", now, rid, step, [N, shape.aux_width],
                                                    shape.aux_dtype, merged_stats(s, range(base, base + N), [c])))
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
