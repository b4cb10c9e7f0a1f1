"""The GPU test bed's device run: real SGLang 0.5.23 servers on CUDA (graphs on), traced, then the checks.

Runs on the device, from the kit (``testbed/gpu/run_device.sh`` sets the paths and calls it)::

    python3 -m testbed.gpu.runner --kit KIT --work DIR

1. ``bench/gpu_hooks.py`` and ``bench/gpu_summarize.py``, from the bare checkout (the image's torch and
   Triton and the kit's tracer wheel alone): host time of the hooks' path per sampled iteration, the
   summariser's GPU cost.
2. In parallel, one server each (file sink, every request sampled): ``eager`` (``--disable-cuda-graph``),
   ``graphs`` (CUDA graphs, ``DRAFTSCOPE_SYNC_DEBUG=1``), the scenarios ``aux-off``, ``algo-eagle``,
   ``weights-dropped``, ``top-level-ids`` (graphs on) and ``tree`` (``--speculative-eagle-topk 4``).
   Each answers the demo prompts one at a time, then four at once, with fixed request ids.
3. Throughput (``testbed/gpu/throughput.py``): three servers (no tracer: the plugin is not on the path;
   1 in 16; every request), the same workload in interleaved rounds in a shuffled order; tokens/s per
   round and the ratios to no tracer per round.
4. ``pytest -m gpu`` over the checks of the phases that ran (``PHASE_CHECKS``; and the live CUDA checks).

Those four run by default. ``--only cross-engine`` serves the ``ids-0-1-2`` draft (graphs on) for the
cross-engine compare with the vLLM kit's run of it. ``--only kimi``, ``--only kimi-throughput``, ``--only kimi-profile``
and ``--only kimi-memory`` run instead the Kimi-K2.5-shaped phases (``testbed/gpu/kimi_phase.py``: bf16, production
widths, each fits one device call), then their checks (the profile and memory phases have none: ``bench/gpu_profile.py``
reads the profile; the memory phase prints its table).

Everything lands in ``DIR``: ``results.json`` (servers, answers, throughput, hooks, kimi), ``traces/``,
``logs/``, ``pytest.log``, the benches' JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from testbed.gpu import kimi_phase, profile_summary as gpu_profile, throughput
from testbed.gpu.bed import Bed, Spec
from testbed.scenarios import SCENARIOS
from testbed.server import ServerHandle
from testbed.texts import DEMO_NEW_TOKENS, DEMO_PROMPTS

SERVER_ARGS = [
    "--dtype", "float32", "--attention-backend", "triton", "--grammar-backend", "none",
    "--skip-server-warmup", "--max-total-tokens", "8192", "--max-running-requests", "8",
    "--cuda-graph-max-bs-decode", "8", "--mem-fraction-static", "0.1",
]
CHAIN = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"]
CHECKED_SCENARIOS = ("aux-off", "algo-eagle", "weights-dropped", "top-level-ids")
# served by the cross-engine phase: the draft whose ids each engine reads as other layers (its trace is compared
# with the vLLM kit's, tests/test_cross_engine_gpu.py)
CROSS_ENGINE = "ids-0-1-2"
KIT_SCENARIOS = (*CHECKED_SCENARIOS, CROSS_ENGINE)
PHASES = ("hooks", "checks", "throughput", "cross-engine", "kimi", "kimi-throughput", "kimi-profile", "kimi-memory",
          "pytest")
DEFAULT_PHASES = ("hooks", "checks", "throughput", "pytest")
PHASE_CHECKS = {"hooks": ["tests/gpu/test_hooks_path.py"],
                "checks": ["tests/gpu/test_gpu_bed.py", "tests/gpu/test_hooks_path.py"],
                "throughput": ["tests/gpu/test_gpu_bed.py"], "kimi": ["tests/gpu/test_kimi.py"],
                "kimi-throughput": ["tests/gpu/test_kimi_throughput.py"]}
# from the runner's start (one device call: 600 s in all, kit install and the checks included)
KIMI_BUDGET_S = 480  # to the end of the last wave of Kimi-shaped servers
KIMI_THROUGHPUT_BUDGET_S = 450  # to the end of the last round


def eagle3(kit: Path, name: str, draft: str, *args: str, tracer: dict) -> Spec:
    """A server of the tiny models: kit ``models/target`` and ``models/<draft>``."""
    models = kit / "models"
    return Spec(name, models / "target", models / draft,
                [*SERVER_ARGS, "--speculative-algorithm", "EAGLE3", *args], tracer)


def check_specs(kit: Path) -> list:
    every = {"DRAFTSCOPE_SAMPLE_RATE": "1"}
    specs = [eagle3(kit, "eager", "draft", *CHAIN, "--disable-cuda-graph", tracer=every),
             eagle3(kit, "graphs", "draft", *CHAIN, tracer={**every, "DRAFTSCOPE_SYNC_DEBUG": "1"}),
             eagle3(kit, "tree", "draft", *TREE, tracer=every)]
    for name in CHECKED_SCENARIOS:
        s = SCENARIOS[name]
        specs.append(eagle3(kit, name, "draft" if s.edit is None else f"scenarios/{name}", *CHAIN, *s.server_args,
                            tracer=every))
    return specs


def cross_engine_specs(kit: Path) -> list:
    return [eagle3(kit, f"graphs-{CROSS_ENGINE}", f"scenarios/{CROSS_ENGINE}", *CHAIN,
                   tracer={"DRAFTSCOPE_SAMPLE_RATE": "1"})]


def throughput_specs(kit: Path) -> list:
    return [eagle3(kit, name, "draft", *CHAIN, tracer=throughput.CONFIGS[name]) for name in throughput.SERVERS]


def ask(handle: ServerHandle, text: str, rid: str, new_tokens: int) -> dict:
    out = handle.generate(text, new_tokens, rid=rid)
    m = out["meta_info"]
    keep = ("completion_tokens", "spec_verify_ct", "spec_accept_length", "spec_accept_histogram", "e2e_latency")
    return {"rid": rid, "prompt": text, "text": out["text"], "meta": {k: m[k] for k in keep if k in m}}


def demo_requests(name: str, handle: ServerHandle) -> list:
    """The demo prompts one by one, then the first four at once (batch > 1 through the graphs)."""
    answers = []
    try:
        for i, p in enumerate(DEMO_PROMPTS):
            answers.append(ask(handle, p, f"seq-{i}", DEMO_NEW_TOKENS))
        together = [None] * 4

        def one(j):
            together[j] = ask(handle, DEMO_PROMPTS[j], f"conc-{j}", DEMO_NEW_TOKENS)

        threads = [threading.Thread(target=one, args=(j,)) for j in range(4)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        answers += [a for a in together if a is not None]
    except Exception as exc:  # noqa: BLE001 - recorded; the checks say what it means
        answers.append({"error": f"{type(exc).__name__}: {exc}"[:2000]})
    print(f"[runner] {name}: {len(answers)} answers", flush=True)
    return answers


def machine() -> dict:
    import torch
    import triton

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    return {"gpu": smi, "python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton.__version__}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--tracer-site", required=True,
                    help="the folder holding draftscope (added for traced servers and the GPU benches)")
    ap.add_argument("--server-path", required=True,
                    help="PYTHONPATH of every server: stand-ins, installed wheels, the kit's source (their loader)")
    ap.add_argument("--skip", default="", help="comma list of phases to skip: hooks, checks, throughput, pytest")
    ap.add_argument("--kimi-throughput-s", type=float, default=KIMI_THROUGHPUT_BUDGET_S,
                    help="seconds after the runner starts by which the Kimi throughput rounds end (default: %(default)s)")
    ap.add_argument("--kimi-throughput-servers", default=",".join(throughput.SERVERS),
                    help="the Kimi throughput phase's servers, no-tracer among them (default: %(default)s; two for an "
                    "H100, e.g. no-tracer,every; unsampled: the tracer installed, nothing sampled; no-tracer-b: a second "
                    "server without it, the bed's own spread)")
    ap.add_argument("--kimi-memory-servers", default=",".join(kimi_phase.MEMORY_SERVERS),
                    help="the Kimi memory phase's servers, each started alone in turn, no-tracer among them "
                    "(default: %(default)s)")
    ap.add_argument("--kimi-workload", default="short", choices=sorted(throughput.WORKLOADS),
                    help="the Kimi throughput phase's requests per level (testbed/gpu/throughput.py WORKLOADS)")
    ap.add_argument("--only", default="", help="comma list of the phases to run instead of the default ones, their "
                    f"checks after them unless --skip pytest: {', '.join(PHASES)}")
    a = ap.parse_args()
    try:
        kimi_servers = throughput.servers(a.kimi_throughput_servers)
        memory_servers = throughput.servers(a.kimi_memory_servers)
    except ValueError as exc:
        ap.error(str(exc))
    began = time.monotonic()
    only = set(filter(None, a.only.split(",")))
    if only - set(PHASES):
        ap.error(f"unknown phases {sorted(only - set(PHASES))}; known: {', '.join(PHASES)}")
    run = (only | {"pytest"} if only else set(DEFAULT_PHASES)) - set(filter(None, a.skip.split(",")))
    skip = set(PHASES) - run
    bed = Bed(a.kit, a.work, a.tracer_site, a.server_path)
    results = {"machine": machine(), "kit": str(a.kit), "started_at": time.time(),
               "manifest": json.loads((a.kit / "manifest.json").read_text())}
    save = lambda: (a.work / "results.json").write_text(json.dumps(results, indent=1, default=str))  # noqa: E731
    src = Path(__file__).resolve().parents[2]
    if "hooks" not in skip:  # the GPU benches, from the bare checkout: the image's torch and Triton, the tracer
        bare = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root"), "OUT": str(a.work),
                "PYTHONPATH": a.tracer_site, "PYTHONUNBUFFERED": "1"}
        results["benches"] = {}
        for bench in ("gpu_hooks", "gpu_summarize"):
            t0 = time.monotonic()
            p = subprocess.run([sys.executable, str(src / "bench" / f"{bench}.py")], env=bare, cwd=src,
                               capture_output=True, text=True, timeout=240)
            (a.work / "logs" / f"{bench}.log").write_text(p.stdout + p.stderr)
            out = a.work / f"{bench}.json"
            results["benches"][bench] = {"rc": p.returncode, "s": round(time.monotonic() - t0, 1),
                                         "result": json.loads(out.read_text()) if out.exists() else None,
                                         "tail": (p.stdout + p.stderr)[-2000:]}
            print(f"[runner] {bench} rc={p.returncode} in {time.monotonic() - t0:.0f} s: {p.stdout[-1200:]}"
                  f"{p.stderr[-800:]}", flush=True)
        save()
    for phase, specs in (("checks", check_specs), ("cross-engine", cross_engine_specs)):
        if phase in skip:
            continue
        state = bed.start_all(specs(a.kit))
        answers = {}
        threads = [threading.Thread(target=lambda n=n, s=s: answers.__setitem__(n, demo_requests(n, s["handle"])))
                   for n, s in state.items() if s["ok"]]
        [t.start() for t in threads]
        [t.join() for t in threads]
        time.sleep(1.0)  # flush intervals: every finished request reaches the file
        bed.stop_all(state)
        results.setdefault("servers", {}).update(state)
        results.setdefault("answers", {}).update(answers)
        save()
    if "throughput" not in skip:
        state = bed.start_all(throughput_specs(a.kit))
        try:
            handles = {name: s["handle"] for name, s in state.items() if s["ok"]}
            results["throughput"] = throughput.measure(handles, DEMO_PROMPTS)
            print(throughput.table(results["throughput"]), flush=True)
        except Exception as exc:  # noqa: BLE001 - recorded, the check fails on it
            results["throughput"] = {"error": f"{type(exc).__name__}: {exc}"}
        bed.stop_all(state)
        results["throughput_servers"] = state
        save()
    kimi = {"kimi", "kimi-throughput", "kimi-profile", "kimi-memory"}
    if run & kimi:
        try:
            models, results["kimi_models"] = kimi_phase.make_models(a.work)
        except Exception as exc:  # noqa: BLE001 - recorded, the checks fail on it
            results["kimi_models"] = {"error": f"{type(exc).__name__}: {exc}"}
            skip |= kimi
        save()
    if "kimi" not in skip:
        results["kimi"] = kimi_phase.run_traces(bed, models, began + KIMI_BUDGET_S)
        save()
    if "kimi-throughput" not in skip:
        results.update(kimi_phase.run_throughput(bed, models, began + a.kimi_throughput_s,
                                                    a.kimi_workload, kimi_servers))
        save()
    if "kimi-profile" not in skip:
        results.update(kimi_phase.run_profile(bed, models, a.work, began + KIMI_BUDGET_S))
        results["kimi_profile_summary"] = gpu_profile.summarize_runs(results["kimi_profile"])
        print(gpu_profile.table(results["kimi_profile_summary"]), flush=True)
        save()
    if "kimi-memory" not in skip:
        results.update(kimi_phase.run_memory(bed, models, began + KIMI_BUDGET_S, memory_servers))
        print(kimi_phase.memory_table(results["kimi_memory"]), flush=True)
        save()
    checks = sorted({f for phase in PHASES if phase not in skip for f in PHASE_CHECKS.get(phase, [])})
    if "pytest" not in skip and checks:  # the cross-engine phase's check runs here, beside the vLLM kit's trace
        save()
        p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--noconftest", "-m", "gpu",
                            "-rA", *checks], cwd=src, env={**os.environ, "DRAFTSCOPE_GPU_RUN": str(a.work)},
                           capture_output=True, text=True, timeout=300)
        (a.work / "pytest.log").write_text(p.stdout + p.stderr)
        results["pytest"] = {"rc": p.returncode, "summary": p.stdout.strip().splitlines()[-1:] if p.stdout else []}
        print(p.stdout[-6000:], p.stderr[-2000:], flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
