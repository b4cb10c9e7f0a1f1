"""Attach-time facts of a vLLM 0.32 engine (``RunRecord.facts``), read from the live model runner after it
loaded the target and the EAGLE-3 draft. Same keys as SGLang's (``facts.py``) where the meaning is the
same; what is vLLM's own is said as vLLM has it. Every reader returns None for what it cannot read.

Aux layers: vLLM feeds the draft Hugging Face ``hidden_states[i]`` for each id ``i`` (the input of layer
``i``; 0 is the embeddings), which is what SGLang's ``layers_to_capture`` counts too, so the ids are
recorded there unchanged (SGLang gets there by adding 1 to the config's ids, vLLM does not).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

import torch

from draftscope_tracer.engine import environment
from draftscope_tracer.engine.checkpoint import checkpoint_tensor, config_hash, safe as _safe, weights_check
from draftscope_tracer.redact import redact_message, redact_server_args

AUX_CONVENTION = "vllm: id i feeds hidden_states[i] (Hugging Face indexing: the input of layer i, 0 the embeddings)"
# vLLM's name for the draft's d2t; a parameter no checkpoint key fills under that name
D2T_PARAMETER = "draft_id_to_target_id"
SERVER_FIELDS = {  # run.server_args: vLLM's config objects, field by field (allow-listed again by redact)
    "model_config": ("model", "tokenizer", "dtype", "max_model_len", "enforce_eager", "seed"),
    "parallel_config": ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"),
    "scheduler_config": ("max_num_seqs", "max_num_batched_tokens", "async_scheduling", "enable_chunked_prefill"),
    "cache_config": ("block_size", "enable_prefix_caching"),
}
VLLM_ENV = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING")  # facts.vllm_env: flags and sizes
SPEC_FIELDS = ("method", "model", "num_speculative_tokens", "draft_tensor_parallel_size",
               "disable_padded_drafter_batch", "parallel_drafting")


def target_model(runner) -> Any:
    """The target model itself: with CUDA graphs on, vLLM wraps ``runner.model`` (``CUDAGraphWrapper``), and
    ``get_model`` unwraps it."""
    get = getattr(runner, "get_model", None)
    return get() if callable(get) else runner.model


def draft_model(runner) -> Any:
    """The draft model itself (``get_draft_model`` unwraps vLLM's CUDA-graph wrapper where the drafter has one)."""
    get = getattr(runner, "get_draft_model", None)
    return get() if callable(get) else runner.drafter.model


def _holder(model) -> Any:
    """The module that owns ``aux_hidden_state_layers`` (the decoder stack of a Llama-family target)."""
    inner = getattr(model, "model", None)
    return inner if hasattr(inner, "aux_hidden_state_layers") else model


def target_facts(runner) -> Dict[str, Any]:
    model, cfg = target_model(runner), runner.model_config.hf_config
    capture = bool(getattr(runner, "use_aux_hidden_state_outputs", False))
    layers = getattr(_holder(model), "aux_hidden_state_layers", None)
    return {
        "path": _safe(lambda: runner.model_config.model),
        "architecture": type(model).__name__,
        "num_layers": _safe(lambda: cfg.num_hidden_layers),
        "hidden_size": _safe(lambda: cfg.hidden_size),
        "vocab_size": _safe(lambda: cfg.vocab_size),
        "eagle3_capture_supported": hasattr(model, "set_aux_hidden_state_layers"),
        "capture_aux_hidden_states": capture,
        "layers_to_capture": [int(i) for i in layers] if capture and layers is not None else None,
        "aux_layer_ids": [int(i) for i in layers] if layers is not None else None,  # vLLM's, as it holds them
        "aux_convention": AUX_CONVENTION,
    }


def draft_facts(runner) -> Dict[str, Any]:
    model, target = draft_model(runner), target_model(runner)
    cfg = runner.speculative_config.draft_model_config.hf_config
    path = _safe(lambda: runner.speculative_config.draft_model_config.model)
    inner = getattr(model, "model", None)
    fc, embed = getattr(inner, "fc", None), getattr(inner, "embed_tokens", None)
    lm_head, target_head = getattr(model, "lm_head", None), getattr(target, "lm_head", None)
    uses_aux = getattr(inner, "use_aux_hidden_state", None)
    weights = _safe(weights_check, model, path, target)
    if weights:  # d2t is a buffer-like parameter in vLLM, filled from the checkpoint's "d2t"
        weights["not_in_checkpoint"] = [n for n in weights["not_in_checkpoint"] if not n.endswith(D2T_PARAMETER)]
    return {
        "path": path,
        "architecture": type(model).__name__,
        "config_architectures": getattr(cfg, "architectures", None),
        "hidden_size": _safe(lambda: cfg.hidden_size),
        "embed_width": _safe(lambda: int(embed.weight.shape[1])),
        "fc_in_features": _safe(lambda: int(fc.input_size)) if fc is not None else None,
        "use_aux_hidden_state": uses_aux,
        "fc_runs": bool(uses_aux and fc is not None),
        "lm_head_rows": _safe(lambda: int(lm_head.weight.shape[0])),
        "config_draft_vocab_size": getattr(cfg, "draft_vocab_size", None),
        "lm_head_shared_with_target": bool(lm_head is not None and target_head is not None and _safe(
            lambda: lm_head.weight.data_ptr() == target_head.weight.data_ptr())),
        "max_position_embeddings": getattr(cfg, "max_position_embeddings", None),
        "config": _safe(lambda: cfg.to_dict()),
        "hot_token_id": _safe(hot_token_facts, model, path, _safe(lambda: runner.model_config.get_vocab_size())),
        "weights": weights,
    }


def hot_token_facts(model, path: Optional[str], target_vocab: Optional[int]) -> Dict[str, Any]:
    """vLLM keeps d2t as loaded (offsets) and maps a draft id ``i`` to ``i + d2t[i]``: that map's range."""
    d2t = getattr(model, D2T_PARAMETER, None)
    if d2t is None:
        return {"present": False, "size": 0, "max_id": None, "min_id": None,
                "in_target_vocab": None, "equals_d2t_plus_arange": None}
    d2t = d2t.detach().to("cpu", torch.int64)
    hot = d2t + torch.arange(d2t.numel())
    ckpt = checkpoint_tensor(path, "d2t")
    return {
        "present": True, "size": int(hot.numel()), "max_id": int(hot.max()), "min_id": int(hot.min()),
        "in_target_vocab": bool(target_vocab is not None and int(hot.min()) >= 0 and int(hot.max()) < target_vocab),
        "equals_d2t_plus_arange": (None if ckpt is None or ckpt.numel() != d2t.numel() else
                                   bool(torch.equal(ckpt.to(torch.int64), d2t))),
    }


def server_args(vllm_config) -> Dict[str, Any]:
    """The allow-listed fields of vLLM's config (``redact_server_args`` drops anything else)."""
    out: Dict[str, Any] = {}
    for part, names in SERVER_FIELDS.items():
        obj = getattr(vllm_config, part, None)
        out.update({n: _plain(getattr(obj, n, None)) for n in names})
    spec = vllm_config.speculative_config
    out["speculative_config"] = {n: _plain(getattr(spec, n, None)) for n in SPEC_FIELDS} if spec is not None else None
    return redact_server_args(out)


def _plain(value: Any) -> Any:
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def collect_config(vllm_config, vllm_version: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(facts, run fields) from vLLM's config alone: what the engine core (its scheduler) knows."""
    spec = vllm_config.speculative_config
    method = getattr(spec, "method", None)
    k = getattr(spec, "num_speculative_tokens", None)
    target_path = _safe(lambda: vllm_config.model_config.model)
    draft_path = _safe(lambda: spec.draft_model_config.model)
    facts: Dict[str, Any] = {
        "vllm_version": vllm_version,
        "algorithm": method.upper() if isinstance(method, str) else None,
        "spec_method": method,
        "spec_num_steps": k,
        "spec_num_draft_tokens": k + 1 if isinstance(k, int) else None,
        "spec_topk": 1,
        "tp_size": _safe(lambda: vllm_config.parallel_config.tensor_parallel_size),
        "environment": _safe(environment.describe),
        "vllm_env": {k: os.environ[k] for k in VLLM_ENV if k in os.environ},
    }
    run = {"algorithm": facts["algorithm"], "target_path": target_path, "target_config_hash": config_hash(target_path),
           "draft_path": draft_path, "draft_config_hash": config_hash(draft_path),
           "server_args": _safe(server_args, vllm_config)}
    return facts, {k: v for k, v in run.items() if v is not None}


def start_failure(vllm_config, vllm_version: str, exc: BaseException) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(facts, run fields) of a worker that failed to load the models: :func:`collect_config`'s, the
    paths it was given and the exception (its message redacted), so a run that never served says why."""
    facts, run = collect_config(vllm_config, vllm_version)
    facts.update(start_error={"type": type(exc).__name__, "message": redact_message(str(exc), os.environ)},
                 target={"path": run.get("target_path")}, draft={"path": run.get("draft_path")})
    return facts, run


def collect(runner, vllm_version: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(facts, run fields) for the runner's target and EAGLE draft, over :func:`collect_config`'s."""
    facts, run = collect_config(runner.vllm_config, vllm_version)
    facts["cuda_graph"] = _safe(lambda: not runner.model_config.enforce_eager and runner.device.type == "cuda")
    facts["target"] = _safe(target_facts, runner)
    facts["draft"] = _safe(draft_facts, runner) if getattr(runner, "drafter", None) is not None else None
    target, draft = facts["target"] or {}, facts["draft"] or {}
    run.update({k: v for k, v in (("target_arch", target.get("architecture")),
                                  ("draft_arch", draft.get("architecture"))) if v is not None})
    return facts, run
