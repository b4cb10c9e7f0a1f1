"""Tracer overhead in tokens/s on the GPU test bed: real SGLang 0.5.23 servers on CUDA, graphs on.

Three servers from the GPU kit, started together (``testbed/gpu/runner.py``'s ``Bed``): **no tracer**
(the plugin's folder is not on the server's path), **1 in 16** and **every request** sampled (file
sink). Each round sends the same workload to each server, in a shuffled order: 32 greedy demo
prompts x 64 new tokens, 8 at a time, fixed request ids. After 3 warm-up rounds, tokens/s per
server (completion tokens / wall time) and the ratio to no tracer within each round.

On the device, from the kit (the runner's throughput phase is this script's ``measure``)::

    bash .cache/gpu-kit/run.sh --skip hooks,checks,pytest   # prints the table; results.json -> throughput

Printed again from a saved ``results.json``::

    python bench/gpu_throughput.py results.json
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

WORKLOAD = {"rounds": 12, "warmup_rounds": 3, "requests": 32, "concurrency": 8, "new_tokens": 64}
CONFIGS = {"no-tracer": {}, "1/16": {"DRAFTSCOPE_SAMPLE_RATE": "1/16"}, "every": {"DRAFTSCOPE_SAMPLE_RATE": "1"}}


def measure(handles: dict, prompts: list[str]) -> dict:
    """Interleaved rounds over ``handles`` (name -> ``ServerHandle``), order shuffled per round."""
    cfg = WORKLOAD
    rng = random.Random(0)
    rounds = []
    names = list(handles)
    for r in range(cfg["rounds"]):
        order = names[:]
        rng.shuffle(order)
        row = {name: _one_round(handles[name], prompts, r) for name in order}
        rounds.append(row)
        print(f"[gpu_throughput] round {r}: " + ", ".join(f"{k} {v:.0f} tok/s" for k, v in row.items()), flush=True)
    measured = rounds[cfg["warmup_rounds"]:]
    out = {"workload": cfg, "rounds": rounds, "median_tokens_per_s": {}, "median_ratio_to_no_tracer": {}}
    for name in names:
        out["median_tokens_per_s"][name] = round(statistics.median(r[name] for r in measured), 1)
        if name != "no-tracer" and "no-tracer" in names:
            ratios = sorted(r[name] / r["no-tracer"] for r in measured)
            out["median_ratio_to_no_tracer"][name] = {"median": round(statistics.median(ratios), 4),
                                                      "min": round(ratios[0], 4), "max": round(ratios[-1], 4)}
    return out


def _one_round(handle, prompts: list[str], r: int) -> float:
    """Completion tokens per wall second of one round's requests, ``concurrency`` at a time."""
    cfg = WORKLOAD
    work = iter([(f"tp-{r}-{j}", prompts[j % len(prompts)]) for j in range(cfg["requests"])])
    tokens, lock = [0], threading.Lock()

    def worker():
        while True:
            with lock:
                nxt = next(work, None)
            if nxt is None:
                return
            meta = handle.generate(nxt[1], cfg["new_tokens"], rid=nxt[0])["meta_info"]
            with lock:
                tokens[0] += meta["completion_tokens"]

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(cfg["concurrency"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tokens[0] / (time.perf_counter() - t0)


def table(result: dict) -> str:
    """The table docs/benchmarks.md shows."""
    lines = ["| | tokens/s, median | ratio to no tracer, median of rounds | min | max |", "|---|---|---|---|---|"]
    for name, tps in result["median_tokens_per_s"].items():
        ratio = result["median_ratio_to_no_tracer"].get(name)
        cells = [f"{ratio[k]:.3f}" for k in ("median", "min", "max")] if ratio else ["", "", ""]
        lines.append(f"| {name} | {tps:,.0f} | " + " | ".join(cells) + " |")
    measured = len(result["rounds"]) - result["workload"]["warmup_rounds"]
    return "\n".join(lines) + f"\n({measured} measured rounds after {result['workload']['warmup_rounds']} warm-up)"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    result = json.loads(Path(argv[0]).read_text()).get("throughput") or {}
    if "median_tokens_per_s" not in result:
        print(f"no throughput result in {argv[0]}: {result.get('error', 'the phase did not run')}", file=sys.stderr)
        return 1
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
