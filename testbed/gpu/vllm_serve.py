"""The vLLM GPU kit's runner on the device: vLLM 0.32 on CUDA serving the tiny target and its EAGLE-3 draft.

    python -m testbed.gpu.vllm_serve --kit KIT --work DIR [--modes graphs,eager,graphs-sync] [--no-hooks]
                                     [--scenarios aux-off,weights-dropped,ids-0-1-2]
                                     [--limit-s S] [--throughput [--throughput-s S] [--throughput-servers A,B]
                                                   [--throughput-levels 1,8,64]]

Phases, each saved into ``DIR/results.json`` as it ends (a later failure keeps what came before):

0. ``prewarm``: vLLM's model inspection for the bed's two architectures, cached for the servers, in the
   background of the next two phases (:func:`prewarm_registry`);
1. ``imports``: ``testbed.gpu.vllm_imports`` in a fresh process: the CUDA path's modules from the kit's
   tree, the platform vLLM resolved, the stand-ins defined and run;
2. ``hooks``: ``pytest -m gpu tests/gpu/test_vllm_hooks_path.py``: the tracer's vLLM hooks on CUDA tensors
   (no vLLM) under sync-debug with GPU work queued ahead, and its negative control;
3. one server per mode, one after the other (``graphs``: vLLM's default, Inductor compile and CUDA
   graphs; ``eager``: ``--enforce-eager``; ``graphs-sync``: as ``graphs`` with ``DRAFTSCOPE_SYNC_DEBUG=1``,
   every hook body under ``torch.cuda.set_sync_debug_mode("error")``: a host sync fails its probe, counted in
   the trace's health and logged), all with custom ops off, vLLM IR's native norms and the ``TRITON_ATTN``
   backend (``SERVER_ARGS``), async scheduling on (vLLM's CUDA default), the Model Runner V1 (where the tracer
   hooks), the tracer loaded as vLLM's general plugin with a file sink and every request sampled. Each
   answers the six demo prompts one by one, greedy, then is stopped with SIGTERM (the tracer flushes). Saved
   per mode: the answers' token ids, vLLM's speculative counters from ``/metrics`` and the accept length they
   give (1 + accepted / drafts), the stand-in ops the log names, stubs called, graph replays counted, the
   tracer's own lines, the trace's record count and ``records`` (:func:`trace_summary`: verify steps, accepted
   drafts per position, sample widths, the tracer's errors and drops, its totals beside vLLM's);
   Then each of ``--scenarios`` (``SCENARIOS``: an edited draft of ``testbed/scenarios.py``) in ``graphs`` mode.
   Once a mode fails to start, the servers after it are skipped (they take the same path to their start);
4. ``graphs_equal_eager`` and ``graphs_sync_equal_eager``, saved after each server: the modes' token ids
   compared prompt by prompt, and their records compared record by record (:func:`compare_records`: requests
   matched by arrival order, ``testbed/gpu/traces.py``'s comparison, as the SGLang bed's ``graphs on == eager``).

``--throughput``: instead of the modes (phases 0-2 as above), the tracer's overhead against vLLM without it
(``testbed/gpu/vllm_throughput.py``); with ``--kimi``, at Kimi widths (its ``kimi_phase``: an H200 for three servers,
an H100 for two: ``--throughput-servers no-tracer,every``). ``--throughput-levels 64``: that level alone, so a call's
rounds all go to it (a level whose rounds vary widely needs many).

``--kimi``: the seed's case at full width (``testbed/gpu/vllm_kimi.py``): after phases 0-2, with its own models,
architectures prewarmed and servers; no tiny mode runs unless ``--modes`` names it.

Nothing here asserts: ``results.json`` says what each mode showed (docs/testbed.md has what the device showed).

``--dry-run`` (a machine without a GPU, a Python with vLLM's dependencies, e.g. ``.venv-vllm``): the import
check with the platform taken as one H200, then each mode's command line parsed by vLLM's own OpenAI-server
parser into the engine configuration it would serve with (compile mode, CUDA-graph mode, custom ops,
attention backend, IR op priority, speculative method, model runner, async scheduling); no server is
started.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from testbed.gpu import traces
from testbed.gpu.vllm_servers import (ENV, MODE_ENV, MODES, await_up, command, log_facts, spec_counters, start,
                                      trace_summary, wait_closed)
from testbed.server import free_port, log_tail
from testbed.texts import DEMO_NEW_TOKENS, DEMO_PROMPTS

DEFAULT_MODES = "graphs,eager,graphs-sync"
# the tiny bed's scenarios served in graphs mode after the modes (--scenarios): the seed's fc skipped, the
# draft's weights under keys vLLM refuses, the cross-engine ids [0, 1, 2]
SCENARIOS = ("aux-off", "weights-dropped", "ids-0-1-2")
START_TIMEOUT_S = 240


def serve(kit: Path, work: Path, mode: str, deadline: float, scenario: str | None = None) -> dict:
    """One server of ``mode`` (of ``scenario``'s draft if given): start, the demo prompts, counters, SIGTERM;
    what it showed."""
    name = f"{mode}-{scenario}" if scenario else mode
    log, trace = work / "logs" / f"{name}.log", work / "traces" / f"{name}.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    trace.parent.mkdir(parents=True, exist_ok=True)
    port, t0 = free_port(), time.monotonic()
    server = start(command(kit, port, mode, scenario), port, log,
                   {**ENV, **MODE_ENV.get(mode, {}), "DRAFTSCOPE_FILE": str(trace)})
    server.model = str(kit / "models" / "target")
    result = {"mode": mode, "scenario": scenario, "args": MODES[mode], "env": MODE_ENV.get(mode, {}), "trace": str(trace)}
    try:
        if error := await_up(server, t0, deadline, START_TIMEOUT_S):
            result["start_error"] = error
            return result
        result["up_s"] = round(time.monotonic() - t0, 1)
        answers = []
        for prompt in DEMO_PROMPTS:
            if time.monotonic() > deadline:
                break
            choice = server.complete(prompt, max_tokens=DEMO_NEW_TOKENS)
            answers.append({"prompt": prompt, "token_ids": choice.get("token_ids"), "text": choice.get("text")})
        result["answers"] = answers
        result["spec_counters"], result["accept_length"] = spec_counters(server)
    except Exception as exc:  # noqa: BLE001 - a request that fails is this run's finding
        result["request_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        server.stop()
        result["trace_closed"] = wait_closed(trace)
        result["log_facts"] = log_facts(log)
        result["trace_records"] = sum(1 for _ in open(trace)) if trace.exists() else 0
        if result["trace_records"]:
            result["records"] = trace_summary(trace, result.get("spec_counters"))
        if "start_error" in result:
            result["log_tail"] = log_tail(log, 60)
    return result


def engine_config(kit: Path, mode: str, extra: list = ()) -> dict:
    """What vLLM makes of ``mode``'s command line (then ``extra``): its parser, then ``create_engine_config`` (no
    engine)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args([*command(kit, 0, mode)[3:], *extra])
    os.environ.update({k: v for k, v in ENV.items() if k.startswith("VLLM_")})
    cfg = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    cc, spec = cfg.compilation_config, cfg.speculative_config
    return {"compile_mode": str(cc.mode), "cudagraph_mode": str(cc.cudagraph_mode), "custom_ops": list(cc.custom_ops),
            "attention_backend": str(cfg.attention_config.backend),
            "ir_op_priority": {"rms_norm": cfg.kernel_config.ir_op_priority.rms_norm,
                               "fused_add_rms_norm": cfg.kernel_config.ir_op_priority.fused_add_rms_norm},
            "speculative": [spec.method, spec.num_speculative_tokens], "v2_model_runner": cfg.use_v2_model_runner,
            "async_scheduling": cfg.scheduler_config.async_scheduling, "max_num_seqs": cfg.scheduler_config.max_num_seqs,
            "kv_cache_memory_bytes": cfg.cache_config.kv_cache_memory_bytes,
            "fusion_passes_on": sorted(k for k, v in vars(cc.pass_config).items() if k.startswith("fuse") and v)}


def dry_run(kit: Path, work: Path, modes: list, throughput: bool = False) -> dict:
    from testbed.gpu import vllm_imports, vllm_throughput

    results = {"dry_run": True, "imports": vllm_imports.check(dry_run=True)}
    results["engine_configs"] = {mode: engine_config(kit, mode) for mode in modes}
    if throughput:
        results["engine_configs"]["throughput"] = engine_config(kit, "graphs", vllm_throughput.ARGS)
    (work / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


def by_arrival(t: traces.Trace) -> traces.Trace:
    """``t`` with its requests renamed ``r0``, ``r1``, ... in the order they arrived (vLLM names requests itself;
    the demo prompts are sent one by one in the same order to every mode)."""
    order = sorted(t.requests, key=lambda rid: (t.requests[rid].get("started_at") or 0.0, rid))
    name = {rid: f"r{i}" for i, rid in enumerate(order)}
    rename = lambda key: (name.get(key[0], key[0]), *key[1:])  # noqa: E731
    return traces.Trace(run=t.run, requests={name[r]: v for r, v in t.requests.items()},
                        steps={rename(k): v for k, v in t.steps.items()},
                        samples={rename(k): v for k, v in t.samples.items()}, health=t.health)


def compare_records(a: Path, b: Path) -> dict:
    """Whether two servers' traces of the same prompts record the same: verify steps, acceptance, target and
    draft top-k, samples (``traces.differences``, float32 tolerances), requests matched by arrival order."""
    ta, tb = by_arrival(traces.load(a)), by_arrival(traces.load(b))
    diffs = traces.differences(ta, tb)
    return {"equal": not diffs and bool(ta.steps), "steps": [len(ta.steps), len(tb.steps)], "differences": diffs}


PAIRS = {"graphs_equal_eager": "graphs", "graphs_sync_equal_eager": "graphs-sync"}  # results key: mode vs eager


def compare(modes: dict, other: str = "graphs") -> dict | None:
    """``other`` against ``eager``: answers prompt by prompt, accept lengths, and the tracer's records."""
    graphs, eager = modes.get(other, {}), modes.get("eager", {})
    if not graphs.get("answers") or not eager.get("answers"):
        return None
    same = [g["token_ids"] == e["token_ids"] for g, e in zip(graphs["answers"], eager["answers"])]
    out = {"prompts": len(same), "equal": sum(same), "accept_length": [graphs.get("accept_length"),
                                                                       eager.get("accept_length")]}
    if graphs.get("trace_records") and eager.get("trace_records"):
        try:
            out["records"] = compare_records(Path(eager["trace"]), Path(graphs["trace"]))
        except Exception as exc:  # noqa: BLE001 - this run's finding
            out["records"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def overview(results: dict) -> dict:
    """What the runner prints at the end: per mode (and scenario) whether it served, its accept length, records, sync errors and
    totals; the comparisons with eager (their first differences)."""
    served = {**results["modes"], **{f"graphs-{n}": r for n, r in results.get("scenarios", {}).items()}}
    modes = {m: {**{k: r.get(k) for k in ("up_s", "accept_length", "trace_records", "start_error", "request_error",
                                          "skipped")},
                 "sync_errors": r.get("log_facts", {}).get("sync_errors"),
                 "tracer_errors": (r.get("records") or {}).get("errors"),
                 "widths": (r.get("records") or {}).get("widths") if r.get("scenario") else None,
                 "totals": (r.get("records") or {}).get("totals")} for m, r in served.items()}
    compared = {}
    for key in PAIRS:
        c = results.get(key)
        records = (c or {}).get("records") or {}
        compared[key] = c and {**c, "records": {**records, "differences": records.get("differences", [])[:5]}}
    imports = results["imports"].get("modules", {})
    return {"imports_ok": all(r.get("ok") for r in imports.values()) or None,
            "hooks": (results.get("hooks") or {}).get("summary"), **modes, **compared}


ARCHITECTURES = ("LlamaForCausalLM", "LlamaForCausalLMEagle3")
PREWARM = """
import sys, threading
from vllm.model_executor.models.registry import ModelRegistry
threads = [threading.Thread(target=ModelRegistry._try_inspect_model_cls, args=(a,)) for a in sys.argv[1:]]
[t.start() for t in threads]; [t.join() for t in threads]
"""


def prewarm_registry(work: Path, architectures: tuple = ARCHITECTURES) -> subprocess.Popen:
    """vLLM inspects each architecture in a subprocess that imports vLLM (~33 s each on the device) and caches
    what it learns in ``~/.cache/vllm/modelinfos``: started here for both of the bed's, side by side and beside
    the import and hooks checks, so the first server finds them cached (``await_prewarm``)."""
    (work / "logs").mkdir(parents=True, exist_ok=True)
    with open(work / "logs" / "prewarm.log", "w") as out:
        return subprocess.Popen([sys.executable, "-c", PREWARM, *architectures], stdout=out, stderr=subprocess.STDOUT)


def await_prewarm(process: subprocess.Popen, started: float) -> dict:
    """The prewarm's outcome (a failure costs only the time it saves: the server inspects the models itself)."""
    try:
        rc = process.wait(timeout=240)
    except subprocess.TimeoutExpired:
        process.kill()
        rc = "timed out"
    return {"rc": rc, "s": round(time.monotonic() - started, 1)}


def hooks_check(work: Path) -> dict:
    """The hooks' path on CUDA under sync-debug (``tests/gpu/test_vllm_hooks_path.py``), in a fresh process."""
    src = Path(__file__).resolve().parents[2]
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--noconftest", "-m", "gpu", "-rA",
                        "tests/gpu/test_vllm_hooks_path.py"], cwd=src, capture_output=True, text=True, timeout=300)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    (work / "logs" / "hooks.log").write_text(p.stdout + p.stderr)
    return {"rc": p.returncode, "s": round(time.monotonic() - t0, 1),
            "summary": p.stdout.strip().splitlines()[-1:] if p.stdout else [], "tail": (p.stdout + p.stderr)[-3000:]}


def main() -> int:
    from testbed.gpu import throughput, vllm_throughput  # they build on this module

    ap = argparse.ArgumentParser(description="vLLM on CUDA from the kit: imports, then one server per mode.")
    ap.add_argument("--kit", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--modes", help="comma list of %(choices)s (default: %(default)s)"
                    % {"choices": list(MODES), "default": DEFAULT_MODES})
    ap.add_argument("--scenarios", default="", help="comma list of the tiny bed's scenarios to serve in graphs "
                    "mode after the modes, from %(choices)s" % {"choices": list(SCENARIOS)})
    ap.add_argument("--no-hooks", action="store_true", help="skip the hooks' sync-debug check on CUDA tensors")
    ap.add_argument("--kimi", action="store_true", help="the Kimi-shaped phase (testbed/gpu/vllm_kimi.py); no tiny "
                    "mode unless --modes names it")
    ap.add_argument("--kimi-servers", default="", help="with --kimi: only these servers, in this order (comma list "
                    "of VARIANT/DRAFT, e.g. llama/kimi-aux-off), no fallback between variants")
    ap.add_argument("--limit-s", type=float, default=500, help="stop starting work after this many seconds")
    ap.add_argument("--throughput", action="store_true", help="instead of the modes: the tracer's overhead against "
                    "vLLM without it (testbed/gpu/vllm_throughput.py); with --kimi, at Kimi widths")
    ap.add_argument("--throughput-s", type=float, default=vllm_throughput.DEFAULT_BUDGET_S,
                    help="seconds after the runner starts by which the throughput rounds end (default: %(default)s)")
    ap.add_argument("--throughput-servers", default=",".join(throughput.SERVERS),
                    help="with --throughput: the servers measured, no-tracer among them (default: %(default)s; "
                    "with --kimi an H100 takes two, e.g. no-tracer,every; unsampled: the tracer installed, nothing sampled; "
                    "no-tracer-b: a second server without it, the bed's own spread)")
    ap.add_argument("--throughput-levels", default=",".join(vllm_throughput.LEVELS),
                    help="with --throughput: the concurrency levels measured, of %(default)s (one alone: all the "
                    "call's rounds at it)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU here: the import check and the engine "
                                                            "configurations only (see the module's docstring)")
    a = ap.parse_args()
    from testbed.gpu import vllm_kimi  # it builds on this module

    modes = [m for m in (a.modes if a.modes is not None else "" if a.kimi else DEFAULT_MODES).split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {unknown}: choose from {list(MODES)}")
    scenarios = [s for s in a.scenarios.split(",") if s]
    if set(scenarios) - set(SCENARIOS):
        ap.error(f"unknown scenario(s) {sorted(set(scenarios) - set(SCENARIOS))}: choose from {list(SCENARIOS)}")
    wrong = [n for n in a.kimi_servers.split(",") if n and (n.split("/") + [""])[:2] not in
             [[v, d] for v in vllm_kimi.VARIANTS for d in vllm_kimi.DRAFTS]]
    if wrong:
        ap.error(f"unknown Kimi server(s) {wrong}: VARIANT/DRAFT of {list(vllm_kimi.VARIANTS)} x {list(vllm_kimi.DRAFTS)}")
    try:
        measured = throughput.servers(a.throughput_servers)
    except ValueError as exc:
        ap.error(str(exc))
    levels = {lv: vllm_throughput.LEVELS[lv] for lv in a.throughput_levels.split(",") if lv in vllm_throughput.LEVELS}
    if not levels or len(levels) != len(a.throughput_levels.split(",")):
        ap.error(f"--throughput-levels {a.throughput_levels!r}: a comma list of {list(vllm_throughput.LEVELS)}")
    deadline = time.monotonic() + a.limit_s
    a.work.mkdir(parents=True, exist_ok=True)
    if a.dry_run:
        r = dry_run(a.kit, a.work, modes, a.throughput)
        if a.kimi:
            r["kimi"] = vllm_kimi.dry_run(a.work)
            if a.throughput:
                r["kimi_throughput"] = vllm_kimi.describe(vllm_throughput.kimi_command(
                    vllm_kimi.write_configs(a.work / "kimi-configs"), 0, len(measured))[3:])
            (a.work / "results.json").write_text(json.dumps(r, indent=1) + "\n")
        print(json.dumps({"imports_ok": all(m["ok"] for m in r["imports"]["modules"].values()),
                          "platform": r["imports"]["platform"], "engine_configs": r["engine_configs"],
                          "kimi": r.get("kimi"), "kimi_throughput": r.get("kimi_throughput")}, indent=1))
        return 0 if all(m["ok"] for m in r["imports"]["modules"].values()) else 1
    results = {"kit": json.loads((a.kit / "manifest.json").read_text()), "modes": {}}
    architectures = vllm_kimi.ARCHITECTURES if a.kimi else ARCHITECTURES
    prewarm, prewarm_t0 = prewarm_registry(a.work, architectures), time.monotonic()
    kimi_models = vllm_kimi.start_models(a.work) if a.kimi else None
    save = lambda: (a.work / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")  # noqa: E731
    imports = subprocess.run([sys.executable, "-m", "testbed.gpu.vllm_imports", "--json", str(a.work / "imports.json")],
                             capture_output=True, text=True, timeout=300)
    results["imports"] = (json.loads((a.work / "imports.json").read_text()) if (a.work / "imports.json").exists()
                          else {"error": imports.stderr[-4000:]})
    save()
    if not a.no_hooks:
        results["hooks"] = hooks_check(a.work)
        print(f"[vllm_serve] hooks: rc={results['hooks']['rc']} {results['hooks']['summary']}", flush=True)
        save()
    results["prewarm"] = await_prewarm(prewarm, prewarm_t0)
    if a.throughput:
        began = deadline - a.limit_s
        if a.kimi:
            import torch

            results["kimi_models"] = made = vllm_kimi.await_models(kimi_models, a.work)
            vllm_throughput.kimi_phase(a.kit, a.work, made, began + a.throughput_s, results, save,
                                       torch.cuda.get_device_properties(0).total_memory, measured, levels)
        else:
            vllm_throughput.phase(a.kit, a.work, began + a.throughput_s, results, save, measured, levels)
        return 0 if "levels" in results["vllm_throughput"] else 1
    results["scenarios"] = {}
    results.update(dict.fromkeys(PAIRS))
    for mode, scenario in [*((m, None) for m in modes), *(("graphs", n) for n in scenarios)]:
        into = results["scenarios"] if scenario else results["modes"]
        failed = [m for m, r in results["modes"].items() if "start_error" in r]
        if failed:  # every server takes the same path to its start: the first failure is the finding
            into[scenario or mode] = {"mode": mode, "scenario": scenario, "skipped": f"{failed[0]} did not start"}
            continue
        into[scenario or mode] = r = serve(a.kit, a.work, mode, deadline, scenario)
        print(f"[vllm_serve] {mode} {scenario or ''}: up {r.get('up_s')} s, accept length {r.get('accept_length')}, "
              f"{r.get('trace_records')} records, {r.get('start_error') or r.get('request_error') or 'served'}",
              flush=True)
        for key, other in PAIRS.items():  # saved as soon as its pair is done: a runner cut by its limit keeps it
            if scenario is None and mode in ("eager", other):
                results[key] = compare(results["modes"], other)
        save()
    if a.kimi:
        vllm_kimi.run(a.work, kimi_models, deadline, results.setdefault("kimi", {}), save,
                      [tuple(n.split("/", 1)) for n in a.kimi_servers.split(",") if n])
    print(json.dumps(overview(results), indent=1, default=str))
    ok = all("answers" in r and "request_error" not in r for r in results["modes"].values())
    ok = ok and (not a.kimi or results["kimi"]["served"] is not None)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
