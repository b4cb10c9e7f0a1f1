"""Host time of the vLLM hooks' CUDA branch per engine step, against the same step without the tracer.

``testbed.gpu.vllm_hooks_path.VllmStepPath`` runs engine steps through the vLLM plugin's own AROUND hooks with a
real ``VLLMTracer`` attached as on CUDA (the runner's ``propose_draft_token_ids``, the drafter's ``propose`` with
the draft's ``fc`` and one ``compute_logits`` per draft position, stand-ins holding tensors shaped as vLLM hands
them). Three paths of the same widths step in turns, in a shuffled order each iteration: **no tracer** (the
plugin's hooks find no tracer and call vLLM's methods only), **1 in 16** and **every request** sampled. Each
iteration first queues ``FORWARD_MS`` of GPU work (the model's forward), the step's host work runs while it is
queued, then the host waits for the previous iteration, so a hook that waited for the GPU would show. The
tracer's own host time per step is the difference of the medians against no tracer; at batch 64 the host
time of each part of the step hooks (1 in 16 and every request) and a cProfile of the every-request path say
where it goes. Widths: the GPU test bed's tiny models (what the vLLM throughput phase
serves: hidden 128, 3 aux layers, vocabulary 1,024, float32) and Kimi-K2.5's (hidden 7168, vocabulary 163,840,
bf16), batch 8 and 64, 3 drafts.

    python bench/gpu_vllm_hooks.py          # JSON also to $OUT/gpu_vllm_hooks.json if OUT is set
    python bench/gpu_vllm_hooks.py --iterations 100 --widths tiny

Needs a CUDA GPU, torch (Triton for the summaries) and the tracer importable as ``draftscope_tracer`` (the vLLM
GPU kit's run.sh puts its tracer on ``PYTHONPATH``; this needs no vLLM).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftscope_tracer.engine.vllm import plugin  # noqa: E402
from testbed.gpu.hooks_path import gpu_sleep_cycles_per_ms  # noqa: E402  (the checkout, by path)
from testbed.gpu.vllm_hooks_path import VllmStepPath  # noqa: E402

FORWARD_MS = 3.0
WIDTHS = {"tiny": dict(hidden=128, aux=3, vocab=1024, k=3, dtype=torch.float32),
          "kimi": dict(hidden=7168, aux=3, vocab=163_840, k=3, dtype=torch.bfloat16)}
CONFIGS = {"no tracer": 1, "1 in 16": 16, "every request": 1}


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def step(path: VllmStepPath, traced: bool) -> float:
    """One engine step's host time (µs): the plugin sees ``path``'s tracer, or none."""
    plugin.PLUGIN.tracer = path.tracer if traced else None
    t0 = time.perf_counter()
    path.step()
    return (time.perf_counter() - t0) * 1e6


def relay_cpu_s(path: VllmStepPath) -> float:
    """CPU seconds the tracer's relay thread (it pickles the records for the recorder process, holding the GIL the
    engine's thread needs) has used so far; 0 without a tracer."""
    writer = path.tracer.core.transport.writer if path.tracer is not None else None
    thread = getattr(writer, "_thread", None)
    if thread is None or thread.ident is None or not thread.is_alive():
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def measure(widths: str, batch: int, iterations: int, warmup: int, cycles: int) -> dict:
    paths = {name: VllmStepPath(batch, sample_every=every, **WIDTHS[widths]) for name, every in CONFIGS.items()}
    times = {name: [] for name in paths}
    relay = {}
    prev = None
    order = list(paths)
    for i in range(warmup + iterations):
        if i == warmup:
            relay = {name: relay_cpu_s(path) for name, path in paths.items()}
        random.shuffle(order)
        for name in order:
            torch.cuda._sleep(cycles)  # the model's forward, queued ahead of the step's host work
            us = step(paths[name], name != "no tracer")
            if prev is not None:
                prev.synchronize()
            prev = torch.cuda.Event()
            prev.record()
            if i >= warmup:
                times[name].append(us)
    torch.cuda.synchronize()
    relay = {name: (relay_cpu_s(path) - relay[name]) * 1e6 / iterations for name, path in paths.items()}
    reports = {}
    for name, path in paths.items():
        plugin.PLUGIN.tracer = path.tracer
        reports[name] = path.close()
    base = statistics.median(times["no tracer"])
    out = {"widths": widths, "batch": batch, "iterations": iterations}
    for name, xs in times.items():
        med = statistics.median(xs)
        out[name] = {"median_us": round(med, 1), "p90_us": round(pct(xs, 0.9), 1),
                     "own_us": None if name == "no tracer" else round(med - base, 1),
                     "relay_cpu_us": round(relay[name], 1),
                     "errors": reports[name]["errors"], "drops": reports[name]["drops"],
                     "relay_error": reports[name]["relay_error"]}
    return out


PARTS = {"cuda": ("before_propose", "on_draft_input", "on_fc", "on_draft_logits", "keep_drafts"),
         "cuda.verify_steps": ("read", "add"), "cuda.summaries": ("target",), "": ("after_propose", "after_draft")}


def breakdown(widths: str, batch: int, every: int, iterations: int, cycles: int) -> dict:
    """Median host µs per step of each part of the tracer's step hooks (each method timed where the hooks call
    it; parts nest: ``cuda.verify_steps.add`` runs inside ``cuda.before_propose``, ``cuda.summaries.target``
    inside ``add``)."""
    path = VllmStepPath(batch, sample_every=every, **WIDTHS[widths])
    spent: dict = {}
    for owner_name, names in PARTS.items():
        owner = path.tracer.steps
        for attr in filter(None, owner_name.split(".")):
            owner = getattr(owner, attr)
        for name in names:
            key = f"{owner_name}.{name}".lstrip(".")
            spent[key] = []

            def timed(*args, _fn=getattr(owner, name), _key=key, **kwargs):
                t0 = time.perf_counter()
                try:
                    return _fn(*args, **kwargs)
                finally:
                    spent[_key][-1] += (time.perf_counter() - t0) * 1e6
            setattr(owner, name, timed)
    total = []
    for i in range(20 + iterations):
        for xs in spent.values():
            xs.append(0.0)
        torch.cuda._sleep(cycles)
        total.append(step(path, True))
        torch.cuda.synchronize()
    sampled = len(path.tracer.requests.sampled)
    path.close()
    out = {k: round(statistics.median(xs[20:]), 1) for k, xs in spent.items()}
    out["step (harness included)"] = round(statistics.median(total[20:]), 1)
    out["sampled requests"] = sampled
    return out


def profile(widths: str, batch: int, every: int, iterations: int, cycles: int) -> str:
    """Where the host time of the path sampling 1 in ``every`` requests goes (cProfile, top functions by own
    time)."""
    path = VllmStepPath(batch, sample_every=every, **WIDTHS[widths])
    for _ in range(10):
        step(path, True)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    for _ in range(iterations):
        torch.cuda._sleep(cycles)
        prof.enable()
        step(path, True)
        prof.disable()
        torch.cuda.synchronize()
    path.close()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
    return buf.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--widths", default="tiny,kimi", help="comma-separated: " + ", ".join(WIDTHS))
    ap.add_argument("--batches", default="8,64")
    ap.add_argument("--no-profile", action="store_true", help="no cProfile (the parts' breakdown is always printed)")
    ap.add_argument("--profile-every", default="1", help="comma-separated: the sampling paths profiled at batch 64 "
                    "(16: 1 in 16, 1: every request)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_vllm_hooks: needs a CUDA GPU", file=sys.stderr)
        return 2
    cycles = int(gpu_sleep_cycles_per_ms() * FORWARD_MS)
    results = {"device": torch.cuda.get_device_name(), "forward_ms": FORWARD_MS, "cases": [], "profiles": {}}
    print("| widths | batch | no tracer µs (median / p90) | 1 in 16 | every request | tracer's own µs, 1 in 16 / every "
          "| relay thread CPU µs per step, 1 in 16 / every |")
    print("|---|---|---|---|---|---|---|")
    for widths in a.widths.split(","):
        for batch in (int(b) for b in a.batches.split(",")):
            r = measure(widths, batch, a.iterations, a.warmup, cycles)
            results["cases"].append(r)
            n, s, e = r["no tracer"], r["1 in 16"], r["every request"]
            print(f"| {widths} | {batch} | {n['median_us']} / {n['p90_us']} | {s['median_us']} / {s['p90_us']} | "
                  f"{e['median_us']} / {e['p90_us']} | {s['own_us']} / {e['own_us']} | {s['relay_cpu_us']} / "
                  f"{e['relay_cpu_us']} |", flush=True)
            bad = {k: (v["errors"], v["drops"], v["relay_error"]) for k, v in r.items() if isinstance(v, dict)
                   and (v["errors"] or v["drops"] or v["relay_error"])}
            if bad:
                print(f"  tracer errors or drops: {bad}", flush=True)
            if batch == 64:
                for every in (16, 1):
                    parts = breakdown(widths, batch, every, a.iterations, cycles)
                    results.setdefault("breakdown", []).append({"widths": widths, "every": every, **parts})
                    print(f"  parts, {widths} widths, batch 64, 1 in {every}: {json.dumps(parts)}", flush=True)
            if not a.no_profile and batch == 64:
                for every in (int(e) for e in a.profile_every.split(",")):
                    results["profiles"][f"{widths}, 1 in {every}"] = text = profile(widths, batch, every, 50, cycles)
                    print(f"\ncProfile, {widths} widths, batch 64, 1 in {every}, 50 steps:\n{text}", flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_vllm_hooks.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
