"""Attach-time facts (``RunRecord.facts``), read from the live scheduler after its workers are built.

Every reader returns None for what it cannot read; nothing here guesses.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Tuple

import torch

from draftscope_tracer.engine import environment
from draftscope_tracer.engine.checkpoint import checkpoint_tensor, config_hash, safe as _safe, weights_check
from draftscope_tracer.device.recompute import fc_in_features
from draftscope_tracer.redact import is_allowed, redact_message, redact_server_args

def _hf_config(model_config) -> Any:
    return getattr(model_config, "hf_config", None)


def _inner_lm(model) -> Any:
    """The module that owns the capture flag (Kimi-K2.5 wraps a DeepSeek LM)."""
    return getattr(model, "language_model", model)


def target_facts(runner) -> Dict[str, Any]:
    model, cfg = runner.model, _hf_config(runner.model_config)
    lm = _inner_lm(model)
    layers = getattr(getattr(lm, "model", None), "layers_to_capture", None)
    return {
        "path": _safe(lambda: runner.model_config.model_path),
        "architecture": type(model).__name__,
        "num_layers": _safe(lambda: cfg.num_hidden_layers),
        "hidden_size": _safe(lambda: cfg.hidden_size),
        "vocab_size": _safe(lambda: cfg.vocab_size),
        "eagle3_capture_supported": hasattr(model, "set_eagle3_layers_to_capture"),
        "capture_aux_hidden_states": bool(getattr(lm, "capture_aux_hidden_states", False)),
        "layers_to_capture": [int(i) for i in layers] if layers is not None else None,
    }


def draft_facts(draft_worker, target_runner) -> Dict[str, Any]:
    runner = draft_worker.draft_runner
    model, cfg = runner.model, _hf_config(runner.model_config)
    inner = getattr(model, "model", None)
    fc = getattr(inner, "fc", None)
    embed = getattr(inner, "embed_tokens", None)
    lm_head = getattr(model, "lm_head", None)
    target_head = getattr(target_runner.model, "lm_head", None)
    path = _safe(lambda: runner.model_config.model_path)
    return {
        "path": path,
        "architecture": type(model).__name__,
        "hidden_size": _safe(lambda: cfg.hidden_size),
        "embed_width": _safe(lambda: int(embed.weight.shape[1])),
        "fc_in_features": fc_in_features(fc),
        "lm_head_rows": _safe(lambda: int(lm_head.weight.shape[0])),
        "config_draft_vocab_size": getattr(cfg, "draft_vocab_size", None),
        "lm_head_shared_with_target": bool(lm_head is not None and target_head is not None and _safe(
            lambda: lm_head.weight.data_ptr() == target_head.weight.data_ptr())),
        "max_position_embeddings": getattr(cfg, "max_position_embeddings", None),  # after any override
        "checkpoint_max_position_embeddings": _safe(_checkpoint_config_value, path, "max_position_embeddings"),
        "context_len": _safe(lambda: runner.model_config.context_len),
        "config": _safe(lambda: cfg.to_dict()) if cfg is not None else None,
        "hot_token_id": hot_token_facts(draft_worker, path, _safe(lambda: target_runner.model_config.vocab_size)),
        "weights": _safe(weights_check, model, path, target_runner.model),
    }


def _checkpoint_config_value(path: Optional[str], key: str) -> Any:
    """``key`` of the checkpoint's own config.json (SGLang may overwrite the live config's)."""
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    return (config.get("transformer_layer_config") or config).get(key)


def hot_token_facts(draft_worker, path: Optional[str], target_vocab: Optional[int]) -> Dict[str, Any]:
    hot = getattr(draft_worker, "hot_token_id", None)
    if hot is None:
        return {"present": False, "size": 0, "max_id": None, "min_id": None,
                "in_target_vocab": None, "equals_d2t_plus_arange": None}
    hot = hot.detach().to("cpu", torch.int64)
    d2t = checkpoint_tensor(path, "d2t")
    return {
        "present": True, "size": int(hot.numel()), "max_id": int(hot.max()), "min_id": int(hot.min()),
        "in_target_vocab": bool(target_vocab is not None and int(hot.min()) >= 0 and int(hot.max()) < target_vocab),
        "equals_d2t_plus_arange": (None if d2t is None or d2t.numel() != hot.numel() else
                                   bool(torch.equal(d2t.to(torch.int64) + torch.arange(d2t.numel()), hot))),
    }


def server_args_facts(server_args) -> Dict[str, Any]:
    """The allow-listed fields of a live ``ServerArgs`` (a msgspec Struct in 0.5.23, its fields outside
    ``__dict__``), with resolution's decisions over them; a secret field is never read."""
    names = getattr(type(server_args), "__struct_fields__", None) or tuple(vars(server_args))
    fields = {name: getattr(server_args, name, None) for name in names if is_allowed(name)}
    return redact_server_args({**fields, "_resolved_overrides": getattr(server_args, "_resolved_overrides", None)})


# Environment variables that change what SGLang does at start (spec/sglang.py OVERRIDE_ENV); their
# values are flags, recorded as given.
SGLANG_ENV = ("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "SGLANG_IS_IN_CI")


def sglang_env() -> Dict[str, str]:
    return {k: os.environ[k] for k in SGLANG_ENV if k in os.environ}


def start_failure(scheduler, sglang_version: str, exc: BaseException) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(facts, run fields) of a scheduler whose workers failed to build: the paths and flags it was
    given and the exception (its message redacted), so a run that never served says why."""
    server_args = getattr(scheduler, "server_args", None)
    target_path = getattr(server_args, "model_path", None)
    draft_path = getattr(server_args, "speculative_draft_model_path", None)
    algorithm = _safe(lambda: str(getattr(server_args, "speculative_algorithm", None) or "") or None)
    facts = {"sglang_version": sglang_version, "algorithm": algorithm,
             "start_error": {"type": type(exc).__name__, "message": redact_message(str(exc), os.environ)},
             "target": {"path": target_path}, "draft": {"path": draft_path},
             "sglang_env": sglang_env(), "environment": _safe(environment.describe)}
    run = {"algorithm": algorithm, "target_path": target_path, "draft_path": draft_path,
           "target_config_hash": config_hash(target_path), "draft_config_hash": config_hash(draft_path),
           "server_args": _safe(server_args_facts, server_args)}
    return facts, {k: v for k, v in run.items() if v is not None}


def collect(scheduler, sglang_version: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(facts, run fields) for the scheduler's target and EAGLE draft."""
    spec_worker = getattr(scheduler, "draft_worker", None)
    target_runner = scheduler.tp_worker.model_runner
    server_args = getattr(scheduler, "server_args", None)
    draft_worker = getattr(spec_worker, "draft_worker", None)
    facts: Dict[str, Any] = {
        "sglang_version": sglang_version,
        "algorithm": _safe(lambda: spec_worker.speculative_algorithm.name),
        "spec_num_steps": getattr(spec_worker, "speculative_num_steps", None),
        "spec_num_draft_tokens": getattr(spec_worker, "speculative_num_draft_tokens", None),
        "spec_topk": getattr(spec_worker, "topk", None),
        "cuda_graph": _safe(lambda: getattr(draft_worker, "cuda_graph_runner", None) is not None
                            or getattr(target_runner, "graph_runner", None) is not None
                            or getattr(draft_worker, "cuda_graph_runner_for_draft_extend", None) is not None),
        "tp_size": getattr(server_args, "tp_size", None),
        "target": _safe(target_facts, target_runner),
        "draft": _safe(draft_facts, draft_worker, target_runner) if draft_worker is not None else None,
        "environment": _safe(environment.describe),
        "sglang_env": sglang_env(),
    }
    target, draft = facts["target"] or {}, facts["draft"] or {}
    run = {"algorithm": facts["algorithm"], "target_path": target.get("path"),
           "target_arch": target.get("architecture"), "target_config_hash": config_hash(target.get("path")),
           "draft_path": draft.get("path"), "draft_arch": draft.get("architecture"),
           "draft_config_hash": config_hash(draft.get("path")),
           "server_args": _safe(server_args_facts, server_args)}
    return facts, {k: v for k, v in run.items() if v is not None}
