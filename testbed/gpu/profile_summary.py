"""What a torch profile of a served step says about the tracer's cost (the runner's ``kimi-profile`` phase).

SGLang's ``/start_profile`` writes a Chrome trace (``*.trace.json.gz``) of N scheduler steps. ``summarize``
reads one into per-step figures:

- the GPU's span, busy time (union of kernels, copies and sets) and idle time, and its kernels by total time;
- CUDA runtime calls (count and host time);
- with Python stacks: the host time in draftscope's own frames on the scheduler's thread (the wrappers
  around SGLang's calls are transparent: ``TRANSPARENT``), per function, and how much of it the GPU sat
  idle ("exposed": what the tracer adds to a step when the host is on the critical path).

``compare`` puts a traced profile beside the untraced one of the same level: kernels only the traced server
ran, and the differences in span, busy and idle time. ``table`` prints both.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}
OURS = "draftscope_tracer/"
# wrappers around SGLang's own calls: the AROUND hooks, their handles, the draft-extend watch, the step tap's
TRANSPARENT = ("engine/sglang/plugin.py", "engine/hooks.py", "): watched", "): tapped_forward", "): counted_draft_forward")


def _union(intervals: list) -> list:
    merged = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def _overlap(a: float, b: float, busy: list) -> float:
    """Length of [a, b] covered by the sorted, disjoint ``busy`` intervals."""
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in busy if y > a and x < b)


def _ours(events: list) -> list:
    """The outermost draftscope frames (transparent wrappers skipped) on the threads that run the hooks (the
    scheduler's; the relay thread's waits are not the step's): (name, ts, end)."""
    hooked = {e.get("tid") for e in events if "engine/sglang/plugin.py" in e.get("name", "") and "_around_" in e["name"]}
    by_tid = defaultdict(list)
    for e in (e for e in events if e.get("tid") in hooked):
        name = e.get("name", "")
        if OURS in name and not any(w in name for w in TRANSPARENT):
            by_tid[e.get("tid")].append((e["ts"], e["ts"] + e.get("dur", 0.0), name.split(OURS, 1)[1]))
    out = []
    for spans in by_tid.values():
        end = float("-inf")
        for ts, te, name in sorted(spans):
            if ts >= end:
                out.append((name, ts, te))
                end = te
    return out


def summarize(path: str | Path, steps: int, top: int = 25) -> dict:
    """Per-step figures of one trace (``steps``: the scheduler steps it covers)."""
    with gzip.open(path, "rt") as f:
        events = [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    if not gpu:
        return {"file": str(path), "steps": steps, "error": "no GPU events in the trace"}
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in gpu]
    busy = _union(spans)
    t0, t1 = busy[0][0], busy[-1][1]
    busy_us = sum(b - a for a, b in busy)
    kernels, runtime = defaultdict(float), defaultdict(lambda: [0, 0.0])
    for e in gpu:
        kernels[e["name"][:120]] += float(e.get("dur", 0.0))
    for e in events:
        if e.get("cat") in RUNTIME_CATS and t0 <= e["ts"] <= t1:
            runtime[e["name"]][0] += 1
            runtime[e["name"]][1] += float(e.get("dur", 0.0))
    per = lambda us: round(us / steps, 1)  # noqa: E731
    out = {"file": Path(path).name, "steps": steps, "span_us": per(t1 - t0), "busy_us": per(busy_us),
           "idle_us": per(t1 - t0 - busy_us),
           "kernels_us": {k: per(v) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:top]},
           "kernel_names": sorted(kernels),
           "all_kernels_us": {k: per(v) for k, v in sorted(kernels.items())},
           "runtime": {k: {"calls": round(n / steps, 2), "us": per(us)}
                       for k, (n, us) in sorted(runtime.items(), key=lambda kv: -kv[1][1])[:top]}}
    ours = [(n, a, b) for n, a, b in _ours([e for e in events if e.get("cat") == "python_function"]) if b > t0 and a < t1]
    if ours:
        host, exposed = defaultdict(float), defaultdict(float)
        for name, a, b in ours:
            host[name] += b - a
            exposed[name] += (b - a) - _overlap(a, b, busy)
        out["ours_host_us"] = per(sum(host.values()))
        out["ours_exposed_us"] = per(sum(exposed.values()))
        out["ours"] = {k: {"host_us": per(v), "exposed_us": per(exposed[k])}
                       for k, v in sorted(host.items(), key=lambda kv: -kv[1])[:top]}
    return out


def compare(base: dict, traced: dict, top: int = 10) -> dict:
    """The traced profile against the untraced one: per-step differences, the kernels only the traced ran (every
    one, with its GPU µs per step) and the ``top`` kernels both ran that took the traced one longer."""
    t_all = traced.get("all_kernels_us", traced["kernels_us"])  # a summary before all_kernels_us: its top ones
    b_all = base.get("all_kernels_us", base["kernels_us"])
    only = set(traced.get("kernel_names", [])) - set(base.get("kernel_names", []))
    more = {k: round(v - b_all[k], 1) for k, v in t_all.items() if k in b_all and v > b_all[k]}
    return {"span_us": round(traced["span_us"] - base["span_us"], 1),
            "busy_us": round(traced["busy_us"] - base["busy_us"], 1),
            "idle_us": round(traced["idle_us"] - base["idle_us"], 1),
            "kernels_only_traced": dict(sorted(((k, v) for k, v in t_all.items() if k in only),
                                               key=lambda kv: -kv[1])),
            "kernels_longer_traced": dict(sorted(more.items(), key=lambda kv: -kv[1])[:top])}


def summarize_runs(runs: list) -> dict:
    """The runner's ``kimi_profile`` runs (``testbed.gpu.kimi_phase.profile_once``) summarised, and each traced
    level compared with the untraced one."""
    by_id = {}
    for r in runs:
        if r.get("files"):
            try:
                by_id[r["profile_id"]] = summarize(r["files"][0], r["steps"])
            except Exception as exc:  # noqa: BLE001 - a bad trace is reported, not fatal
                by_id[r["profile_id"]] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    deltas = {}
    for pid, s in by_id.items():
        base = by_id.get(pid.replace("every-", "no-tracer-", 1))
        if pid.startswith("every-") and not pid.endswith("-stack") and base and "error" not in base and "error" not in s:
            deltas[pid] = compare(base, s)
    return {"profiles": by_id, "deltas": deltas}


def table(summary: dict) -> str:
    lines = ["profile | steps | span us/step | GPU busy | GPU idle | draftscope host us/step (exposed)"]
    for pid, s in summary.get("profiles", {}).items():
        if "error" in s:
            lines.append(f"{pid} | {s['error']}")
            continue
        ours = f"{s['ours_host_us']} ({s['ours_exposed_us']})" if "ours_host_us" in s else "-"
        lines.append(f"{pid} | {s['steps']} | {s['span_us']} | {s['busy_us']} | {s['idle_us']} | {ours}")
    for pid, d in summary.get("deltas", {}).items():
        lines.append(f"{pid} vs no tracer: span {d['span_us']:+} us/step, busy {d['busy_us']:+}, idle {d['idle_us']:+}")
        for k, v in d["kernels_only_traced"].items():
            lines.append(f"    only traced: {v} us/step  {k}")
        for k, v in d.get("kernels_longer_traced", {}).items():
            lines.append(f"    longer traced: {v:+} us/step  {k}")
    for pid, s in summary.get("profiles", {}).items():
        for k, v in (s.get("ours") or {}).items():
            lines.append(f"{pid}: {v['host_us']} us/step host, {v['exposed_us']} exposed  {k}")
    return "\n".join(lines)


def main(argv: list | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Per-step figures of SGLang torch profiles (the kimi-profile phase).")
    ap.add_argument("results", type=Path, help="a GPU run's results.json (its kimi_profile_summary), or a trace")
    ap.add_argument("--steps", type=int, default=40, help="steps a single trace covers")
    a = ap.parse_args(argv)
    if a.results.name.endswith(".trace.json.gz"):
        print(json.dumps(summarize(a.results, a.steps), indent=1))
    else:
        print(table(json.loads(a.results.read_text())["kimi_profile_summary"]))
    return 0
