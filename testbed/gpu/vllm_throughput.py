"""Tracer overhead on vLLM in tokens/s, against vLLM without the tracer: the vLLM GPU kit's throughput phase.

    bash .cache/vllm-gpu-kit/run.sh --no-hooks --throughput [--throughput-s S]

Three vLLM 0.32 servers of the tiny bed (target and EAGLE-3 draft, ``vllm_servers``' ``SERVER_ARGS`` and ``ENV``,
CUDA graphs on, ``ARGS``), started together: **no tracer** (the tracer's folder is not on its path, so vLLM finds
no draftscope entry point in ``vllm.general_plugins``: what a user without draftscope runs), **1 in 16** and
**every request** sampled (file sink). Then ``testbed/gpu/throughput.py``'s ``measure_levels`` at 1, 8 and 64
concurrent requests (``LEVELS``): the demo prompts, greedy, exactly the level's new tokens (``ignore_eos``), the
servers' order shuffled per level and round, rounds until the deadline, the first a warm-up; cost = no tracer's
tokens/s over the server's, minus 1, per round: the median with a 95% bootstrap interval.

Request ``j % 16 == 0`` of each level is the one sampled at 1 in 16: the client names each request
(``request_id``), vLLM's OpenAI server makes it ``cmpl-<id>-0`` and, with ``VLLM_DISABLE_REQUEST_ID_RANDOMIZATION=1``
(all three servers), adds no random suffix. Each server's KV cache is sized (``--kv-cache-memory-bytes``): vLLM's
memory profiling assumes that no other process changes its GPU memory meanwhile, which servers starting together do.

``results.json``: ``vllm_throughput`` (saved after every round) and ``vllm_throughput_servers`` (start, the log's
facts, the tracer's lines; per traced server its trace's requests, how many sampled, the tracer's errors and drops).
``bench/gpu_throughput.py`` prints the table again.

``--throughput --kimi`` (:func:`kimi_phase`): the same three servers at production widths, the Kimi phase's Llama
target (``vllm_kimi``: 61 layers at hidden 7168, vocabulary 163,840, bf16 dummy weights) and its healthy EAGLE-3
draft, prompts of random token ids (``kimi_phase.prompt``: the target has no tokenizer), CUDA graphs captured at
the token counts of 1, 8 and 64 verifies and the powers of two between (``KIMI_ARGS``). Three such servers need
~100 GB: on a smaller GPU the phase records why it did not run. ``--throughput-servers no-tracer,every`` (or
``no-tracer,1/16``) starts two of them, which an H100 takes.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Callable

from testbed.gpu import kimi_phase as kimi_prompts, throughput, traces, vllm_kimi, vllm_servers
from testbed.gpu.bed import Bed, Spec
from testbed.texts import DEMO_PROMPTS
from testbed.vllm_server import VLLMServer

LEVELS = {"1": (16, 32), "8": (32, 64), "64": (128, 64)}  # concurrent requests -> (requests a round, new tokens)
ARGS = ["--max-num-seqs", "64", "--kv-cache-memory-bytes", str(1 << 30)]  # after SERVER_ARGS: the last one counts
ENV = {**{k: v for k, v in vllm_servers.ENV.items() if not k.startswith("DRAFTSCOPE_")},
       "VLLM_DISABLE_REQUEST_ID_RANDOMIZATION": "1"}
START_TIMEOUT_S = 300
DEFAULT_BUDGET_S = 440  # after the runner starts: the rounds end by then; stopping and summaries take ~30 s more


# after vllm_kimi.command's: the last of an option counts. Each server asks its share of KIMI_GPU_SHARE of the GPU at
# its start (vLLM refuses to start when that much is not free: 0.28 each of three) and a fixed KV cache (~15,000
# tokens of the 61-layer target);
# graphs captured at the token counts a level's full batch of verifies takes (1, 8 and 64 requests x 4 tokens) and
# the powers of two between (vLLM pads a step to the next one): 7 sizes, not the ~35 of a default list to 256, which
# three 61-layer servers capturing at once would take minutes over
KIMI_CAPTURE_SIZES = [4, 8, 16, 32, 64, 128, 256]
KIMI_ARGS = ["--max-num-seqs", "64", "--kv-cache-memory-bytes", str(4 << 30),
             "--compilation-config", json.dumps({"custom_ops": ["none"], "cudagraph_capture_sizes": KIMI_CAPTURE_SIZES})]
KIMI_GPU_SHARE = 0.84
KIMI_START_TIMEOUT_S = 420  # the Kimi-width servers building and capturing graphs at once
KIMI_VARIANT, KIMI_DRAFT = "llama", "kimi-healthy"
# a server's ~24 GB of weights, its KV cache, graphs and activations: three need an H200, two fit an H100 (80 GiB)
KIMI_GPU_BYTES_PER_SERVER = 36 * 2**30


def send(server: VLLMServer, rid: str, prompt, new_tokens: int) -> int:
    """One greedy ``/v1/completions`` request of exactly ``new_tokens`` named ``rid`` (``prompt``: text, or token
    ids): its completion tokens."""
    return len(server.complete(prompt, new_tokens, request_id=rid, ignore_eos=True)["token_ids"])


VLLM = throughput.Client(send, seen=lambda rid: f"cmpl-{rid}-0")


def prompt(seed: int) -> str:
    return DEMO_PROMPTS[seed % len(DEMO_PROMPTS)]


class VLLMBed(Bed):
    """The bed's servers as vLLM OpenAI servers: ``base(port)`` is the command line before each spec's args."""

    def __init__(self, kit: Path, work: Path, tracer_site: str, server_path: str, base: Callable[[int], list],
                 env: dict = ENV):
        super().__init__(kit, work, tracer_site, server_path)
        self.base, self.env = base, env

    def command(self, spec: Spec, port: int) -> list:
        return [*self.base(port), *spec.args]

    def handle(self, spec: Spec, process, url: str, log: Path) -> VLLMServer:
        server = VLLMServer(process, url, log)
        server.model = str(spec.target)
        return server

    def facts(self, log: Path) -> dict:
        return vllm_servers.log_facts(log)


def tracer_paths() -> tuple[str, str]:
    """(the tracer's folder, ``PYTHONPATH`` without it). Refused where draftscope is installed elsewhere on the
    path too (a venv's site-packages): the server without the tracer would load its vLLM plugin all the same."""
    import draftscope_tracer

    site = Path(draftscope_tracer.__file__).resolve().parents[1]
    elsewhere = [p for p in sys.path if p and Path(p).resolve() != site]
    if any(d.metadata["Name"] == "draftscope" for d in importlib.metadata.distributions(path=elsewhere)):
        raise RuntimeError(f"draftscope is installed outside {site}: a server without the tracer would load its vLLM "
                           "plugin too (run with the tracer on PYTHONPATH only, as the kit's run.sh does)")
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != site]
    return str(site), os.pathsep.join(rest)


PLUGINS = "import importlib.metadata as m, json; print(json.dumps([e.value for e in m.entry_points(group=%r)]))"


def general_plugins(path: str) -> list:
    """The ``vllm.general_plugins`` entry points this Python finds with ``path`` as ``PYTHONPATH``: what vLLM loads."""
    out = subprocess.run([sys.executable, "-c", PLUGINS % "vllm.general_plugins"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": path}, timeout=60)
    return json.loads(out.stdout) if out.returncode == 0 else [out.stderr[-500:]]


def specs(target: Path, draft: Path, args: list, names: tuple = throughput.SERVERS) -> list:
    """The servers of ``names`` (of ``throughput.CONFIGS``; by default no tracer, 1 in 16, every request)."""
    return [Spec(name, target, draft, args, throughput.CONFIGS[name]) for name in names]


def trace_records(trace: Path) -> dict:
    """What the tracer recorded: requests, how many sampled, verify steps, its errors and drops."""
    t = traces.load(trace)
    return {**t.summary(), "sampled": sum(1 for r in t.requests.values() if r.get("sampled"))}


def run(bed: VLLMBed, servers: list, deadline: float, on_round: Callable | None = None,
        levels: dict = LEVELS, prompts: Callable = prompt, start_timeout: float = START_TIMEOUT_S) -> dict:
    """Start ``servers`` together, rounds at ``levels`` until ``deadline`` (``time.monotonic``) with ``prompts(seed)``,
    stop them; the results' keys (``vllm_throughput_plugins``: the vLLM plugins found without and with the tracer's
    folder)."""
    plugins = {"no-tracer": general_plugins(bed.server_path),
               "traced": general_plugins(os.pathsep.join([bed.tracer_site, bed.server_path]))}
    state = bed.start_all(servers, start_timeout)
    failed = [name for name, s in state.items() if not s["ok"]]
    try:
        if failed:
            raise RuntimeError(f"not started: {failed}")
        handles = {name: s["handle"] for name, s in state.items()}
        result = throughput.measure_levels(handles, prompts, deadline, levels, client=VLLM, on_round=on_round)
        print(throughput.levels_table(result), flush=True)
    except Exception as exc:  # noqa: BLE001 - this run's finding
        result = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    time.sleep(1.0)  # flush intervals: every finished request reaches the file before SIGTERM
    bed.stop_all(state)
    for s in state.values():
        if s["trace"]:
            s["trace_closed"] = vllm_servers.wait_closed(Path(s["trace"]))
            s["records"] = trace_records(Path(s["trace"])) if Path(s["trace"]).exists() else None
    return {"vllm_throughput": result, "vllm_throughput_servers": state, "vllm_throughput_plugins": plugins}


def _saver(results: dict, save: Callable) -> Callable:
    def on_round(summary: dict) -> None:
        results["vllm_throughput"] = summary
        save()
    return on_round


def _report(results: dict) -> None:
    print(json.dumps({n: {k: s.get(k) for k in ("ok", "start_s", "error", "records")}
                      for n, s in results["vllm_throughput_servers"].items()}, indent=1, default=str), flush=True)


def phase(kit: Path, work: Path, deadline: float, results: dict, save: Callable,
          names: tuple = throughput.SERVERS, levels: dict = LEVELS) -> None:
    """The runner's ``--throughput``: the kit's models, ``vllm_servers.command`` in graphs mode with ``ARGS``, the
    servers of ``names`` at ``levels`` (of ``LEVELS``); into ``results``, saved after every round and at the end."""
    bed = VLLMBed(kit, work, *tracer_paths(), partial(vllm_servers.command, kit, mode="graphs"))
    models = kit / "models"
    results.update(run(bed, specs(models / "target", models / "draft", ARGS, names), deadline,
                       _saver(results, save), levels))
    save()
    _report(results)


def kimi_command(models: Path, port: int, servers: int = len(throughput.SERVERS)) -> list:
    """A Kimi-width server's command line, one of ``servers`` on the GPU: the Kimi phase's, then ``KIMI_ARGS`` and
    its share of the GPU."""
    share = f"{KIMI_GPU_SHARE / servers:.2f}"
    return [*vllm_kimi.command(models, KIMI_VARIANT, KIMI_DRAFT, port), *KIMI_ARGS, "--gpu-memory-utilization", share]


def kimi_phase(kit: Path, work: Path, models: dict, deadline: float, results: dict, save: Callable,
               gpu_bytes: int, names: tuple = throughput.SERVERS, levels: dict = LEVELS) -> None:
    """The runner's ``--throughput --kimi``: Kimi-width servers (``kimi_command``) of ``names`` (of ``throughput.CONFIGS``)
    at ``levels`` on ``models`` (``vllm_kimi.await_models``' result), prompts of token ids; into ``results`` as :func:`phase` does.
    Not run on a GPU of fewer than ``KIMI_GPU_BYTES_PER_SERVER`` a server (``gpu_bytes``), nor without the models:
    ``vllm_throughput`` says why."""
    need = len(names) * KIMI_GPU_BYTES_PER_SERVER
    if gpu_bytes < need:
        results["vllm_throughput"] = {"error": f"{len(names)} Kimi-width servers need {need >> 30} GiB of GPU memory; "
                                               f"this GPU has {gpu_bytes >> 30} GiB (an H200 has 139 for three; an "
                                               "H100 takes two: --throughput-servers no-tracer,every)"}
    elif "error" in models:
        results["vllm_throughput"] = {"error": f"the Kimi models were not made: {models['error']}"}
    if "vllm_throughput" in results:
        save()
        return
    dest = Path(models["dest"])
    bed = VLLMBed(kit, work, *tracer_paths(), lambda port: kimi_command(dest, port, len(names)))
    servers = specs(dest / vllm_kimi.VARIANTS[KIMI_VARIANT], dest / KIMI_DRAFT, [], names)
    results.update(run(bed, servers, deadline, _saver(results, save), levels, prompts=kimi_prompts.prompt,
                       start_timeout=KIMI_START_TIMEOUT_S))
    save()
    _report(results)
