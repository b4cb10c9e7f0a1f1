"""Read a tracer file sink (JSON lines, one batch a line) and compare two traces record by record.

Used by the GPU test bed's checks (``tests/gpu``): graphs on and graphs off must record the same for
the same greedy prompts and request ids.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

STATS = ("l2_mean", "l2_max", "mean", "std", "absmax")
REL, ABS = 1e-3, 1e-4  # float32 on one GPU: graph replay and eager kernels may round differently
PROB = 5e-3  # top-k probabilities: a graph batch is padded, so a row's softmax can move in the 4th digit


@dataclass(frozen=True)
class Tolerance:
    """How far two runs of the same requests may differ and still have recorded the same.

    ``of_std``: a statistic may also differ by this fraction of the sample's ``std`` (a mean near 0 moves by
    more than ``rel`` of itself). ``tie``: a best token may differ where either run ranks the other's best
    within this fraction of its own best's probability, a near tie that rounding decides; the drafted
    positions after it and that step's samples (other tokens were verified) then differ too. The target's
    decisions (accept lengths and flags, bonus token) must still be equal."""

    rel: float = REL
    abs_: float = ABS
    prob: float = PROB
    of_std: float = 0.0
    tie: float = 0.0


FLOAT32 = Tolerance()
# bf16 (the Kimi-shaped bed): 8 bits of mantissa, and the eager and graph paths run different GEMM kernels, so
# hidden states differ by a few units in the last place (~1%), and near-uniform random-weight logits tie
BF16 = Tolerance(rel=2e-2, abs_=1e-4, prob=5e-3, of_std=2e-2, tie=5e-2)


@dataclass
class Trace:
    run: dict = field(default_factory=dict)
    requests: dict = field(default_factory=dict)  # rid -> merged request record
    steps: dict = field(default_factory=dict)  # (rid, step_index) -> step record
    samples: dict = field(default_factory=dict)  # (rid, step_index, point, phase) -> [sample records]
    health: list = field(default_factory=list)

    def last_health(self) -> dict:
        return self.health[-1] if self.health else {}

    def summary(self) -> dict:
        """Counts a reader can compare at a glance."""
        positions = Counter(len(s.get("draft_topk") or []) for s in self.steps.values())
        points = Counter(f"{k[2]}@{k[3]}" for k, v in self.samples.items() for _ in v)
        return {"requests": len(self.requests), "steps": len(self.steps),
                "steps_by_draft_topk_positions": dict(sorted(positions.items())),
                "samples_by_point": dict(sorted(points.items())),
                "errors": self.last_health().get("errors", {}), "drops": self.last_health().get("drops", {})}


def load(path: Path | str) -> Trace:
    t = Trace()
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        batch = json.loads(line)
        if batch.get("run"):
            t.run.update(batch["run"])
        for r in batch.get("requests") or []:
            t.requests.setdefault(r["rid"], {}).update({k: v for k, v in r.items() if v is not None})
        for s in batch.get("steps") or []:
            t.steps[(s["rid"], s["step_index"])] = s
        for s in batch.get("samples") or []:
            t.samples.setdefault((s.get("rid"), s.get("step_index"), s["point"], s["phase"]), []).append(s)
        t.health += batch.get("health") or []
    return t


def run_record(path: Path | str) -> dict:
    """The run record of a trace (its updates merged), read without its requests, steps and samples: a throughput
    run's trace is too large to come back from the device, its run's facts (what the tracer reserved on the GPU)
    are not."""
    run: dict = {}
    with open(path) as f:
        for line in f:
            if '"run"' in line:
                batch = json.loads(line)
                run.update(batch.get("run") or {})
    return run


def only(t: Trace, prefix: str) -> Trace:
    """The records of ``t``'s requests whose ids start with ``prefix``."""
    return Trace(run=t.run, requests={k: v for k, v in t.requests.items() if k.startswith(prefix)},
                 steps={k: v for k, v in t.steps.items() if k[0].startswith(prefix)},
                 samples={k: v for k, v in t.samples.items() if (k[0] or "").startswith(prefix)}, health=t.health)


def _close(a, b, rel: float = REL, abs_: float = ABS) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return abs(a - b) <= abs_ + rel * max(abs(a), abs(b))


def _tied(a: list, b: list, tie: float) -> bool:
    """Whether position top-k lists ``a`` and ``b`` (``[[id, prob], ...]``, best first) disagree on their best id
    only by a near tie: either ranks the other's best within ``tie`` of its own best's probability."""
    if not tie or not a or not b:
        return False
    for x, y in ((a, b), (b, a)):
        p = dict((i, q) for i, q in x).get(y[0][0])
        if p is not None and p >= (1 - tie) * x[0][1]:
            return True
    return False


def _topk_same(a, b, tol: Tolerance = FLOAT32) -> bool:
    """Same positions, same best id at each (or a near tie), its probability within ``tol.prob``."""
    a, b = a or [], b or []
    return len(a) == len(b) and all(
        (not pa and not pb) or (pa and pb and (_tied(pa, pb, tol.tie) or (
            pa[0][0] == pb[0][0] and _close(pa[0][1], pb[0][1], 0.0, tol.prob))))
        for pa, pb in zip(a, b))


def _drafts_same(sa: dict, sb: dict, tol: Tolerance) -> bool:
    """Same drafted tokens, or the same up to a position where the draft's top-k shows a near tie."""
    da, db = sa.get("drafted_tokens") or [], sb.get("drafted_tokens") or []
    if da == db:
        return True
    if len(da) != len(db) or not tol.tie:
        return False
    first = next(j for j, (x, y) in enumerate(zip(da, db)) if x != y)
    ka, kb = sa.get("draft_topk") or [], sb.get("draft_topk") or []
    return first < min(len(ka), len(kb)) and _tied(ka[first], kb[first], tol.tie)


def _stats_close(x: dict, y: dict, tol: Tolerance) -> list:
    """The statistics of samples ``x`` and ``y`` that differ beyond ``tol``."""
    bad = []
    for s in STATS:
        a, b = x.get(s), y.get(s)
        spread = tol.of_std * max(abs(x.get("std") or 0.0), abs(y.get("std") or 0.0))
        if not _close(a, b, tol.rel, tol.abs_ + spread):
            bad.append(s)
    return bad


def differences(a: Trace, b: Trace, limit: int = 20, tol: Tolerance = FLOAT32) -> list:
    """What ``b`` records differently from ``a`` (steps, acceptance, top-k, samples) beyond ``tol``, at most
    ``limit`` lines."""
    out, tied = [], set()
    for key in sorted(set(a.steps) | set(b.steps)):
        sa, sb = a.steps.get(key), b.steps.get(key)
        if sa is None or sb is None:
            out.append(f"step {key}: only in {'b' if sa is None else 'a'}")
            continue
        for f in ("accept_len", "accept_flags", "bonus_token"):
            if sa.get(f) != sb.get(f):
                out.append(f"step {key}: {f} {sa.get(f)} != {sb.get(f)}")
        if not _drafts_same(sa, sb, tol):
            out.append(f"step {key}: drafted_tokens {sa.get('drafted_tokens')} != {sb.get('drafted_tokens')}")
        elif sa.get("drafted_tokens") != sb.get("drafted_tokens"):
            tied.add(key)  # a near tie drafted other tokens: from there on the step's values differ
            continue
        for f in ("draft_topk", "target_topk"):
            if not _topk_same(sa.get(f), sb.get(f), tol):
                out.append(f"step {key}: {f} has {len(sa.get(f) or [])} positions vs {len(sb.get(f) or [])}"
                           f" or differs ({str(sa.get(f))[:120]} vs {str(sb.get(f))[:120]})")
    for key in sorted(set(a.samples) | set(b.samples), key=str):
        la, lb = a.samples.get(key, []), b.samples.get(key, [])
        if len(la) != len(lb):
            out.append(f"samples {key}: {len(la)} vs {len(lb)}")
            continue
        for x, y in zip(la, lb):
            if (x.get("width"), x.get("rows"), x.get("shape")) != (y.get("width"), y.get("rows"), y.get("shape")):
                out.append(f"sample {key}: shape {x.get('shape')} vs {y.get('shape')}")
            if key[:2] in tied:
                continue
            bad = _stats_close(x, y, tol)
            if bad:
                out.append(f"sample {key}: {', '.join(f'{s} {x.get(s)} vs {y.get(s)}' for s in bad)}")
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


def ties(a: Trace, b: Trace, tol: Tolerance) -> int:
    """Steps whose drafted tokens differ by a near tie (see :class:`Tolerance`)."""
    return sum(1 for k in set(a.steps) & set(b.steps) if a.steps[k].get("drafted_tokens") !=
               b.steps[k].get("drafted_tokens") and _drafts_same(a.steps[k], b.steps[k], tol))
