"""What SGLang 0.5.23 will do with a draft + target pair, derived from its source.

Every expectation names the SGLang function it encodes (paths relative to ``sglang/srt/``), so a
rule built on it can cite its source and a test can re-check it against the installed package.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from draftscope.spec.draft import DraftFeatureSpec
from draftscope.spec.expectations import Expectations
from draftscope.spec.target import TargetSpec

SRC = {
    "aux_config": "model_executor/model_runner_components/spec_aux_hidden_state.py::"
                  "_resolve_eagle_aux_hidden_state",
    "capture_guard": "model_executor/model_runner_components/attention_backend_setup.py::"
                     "configure_aux_hidden_state_capture",
    "capture_plus1": "models/llama.py::LlamaForCausalLM.set_eagle3_layers_to_capture",
    "capture_first1": "models/deepseek_v2.py::DeepseekV2ForCausalLM.set_eagle3_layers_to_capture",
    "capture_loop": "models/llama.py::LlamaModel.forward (i in self.layers_to_capture)",
    "fc_width": "models/llama_eagle3.py::LlamaModel.__init__ (fc = Linear(hidden_size_in * "
                "num_aux_hidden_states, hidden_size))",
    "fc_skip": "models/llama_eagle3.py::LlamaModel.forward (fc only if hidden_states.shape[-1] "
               "!= embeds.shape[-1])",
    "load_weights": "models/llama_eagle3.py::LlamaForCausalLMEagle3.load_weights",
    "config_parse": "utils/hf_transformers/config.py::HfModelConfigParser.parse (AutoConfig.from_pretrained)",
    "registry": "models/registry.py::_ModelRegistry.resolve_model_cls",
    "load_weights_mla": "models/kimi_k25_eagle3.py::Eagle3DeepseekV2ForCausalLM.load_weights",
    "lm_head": "models/llama_eagle3.py::LlamaForCausalLMEagle3.__init__ (load_lm_head_from_target "
               "when draft_vocab_size is None)",
    "init_lm_head": "speculative/eagle_worker_v2.py::EagleDraftWorker.init_lm_head",
    "token_map": "speculative/eagle_worker_v2.py::EagleDraftWorker.init_token_map",
    "hot_token_id": "speculative/eagle_worker_v2.py::EagleDraftWorker.init_lm_head (self.hot_token_id = "
                    "self.draft_runner.model.hot_token_id)",
    "context_length": "configs/model_config.py::ModelConfig._derive_context_length "
                      "(SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN)",
    "draft_context_length": "speculative/eagle_worker_v2.py::EagleDraftWorker.__init__ "
                            "(context_length=target_worker.model_runner.model_config.context_len)",
}
# EAGLE-3.1 flags each SGLang draft class applies, with where (absent: the class ignores the flag).
DRAFT_NORMS = {
    "LlamaForCausalLMEagle3": {
        "norm_before_fc": "models/llama_eagle3.py::LlamaModel.__init__ (input_norm over the concatenated "
                          "aux states when eagle_config.norm_before_fc or norm_before_fc)",
        "fc_norm": "models/llama_eagle3.py::LlamaModel.__init__ (fc_norm: one RMSNorm per aux state "
                   "when fc_norm or use_aux_norm)",
        "norm_output": "models/llama_eagle3.py::LlamaModel.forward (the next step gets the normed "
                       "hidden state when norm_output)"},
    "Eagle3DeepseekV2ForCausalLM": {
        "fc_norm": "models/kimi_k25_eagle3.py::Eagle3MLAModel.__init__ (fc_norm when fc_norm "
                   "or use_aux_norm)",
        "norm_output": "models/kimi_k25_eagle3.py::Eagle3MLAModel.forward (norm_output)"},
}
# Server environment variables that change what SGLang does at start (environ.py EnvBool: 1/true/yes/y).
OVERRIDE_ENV = ("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN", "SGLANG_IS_IN_CI")

# Target classes with set_eagle3_layers_to_capture and how they shift explicit ids:
# "plus1": every id + 1; "first1": + 1 only when the first id == 1 (sglang PR #25454).
CAPTURE_SHIFT = {
    "LlamaForCausalLM": "plus1", "MistralForCausalLM": "plus1", "Phi3ForCausalLM": "plus1",
    "InternLM3ForCausalLM": "plus1", "Qwen2ForCausalLM": "plus1", "Qwen2MoeForCausalLM": "plus1",
    "Qwen3ForCausalLM": "plus1", "Qwen3MoeForCausalLM": "plus1", "GptOssForCausalLM": "plus1",
    "Glm4MoeForCausalLM": "plus1", "MiniMaxM2ForCausalLM": "plus1",
    "Qwen2_5_VLForConditionalGeneration": "plus1", "Qwen3VLForConditionalGeneration": "plus1",
    "DeepseekV2ForCausalLM": "first1", "DeepseekV3ForCausalLM": "first1",
    "DeepseekV32ForCausalLM": "first1", "Glm4MoeLiteForCausalLM": "first1",
    "KimiK25ForConditionalGeneration": "first1",  # delegates to its DeepseekV3 language_model
}
# The EAGLE-3 draft heads of SGLang's model registry (models/llama_eagle3.py, models/kimi_k25_eagle3.py
# EntryClass; tests/test_spec_registries.py holds this to the installed source).
EAGLE3_DRAFT_CLASSES = {"LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM"}
D2T_CRASH = "once an id >= vocab is drafted (IndexError in embed_tokens): it depends on the traffic"
LEGACY_NAME_MAP = {"midlayer": "layers.0", "aux_norm_low": "fc_norm.0",
                   "aux_norm_mid": "fc_norm.1", "aux_norm_high": "fc_norm.2"}
STACKED = [(".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"), (".qkv_proj", ".v_proj", "v"),
           (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1)]
SHARDS = {".qkv_proj": {"q", "k", "v"}, ".gate_up_proj": {0, 1}}


def draft_class(config: dict[str, Any]) -> tuple[str | None, str]:
    """(the EAGLE-3 draft class SGLang builds from this draft config, or None, and why not): the
    config is parsed by transformers' AutoConfig, which needs a top-level model_type, and the first
    architecture SGLang's registry knows picks the class."""
    if config.get("model_type") is None:
        return None, ("config.json has no top-level model_type (speculators' layout keeps the model under "
                      "transformer_layer_config), so SGLang stops at start, before loading anything: "
                      "transformers' AutoConfig raises \"ValueError: Unrecognized model ... Should have a "
                      "`model_type` key in its config.json\"")
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    arch = next((a for a in archs if a in EAGLE3_DRAFT_CLASSES or a in CAPTURE_SHIFT), None)
    if arch in EAGLE3_DRAFT_CLASSES:
        return arch, ""
    if arch is not None:
        return None, (f"architecture {arch} makes SGLang build a full target model ({arch}), not an "
                      "EAGLE-3 draft head (fc + midlayer), so the draft weights do not fit")
    return None, (f"SGLang has no model class for architectures {archs or 'none'} (its registry falls back "
                  "to the Transformers backend), so it builds no EAGLE-3 draft head")


def parse_server_args(text: str | None) -> dict[str, Any]:
    """``"--speculative-algorithm EAGLE --tp 2"`` -> ``{"speculative_algorithm": "EAGLE", "tp": "2"}``;
    a flag without a value maps to True."""
    args: dict[str, Any] = {}
    tokens = shlex.split(text or "")
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--"):
            key, _, value = tok[2:].partition("=")
            key = key.replace("-", "_")
            if value:
                args[key] = value
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                args[key] = tokens[i + 1]
                i += 1
            else:
                args[key] = True
        i += 1
    return args


def random_weights(server_args: dict[str, Any] | None) -> dict[str, str]:
    """Which models SGLang fills with random values instead of their checkpoint (``--load-format
    dummy``), each with the flag that says so: {"target": ..., "draft": ...}. The draft loads with
    ``--speculative-draft-load-format``, else the target's ``--load-format``
    (``model_executor/model_runner.py::ModelRunner._resolve_draft_load_format``)."""
    args = server_args or {}
    target = args.get("load_format")
    draft = args.get("speculative_draft_load_format")
    found = {}
    if target == "dummy":
        found["target"] = "--load-format dummy"
    if draft == "dummy" or (draft is None and target == "dummy"):
        found["draft"] = ("--speculative-draft-load-format dummy" if draft == "dummy"
                          else "--load-format dummy (the draft inherits it)")
    return found


def format_server_args(args: dict[str, Any]) -> str:
    """The inverse of parse_server_args: ``{"tp": "2", "x": True}`` -> ``"--tp 2 --x"``."""
    return " ".join(f"--{k.replace('_', '-')}" + ("" if v is True else f" {shlex.quote(str(v))}")
                    for k, v in args.items())


def expect_sglang(spec: DraftFeatureSpec, target: TargetSpec,
                  server_args: dict[str, Any] | None = None,
                  env: dict[str, str] | None = None) -> Expectations:
    """SGLang's behaviour for ``spec`` drafting for ``target`` under ``server_args`` and the
    server's environment ``env`` (only OVERRIDE_ENV is read)."""
    server_args = server_args or {}
    algorithm = str(server_args.get("speculative_algorithm") or "EAGLE3").upper()
    config = spec.config
    eagle_config = config.get("eagle_config")
    sources = {"aux_config": SRC["aux_config"], "fc_width": SRC["fc_width"], "fc_skip": SRC["fc_skip"]}

    # spec_aux_hidden_state.py: use_aux defaults to True; ids only from eagle_config (a missing or
    # non-dict eagle_config raises inside the try and leaves ids None).
    capture, ids, reason = False, None, ""
    if algorithm != "EAGLE3":
        reason = f"--speculative-algorithm {algorithm} resolves no aux capture (only EAGLE3 does)"
    elif isinstance(eagle_config, dict) and not eagle_config.get("use_aux_hidden_state", True):
        reason = "eagle_config.use_aux_hidden_state is false"
    else:
        capture = True
        if isinstance(eagle_config, dict) and "eagle_aux_hidden_state_layer_ids" in eagle_config:
            ids = list(eagle_config["eagle_aux_hidden_state_layer_ids"])
            reason = "explicit ids from eagle_config"
        else:
            reason = ("eagle_aux_hidden_state_layer_ids is not inside eagle_config; SGLang uses its "
                      "default [2, L//2, L-3]")

    shift = CAPTURE_SHIFT.get(target.architecture)
    layers = captured = physical = None
    dropped: list[int] = []
    if capture and shift is not None:
        sources["capture"] = SRC["capture_plus1" if shift == "plus1" else "capture_first1"]
        sources["capture_loop"] = SRC["capture_loop"]
        layers, captured, dropped, physical = capture_for_ids(ids, target)

    # llama_eagle3.py LlamaModel.__init__: num_aux from num_aux_hidden_states, else eagle_config ids.
    num_aux = config.get("num_aux_hidden_states")
    if num_aux is None:
        cfg_ids = (eagle_config or {}).get("eagle_aux_hidden_state_layer_ids") \
            if isinstance(eagle_config, dict) else None
        num_aux = len(cfg_ids) if cfg_ids else 3
    fc_in = spec.target_hidden_size * int(num_aux)
    if capture and captured is not None:
        aux_count, width = len(captured), len(captured) * target.hidden_size
    elif capture:
        aux_count, width = None, None
    else:
        aux_count, width = 0, target.hidden_size
    fc_runs = None if width is None else width != spec.hidden_size
    fc_error = None if width is None else (fc_runs and width != fc_in)

    tied = spec.tie_word_embeddings
    if algorithm != "EAGLE3":
        lm_head, d2t_used = "target", False
        sources["lm_head"], sources["d2t"] = SRC["init_lm_head"], SRC["token_map"]
    else:
        lm_head = "draft_embed" if tied else ("target" if spec.draft_vocab_size is None else "draft")
        d2t_used = spec.vocab_map.d2t_present
        sources["lm_head"], sources["d2t"] = SRC["lm_head"], SRC["hot_token_id"]

    cls, why = draft_class(config)
    sources["draft_class"] = SRC["registry"] if config.get("model_type") is not None else SRC["config_parse"]
    exp = Expectations(
        algorithm=algorithm, draft_class_supported=cls is not None, draft_class=cls, draft_class_reason=why,
        aux_capture=capture, capture_reason=reason, ids_passed=ids, shift_rule=shift,
        layers_to_capture=layers, captured_layers=captured, dropped_layers=dropped,
        captured_physical=physical, aux_count=aux_count, draft_input_width=width,
        fc_in_features=fc_in, fc_runs=fc_runs, fc_shape_error=fc_error, lm_head_source=lm_head,
        d2t_used=d2t_used, sources=sources)
    _simulate_load(spec, exp, needs_lm_head=lm_head == "draft", num_aux=int(num_aux))
    _context_length(spec, target, server_args, env or {}, exp)
    return exp


def _context_length(spec: DraftFeatureSpec, target: TargetSpec, server_args: dict[str, Any],
                    env: dict[str, str], exp: Expectations) -> None:
    """``ModelConfig._derive_context_length``, for the target (user --context-length) and then the
    draft (given the target's context_len): a longer context than derived raises ValueError unless
    an override variable is set, which for the draft also overwrites its max_position_embeddings."""
    exp.sources["context_length"] = SRC["context_length"]
    exp.sources["draft_context_length"] = SRC["draft_context_length"]  # the draft gets the target's
    allowed = next((k for k in OVERRIDE_ENV if str(env.get(k, "")).lower() in ("1", "true", "yes", "y")), None)
    tail = (" This may lead to incorrect model outputs or CUDA errors. To allow overriding this "
            "maximum, set the env var SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1")
    user = server_args.get("context_length")
    context = int(user) if user not in (None, True) else target.context_length
    if context > target.context_length and not allowed:
        exp.startup_error = (f"ValueError: User-specified context_length ({context}) is greater than the "
                             f"derived context_length ({target.context_length}).{tail}")
        return
    exp.context_len, exp.draft_context_len = context, spec.context_length
    if context > spec.context_length:
        if allowed:
            exp.draft_max_position_override, exp.override_env = context, allowed
        else:
            exp.startup_error = (f"ValueError: Target model's context_length ({context}) is greater "
                                 f"than the derived context_length ({spec.context_length}).{tail}")


def capture_for_ids(ids: list[int] | None, target: TargetSpec
                    ) -> tuple[list[int], list[int], list[int], list[int]]:
    """(layers_to_capture, captured, dropped, captured as "output of layer j") for eagle_config
    ``ids`` (None: the default) on a target class whose shift rule draftscope knows."""
    n = target.num_layers
    if ids is None:
        layers = [2, n // 2, n - 3]
    elif CAPTURE_SHIFT[target.architecture] == "plus1" or (ids and ids[0] == 1):
        layers = [i + 1 for i in ids]
    else:
        layers = list(ids)
    # LlamaModel.forward loops over layers and captures where ``i in layers_to_capture``: order
    # is layer order, duplicates collapse, an index >= L is never reached.
    captured = [i for i in range(n) if i in layers]
    dropped = sorted({i for i in layers if i >= n or i < 0})
    return layers, captured, dropped, [i - 1 for i in captured]


def ids_capturing(physical: list[int], target: TargetSpec) -> list[int] | None:
    """The eagle_config ids that make SGLang capture the output of exactly ``physical`` (in that
    order), or None when no ids can (e.g. the output of the last layer is never captured)."""
    if target.architecture not in CAPTURE_SHIFT:
        return None
    for ids in (list(physical), [p + 1 for p in physical]):
        _, captured, dropped, phys = capture_for_ids(ids, target)
        if not dropped and phys == list(physical):
            return ids
    return None


def sglang_reading(ids: list[int] | None, target: TargetSpec) -> str | None:
    """How SGLang reads explicit ids on this target: output_of (id j = output of layer j) or
    input_to (id j = input of layer j); None for default ids or an unknown target class."""
    shift = CAPTURE_SHIFT.get(target.architecture)
    if ids is None or shift is None:
        return None
    return "output_of" if shift == "plus1" or (ids and ids[0] == 1) else "input_to"


def _llama_eagle3_params(spec: DraftFeatureSpec, num_aux: int, with_lm_head: bool) -> set[str]:
    """Parameter names of LlamaForCausalLMEagle3 that matter (embed is replaced by the target's)."""
    params = {"model.fc.weight", "model.norm.weight"}
    if spec.config.get("bias"):
        params.add("model.fc.bias")
    if spec.norm_before_fc:
        params.add("model.input_norm.weight")
    if spec.fc_norm:
        params |= {f"model.fc_norm.{i}.weight" for i in range(num_aux)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        params |= {p + "self_attn.qkv_proj.weight", p + "self_attn.o_proj.weight",
                   p + "mlp.gate_up_proj.weight", p + "mlp.down_proj.weight",
                   p + "input_layernorm.weight", p + "post_attention_layernorm.weight",
                   p + "hidden_norm.weight"}
    if with_lm_head:
        params.add("lm_head.weight")
    return params


def _simulate_load(spec: DraftFeatureSpec, exp: Expectations, needs_lm_head: bool,
                   num_aux: int) -> None:
    """Replay the draft class's load_weights over the checkpoint key names."""
    if spec.architecture == "Eagle3DeepseekV2ForCausalLM":
        exp.sources["load_weights"] = SRC["load_weights_mla"]
        for key in spec.keys:
            if key.split(".")[-1] in ("d2t", "t2d"):
                continue
            name = re.sub(r"^layers\.0\.", "midlayer.", key)
            name = name if name.startswith("lm_head.") else f"model.{name}"
            known = ("model.midlayer.", "model.fc.", "model.norm.", "model.embed_tokens.", "lm_head.") \
                + (("model.fc_norm.",) if spec.fc_norm else ())
            if name.startswith(known):
                exp.keys_loaded[key] = name
            else:
                exp.keys_ignored.append(key)
        required = {"model.fc.weight", "model.norm.weight"} | ({"lm_head.weight"} if needs_lm_head else set())
        exp.params_missing = sorted(required - set(exp.keys_loaded.values()))
        return
    if spec.architecture != "LlamaForCausalLMEagle3":
        return
    exp.sources["load_weights"] = SRC["load_weights"]
    embed = {"model.embed_tokens.weight"}
    params = _llama_eagle3_params(spec, num_aux, with_lm_head=not spec.tie_word_embeddings)
    shards: dict[str, set] = {}
    for key in spec.keys:
        name = key
        for legacy, new in LEGACY_NAME_MAP.items():
            if legacy in name:
                name = name.replace(legacy, new)
        if name != key:
            exp.keys_renamed[key] = name
        if "d2t" in name or "t2d" in name:
            continue
        for param_name, weight_name, shard_id in STACKED:
            if weight_name not in name:
                continue
            name = name.replace(weight_name, param_name)
            target = name if name in params else f"model.{name}"
            if target in params:
                exp.keys_loaded[key] = target
                shards.setdefault(target, set()).add(shard_id)
            else:
                exp.keys_ignored.append(key)
            break
        else:
            target = name if name in params | embed else f"model.{name}"
            if target in params | embed:
                exp.keys_loaded[key] = target
            else:
                exp.keys_ignored.append(key)
    # An unfilled norm keeps RMSNorm's unit weight (not garbage): the EAGLE-3.1 rules report it.
    required = {p for p in _llama_eagle3_params(spec, num_aux, with_lm_head=needs_lm_head)
                if not p.startswith(("model.input_norm.", "model.fc_norm."))}
    filled = set(exp.keys_loaded.values())
    missing = required - filled
    for param, got in shards.items():
        for suffix, want in SHARDS.items():
            if param.endswith(suffix + ".weight") and got != want:
                missing.add(param)
    exp.params_missing = sorted(missing)
