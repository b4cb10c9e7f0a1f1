"""Tracer overhead on the real CPU SGLang server: tokens/s without the tracer, at 1/16, at every request.

One run, variants interleaved: each round starts the three servers in turn (order rotated per round)
and times the same greedy request set on each, ``--concurrency`` requests in flight. Prints a Markdown
table of medians, spread (min-max) and ratios.

    python bench/tracer_overhead.py --rounds 3 --requests 16 --new-tokens 32 --concurrency 4
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ThreadPoolExecutor
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from draftscope import db as store_db  # noqa: E402
from testbed.models import ensure_models  # noqa: E402
from testbed.server import start_server  # noqa: E402

PROMPTS = ["The quick brown fox", "Once upon a time there was", "Hello world, this is", "A B C D",
           "In the beginning", "She said that the"]


def measure(models, env, requests: int, new_tokens: int, concurrency: int, log: Path, python: str) -> float:
    with start_server(models.target, models.draft, [], log, env=env, python=python) as server:
        server.generate(PROMPTS[0], max_new_tokens=4)  # warm-up, not timed

        def one(i: int) -> int:
            out = server.generate(PROMPTS[i % len(PROMPTS)] + f" {i}", max_new_tokens=new_tokens)
            return out["meta_info"]["completion_tokens"]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            tokens = sum(pool.map(one, range(requests)))
        return tokens / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--python", default=os.environ.get("DRAFTSCOPE_VENV", "/tmp/vb/venv") + "/bin/python")
    args = ap.parse_args()
    models = ensure_models()
    work = Path(tempfile.mkdtemp(prefix="draftscope-bench-"))
    store = work / "store.db"
    store_db.upgrade(f"sqlite:///{store}")
    variants = {"no tracer": {}, "rate 1/16": {"DRAFTSCOPE_DB": str(store), "DRAFTSCOPE_SAMPLE_RATE": "1/16"},
                "every request": {"DRAFTSCOPE_DB": str(store), "DRAFTSCOPE_SAMPLE_RATE": "1"}}
    results = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        for name in names[r % 3:] + names[:r % 3]:
            tps = measure(models, variants[name], args.requests, args.new_tokens, args.concurrency, work / f"{r}-{name}.log", args.python)
            results[name].append(tps)
            print(f"round {r} {name}: {tps:.1f} tok/s", flush=True)
    base = statistics.median(results["no tracer"])
    print("\n| variant | tokens/s (median) | min-max | runs | ratio to no tracer | slowdown |\n|---|---|---|---|---|---|")
    for name, xs in results.items():
        med = statistics.median(xs)
        print(f"| {name} | {med:.1f} | {min(xs):.1f}-{max(xs):.1f} | {', '.join(f'{x:.1f}' for x in xs)} | "
              f"{med / base:.3f} | {100 * (1 - med / base):+.1f}% |")
    # per-round ratios: each traced run against the untraced run of the same round (less drift)
    for name in names[1:]:
        ratios = [t / b for t, b in zip(results[name], results["no tracer"])]
        print(f"per-round ratio {name}: {', '.join(f'{r:.3f}' for r in ratios)}")


if __name__ == "__main__":
    main()
