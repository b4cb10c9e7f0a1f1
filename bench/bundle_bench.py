"""Trace bundles: export and import time and bundle size for a run of --requests requests, all sampled.

The run is built from a real recording of the CPU test bed (``demo/healthy.jsonl``): each request
gets the recorded prefill samples, then --steps verify steps cycled from the recorded ones (each
with its recorded samples: aux layers, draft input, fc output, draft logits), with token ids drawn
again and statistics and probabilities varied by up to 10% (so that the bundle compresses like a
real run, not like one record repeated), stored through the
ingest path (``BatchWriter``, batches of 256 records as the tracer sends them) into a SQLite
store. Then, --rounds times: export the run (``export_to_file``) and import the bundle into a
fresh SQLite store (checks, then storing and diagnosing in one transaction), each timed in
wall and CPU seconds (on a shared machine, CPU seconds are the steadier figure). Prints the
medians, the bundle's size and the process's peak RSS.

    .venv/bin/python bench/bundle_bench.py --requests 1000 --steps 64 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

from draftscope.bundle.export import export_to_file
from draftscope.bundle.loader import store_bundle
from draftscope.bundle.reader import read_bundle
from draftscope.store import db
from draftscope.store.ingest import BatchWriter

RECORDING = Path(__file__).resolve().parent.parent / "demo" / "healthy.jsonl"
BATCH_RECORDS = 256


def template() -> tuple[dict, dict, list[dict], list[dict], list[list[dict]]]:
    """(run record, request record, prefill samples, steps, samples per step) of the recording's
    longest request."""
    batches = [json.loads(line) for line in RECORDING.read_text().splitlines()]
    run = next(b["run"] for b in batches if b["run"])
    steps = [s for b in batches for s in b["steps"]]
    rid = max({s["rid"] for s in steps}, key=lambda r: sum(s["rid"] == r for s in steps))
    request = next(r for b in batches for r in b["requests"] if r["rid"] == rid)
    samples = [s for b in batches for s in b["samples"] if s.get("rid") == rid]
    steps = sorted((s for s in steps if s["rid"] == rid), key=lambda s: s["step_index"])
    per_step = [[s for s in samples if s.get("step_index") == step["step_index"]
                 and s["phase"] != "prefill"] for step in steps]
    prefill = [s for s in samples if s["phase"] == "prefill"]
    return run, request, prefill, steps, per_step


def vary_sample(sample: dict, rng: random.Random, rid: str, step: int | None, shift: float) -> dict:
    """A recorded sample for another request and step: its statistics within +-10%, so that the
    bundle compresses like real data, not like one record repeated."""
    out = {**sample, "rid": rid, "step_index": step, "at": sample["at"] + shift}
    for key in ("l2_mean", "l2_max", "mean", "std", "absmax"):
        if out.get(key) is not None:
            out[key] *= rng.uniform(0.9, 1.1)
    return out


def vary_step(step: dict, rng: random.Random, rid: str, index: int, shift: float) -> dict:
    """A recorded verify step for another request: other token ids, top-k probabilities varied."""
    vocab = 1024  # the test bed's target vocabulary
    out = {**step, "rid": rid, "step_index": index, "at": step["at"] + shift,
           "drafted_tokens": [rng.randrange(vocab) for _ in step["drafted_tokens"]],
           "bonus_token": rng.randrange(vocab)}
    for key in ("draft_topk", "target_topk"):
        if out.get(key):
            out[key] = [[[rng.randrange(vocab), p * rng.uniform(0.9, 1.1) if p is not None else None]
                         for _, p in position] for position in out[key]]
    return out


def build_run(url: str, requests: int, steps_per_request: int) -> tuple[str, int]:
    """Store the synthetic run through the ingest path; (run id, records stored)."""
    run, request, prefill, steps, per_step = template()
    run_id = uuid.uuid4().hex
    writer = BatchWriter(db.make_engine(url))
    pending: dict[str, list] = {"requests": [], "steps": [], "samples": []}
    stored, first = 0, True

    def flush() -> None:
        nonlocal first, stored
        body = {"schema_version": 1, "batch_id": uuid.uuid4().hex, "run_id": run_id,
                "sent_at": time.time(), "run": run if first else None, **pending}
        writer.write(orjson.dumps(body))
        stored += sum(len(v) for v in pending.values())
        first = False
        for records in pending.values():
            records.clear()

    rng = random.Random(0)
    for i in range(requests):
        rid, shift = f"req-{i:05d}", i * 0.5  # requests half a second apart
        pending["samples"] += [vary_sample(s, rng, rid, s.get("step_index"), shift) for s in prefill]
        for j in range(steps_per_request):
            k = j % len(steps)
            pending["steps"].append(vary_step(steps[k], rng, rid, j, shift))
            pending["samples"] += [vary_sample(s, rng, rid, j, shift) for s in per_step[k]]
            if sum(len(v) for v in pending.values()) >= BATCH_RECORDS:
                flush()
        pending["requests"].append({**request, "rid": rid, "spec_verify_ct": steps_per_request,
                                    "traced_verify_ct": steps_per_request})
    flush()
    writer.engine.dispose()
    return run_id, stored


@contextmanager
def timed(into: list[tuple[float, float]]) -> Iterator[None]:
    """Append (wall seconds, CPU seconds of this process) of the block to ``into``."""
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    into.append((time.perf_counter() - wall, time.process_time() - cpu))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=64, help="verify steps per request")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="draftscope-bundle-bench-") as tmp:
        root = Path(tmp)
        source = f"sqlite:///{root / 'source.db'}"
        db.upgrade(source)
        started = time.perf_counter()
        run_id, records = build_run(source, args.requests, args.steps)
        print(f"run: {args.requests} requests x {args.steps} verify steps, {records:,} records "
              f"stored through the ingest path in {time.perf_counter() - started:.1f} s")
        engine = db.make_engine(source)
        times: dict[str, list[tuple[float, float]]] = {"export": [], "checks": [], "store": []}
        for i in range(args.rounds):
            bundle = root / f"bundle-{i}.zip"
            with timed(times["export"]):
                manifest = export_to_file(engine, run_id, bundle)
            target = f"sqlite:///{root / f'target-{i}.db'}"
            db.upgrade(target)
            target_engine = db.make_engine(target)
            with bundle.open("rb") as f:
                with timed(times["checks"]):
                    loaded = read_bundle(f)
                with timed(times["store"]):
                    store_bundle(BatchWriter(target_engine), loaded, bundle.name)
            target_engine.dispose()
            print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f} s ({v[-1][1]:.2f} s CPU)"
                                                 for k, v in times.items()))
        engine.dispose()
        size = bundle.stat().st_size
        unpacked = sum(m["size"] for m in manifest["members"].values())
    print(f"bundle: {size / 1e6:.1f} MB ({unpacked / 1e6:.0f} MB unpacked), counts {manifest['counts']}")
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
           for k, v in times.items()}
    imported = [(a[0] + b[0], a[1] + b[1]) for a, b in zip(times["checks"], times["store"])]
    med["import"] = (statistics.median(w for w, _ in imported), statistics.median(c for _, c in imported))
    print(f"median of {args.rounds} (wall, CPU of this process): "
          + ", ".join(f"{k} {w:.2f} s / {c:.2f} s" for k, (w, c) in med.items()))
    print(f"records/s by wall time: export {records / med['export'][0]:,.0f}, "
          f"import {records / med['import'][0]:,.0f}")
    print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
