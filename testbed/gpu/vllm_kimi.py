"""The vLLM GPU kit's Kimi-shaped phase (``--kimi``): the seed's case at full width on vLLM 0.32 on CUDA.

    python -m testbed.gpu.vllm_serve --kit KIT --work DIR --kimi [--no-hooks] [--limit-s S]

The models are made on the device beside the import check (``testbed.gpu.kimi_models``: the Kimi-K2.5-shaped
target's ``config.json``, served with ``--load-format dummy``, and the EAGLE-3 drafts from a seed, aux ids
[20, 40, 60], ``d2t`` as offsets; here also ``target-llama``, :func:`llama_target_config`). Then one server after
the other, the healthy draft's and the seed's (``kimi-aux-off``: ``use_aux_hidden_state`` false, the CPU bed's
``aux-off`` edit), for the first target of ``VARIANTS`` whose healthy server answers:

- ``mla``: ``DeepseekV3ForCausalLM`` with MLA at Kimi's widths, ``TRITON_MLA`` for decode and verify, and vLLM's
  torch-SDPA MLA prefill (``--attention-config '{"mla_prefill_backend": "CPU"}'``: vLLM's own switch picks
  ``CPUSDPAMLAPrefillBackend`` whatever the platform; on CUDA it would choose FlashAttention, FlashInfer, TRT-LLM
  or cuDNN, binaries the kit lacks). Its q_a/kv_a projection for 1-16 tokens calls ``_C::dsv3_fused_a_gemm``
  (stood in by ``torch.mm``).
- ``llama``: a Llama target at the same widths (61 layers, 56 heads of 128, 8 KV heads, MLP 2048), served with
  ``TRITON_ATTN``, only when the ``mla`` healthy server does not start or answer.

Every server: bf16, vLLM's default compile and ``FULL_AND_PIECEWISE`` CUDA graphs (captured up to 32 tokens), the
draft loaded from its safetensors (``draft_load_config``) with ``TRITON_ATTN``, ``--skip-tokenizer-init`` (the
target has no tokenizer: prompts are token ids), no prefix caching (a cached prefix would take MLA's
context-chunk path, whose gather ops are stubs), the tracer as vLLM's plugin with a file sink and every request
sampled. Each answers ``PROMPTS`` (the random token ids of the SGLang Kimi phase's one-by-one requests,
``kimi_phase.prompt``) greedily, 32 new tokens, ``ignore_eos``, then is stopped with SIGTERM.

``results.json`` -> ``kimi``, saved as each step ends: ``models``, ``servers`` (per ``variant/draft``: what the tiny
bed's servers save, plus ``facts``: the tracer's attach-time facts of the target's aux capture (vLLM's reading of
the ids: which ``hidden_states`` it feeds) and of the draft's ``fc``; ``seed_case``: the widths the draft received
beside the ``fc`` input its checkpoint was trained on), ``served`` (the variant that answered, or None).
``--dry-run --kimi`` writes the full-width configs and parses each server's command line with vLLM's own parser
(the platform taken as one H200).
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

from testbed.gpu import kimi_models, kimi_phase
from testbed.gpu.vllm_servers import ENV, await_up, log_facts, spec_counters, start, trace_summary, wait_closed
from testbed.server import HOST, free_port, log_tail
from testbed.vllm_server import NUM_SPECULATIVE_TOKENS, VLLMServer

ARCHITECTURES = ("DeepseekV3ForCausalLM", "LlamaForCausalLM", "LlamaForCausalLMEagle3")  # prewarmed
VARIANTS = {"mla": "target", "llama": "target-llama"}  # variant -> its target's folder
DRAFTS = ("kimi-healthy", "kimi-aux-off")
COMMON_ARGS = ["--dtype", "bfloat16", "--load-format", "dummy", "--skip-tokenizer-init", "--max-model-len", "2048",
               "--max-num-seqs", "8", "--max-num-batched-tokens", "2048", "--gpu-memory-utilization", "0.85",
               "--no-enable-prefix-caching", "--seed", "0", "--shutdown-timeout", "10",
               "--compilation-config", json.dumps({"custom_ops": ["none"], "max_cudagraph_capture_size": 32}),
               "--ir-op-priority", json.dumps({"rms_norm": ["native"], "fused_add_rms_norm": ["native"]})]
VARIANT_ARGS = {"mla": ["--attention-backend", "TRITON_MLA", "--attention-config",
                        json.dumps({"mla_prefill_backend": "CPU"})],
                "llama": ["--attention-backend", "TRITON_ATTN"]}
PROMPTS = 4  # kimi_phase.prompt(0..3): 48-72 random token ids each
NEW_TOKENS = 32
START_TIMEOUT_S = 300
MIN_START_S = 100  # a server is not started with less left: start, four answers and the stop take more
LOG_FACTS = {"backends": r"Using (\S+) (?:MLA prefill )?backend",
             "aux_layers_logged": r"Using auxiliary layers from speculative config: (.*)"}


def llama_target_config(w: kimi_models.Widths) -> dict:
    """The ``llama`` variant's target: Llama at the Kimi target's widths (heads of ``w.head_dim``, GQA with 8 KV
    heads, 2 at toy widths), 61 layers so that ids 20, 40 and 60 exist; no weights (``--load-format dummy``)."""
    kimi = kimi_models.target_config(w)
    keep = ("hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size", "rms_norm_eps", "rope_theta",
            "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id", "torch_dtype")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **{k: kimi[k] for k in keep},
            "num_attention_heads": w.hidden // w.head_dim, "num_key_value_heads": 8 if w.hidden >= 1024 else 2,
            "head_dim": w.head_dim, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}


def write_configs(dest: Path, w: kimi_models.Widths = kimi_models.KIMI) -> Path:
    """The two targets' and two drafts' ``config.json`` alone (the dry run parses them; no weights)."""
    aux_off = kimi_models.draft_config(w)
    aux_off["eagle_config"]["use_aux_hidden_state"] = False
    configs = {"target": kimi_models.target_config(w), "target-llama": llama_target_config(w),
               "kimi-healthy": kimi_models.draft_config(w), "kimi-aux-off": aux_off}
    for name, config in configs.items():
        (dest / name).mkdir(parents=True, exist_ok=True)
        (dest / name / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dest


def start_models(work: Path) -> subprocess.Popen:
    """``testbed.gpu.kimi_models`` into ``WORK/kimi-models`` in its own process, beside the import check."""
    (work / "logs").mkdir(parents=True, exist_ok=True)
    with open(work / "logs" / "kimi-models.log", "w") as out:
        return subprocess.Popen([sys.executable, "-m", "testbed.gpu.kimi_models", str(work / "kimi-models")],
                                stdout=out, stderr=subprocess.STDOUT)


def await_models(process: subprocess.Popen, work: Path) -> dict:
    """What ``kimi_models`` made (its last line), with the Llama target's config written beside; ``error``
    with its log's tail if it failed."""
    rc = process.wait(timeout=300)
    log = work / "logs" / "kimi-models.log"
    if rc:
        return {"error": f"kimi_models exit code {rc}", "log_tail": log_tail(log, 40)}
    made = json.loads(next(ln for ln in reversed(log.read_text().splitlines()) if ln.startswith("{")))
    target = Path(made["dest"]) / VARIANTS["llama"]
    target.mkdir(exist_ok=True)
    (target / "config.json").write_text(json.dumps(llama_target_config(kimi_models.KIMI), indent=2) + "\n")
    return made


def command(models: Path, variant: str, draft: str, port: int) -> list:
    spec = {"method": "eagle3", "model": str(models / draft), "num_speculative_tokens": NUM_SPECULATIVE_TOKENS,
            "attention_backend": "TRITON_ATTN", "draft_load_config": {"load_format": "safetensors"}}
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(models / VARIANTS[variant]),
            "--host", HOST, "--port", str(port), "--speculative-config", json.dumps(spec), *COMMON_ARGS,
            *VARIANT_ARGS[variant]]


def ask(server: VLLMServer, ids: list) -> dict:
    """Greedy ``/v1/completions`` of token ids (no tokenizer), ``NEW_TOKENS`` whatever is drawn."""
    body = {"model": server.model, "prompt": ids, "max_tokens": NEW_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    choice = server._post("/v1/completions", body)["choices"][0]
    return {"prompt_tokens": len(ids), "token_ids": choice.get("token_ids")}


def trained_fc_in(draft: Path) -> int | None:
    """The input width of ``fc.weight`` in the draft's checkpoint (its safetensors header): what it was trained on."""
    for path in sorted(draft.glob("*.safetensors")):
        with open(path, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        if "fc.weight" in header:
            return header["fc.weight"]["shape"][1]
    return None


def run_facts(trace: Path) -> dict:
    """The tracer's attach-time facts of the aux capture and the draft's ``fc`` (allow-listed)."""
    from testbed.gpu import traces

    facts = traces.load(trace).run.get("facts") or {}
    target, draft = facts.get("target") or {}, facts.get("draft") or {}
    return {"target": {k: target.get(k) for k in ("architecture", "hidden_size", "num_layers", "aux_layer_ids",
                                                  "layers_to_capture", "capture_aux_hidden_states", "aux_convention")},
            "draft": {k: draft.get(k) for k in ("architecture", "hidden_size", "fc_in_features", "use_aux_hidden_state",
                                                "fc_runs", "lm_head_rows")},
            "draft_aux_ids": ((draft.get("config") or {}).get("eagle_config") or {}).get(
                "eagle_aux_hidden_state_layer_ids"),
            "cuda_graph": facts.get("cuda_graph")}


def seed_case(draft: Path, records: dict) -> dict:
    """The widths the draft received (``draft.input`` at every phase) and whether ``fc`` was sampled, beside the
    ``fc`` input of its checkpoint: the seed reads 7168 received where it was trained on 21504."""
    widths = records.get("widths") or {}
    received = sorted({w for k, ws in widths.items() if k.startswith("draft.input@") for w in ws if w is not None})
    return {"draft_input_widths": received, "trained_fc_in": trained_fc_in(draft),
            "fc_sampled": any(k.startswith("draft.fc") for k in widths)}


def serve(models: Path, work: Path, variant: str, draft: str, deadline: float) -> dict:
    """One server of ``variant`` with ``draft``: start, the prompts one by one, counters, SIGTERM; what it showed."""
    name = f"{variant}-{draft}"
    log, trace = work / "logs" / f"{name}.log", work / "traces" / f"{name}.jsonl"
    trace.parent.mkdir(parents=True, exist_ok=True)
    kimi_phase.wait_gpu_free()
    port, t0 = free_port(), time.monotonic()
    cmd = command(models, variant, draft, port)
    server = start(cmd, port, log, {**ENV, "DRAFTSCOPE_FILE": str(trace)})
    server.model = str(models / VARIANTS[variant])
    result = {"variant": variant, "draft": draft, "args": cmd[3:], "trace": str(trace)}
    try:
        if error := await_up(server, t0, deadline, START_TIMEOUT_S):
            result["start_error"] = error
            return result
        result["up_s"] = round(time.monotonic() - t0, 1)
        result["answers"] = [ask(server, kimi_phase.prompt(i)) for i in range(PROMPTS) if time.monotonic() < deadline]
        result["spec_counters"], result["accept_length"] = spec_counters(server)
    except Exception as exc:  # noqa: BLE001 - a request that fails is this run's finding
        result["request_error"] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        server.stop()
        result.update(trace_closed=wait_closed(trace), log_facts={**log_facts(log), **_log_facts(log)})
        result["trace_records"] = sum(1 for _ in open(trace)) if trace.exists() else 0
        if result["trace_records"]:
            result["records"] = trace_summary(trace, result.get("spec_counters"))
            result["facts"] = run_facts(trace)
            result["seed_case"] = seed_case(models / draft, result["records"])
        if "start_error" in result or "request_error" in result:
            result["log_tail"] = log_tail(log, 60)
    return result


def _log_facts(log: Path) -> dict:
    text = log.read_text(errors="replace") if log.exists() else ""
    return {key: sorted(set(re.findall(pattern, text)))[:10] for key, pattern in LOG_FACTS.items()}


def answered(r: dict) -> bool:
    return bool(r.get("answers")) and "request_error" not in r


def line(name: str, r: dict) -> str:
    """One server in a line: start, accept length, what the draft received against its training, aux capture."""
    case, facts = r.get("seed_case") or {}, (r.get("facts") or {}).get("target") or {}
    totals = ((r.get("records") or {}).get("totals") or {}).get("equal")
    outcome = r.get("skipped") or r.get("start_error") or r.get("request_error") or "served"
    return (f"[vllm_kimi] {name}: up {r.get('up_s')} s, accept length {r.get('accept_length')}, draft input "
            f"{case.get('draft_input_widths')} (trained on {case.get('trained_fc_in')}), aux ids "
            f"{facts.get('aux_layer_ids')} captured {facts.get('layers_to_capture')}, {r.get('trace_records')} "
            f"records, totals equal {totals}, {outcome}")


def run(work: Path, models_process: subprocess.Popen, deadline: float, into: dict, save, only: list = ()) -> dict:
    """The phase: the models, then each variant's two servers until one's healthy server answers, or exactly the
    ``(variant, draft)`` servers of ``only`` (``into`` is ``results["kimi"]``, saved by ``save()`` after each step)."""
    into.update(models=await_models(models_process, work), servers={}, served=None)
    save()
    if "error" in into["models"]:
        return into
    models = Path(into["models"]["dest"])
    plan = [[pair] for pair in only] or [[(variant, draft) for draft in DRAFTS] for variant in VARIANTS]
    for servers in plan:
        variant = servers[0][0]
        for _, draft in servers:
            name, left = f"{variant}/{draft}", deadline - time.monotonic()
            if left < MIN_START_S:
                r = {"variant": variant, "draft": draft, "skipped": f"{left:.0f} s left"}
            else:
                r = serve(models, work, variant, draft, deadline)
            into["servers"][name] = r
            print(line(name, r), flush=True)
            save()
            if draft == DRAFTS[0] and not answered(r):
                break  # this target does not serve: the next variant
        if not only and answered(into["servers"].get(f"{variant}/{DRAFTS[0]}", {})):
            into["served"] = variant
            save()
            break
    if only:
        into["served"] = next((n.split("/")[0] for n, r in into["servers"].items() if answered(r)), None)
    print(json.dumps(overview(into), indent=1, default=str), flush=True)
    return into


def overview(kimi: dict) -> dict:
    """Which target served, and per server the lines a reader checks first."""
    out = {"served": kimi.get("served") and f"{kimi['served']}: " + (
        "DeepseekV3ForCausalLM with MLA at Kimi-K2.5's widths" if kimi["served"] == "mla"
        else "a Llama target at the same widths (LlamaForCausalLM)"), "models_error": kimi["models"].get("error")}
    for name, r in kimi.get("servers", {}).items():
        out[name] = {"up_s": r.get("up_s"), "accept_length": r.get("accept_length"),
                     "outcome": r.get("skipped") or r.get("start_error") or r.get("request_error") or "served",
                     "seed_case": r.get("seed_case"), "aux": (r.get("facts") or {}).get("target"),
                     "totals": ((r.get("records") or {}).get("totals")),
                     "tracer_errors": (r.get("records") or {}).get("errors"), "backends": r.get("log_facts", {}).get(
                         "backends"), "stubs_called": r.get("log_facts", {}).get("stubs_called")}
    return out


def describe(argv: list) -> dict:
    """What vLLM makes of a server's command line (its parser, ``create_engine_config``; no engine), and with the
    platform it runs on (a faked H200 in the dry run): the target's attention backend and MLA prefill backend
    as vLLM selects them, and the aux ids its GPU model runner reads from the draft's config."""
    from types import SimpleNamespace

    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.attention.selector import get_attn_backend
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    os.environ.update({k: v for k, v in ENV.items() if k.startswith("VLLM_")})
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    cfg = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    cc, spec, model = cfg.compilation_config, cfg.speculative_config, cfg.model_config
    out = {"architectures": model.architectures, "use_mla": model.use_mla, "dtype": str(model.dtype),
           "compile_mode": str(cc.mode), "cudagraph_mode": str(cc.cudagraph_mode),
           "capture_sizes": cc.cudagraph_capture_sizes, "custom_ops": list(cc.custom_ops),
           "fusion_passes_on": sorted(k for k, v in vars(cc.pass_config).items() if k.startswith("fuse") and v),
           "attention_backend": str(cfg.attention_config.backend),
           "mla_prefill_backend": str(cfg.attention_config.mla_prefill_backend),
           "prefix_caching": cfg.cache_config.enable_prefix_caching, "load_format": cfg.load_config.load_format,
           "speculative": [spec.method, spec.num_speculative_tokens], "draft_architectures":
               spec.draft_model_config.architectures, "draft_attention_backend": str(spec.attention_backend),
           "draft_load_format": spec.draft_load_config and spec.draft_load_config.load_format,
           "aux_ids_read": GPUModelRunner._get_eagle3_aux_layers_from_config(SimpleNamespace(speculative_config=spec)),
           "v2_model_runner": cfg.use_v2_model_runner, "async_scheduling": cfg.scheduler_config.async_scheduling,
           "max_num_seqs": cfg.scheduler_config.max_num_seqs,
           "gpu_memory_utilization": cfg.cache_config.gpu_memory_utilization,
           "kv_cache_memory_bytes": cfg.cache_config.kv_cache_memory_bytes}
    with set_current_vllm_config(cfg):
        head = model.get_head_size()
        out["target_attention_selected"] = get_attn_backend(head, model.dtype, "auto", use_mla=model.use_mla,
                                                            num_heads=model.get_num_attention_heads(cfg.parallel_config)
                                                            ).get_name()
        if model.use_mla:
            from vllm.v1.attention.backends.mla.prefill.selector import get_mla_prefill_backend

            out["mla_prefill_selected"] = get_mla_prefill_backend(cfg).get_name()
    return out


def dry_run(work: Path) -> dict:
    """Each server's command line at full width (configs only) parsed as :func:`describe` says."""
    models = write_configs(work / "kimi-configs")
    out = {}
    for variant in VARIANTS:
        for draft in DRAFTS:
            try:
                out[f"{variant}/{draft}"] = describe(command(models, variant, draft, 0)[3:])
            except Exception as exc:  # noqa: BLE001 - the dry run's finding
                out[f"{variant}/{draft}"] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    return out
