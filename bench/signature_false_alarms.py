"""False alarms of the time and position acceptance signatures (`acceptance-drift-over-time`,
`acceptance-decays-with-position`) on healthy runs: how often either warns where nothing is wrong.

    .venv/bin/python bench/signature_false_alarms.py                  # the figure of docs/findings.md
    .venv/bin/python bench/signature_false_alarms.py --record DIR     # re-record the healthy mixes (CPU server)

Healthy runs: the demo's (`demo/healthy.jsonl`, `demo/kimi-healthy.jsonl`) and the recordings in
`bench/traces/` (the healthy test-bed draft on the real CPU SGLang server, prompts of four kinds each
sent three times, sampled at temperature 0.8; `--record` makes them). Each recording is re-analysed
offline in many variants, each a run of its own: as recorded; its requests re-timed so that the
prompts change kind along the run (sorted by kind, both ways); random orders; contiguous slices;
slices with a lost-record gap in the middle; the same without prompt keys (a tracer that recorded
none). Every variant goes through the real ingest, aggregates and rules (a fresh SQLite store).
Prints one line per variant with a warning, then the rate; then, to show the rules still see a real
fall, how many of the recordings with a drift injected (the same prompts accepted a third as often
late in the run) warn. Deterministic (fixed seeds).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SIGNATURES = ("acceptance-drift-over-time", "acceptance-decays-with-position")
TRACES = REPO / "bench" / "traces"
DEMO_HEALTHY = [REPO / "demo" / n for n in ("healthy.jsonl", "kimi-healthy.jsonl", "tree.jsonl")]


@dataclass
class Trace:
    """One run's records, flattened out of its batches."""

    run: dict[str, Any]  # the last run record (its facts complete)
    requests: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    health: list[dict[str, Any]] = field(default_factory=list)


def load(path: Path) -> Trace:
    """The records of the one run in a JSON-lines trace; request records of one rid merged."""
    trace, requests = None, {}
    for line in path.read_bytes().splitlines():
        batch = orjson.loads(line)
        if batch.get("run"):
            trace = trace or Trace(batch["run"])
            trace.run = {**trace.run, **{k: v for k, v in batch["run"].items() if v is not None}}
        for r in batch.get("requests", []):
            requests[r["rid"]] = {**requests.get(r["rid"], {}), **r}
        trace.steps += batch.get("steps", [])
        trace.samples += batch.get("samples", [])
        trace.health += batch.get("health", [])
    trace.requests = list(requests.values())
    return trace


def start_of(trace: Trace, rid: str) -> float:
    request = next(r for r in trace.requests if r["rid"] == rid)
    times = [s["at"] for s in trace.steps if s["rid"] == rid]
    return request.get("started_at") or min(times or [request.get("finished_at", 0.0)])


def order_of(trace: Trace) -> list[str]:
    """Request ids in arrival order."""
    return sorted((r["rid"] for r in trace.requests), key=lambda rid: (start_of(trace, rid), rid))


def retimed(trace: Trace, rids: list[str], gap_after: int | None = None) -> Trace:
    """``rids`` one after another in that order (others dropped), each moved whole in time (its
    request record, steps and samples); ``gap_after``: a lost-record window (and one lost request)
    after that many requests, as the tracer's health reports one."""
    t, shift, out = trace.run.get("started_at", 0.0) + 1.0, {}, replace(trace, health=[])
    for i, rid in enumerate(rids):
        if gap_after is not None and i == gap_after:
            out.health = [{"at": t + 5.0, "drops": {"sink_error": 40}, "errors": {}, "heartbeats": {},
                           "disabled_probes": [], "records_lost": 40, "requests_lost": 1,
                           "lost_rids": ["lost-0"], "gaps": [[t, t + 4.0]]}]
            t += 5.0
        start = start_of(trace, rid)
        request = next(r for r in trace.requests if r["rid"] == rid)
        end = max([request.get("finished_at") or start] + [s["at"] for s in trace.steps if s["rid"] == rid])
        shift[rid] = t - start
        t += end - start + 0.05
    moved = lambda rec, *keys: {**rec, **{k: rec[k] + shift[rec["rid"]] for k in keys if rec.get(k) is not None}}
    out.requests = [moved(r, "started_at", "finished_at") for r in trace.requests if r["rid"] in shift]
    out.steps = [moved(s, "at") for s in trace.steps if s["rid"] in shift]
    out.samples = [moved(s, "at") if s.get("rid") in shift else s for s in trace.samples
                   if s.get("rid") is None or s.get("rid") in shift]
    return out


def unkeyed(trace: Trace) -> Trace:
    return replace(trace, requests=[{k: v for k, v in r.items() if k != "prompt_key"} for r in trace.requests])


def batches(trace: Trace, run_id: str, per_batch: int = 200) -> list[bytes]:
    """The trace as wire batches of a new run ``run_id`` (the run record first and last)."""
    now = max([s["at"] for s in trace.steps] + [trace.run.get("started_at", 0.0)])
    run = {**trace.run, "status": "running"}
    out, kinds = [], (("requests", trace.requests), ("steps", trace.steps), ("samples", trace.samples),
                      ("health", trace.health))
    first = True
    for kind, records in kinds:
        for i in range(0, len(records), per_batch):
            out.append(orjson.dumps({"schema_version": 1, "batch_id": uuid.uuid4().hex, "run_id": run_id,
                                     "sent_at": now, "run": run if first else None,
                                     kind: records[i:i + per_batch]}))
            first = False
    out.append(orjson.dumps({"schema_version": 1, "batch_id": uuid.uuid4().hex, "run_id": run_id,
                             "sent_at": now, "run": {**trace.run, "status": "ended", "ended_at": now}}))
    return out


class Store:
    """A migrated SQLite store, copied afresh for each analysis."""

    def __init__(self, work: Path):
        from draftscope.store import db

        self.work, self.empty = work, work / "empty.db"
        db.upgrade(f"sqlite:///{self.empty}")

    def findings(self, trace: Trace) -> list:
        """The findings of ``trace`` stored as a new run, through ingest and the rules."""
        from draftscope.store import db
        from draftscope.store.analyze import refresh_run
        from draftscope.store.ingest import BatchWriter

        path = self.work / f"{uuid.uuid4().hex}.db"
        shutil.copy(self.empty, path)
        engine = db.make_engine(f"sqlite:///{path}")
        try:
            run_id, writer = uuid.uuid4().hex, BatchWriter(engine)
            for line in batches(trace, run_id):
                writer.write(line)
            return refresh_run(engine, run_id) or []
        finally:
            engine.dispose()
            path.unlink()


def prompt_len(trace: Trace, rid: str) -> int:
    """The mixes' kinds differ in prompt length (story openings, sentences, long joins)."""
    return next(r for r in trace.requests if r["rid"] == rid).get("prompt_len") or 0


def variants(name: str, trace: Trace, seed: int = 0) -> list[tuple[str, Trace]]:
    """The healthy variants of one recording (module docstring)."""
    rng, rids = random.Random(seed), order_of(trace)
    out = [(f"{name}: as recorded", retimed(trace, rids))]
    if len(rids) < 6:
        return out
    by_kind = sorted(rids, key=lambda r: (prompt_len(trace, r), r))
    out += [(f"{name}: kind changes along the run (short prompts first)", retimed(trace, by_kind)),
            (f"{name}: kind changes along the run (long prompts first)", retimed(trace, by_kind[::-1]))]
    for i in range(8):
        out.append((f"{name}: random order {i}", retimed(trace, rng.sample(rids, len(rids)))))
    for size in (len(rids) * 2 // 3, len(rids) // 2):
        for start in range(0, len(rids) - size + 1, max(1, size // 3)):
            part = rids[start:start + size]
            out.append((f"{name}: slice {start}..{start + size}", retimed(trace, part)))
            out.append((f"{name}: slice {start}..{start + size} with a gap", retimed(trace, part, len(part) // 2)))
    out += [(f"{label} (no prompt keys)", unkeyed(t)) for label, t in out[:3]]
    return out


def with_late_fall(trace: Trace, keep: float, seed: int) -> Trace:
    """A true drift injected into a healthy recording: in the last third of its requests (arrival
    order), each verify step keeps its accepted drafts with probability ``keep``, else accepts none."""
    rng, rids = random.Random(seed), order_of(trace)
    late = set(rids[len(rids) - len(rids) // 3:])

    def fall(step):
        if step["rid"] not in late or rng.random() < keep:
            return step
        flags = [False] * len(step["accept_flags"])
        return {**step, "accept_len": 1, "accept_flags": flags}
    return replace(trace, steps=[fall(s) for s in trace.steps])


def detections(paths: list[Path], store: Store) -> tuple[int, int]:
    """(injected drifts that warned, injected drifts): each recording of 24+ requests, a third of its
    late steps' acceptance kept (a fall to a third), in its random orders' arrival order."""
    caught = tried = 0
    for path in paths:
        trace = load(path)
        if len(trace.requests) < 24:
            continue
        for seed in range(4):
            t = retimed(trace, random.Random(seed).sample(order_of(trace), len(trace.requests)))
            found = store.findings(with_late_fall(t, keep=1 / 3, seed=seed))
            tried += 1
            caught += any(f.rule_id == SIGNATURES[0] and f.severity == "warning" for f in found)
    return caught, tried


def measure(paths: list[Path]) -> int:
    work = Path(tempfile.mkdtemp(prefix="signature-bench-"))
    try:
        store, judged, alarms, infos = Store(work), 0, [], {}
        for path in paths:
            for label, trace in variants(path.stem, load(path)):
                found = [f for f in store.findings(trace) if f.rule_id in SIGNATURES]
                judged += 1
                for f in found:
                    if f.severity == "info":
                        infos[f.rule_id] = infos.get(f.rule_id, 0) + 1
                alarms += [(label, f) for f in found if f.severity in ("warning", "error")]
                for f in found:
                    if f.severity != "info":
                        print(f"ALARM {label}: {f.rule_id}: {f.message}")
        caught, tried = detections(paths, store)
    finally:
        shutil.rmtree(work)
    runs = len({label for label, _ in alarms})
    said = ", ".join(f"{n} {rule}" for rule, n in sorted(infos.items())) or "none"
    print(f"{judged} healthy runs judged ({len(paths)} recordings); {runs} with a drift or decay warning "
          f"({runs / judged:.1%}); info findings (said, not warned): {said}")
    if tried:
        print(f"a drift injected into them (late acceptance kept a third): {caught} of {tried} warned")
    return runs


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, metavar="DIR", help="record the healthy mixes into DIR instead")
    parser.add_argument("--mix", action="append", help="with --record: only this mix (repeatable)")
    parser.add_argument("traces", nargs="*", type=Path, help="traces to judge (default: the demo's healthy "
                        "runs and bench/traces/*.jsonl)")
    args = parser.parse_args(argv)
    if args.record:
        from bench.record_healthy_mixes import record_all

        record_all(args.record, args.mix)
        return 0
    measure(args.traces or [*DEMO_HEALTHY, *sorted(TRACES.glob("*.jsonl"))])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
