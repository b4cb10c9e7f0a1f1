"""The GPU runner's Kimi-K2.5-shaped phases: real SGLang 0.5.23 in bf16 with CUDA graphs, at production widths.

``kimi`` (``bash .cache/gpu-kit/run.sh --only kimi``): the models are made on the device
(``testbed.gpu.kimi_models``: the target served with ``--load-format dummy``, the drafts written from a
seed), then the four servers of ``kimi_models.SCENARIOS`` and the healthy draft's eager twin (``EAGER``,
``--disable-cuda-graph``) in ``WAVES`` (~40 GB each: all five do not fit one H200), each traced (file sink, every request sampled), answering four requests one by one and
sixteen eight at a time (token ids, fixed request ids), then stopped with SIGTERM so the tracer flushes.

``kimi-throughput`` (``--only kimi-throughput``): the healthy draft's server three times at once (no
tracer, 1 in 16, every request) and ``testbed/gpu/throughput.py``'s ``measure_levels`` at 1, 8 and 64 concurrent
requests, in interleaved, shuffled rounds until the phase's deadline.

``kimi-memory`` (``--only kimi-memory``): the same server without the tracer and with it (``MEMORY_SERVERS``), each
started alone, one after the other, so that SGLang's own account of its start-up (the device memory free after each
phase, from its log) and ``nvidia-smi``'s figure for the process are this server's alone: where the traced server's
extra memory is taken.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from testbed.gpu import kimi_models, throughput, traces
from testbed.gpu.bed import Spec
from testbed.scenarios import FINDINGS

CHAIN = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4"]
# --mem-fraction-static: SGLang sizes the KV pool as the memory free after loading minus (1 - f) of the memory
# free before; servers loading side by side take from both, so f is high and the pool is capped by
# --max-total-tokens instead (16384 tokens: ~1.7 GB of target and draft KV).
BASE_ARGS = ["--dtype", "bfloat16", "--load-format", "dummy", "--speculative-draft-load-format", "safetensors",
             "--skip-tokenizer-init", "--attention-backend", "triton", "--grammar-backend", "none",
             "--skip-server-warmup", "--mem-fraction-static", "0.85", "--max-total-tokens", "16384",
             "--cuda-graph-max-bs-prefill", "128", *CHAIN]
TRACE_ARGS = [*BASE_ARGS, "--max-running-requests", "8", "--cuda-graph-max-bs-decode", "8"]
THROUGHPUT_ARGS = [*BASE_ARGS, "--max-running-requests", "64", "--cuda-graph-bs-decode", "1", "2", "4", "8", "16",
                   "32", "64"]
# the healthy draft once more with CUDA graphs off: its sequential requests must record what the graphs server's do
EAGER = {"kimi-healthy-eager": "kimi-healthy"}
WAVES = (("kimi-healthy", "kimi-aux-off", "kimi-healthy-eager"), ("kimi-weights-dropped", "kimi-d2t-absolute"))
EVERY = {"DRAFTSCOPE_SAMPLE_RATE": "1"}
NEW_TOKENS = 32
START_TIMEOUT_S = 300
WAVE_MIN_START_S, WAVE_AFTER_START_S = 90, 60  # a wave's servers need ~70-100 s to start, then requests and stop


def make_models(work: Path) -> tuple[Path, dict]:
    """``testbed.gpu.kimi_models`` in its own process (the runner never touches CUDA): (folder, what it made)."""
    dest = work / "kimi-models"
    done = subprocess.run([sys.executable, "-m", "testbed.gpu.kimi_models", str(dest)], capture_output=True,
                          text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"kimi_models failed ({done.returncode}): {(done.stdout + done.stderr)[-3000:]}")
    made = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"[runner] kimi models in {made['seconds']} s on {made['device']}", flush=True)
    return dest, made


def trace_specs(models: Path) -> dict:
    specs = {name: Spec(name, models / "target", models / name, TRACE_ARGS, EVERY) for name in kimi_models.SCENARIOS}
    for name, draft in EAGER.items():
        specs[name] = Spec(name, models / "target", models / draft, [*TRACE_ARGS, "--disable-cuda-graph"], EVERY)
    return specs


def throughput_specs(models: Path, names: tuple = throughput.SERVERS) -> list:
    return [Spec(name, models / "target", models / "kimi-healthy", THROUGHPUT_ARGS, throughput.CONFIGS[name])
            for name in names]


def prompt(seed: int) -> list[int]:
    """48-72 random token ids (no two prompts share a prefix, so the radix cache never serves one)."""
    rng = random.Random(seed)
    return [rng.randrange(1000, 160000) for _ in range(48 + (seed % 4) * 8)]


def ask(handle, ids: list[int], rid: str, new_tokens: int) -> dict:
    out = handle.generate(ids, new_tokens, rid=rid, ignore_eos=True)
    m = out["meta_info"]
    keep = ("completion_tokens", "spec_verify_ct", "spec_accept_length", "e2e_latency")
    return {"rid": rid, "output_ids": len(out.get("output_ids") or []), "meta": {k: m[k] for k in keep if k in m}}


def requests(name: str, handle) -> list:
    """Four requests one by one, then sixteen eight at a time; none after the first failure (a scenario that
    crashes the server, as d2t-absolute may)."""
    answers, lock = [], threading.Lock()

    def one(i: int, rid: str) -> None:
        try:
            a = ask(handle, prompt(i), rid, NEW_TOKENS)
        except Exception as exc:  # noqa: BLE001 - recorded; the checks say what it means
            a = {"rid": rid, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        with lock:
            answers.append(a)

    for i in range(4):
        one(i, f"kimi-seq-{i}")
        if "error" in answers[-1]:
            break
    else:
        for wave in range(2):
            threads = [threading.Thread(target=one, args=(100 + 8 * wave + j, f"kimi-conc-{8 * wave + j}"))
                       for j in range(8)]
            [t.start() for t in threads]
            [t.join() for t in threads]
            if any("error" in a for a in answers):
                break
    print(f"[runner] {name}: {len(answers)} answers, {sum('error' in a for a in answers)} failed", flush=True)
    return answers


def smi(query: str) -> list:
    """Rows of ``nvidia-smi --query-QUERY`` ([] where there is none: a dry run off the device)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-{query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout
    except FileNotFoundError:
        return []
    return [[c.strip() for c in ln.split(",")] for ln in out.splitlines() if ln.strip()]


def gpu_memory(state: dict) -> dict:
    """MiB of GPU memory per server (its process group's processes) and in all."""
    groups = {}
    for pid, mib in smi("compute-apps=pid,used_memory"):
        try:
            group = os.getpgid(int(pid))
        except (ProcessLookupError, ValueError):
            continue
        groups[group] = groups.get(group, 0) + int(mib)
    used = smi("gpu=memory.used,memory.total")
    return {"per_server_mib": {n: groups.get(s["handle"].pid) for n, s in state.items() if "handle" in s},
            "used_mib": int(used[0][0]) if used else None, "total_mib": int(used[0][1]) if used else None}


def wait_gpu_free(limit_mib: int = 4000, timeout_s: float = 30.0) -> None:
    """Until the GPU holds under ``limit_mib`` (the last wave's memory is released) or ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        used = smi("gpu=memory.used")
        if not used or int(used[0][0]) < limit_mib:
            return
        time.sleep(0.5)


def crashes(name: str) -> bool:
    """Whether the CPU bed's twin of scenario ``name`` ends its server serving (``testbed.scenarios.FINDINGS``)."""
    return FINDINGS[kimi_models.SCENARIOS[EAGER.get(name, name)][1]][2]


def run_traces(bed, models: Path, deadline: float) -> dict:
    """The ``kimi`` phase's servers, wave by wave, none started that could not be up and stopped by ``deadline``
    (``time.monotonic``); ``{"servers": ..., "answers": ...}`` as the checks read them."""
    specs = trace_specs(models)
    servers, answers = {}, {}
    for wave in WAVES:
        wait_gpu_free()
        left = deadline - time.monotonic() - WAVE_AFTER_START_S
        if left < WAVE_MIN_START_S:
            print(f"[runner] kimi wave {wave} not started: {left + WAVE_AFTER_START_S:.0f} s left", flush=True)
            continue
        state = bed.start_all([specs[n] for n in wave], min(START_TIMEOUT_S, left))
        memory = gpu_memory(state)
        print(f"[runner] kimi wave {wave}: GPU memory {memory}", flush=True)
        # a scenario that may crash its server (a device-side assert) is served after the others are done
        for last in (False, True):
            threads = [threading.Thread(target=lambda n=n, s=s: answers.__setitem__(n, requests(n, s["handle"])))
                       for n, s in state.items() if s["ok"] and crashes(n) == last]
            [t.start() for t in threads]
            [t.join() for t in threads]
        time.sleep(1.0)  # flush intervals: every finished request reaches the file before SIGTERM
        bed.stop_all(state)
        for s in state.values():
            s["gpu_memory_mib"] = memory["per_server_mib"].get(s["name"])
        servers.update(state)
    return {"servers": servers, "answers": answers}


def run_throughput(bed, models: Path, deadline: float, workload: str = "short",
                   names: tuple = throughput.SERVERS) -> dict:
    """The ``kimi-throughput`` phase: the servers of ``names`` at once (by default no tracer, 1 in 16 and every
    request: an H200 holds the three; two should fit an H100), rounds of ``throughput.WORKLOADS[workload]`` until ``deadline``
    (``time.monotonic``)."""
    wait_gpu_free()
    state = bed.start_all(throughput_specs(models, names), START_TIMEOUT_S)
    memory = gpu_memory(state)
    print(f"[runner] kimi throughput servers: GPU memory {memory}", flush=True)
    try:
        handles = {name: s["handle"] for name, s in state.items() if s["ok"]}
        result = throughput.measure_levels(handles, prompt, deadline, throughput.WORKLOADS[workload])
        print(throughput.levels_table(result), flush=True)
    except Exception as exc:  # noqa: BLE001 - recorded, the check fails on it
        result = {"error": f"{type(exc).__name__}: {exc}"}
    time.sleep(1.0)
    bed.stop_all(state)
    for s in state.values():
        s["gpu_memory_mib"] = memory["per_server_mib"].get(s["name"])
        s["tracing_device"] = tracing_device(s.get("trace"))
    return {"kimi_throughput": result, "kimi_throughput_servers": state}


MEMORY_SERVERS = ("no-tracer", "unsampled")  # the tracer's start-up memory does not depend on sampling
# SGLang's start-up lines that state the device memory free after a phase: weights loaded (target, then draft), the KV
# pools, each CUDA-graph capture, the scheduler ready (after the tracer's attach)
_PHASE = re.compile(r"(Load weight end\.|Memory pool end\.|Capture (?P<graph>[a-z ]+) CUDA graph end\.|"
                    r"max_total_num_tokens=)(?:.*?type=(?P<type>\w+))?.*?(?:avail mem|available_gpu_mem)=(?P<gb>[0-9.]+) ?GB")


def memory_phases(log: Path) -> list:
    """``[[phase, GB free after it], ...]`` in the order SGLang logged them (``_PHASE``)."""
    phases = []
    for line in Path(log).read_text(errors="replace").splitlines():
        m = _PHASE.search(line)
        if m is None:
            continue
        head = m.group(1)
        label = (f"weights {m.group('type') or ''}".strip() if head.startswith("Load") else "KV pool"
                 if head.startswith("Memory") else f"{m.group('graph')} graphs" if m.group("graph") else "ready")
        phases.append([label, float(m.group("gb"))])
    return phases


def run_memory(bed, models: Path, deadline: float, names: tuple = MEMORY_SERVERS) -> dict:
    """The ``kimi-memory`` phase: each server of ``names`` started alone, its GPU memory (``nvidia-smi``, its process
    group) and SGLang's start-up phases read, then stopped; none started that could not be up by ``deadline``."""
    out = {}
    for name in names:
        if time.monotonic() + WAVE_MIN_START_S > deadline:
            out[name] = {"ok": False, "error": "not started: too little of the phase's time left"}
            continue
        wait_gpu_free()
        state = bed.start_all(throughput_specs(models, (name,)), min(START_TIMEOUT_S, deadline - time.monotonic()))
        s, memory = state[name], gpu_memory(state)
        log = s["handle"].log_path
        bed.stop_all(state)
        out[name] = {"ok": s["ok"], "error": s.get("error"), "gpu_memory_mib": memory["per_server_mib"].get(name),
                     "phases": memory_phases(log), "tracing_device": tracing_device(s.get("trace"))}
        print(f"[runner] kimi memory, {name}: {out[name]}", flush=True)
    return {"kimi_memory": out}


def memory_table(result: dict) -> str:
    """The servers side by side: GB free after each start-up phase (the n-th line of each kind paired), then the
    process's MiB; the last column, each traced server's less the first's (what the tracer took by then)."""
    names = [n for n, s in result.items() if s.get("phases")]
    if len(names) < 2:
        return "kimi memory: fewer than two servers started"
    base, rest = names[0], names[1:]
    lines = [f"| phase | {' | '.join(f'{n}: GB free' for n in names)} | {' | '.join(f'{n} took more, GB' for n in rest)} |",
             "|---|" + "---|" * (len(names) + len(rest))]
    keyed = {n: _keyed(result[n]["phases"]) for n in names}
    for (label, n), first in keyed[base].items():
        row = [first, *(keyed[other].get((label, n)) for other in rest)]
        more = [f"{first - v:+.2f}" if v is not None else "" for v in row[1:]]
        name = label if n == 1 else f"{label} ({n})"
        lines.append(f"| {name} | {' | '.join('' if v is None else f'{v:.2f}' for v in row)} | {' | '.join(more)} |")
    mib = [result[n].get("gpu_memory_mib") for n in names]
    more = [f"{(v - mib[0]) / 1024:+.2f}" if None not in (v, mib[0]) else "" for v in mib[1:]]
    lines.append(f"| the process (nvidia-smi), MiB | {' | '.join('' if v is None else f'{v:,}' for v in mib)} | "
                 f"{' | '.join(more)} |")
    return "\n".join(lines)


def _keyed(phases: list) -> dict:
    """``{(phase, its n-th occurrence): GB free}``, in the log's order."""
    out, seen = {}, {}
    for label, gb in phases:
        seen[label] = seen.get(label, 0) + 1
        out[(label, seen[label])] = gb
    return out


def tracing_device(trace) -> dict | None:
    """What the traced server's tracer built on the GPU at attach (its run's ``facts.tracing.device``: prepared rows,
    layouts, ``reserved_bytes``), read from its trace here, since the trace itself is too large to come back; None
    for the server without the tracer, or when the trace holds none."""
    if not trace or not Path(trace).exists():
        return None
    try:
        return ((traces.run_record(trace).get("facts") or {}).get("tracing") or {}).get("device")
    except (OSError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


PROFILE_CONFIGS = ("no-tracer", "every")
# (concurrent requests, new tokens each, with Python stacks): random weights accept nothing, so a request of n
# tokens is n steps; the profile starts once every request is decoding and records PROFILE_STEPS steps
PROFILE_LEVELS = ((1, 160, False), (8, 160, False), (1, 160, True))
PROFILE_STEPS, PROFILE_STACK_STEPS = 40, 12


def start_profile(handle, body: dict) -> str:
    """``POST /start_profile`` (answered in plain text once the profile is written, with ``num_steps``)."""
    request = urllib.request.Request(handle.url + "/start_profile", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **handle.headers})
    with urllib.request.urlopen(request, timeout=180.0) as response:
        return response.read().decode(errors="replace")[:200]


def profile_once(handle, out: Path, profile_id: str, level: tuple, seed: int) -> dict:
    """One torch profile (SGLang's ``/start_profile``) of ``PROFILE_STEPS`` decode steps while ``level``'s requests
    run: the trace file it wrote and the wall time of the requests."""
    concurrency, new_tokens, stack = level
    work = [(f"{profile_id}-{j}", prompt(seed + j)) for j in range(concurrency)]
    done = {}
    threads = [threading.Thread(target=lambda rid=rid, ids=ids: done.__setitem__(rid, ask(handle, ids, rid, new_tokens)))
               for rid, ids in work]
    t0 = time.monotonic()
    [t.start() for t in threads]
    time.sleep(0.5)  # the prompts are in (prefill takes ~0.1 s): the profile sees decode steps only
    body = {"output_dir": str(out), "num_steps": PROFILE_STACK_STEPS if stack else PROFILE_STEPS,
            "activities": ["CPU", "GPU"], "with_stack": stack, "record_shapes": False, "profile_id": profile_id}
    try:
        started = start_profile(handle, body)
    finally:
        [t.join() for t in threads]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not list(out.glob(f"{profile_id}*.trace.json.gz")):
        time.sleep(0.2)
    files = [str(p) for p in out.glob(f"{profile_id}*.trace.json.gz")]
    return {"profile_id": profile_id, "level": list(level), "steps": body["num_steps"], "files": files,
            "requests_s": round(time.monotonic() - t0, 2), "start_reply": started,
            "answers": [done.get(rid) for rid, _ in work]}


def run_profile(bed, models: Path, work: Path, deadline: float) -> dict:
    """The ``kimi-profile`` phase: the healthy server without the tracer and with every request sampled, each
    profiled at ``PROFILE_LEVELS`` (``bench/gpu_profile.py`` reads the traces)."""
    wait_gpu_free()
    specs = [s for s in throughput_specs(models) if s.name in PROFILE_CONFIGS]
    state = bed.start_all(specs, START_TIMEOUT_S)
    out, runs = work / "traces" / "profiles", []
    out.mkdir(parents=True, exist_ok=True)
    try:
        for name, s in state.items():  # warm-up: the first requests of a server compile and capture
            if s["ok"]:
                for j in range(2):
                    ask(s["handle"], prompt(900 + j), f"warm-{name}-{j}", 16)
        for i, level in enumerate(PROFILE_LEVELS):
            for name, s in state.items():
                if not s["ok"] or (level[2] and name == "no-tracer") or time.monotonic() + 30 > deadline:
                    continue
                pid = f"{name}-c{level[0]}{'-stack' if level[2] else ''}"
                try:
                    runs.append({"server": name, **profile_once(s["handle"], out, pid, level, 5000 + 100 * i)})
                except Exception as exc:  # noqa: BLE001 - recorded; the next profile still runs
                    runs.append({"server": name, "profile_id": pid, "error": f"{type(exc).__name__}: {exc}"[:2000]})
                print(f"[runner] profile {pid}: {runs[-1].get('files', runs[-1].get('error'))}", flush=True)
    except Exception as exc:  # noqa: BLE001 - recorded
        runs.append({"error": f"{type(exc).__name__}: {exc}"[:2000]})
    bed.stop_all(state)
    return {"kimi_profile": runs, "kimi_profile_servers": state}
