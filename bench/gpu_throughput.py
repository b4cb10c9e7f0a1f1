"""Tracer overhead in tokens/s on the GPU test bed: the tables of a saved run.

The GPU runners measure (``testbed/gpu/throughput.py``: no tracer, 1 in 16 and every request sampled,
interleaved rounds; on SGLang the tiny models, and the Kimi-K2.5-shaped server at 1, 8 and 64 concurrent
requests; on vLLM the tiny models at 1, 8 and 64, ``testbed/gpu/vllm_throughput.py``) and save the figures in
``results.json``. On the device, from the kits::

    bash .cache/gpu-kit/run.sh --skip hooks,checks,pytest       # tiny models; results.json -> throughput
    bash .cache/gpu-kit/run.sh --only kimi-throughput           # Kimi-shaped; results.json -> kimi_throughput
    bash .cache/vllm-gpu-kit/run.sh --no-hooks --throughput     # vLLM, tiny models; -> vllm_throughput

The tables docs/benchmarks.md shows, from a saved ``results.json`` (each one present), or from the
runner's log (``run.log``: the rounds it printed, for a run whose ``results.json`` lost them)::

    python bench/gpu_throughput.py results.json
    python bench/gpu_throughput.py --log run.log

After a Kimi-shaped run's table: each server's GPU memory and what its tracer reserved on the GPU at attach
(``tracing.device.reserved_bytes`` of its run, which the runner reads from the trace on the device).

Several runs of the same servers (one lease's rounds are few at Kimi widths), pooled into one levels table::

    python bench/gpu_throughput.py --pool bench/gpu_runs/2026-12-06-vllm-kimi-1in16-a.json \\
        bench/gpu_runs/2026-12-06-vllm-kimi-1in16-b.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script, too

from testbed.gpu.throughput import levels_table, pool_runs, rounds_from_log, summarize_rounds, table  # noqa: E402

LEVEL_PHASES = ("kimi_throughput", "vllm_throughput")  # results.json keys of tables by concurrency level


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--log":
        rounds = rounds_from_log(Path(argv[1]).read_text())
        if len(rounds) < 2:
            print(f"no measured rounds in {argv[1]}", file=sys.stderr)
            return 1
        print(levels_table(summarize_rounds(rounds, {level: None for level in rounds[0]})))  # the levels it ran
        return 0
    if len(argv) >= 3 and argv[0] == "--pool":
        saved = [json.loads(Path(a).read_text()) for a in argv[1:]]
        phases = [k for k in LEVEL_PHASES if all("levels" in (s.get(k) or {}) for s in saved)]
        if not phases:
            print(f"no levels phase that every one of {', '.join(argv[1:])} ran", file=sys.stderr)
            return 1
        print("\n\n".join(levels_table(pool_runs([s[k] for s in saved])) for k in phases))
        return 0
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    saved = json.loads(Path(argv[0]).read_text())
    tables = [table(saved["throughput"]) if "median_tokens_per_s" in (saved.get("throughput") or {}) else None,
              *(levels_table(saved[k]) if "levels" in (saved.get(k) or {}) else None for k in LEVEL_PHASES)]
    if not any(tables):
        errors = [(saved.get(k) or {}).get("error") for k in ("throughput", *LEVEL_PHASES)]
        print(f"no throughput result in {argv[0]}: {', '.join(filter(None, errors)) or 'no phase ran'}",
              file=sys.stderr)
        return 1
    print("\n\n".join(filter(None, [*tables, memory_line(saved.get("kimi_throughput_servers") or {})])))
    return 0


def memory_line(servers: dict) -> str | None:
    """Each server's GPU memory (nvidia-smi, MiB) and, for a traced one, what its tracer reserved through PyTorch's
    allocator at attach (its run's ``tracing.device.reserved_bytes``, where the run kept it)."""
    parts = []
    for name, s in servers.items():
        if s.get("gpu_memory_mib") is None:
            continue
        device = s.get("tracing_device") or {}
        reserved = device.get("reserved_bytes")
        note = f" (the tracer reserved {reserved / 2**20:,.1f} MiB at attach)" if isinstance(reserved, int) else ""
        parts.append(f"{name} {s['gpu_memory_mib']:,} MiB{note}")
    return "GPU memory by server: " + "; ".join(parts) if parts else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
