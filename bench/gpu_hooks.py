"""The hooks' summary path on a GPU: the same records as on a CPU, and host time per sampled iteration.

1. Records: at Kimi-K2.5 widths with 1 request in 16 sampled, the recorder-side results
   (``merged_stats``, ``topk_list``) of each launch the hooks issue per iteration (verify aux hidden
   states with the target logits, the fc output, the seed and two step draft logits), pickled as the
   relay pickles them, equal those of the CPU path (``host_reduce.host_rows``) on the same rows (1e-4).
2. Host time: ``testbed.gpu.hooks_path.HooksPath`` runs the hooks' whole per-iteration path (one decode
   iteration through the plugin's own hooks with the real ``Tracer``: draft taps, verify, draft extend
   with the fc recompute and the draft seeds, result processing) at batch 8 and 64, 1 request in 16
   sampled, a thread pickling the queued calls every 100 ms as the relay does. Paced as SGLang's overlap scheduler runs: each iteration first
   queues 3 ms of GPU work (``torch.cuda._sleep``, the model's forward), the hooks run while it is queued,
   and only then the host waits for the previous iteration's work. So the GPU is never idle when the hooks
   run and a hook that waited for it would show. Wall-clock microseconds of the hooks' host work per
   iteration: median and 90th percentile of 300 iterations after 30 warm-up ones, and where it goes. Each is
   followed by the same iteration without the tracer (the hooks call the stand-ins for SGLang's methods only:
   the draft-decode graph's replay is their cost), so the tracer's own host time is the difference of the
   two medians.
3. What single CUDA calls from Python cost on the host (GPU idle, median of 500): the parts of 2.

    python bench/gpu_hooks.py        # JSON also to $OUT/gpu_hooks.json if OUT is set
    python bench/gpu_hooks.py --host-time-only   # part 2 alone

Needs a CUDA GPU, torch (Triton for the fast summaries) and the tracer importable as ``draftscope_tracer``
(the checkout installed, or the GPU kit's tracer wheel on ``PYTHONPATH`` as ``testbed/gpu/runner.py`` runs it).
"""

from __future__ import annotations

import json
import os
import pickle
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftscope_tracer.health import Health  # noqa: E402
from draftscope_tracer.transport.records import topk_list  # noqa: E402
from draftscope_tracer.stats import merged_stats  # noqa: E402
from draftscope_tracer.device.summaries import Summaries  # noqa: E402
from testbed.gpu.hooks_path import HooksPath, gpu_sleep_cycles_per_ms  # noqa: E402  (the checkout, by path)

ITERATIONS, WARMUP, FORWARD_MS = 300, 30, 3.0

H, K, V, V_DRAFT, N = 7168, 3, 163_840, 32_000, 4


def close(a, b) -> bool:
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-4 * max(1.0, abs(a), abs(b))
    return a == b


def records(pending, groups, chunks) -> list:
    """What the recorder makes of one launch (after crossing the pipe): statistics per (row group, chunk
    selection), then top-k."""
    s = pickle.loads(pickle.dumps(pending)).result()
    out = [merged_stats(s, g, c) for g in groups for c in chunks]
    return out + [topk_list(r.topk) for r in s.rows if r.topk is not None]


def host_time(batch: int, cycles_per_ms: float, graphs: bool = True) -> dict:
    """Host microseconds of the hooks' work per sampled iteration, the GPU kept busy (never synchronised).
    ``graphs``: the draft-decode loop replayed as a CUDA graph (SGLang with graphs on), else run eagerly."""
    path = HooksPath(batch, graphs=graphs)
    for _ in range(WARMUP):
        path.iteration()
    torch.cuda.synchronize()  # once, before the measured run
    launches = path.tracer.capture.summaries  # counted below from the summarisers' launch counters
    before = sum(s.launches for s in launches._by_shape.values())
    times, bare, stages, previous, busy = [], [], {}, None, 0
    for _ in range(ITERATIONS):
        for traced in (True, False):  # interleaved: the same iteration without the tracer, as the baseline
            torch.cuda._sleep(int(cycles_per_ms * FORWARD_MS))
            t0 = time.perf_counter()
            path.iteration(stages if traced else None, traced=traced)
            (times if traced else bare).append(time.perf_counter() - t0)
            busy += traced and not torch.cuda.current_stream().query()
            done = torch.cuda.Event()
            done.record()
            if previous is not None:
                previous.synchronize()  # the scheduler's wait for the previous batch, outside the hooks
            previous = done
    n = sum(s.launches for s in launches._by_shape.values()) - before
    fallbacks = sum(s.fallbacks for s in launches._by_shape.values())
    health = path.close()
    if health["errors"] or health["relay_error"] or fallbacks:
        raise SystemExit(f"batch {batch}: the hooks' path failed: {health}, Triton fallbacks {fallbacks}")
    times.sort()
    bare_us = 1e6 * statistics.median(bare)
    return {"sampled_requests": len(path.tracer.sampled.live), "iterations": ITERATIONS,
            "host_us_median": round(1e6 * statistics.median(times), 1),
            "host_us_p90": round(1e6 * times[int(0.9 * len(times))], 1),
            "no_tracer_us_median": round(bare_us, 1),
            "tracer_us_median": round(1e6 * statistics.median(times) - bare_us, 1),
            "launches_per_iteration": n / ITERATIONS,
            "host_us_by_hook": {k: round(1e6 * v / ITERATIONS, 1) for k, v in stages.items()},
            "iterations_gpu_busy_after_hooks": busy, "drops": health["drops"]}


def profile(batch: int, top: int = 25) -> list:
    """Where the host time of the hooks goes: cProfile over 200 paced iterations, the functions with the most
    own time, then the tracer's functions with the most time including what they call ("cumulative"), as
    ``[microseconds per iteration, calls per iteration, function]``."""
    import cProfile
    import pstats

    path, cycles = HooksPath(batch), gpu_sleep_cycles_per_ms()
    for _ in range(WARMUP):
        path.iteration()
    torch.cuda.synchronize()
    prof, n = cProfile.Profile(), 200
    for _ in range(n):
        torch.cuda._sleep(int(cycles * FORWARD_MS))
        prof.enable()
        path.iteration()
        prof.disable()
        torch.cuda.synchronize()
    path.close()
    stats = pstats.Stats(prof).stats
    rows = sorted(((tt, nc, f"{Path(fn).name}:{line}({name})") for (fn, line, name), (_, nc, tt, _, _) in stats.items()),
                  reverse=True)[:top]
    # and the tracer's own functions by time including what they call
    ours = sorted(((ct, nc, f"{Path(fn).name}:{line}({name})")
                   for (fn, line, name), (_, nc, _, ct, _) in stats.items() if "draftscope_tracer" in fn),
                  reverse=True)[:top]
    return [[round(1e6 * tt / n, 1), round(nc / n, 1), where] for tt, nc, where in rows] + \
        [[round(1e6 * ct / n, 1), round(nc / n, 1), "cumulative " + where] for ct, nc, where in ours]


def call_costs() -> dict:
    """Host microseconds of single CUDA calls from Python (median of 500, GPU idle): what the hooks'
    path is made of."""
    dev = torch.device("cuda")
    pinned = torch.empty(16, dtype=torch.int64, pin_memory=True)
    rows = torch.arange(16, device=dev)
    logits = torch.randn(256, V_DRAFT, device=dev)
    event = torch.cuda.Event()
    summaries, hidden, target = Summaries(Health(), topk=8), torch.randn(256, K * H, device=dev,
                                                                         dtype=torch.bfloat16), torch.randn(256, V, device=dev)
    pending = []
    calls = {"pinned host tensor": lambda: torch.empty(16, dtype=torch.int64, pin_memory=True),
             "non-blocking copy to the device": lambda: pinned.to(dev, non_blocking=True),
             "index_select": lambda: logits.index_select(0, rows),
             "event record": event.record,
             "one summary launch (verify shapes)": lambda: pending.append(
                 summaries.launch(hidden, range(16), chunk_width=H, logits=target))}
    out = {}
    for name, fn in calls.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(500 if "summary" not in name else 100):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            if len(pending) >= 64:
                [p.result() for p in pending]
                pending.clear()
        out[name] = round(1e6 * statistics.median(times), 1)
        [p.result() for p in pending]
        pending.clear()
    return out


def main() -> None:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    gpu, cpu = Summaries(Health(), topk=8), Summaries(Health(), topk=8)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if "--host-time-only" in sys.argv[1:]:  # part 2 alone (an A/B of two tracers runs it in turns)
        cycles = gpu_sleep_cycles_per_ms()
        for batch in (8, 64):
            r = results[f"batch {batch}"] = host_time(batch, cycles)
            print(f"batch {batch}: {r['host_us_median']:.1f} us median with the tracer, {r['no_tracer_us_median']:.1f} "
                  f"without, the tracer's own {r['tracer_us_median']:.1f}; by hook {r['host_us_by_hook']}", flush=True)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "gpu_hooks.json").write_text(json.dumps(results, indent=2))
        return
    for batch in (8, 64):
        sampled = list(range(0, batch, 16))  # 1 request in 16
        nodes = [i * N + p for i in sampled for p in range(N)]
        aux = torch.randn(batch * N, K * H, device=dev, dtype=torch.bfloat16)
        logits = torch.randn(batch * N, V, device=dev) * 4
        fc_out = torch.randn(len(nodes), H, device=dev, dtype=torch.bfloat16)
        draft_logits = torch.randn(batch, V_DRAFT, device=dev) * 4

        per_request = [range(j * N, (j + 1) * N) for j in range(len(sampled))]
        # (launch, row groups, chunk selections) as the hooks issue them and the recorder reads them
        launches = [
            (lambda S, t: S.launch(t[0], nodes, chunk_width=H, logits=t[1]), per_request, [[0], [1], [2], None]),
            (lambda S, t: S.launch(t[2], range(len(nodes))), per_request, [None]),
            (lambda S, t: S.launch(t[3], sampled, logits=t[3]), [[j] for j in range(len(sampled))], [None]),
            (lambda S, t: S.launch(t[3], sampled, logits=t[3], stats=False), [], []),
            (lambda S, t: S.launch(t[3], sampled, logits=t[3], stats=False), [], []),
        ]
        on_gpu = (aux, logits, fc_out, draft_logits)
        on_cpu = tuple(t.cpu() for t in on_gpu)

        def iteration(summ, tensors):
            return [launch(summ, tensors) for launch, _, _ in launches]

        # 1. the same records as the CPU path
        for g, c, (_, groups, chunks) in zip(iteration(gpu, on_gpu), iteration(cpu, on_cpu), launches):
            if not close(records(g, groups, chunks), records(c, groups, chunks)):
                raise SystemExit(f"batch {batch}: GPU records differ from the CPU path's")
        print(f"batch {batch}: records equal the CPU path's", flush=True)
    results["host_us_per_call"] = call_costs()
    print(f"host us per CUDA call from Python: {results['host_us_per_call']}", flush=True)
    cycles = gpu_sleep_cycles_per_ms()
    for batch in (8, 64):
        results[f"batch {batch}"] = host_time(batch, cycles)
        r = results[f"batch {batch}"]
        print(f"batch {batch}: host time per sampled iteration {r['host_us_median']:.1f} us median, "
              f"{r['host_us_p90']:.1f} us p90 ({r['launches_per_iteration']:.0f} summary launches); the same "
              f"iteration without the tracer {r['no_tracer_us_median']:.1f} us, so the tracer's own "
              f"{r['tracer_us_median']:.1f} us; by hook: {r['host_us_by_hook']}", flush=True)
    results["batch 64, draft loop eager"] = host_time(64, cycles, graphs=False)
    print(f"batch 64, draft loop eager: {results['batch 64, draft loop eager']['host_us_median']:.1f} us median",
          flush=True)
    results["profile batch 64"] = profile(64)
    print("where the host time goes (batch 64; us per iteration, calls, function):", flush=True)
    for row in results["profile batch 64"]:
        print(f"  {row[0]:8.1f} {row[1]:6.1f}  {row[2]}", flush=True)
    print("ALL CHECKS PASSED")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_hooks.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
