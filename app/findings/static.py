"""Static rules: the draft checkpoint, the target config and the serving engine's expected behaviour
(SGLang 0.5.23 or vLLM 0.32: ``Expectations.engine``).

Each rule returns its findings; a root cause suppresses the consequences it explains, so every
problem is reported once, in one line naming the cause. A finding names the engine it predicts for,
and where the other engine does something else with the same checkpoint, says that too. Its
evidence cites the engine's source under ``<engine>_source``.
"""

from __future__ import annotations

from typing import Any

from draftscope.findings.model import Finding
from draftscope.spec import engines, sglang, vllm
from draftscope.spec.convention import (IN_HF, OWNER, SHORT, Reading, aux_readings, hidden_states,
                                        other_engine, verdicts)
from draftscope.spec.draft import DraftFeatureSpec, layers_of_ids
from draftscope.spec.expectations import NAMES, VERSIONS, Expectations
from draftscope.spec.target import TargetSpec
from draftscope.spec.training import training_settings

IDS = "eagle_config.eagle_aux_hidden_state_layer_ids"
# Rules that can carry a mechanical fix (Finding.patch); tests/test_fix.py applies each one.
FIXABLE = {"draft-arch-unsupported", "eagle-algorithm-with-eagle3-draft", "fc-bypassed", "aux-ids-not-read",
           "captured-layers-differ", "draft-weights-not-loaded", "d2t-not-offsets",
           "draft-vocab-lm-head-mismatch", "startup-refused", "draft-context-overridden",
           "eagle31-weights-without-flag", "aux-count-short"}
NORM_MEANING = {"norm_before_fc": "one RMSNorm over the concatenated aux states before fc",
                "fc_norm": "an RMSNorm per aux state before fc",
                "norm_output": "the normed (not pre-norm) hidden state fed to the next draft step"}
# Where setting the flag makes SGLang build the norm (norm_before_fc is read from eagle_config first).
NORM_FLAG_PATH = {"norm_before_fc": "eagle_config.norm_before_fc", "fc_norm": "fc_norm"}


def static_findings(spec: DraftFeatureSpec, target: TargetSpec,
                    exp: Expectations) -> list[Finding]:
    """Every static finding for this draft, target and engine expectation, errors first."""
    found: list[Finding] = []
    if not exp.draft_class_supported:
        found += _unsupported_draft(spec, target, exp)
    elif exp.algorithm != "EAGLE3":
        found += _eagle_algorithm(spec, exp)
    else:
        found += _capture(spec, target, exp)
    found += _weights(spec, exp) if exp.draft_class_supported else []
    found += _norms(spec, exp) if exp.draft_class_supported else []
    found += _vocab(spec, target, exp)
    found += _positions(spec, target, exp)
    found += _training(spec, target, exp)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(found, key=lambda f: order[f.severity])


def _name(exp: Expectations) -> str:
    """How a message names the engine: "SGLang" or "vLLM"."""
    return NAMES[exp.engine]


def _src(exp: Expectations) -> str:
    """The evidence key of the engine's source: ``sglang_source`` or ``vllm_source``."""
    return f"{exp.engine}_source"


def _unsupported_draft(spec: DraftFeatureSpec, target: TargetSpec, exp: Expectations) -> list[Finding]:
    """The engine builds no EAGLE-3 draft head from this config (``Expectations.draft_class_reason``,
    from its config parser and model registry). speculators' layout on SGLang converts mechanically:
    its model fields to the top level, SGLang's class, and the ids that capture the trained layers in
    eagle_config (the top-level ones stay for vLLM)."""
    ev = {"architecture": spec.architecture, "source_format": spec.source_format,
          _src(exp): exp.sources.get("draft_class")}
    patch: list[dict] = []
    if exp.engine == "vllm":
        fix = ("set \"architectures\": [\"LlamaForCausalLMEagle3\"] and a top-level \"model_type\" in the "
               "draft's config.json, or write speculators' layout (speculators_config, transformer_layer_config)")
    elif spec.source_format == "speculators":
        body = spec.config.get("transformer_layer_config") or {}
        physical = spec.aux_layers_physical
        ids = engines.ids_capturing(physical, target, "sglang") if physical is not None else None
        fix = ("convert it to SGLang's layout: architectures [\"LlamaForCausalLMEagle3\"] and the "
               "transformer_layer_config fields (model_type among them) at the top level"
               + (f"; {engines.ids_fix('sglang', ids, physical)}" if ids is not None else
                  "; the aux ids in eagle_config in SGLang's reading"))
        if ids is not None and isinstance(body.get("model_type"), str):
            patch = ([{"op": "config_set", "path": "architectures", "value": ["LlamaForCausalLMEagle3"]}]
                     + [{"op": "config_set", "path": k, "value": v} for k, v in body.items() if k not in spec.config]
                     + engines.ids_patch("sglang", ids, physical))
    else:
        fix = "set \"architectures\": [\"LlamaForCausalLMEagle3\"] in the draft's config.json"
    return [Finding("draft-arch-unsupported", "error",
                    f"{exp.label} builds no EAGLE-3 draft head from this checkpoint: {exp.draft_class_reason}",
                    fix, ev, patch=patch)]


def _eagle_algorithm(spec: DraftFeatureSpec, exp: Expectations) -> list[Finding]:
    src = [exp.sources["aux_config"], exp.sources["lm_head"], exp.sources["d2t"]]
    if exp.engine == "vllm":
        return [Finding("eagle-algorithm-with-eagle3-draft", "error",
                        f"speculative method {exp.algorithm.lower()} with an EAGLE-3 draft: vLLM "
                        f"captures no aux states (the draft gets {spec.target_hidden_size}-wide final hidden "
                        f"states, so its fc {spec.fc_in_features}->{spec.hidden_size} never runs)",
                        "launch with --speculative-config '{\"method\": \"eagle3\", ...}'",
                        {"algorithm": exp.algorithm, "draft_architecture": spec.architecture, "vllm_source": src})]
    return [Finding("eagle-algorithm-with-eagle3-draft", "error",
                    f"--speculative-algorithm {exp.algorithm} with an EAGLE-3 draft: SGLang captures "
                    f"no aux states (the draft gets {spec.target_hidden_size}-wide final hidden "
                    f"states, so its fc {spec.fc_in_features}->{spec.hidden_size} never runs), "
                    "swaps in the target's lm_head and ignores d2t",
                    "launch with --speculative-algorithm EAGLE3",
                    {"algorithm": exp.algorithm, "draft_architecture": spec.architecture, "sglang_source": src},
                    patch=[{"op": "server_arg", "name": "speculative_algorithm", "value": "EAGLE3"}])]


def _capture(spec: DraftFeatureSpec, target: TargetSpec, exp: Expectations) -> list[Finding]:
    src = [exp.sources[k] for k in ("aux_config", "capture", "capture_loop", "fc_width", "fc_skip")
           if k in exp.sources]
    name = _name(exp)
    ev = {"aux_layer_ids": spec.aux_layer_ids, "ids_location": spec.aux_ids_location,
          "trained_physical": spec.aux_layers_physical, "layers_to_capture": exp.layers_to_capture,
          "captured_physical": exp.captured_physical, "aux_count": exp.aux_count, "k": spec.k,
          "draft_input_width": exp.draft_input_width, "fc_in_features": exp.fc_in_features,
          "target_layers": target.num_layers, _src(exp): src}
    if not exp.aux_capture:
        if spec.fc_in_features and spec.fc_in_features != spec.hidden_size:
            skips = "vLLM builds no fc" if exp.engine == "vllm" else "silently skips fc"
            return [Finding("fc-bypassed", "error",
                            f"{exp.capture_reason}: {name} captures no aux states, the draft gets "
                            f"{exp.draft_input_width}-wide final hidden states (== its embed width) "
                            f"and {skips} ({spec.fc_in_features}->{spec.hidden_size})",
                            "remove \"use_aux_hidden_state\": false from eagle_config (EAGLE-3 "
                            "drafts are trained on aux states)", ev,
                            patch=[{"op": "config_delete", "path": "eagle_config.use_aux_hidden_state"}])]
        return []
    if exp.shift_rule is None:
        return [Finding("capture-semantics-unknown", "info",
                        f"draftscope does not know how {target.architecture} captures aux states in "
                        f"{exp.label}; layer and width checks were skipped",
                        "check at runtime: attach the tracer and read target.layers_to_capture",
                        {"target_architecture": target.architecture})]
    if spec.fc_in_features and spec.fc_in_features != exp.fc_in_features:
        return [Finding("aux-width-mismatch", "error",
                        f"the checkpoint's fc takes {spec.fc_in_features} inputs but {name} builds "
                        f"fc for {exp.fc_in_features} (target_hidden_size {spec.target_hidden_size} "
                        "x the number of eagle_config ids): loading fails",
                        "list one eagle_config id per trained aux layer (or set "
                        "num_aux_hidden_states) so that the product is the fc width", ev)]
    short = exp.aux_count is not None and exp.aux_count < spec.k
    crash = (f"; {exp.aux_count} aux states ({exp.draft_input_width} wide) reach an fc built for "
             f"{exp.fc_in_features}, so the first request crashes" if exp.fc_shape_error else "")
    differ = (spec.aux_layers_physical is not None
              and exp.captured_physical != spec.aux_layers_physical)
    readings = aux_readings(spec, target, exp)
    if exp.engine == "sglang" and spec.aux_ids_location == "top_level" and (short or differ):
        return [_not_read(spec, target, exp, readings, crash, ev)]
    if short:
        return [_short(spec, target, exp, readings, crash, ev)]
    found = [_top_level_read(spec, target, readings, ev)] if exp.engine == "vllm" \
        and spec.aux_ids_location == "top_level" and spec.source_format != "speculators" else []
    if len(readings) > 1 and any(r.matches_engine for r in readings):
        found.append(_ambiguous(spec, target, exp, readings, ev))
    elif len(readings) > 1 or differ:
        found.append(_layers_differ(spec, target, exp, readings, ev))
    if exp.fc_shape_error:
        found.append(Finding("aux-width-mismatch", "error",
                             f"the draft will receive {exp.draft_input_width}-wide aux features but "
                             f"{name} builds fc for {exp.fc_in_features}: the first request crashes",
                             "make num_aux_hidden_states / the eagle_config ids match the trained "
                             "fc width", ev))
    return found


def _fix(readings: list[Reading], target: TargetSpec, exp: Expectations) -> tuple[str, list[dict]]:
    """(the fix, its patch) that makes the engine capture the trained layers: the ids
    ``engines.ids_capturing`` gives, written where the engine reads them (the same ids the spec row and
    the compare note give); "retrain" only when no ids can. Per reading, without a patch, when the
    checkpoint does not settle the convention."""
    if len(readings) == 1:
        r = readings[0]
        if r.physical is None:
            return "list the trained aux layers in the config", []
        if r.fix_ids is None:
            return engines.no_ids_fix(r.physical, target, exp.engine), []
        return engines.ids_fix(exp.engine, r.fix_ids, r.physical), engines.ids_patch(exp.engine, r.fix_ids, r.physical)
    parts = [f"if it was trained {SHORT[r.convention]}: {_fix([r], target, exp)[0]}"
             for r in readings if not r.matches_engine]
    return ("settle which trainer wrote the checkpoint (pass its training config with --training-config, or "
            "ask its publisher); " + "; ".join(parts)), []


def _not_read(spec: DraftFeatureSpec, target: TargetSpec, exp: Expectations, readings: list[Reading],
              crash: str, ev: dict) -> Finding:
    """SGLang reads ids only from eagle_config: top-level ids are not read."""
    said = (f"eagle_aux_hidden_state_layer_ids {spec.aux_layer_ids} is at the config's top level; SGLang reads "
            "it only from eagle_config and captures its default [2, L//2, L-3] = input of layers "
            f"{exp.captured_layers} instead{crash or ' (silently the wrong features)'} (vLLM "
            f"{VERSIONS['vllm']} reads the top level first)")
    r = readings[0] if len(readings) == 1 else None
    if r is not None and r.fix_ids == spec.aux_layer_ids:  # the ids are right for SGLang where it reads
        return Finding("aux-ids-not-read", "error", said,
                       f"move the ids into \"eagle_config\" in the draft's config.json: {r.fix_ids}", ev,
                       patch=[{"op": "config_delete", "path": "eagle_aux_hidden_state_layer_ids"},
                              {"op": "config_set", "path": IDS, "value": r.fix_ids}])
    fix, patch = _fix(readings, target, exp)
    if patch:
        fix += "; the top-level ids stay for vLLM, which reads them first"
    return Finding("aux-ids-not-read", "error", said, fix, ev, patch=patch)


def _top_level_read(spec: DraftFeatureSpec, target: TargetSpec, readings: list[Reading], ev: dict) -> Finding:
    """vLLM reads top-level ids; SGLang would not (its ``aux-ids-not-read``): info, with the ids SGLang
    needs in eagle_config (the top-level ones stay for vLLM)."""
    n = target.num_layers
    sglang_ids = None
    if len(readings) == 1 and readings[0].physical is not None:
        sglang_ids = engines.ids_capturing(readings[0].physical, target, "sglang")
    fix = (f"for SGLang, write {IDS} {sglang_ids} (it then captures the output of layers {readings[0].physical}; "
           "vLLM keeps reading the top level)" if sglang_ids is not None else
           "for SGLang, write the ids that capture the trained layers into eagle_config")
    return Finding("aux-ids-not-read", "info",
                   f"eagle_aux_hidden_state_layer_ids {spec.aux_layer_ids} is at the config's top level: vLLM "
                   f"{VERSIONS['vllm']} reads it there, but SGLang {VERSIONS['sglang']} reads it only from "
                   f"eagle_config and would capture its default [2, L//2, L-3] = hidden_states"
                   f"{[2, n // 2, n - 3]} instead", fix, ev)


def _short(spec: DraftFeatureSpec, target: TargetSpec, exp: Expectations, readings: list[Reading],
           crash: str, ev: dict) -> Finding:
    """``aux-count-short``: ids the engine never reaches (SGLang's id L-1, any id past vLLM's L), or ids
    that collapse; the fix is the ids that capture the trained layers, when any can."""
    last = target.num_layers - 1
    fix, patch = _fix(readings, target, exp)
    if not exp.dropped_layers:
        said = (f"{_name(exp)} captures {exp.aux_count} aux states (layers {exp.captured_layers}) "
                f"but the draft was trained on {spec.k}{crash}")
    elif exp.engine == "vllm":
        top = vllm.last_index(target.architecture, target.num_layers)
        said = (f"aux ids {exp.dropped_layers} are outside 0..{top}: vLLM captures "
                f"hidden_states[i] for 0 <= i <= {top} only on {target.architecture}, so {exp.aux_count} of "
                f"{spec.k} aux states are captured{crash}")
    else:
        said = (f"aux id {last} is the target's last layer: SGLang captures the input of "
                f"layer id+1 and layer {target.num_layers} does not exist, so only "
                f"{exp.aux_count} of {spec.k} aux states are captured{crash} (vLLM {VERSIONS['vllm']} "
                f"reads id {last} as hidden_states[{last}], the input of layer {last}, and serves)")
    trained = (f"; the draft was trained on the output of layers {readings[0].physical} "
               f"({OWNER[readings[0].convention]} convention: {IN_HF[readings[0].convention]})"
               if len(readings) == 1 and readings[0].physical is not None else "")
    return Finding("aux-count-short", "error", said + trained, fix, ev, patch=patch)


def _layers_differ(spec: DraftFeatureSpec, target: TargetSpec, exp: Expectations,
                   readings: list[Reading], ev: dict) -> Finding:
    """The engine captures other layers than the trained ones: under the one reading the checkpoint
    records, or under every reading when it records none."""
    fix, patch = _fix(readings, target, exp)
    said = verdicts([(r.convention, r.physical) for r in readings], exp.captured_physical,
                    target.architecture, exp.engine) + other_engine(spec.aux_layer_ids, exp.engine, target.num_layers)
    if len(readings) > 1:
        message = (f"{_name(exp)} captures the output of layers {exp.captured_physical} for ids "
                   f"{spec.aux_layer_ids}, which match the trained layers under no convention (the checkpoint "
                   f"names no trainer: {spec.trainer_source}): {said}")
    else:
        r = readings[0]
        message = (f"{_name(exp)} captures the output of layers {exp.captured_physical} but the draft was "
                   f"trained on {r.physical} (ids {spec.aux_layer_ids} in {OWNER[r.convention]} "
                   f"convention: {IN_HF[r.convention]}; {spec.aux_convention_reason}); {said}")
    return Finding("captured-layers-differ", "error", message, fix,
                   {**ev, "readings": _readings_ev(readings)}, patch=patch)


def _readings_ev(readings: list[Reading]) -> list[dict]:
    return [{"convention": r.convention, "physical": r.physical, "matches_engine": r.matches_engine,
             "fix_ids": r.fix_ids} for r in readings]


def _ambiguous(spec: DraftFeatureSpec, target: TargetSpec, exp: Expectations,
               readings: list[Reading], ev: dict) -> Finding:
    """Info naming both readings of ids whose convention the checkpoint does not settle, one of which
    is what the engine captures: right if the draft was trained that way, a guess either way."""
    said = verdicts([(r.convention, r.physical) for r in readings], exp.captured_physical,
                    target.architecture, exp.engine)
    return Finding("aux-convention-ambiguous", "info",
                   f"the checkpoint names no trainer ({spec.trainer_source}); {exp.label} on "
                   f"{target.architecture} captures "
                   f"{hidden_states(exp.captured_physical)} (the output of layers "
                   f"{exp.captured_physical}) for ids {spec.aux_layer_ids}: {said}"
                   + other_engine(spec.aux_layer_ids, exp.engine, target.num_layers),
                   _fix(readings, target, exp)[0], {**ev, "readings": _readings_ev(readings)})


def _weights(spec: DraftFeatureSpec, exp: Expectations) -> list[Finding]:
    src, key = exp.sources.get("load_weights"), _src(exp)
    ignored = exp.keys_ignored
    prefix = spec.key_style[len("prefixed:"):] if spec.key_style.startswith("prefixed:") else None
    if exp.load_error:
        return [Finding("draft-weights-not-loaded", "error",
                        f"vLLM {VERSIONS['vllm']} refuses to start while loading the draft: {exp.load_error}"
                        + (f" (its keys sit under '{prefix}'; SGLang {VERSIONS['sglang']} would skip them "
                           "without a word and serve a draft of uninitialised weights)" if prefix else ""),
                        (f"rename the keys without the '{prefix}' prefix" if prefix else
                         "rename the keys to fc.weight, midlayer.* (or layers.0.*), norm.weight, lm_head.weight"),
                        {"load_error": exp.load_error, "key_style": spec.key_style, key: src},
                        patch=[{"op": "strip_key_prefix", "prefix": prefix}] if prefix else [])]
    name = _name(exp)
    if exp.params_missing:
        lm_only = exp.params_missing == ["lm_head.weight"]
        if lm_only:
            return [Finding("draft-weights-not-loaded", "error",
                            f"the checkpoint has no lm_head.weight while draft_vocab_size is "
                            f"{spec.draft_vocab_size}: SGLang keeps a randomly initialised draft "
                            "head (acceptance ~0, no error)",
                            "ship lm_head.weight, or remove draft_vocab_size so SGLang takes the "
                            "target's head", {"params_missing": exp.params_missing,
                                              key: [src, exp.sources["lm_head"]]})]
        cause = (f"its keys sit under '{prefix}', a prefix {name}'s load_weights does not strip"
                 if prefix else f"{len(ignored)} checkpoint keys match no parameter name" if ignored
                 else "the checkpoint has no key for them")
        return [Finding("draft-weights-not-loaded", "error",
                        f"{len(exp.params_missing)} draft parameters get no checkpoint tensor "
                        f"(e.g. {exp.params_missing[0]}): {cause}, so {name} leaves them uninitialised "
                        "and the draft proposes garbage",
                        (f"rename the keys without the '{prefix}' prefix" if prefix else
                         "rename the keys to fc.weight, midlayer.* (or layers.0.*), norm.weight, "
                         "lm_head.weight"),
                        {"params_missing": exp.params_missing, "keys_ignored": ignored[:50],
                         "key_style": spec.key_style, key: src},
                        patch=[{"op": "strip_key_prefix", "prefix": prefix}] if prefix else [])]
    norm = {k for keys in spec.norm_keys.values() for k in keys}
    ignored = [k for k in ignored if k not in norm]  # the EAGLE-3.1 rules name those
    if ignored:
        return [Finding("checkpoint-keys-ignored", "warning",
                        f"{name}'s load_weights silently skips {len(ignored)} checkpoint keys "
                        f"(e.g. {ignored[0]})",
                        "rename or drop those keys; if they are trained weights (fc_norm, "
                        "input_norm) set the config flag that creates their parameters",
                        {"keys_ignored": ignored[:50], key: src})]
    return []


def _vocab(spec: DraftFeatureSpec, target: TargetSpec, exp: Expectations) -> list[Finding]:
    vm, found = spec.vocab_map, []
    v_t, v_d = target.vocab_size, spec.draft_vocab_size
    src, key, name = exp.sources.get("d2t"), _src(exp), _name(exp)
    sev = "error" if exp.d2t_used else "warning"
    crash = ("an id >= vocab crashes the server" if exp.engine == "sglang" else
             f"the server crashes {vllm.D2T_CRASH}, where SGLang {VERSIONS['sglang']} crashes only "
             f"{sglang.D2T_CRASH}")
    if spec.target_vocab_size is not None and spec.target_vocab_size != v_t:
        found.append(Finding("target-vocab-mismatch", "error",
                             f"the draft was built for a {spec.target_vocab_size}-token vocabulary, "
                             f"the target has {v_t}: a different tokenizer or model family",
                             "use the draft trained for this target (same tokenizer)",
                             {"draft_vocab_size_of_target": spec.target_vocab_size, "target_vocab": v_t}))
    if vm.d2t_present and (vm.looks_absolute or vm.target_ids_in_range is False
                           or vm.target_ids_unique is False):
        what = ("d2t holds absolute target ids, not offsets" if vm.looks_absolute
                else "d2t offsets map draft ids outside the target vocabulary or onto the same id")
        found.append(Finding("d2t-not-offsets", sev,
                             f"{what}: {name} maps draft id i to i + d2t[i] (max "
                             f"{vm.target_id_max}, vocab {v_t}), so drafts land on wrong tokens and "
                             f"{crash}",
                             "store offsets: d2t = selected_target_ids - arange(draft_vocab_size)",
                             {"target_id_min": vm.target_id_min, "target_id_max": vm.target_id_max,
                              "unique": vm.target_ids_unique, "looks_absolute": vm.looks_absolute,
                              key: src},
                             patch=[{"op": "d2t_to_offsets"}] if vm.looks_absolute else []))
    elif vm.d2t_present and vm.d2t_all_zero and v_d is not None and v_d < v_t:
        found.append(Finding("d2t-identity-slice", "warning",
                             f"d2t is all zeros while the draft vocabulary ({v_d}) is smaller than "
                             f"the target's ({v_t}): the draft can only propose target ids 0..{v_d - 1}",
                             "export the real d2t from training's vocab mapping",
                             {"draft_vocab": v_d, "target_vocab": v_t}))
    if not vm.d2t_present and exp.algorithm == "EAGLE3" and v_d is not None and v_d < v_t:
        found.append(Finding("d2t-missing", "error",
                             f"draft_vocab_size {v_d} < target vocab {v_t} but the checkpoint has no "
                             f"d2t: {name} uses draft ids as target ids",
                             "add the d2t tensor from training's vocab mapping", {key: src}))
    d2t_bad = any(f.rule_id == "d2t-not-offsets" for f in found)
    if vm.t2d_present and not d2t_bad and (
            vm.t2d_size != v_t or (v_d is not None and vm.t2d_sum != v_d) or vm.t2d_matches_d2t is False):
        found.append(Finding("t2d-inconsistent", "warning",
                             f"t2d (size {vm.t2d_size}, {vm.t2d_sum} set) does not agree with the "
                             f"target vocab {v_t}, draft_vocab_size {v_d} or d2t; {name} ignores "
                             "t2d, but the vocab mapping it came from is suspect",
                             "regenerate t2d and d2t together from the same vocab mapping",
                             {"t2d_size": vm.t2d_size, "t2d_sum": vm.t2d_sum,
                              "matches_d2t": vm.t2d_matches_d2t,
                              key: exp.sources.get("load_weights", "") + " (t2d skipped)"}))
    sizes = {"lm_head rows": spec.lm_head_rows, "draft_vocab_size": v_d,
                                      "d2t size": vm.d2t_size}
    known = {k: v for k, v in sizes.items() if v is not None}
    if exp.lm_head_source == "draft" and len(set(known.values())) > 1:
        found.append(Finding("draft-vocab-lm-head-mismatch", "error",
                             "the draft's vocabulary sizes disagree ("
                             + ", ".join(f"{k} {v}" for k, v in known.items())
                             + f"): {name} builds lm_head with draft_vocab_size rows, so loading or "
                             "id mapping breaks",
                             "make draft_vocab_size, lm_head.weight rows and d2t length equal",
                             {**known, key: exp.sources["lm_head"]},
                             patch=[{"op": "config_set", "path": "draft_vocab_size",
                                     "value": spec.lm_head_rows}]
                             if spec.lm_head_rows and vm.d2t_size in (None, spec.lm_head_rows) else []))
    return found


def _positions(spec: DraftFeatureSpec, target: TargetSpec, exp: Expectations) -> list[Finding]:
    found = []
    src = exp.sources.get("context_length")  # None: the engine's start-up checks are not modelled
    if exp.startup_error:
        draft_side = "Target model's" in exp.startup_error
        cap = spec.context_length if draft_side else target.context_length
        found.append(Finding("startup-refused", "error",
                             f"SGLang {VERSIONS['sglang']} refuses to start: {exp.startup_error}",
                             f"serve with --context-length {cap} (every request then fits "
                             f"{'the draft' if draft_side else 'the target'}), or set "
                             "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 to serve longer"
                             + (f" (SGLang then overwrites the draft's max_position_embeddings "
                                f"{spec.context_length} with the target's, and acceptance falls past "
                                f"{spec.context_length})" if draft_side else ""),
                             {"draft_context_length": spec.context_length,
                              "target_context_length": target.context_length,
                              "server_context_length": exp.context_len, "sglang_source": src},
                             patch=[{"op": "server_arg", "name": "context_length", "value": cap}]))
    elif exp.draft_max_position_override:
        found.append(Finding("draft-context-overridden", "warning",
                             f"{exp.override_env}=1: SGLang overwrites the draft's "
                             f"max_position_embeddings {spec.context_length} with the target's context "
                             f"length {exp.draft_max_position_override}, so requests past "
                             f"{spec.context_length} run the draft beyond the positions it was trained "
                             "on and acceptance falls there",
                             f"use a draft trained for {exp.draft_max_position_override} positions, or "
                             f"serve with --context-length {spec.context_length}",
                             {"draft_context_length": spec.context_length,
                              "overridden_to": exp.draft_max_position_override,
                              "env": exp.override_env, "sglang_source": src},
                             patch=[{"op": "server_arg", "name": "context_length",
                                     "value": spec.context_length}]))
    d_theta, t_theta = spec.rope.get("theta"), target.rope.get("theta")
    if d_theta and t_theta and float(d_theta) != float(t_theta):
        found.append(Finding("rope-differs-from-target", "info",
                             f"the draft's rope_theta ({d_theta}) differs from the target's ({t_theta})",
                             "check the training config: drafts usually share the target's rope",
                             {"draft_rope": spec.rope, "target_rope": target.rope}))
    return found


def _training(spec: DraftFeatureSpec, target: TargetSpec, exp: Expectations) -> list[Finding]:
    """The trainer's config against config.json: aux layers, widths, vocabularies, length."""
    if not spec.training:
        return []
    got = training_settings(spec.training)
    diffs: dict[str, tuple[Any, Any]] = {}  # setting -> (training config, config.json)
    fix = "find out which is true and correct the other file"
    ids = got.get("aux_layer_ids")
    if ids is not None and spec.aux_layers_physical is not None:
        trained = layers_of_ids(spec.source_format, ids, target.num_layers, spec.trainer)
        if trained != spec.aux_layers_physical:
            diffs["aux layers (output of layer j)"] = (f"{trained} (ids {ids})", f"{spec.aux_layers_physical} "
                                                       f"(ids {spec.aux_layer_ids})")
            fix_ids = engines.ids_capturing(trained, target, exp.engine) if trained is not None else None
            if fix_ids is not None:
                fix += f"; if the training config is right, {engines.ids_fix(exp.engine, fix_ids, trained)}"
    for setting, mine in (("target_hidden_size", spec.target_hidden_size), ("hidden_size", spec.hidden_size),
                          ("vocab_size", spec.target_vocab_size), ("draft_vocab_size", spec.draft_vocab_size),
                          ("max_length", spec.max_position_embeddings)):
        theirs = got.get(setting)
        if theirs is not None and mine is not None and theirs != mine:
            diffs[setting if setting != "max_length" else "max_length / max_position_embeddings"] = (theirs, mine)
    if not diffs:
        return []
    serious = set(diffs) - {"max_length / max_position_embeddings"}
    return [Finding("training-config-disagrees", "error" if serious else "info",
                    f"the training config {spec.training_path} disagrees with config.json: "
                    + "; ".join(f"{k} {a} vs {b}" for k, a, b in ((k, *v) for k, v in diffs.items()))
                    + (f" ({_name(exp)} follows config.json)" if serious else
                       ": acceptance may fall past the length the draft was trained on"), fix,
                    {"training_config": spec.training_path, "disagreements": {
                        k: {"training_config": a, "config_json": b} for k, (a, b) in diffs.items()}})]


def _norms(spec: DraftFeatureSpec, exp: Expectations) -> list[Finding]:
    """EAGLE-3.1 flags against their weights and against what the engine's draft class applies."""
    if exp.draft_class not in engines.draft_norms(exp.engine):
        return []  # a class whose norms draftscope has not read
    applies, name = engines.draft_norms(exp.engine)[exp.draft_class], _name(exp)
    found = []
    for flag, meaning in NORM_MEANING.items():
        on, keys = getattr(spec, flag), spec.norm_keys.get(flag)
        ev = {"flag": flag, "set": on, "weights": keys, "draft_class": spec.architecture,
              _src(exp): applies.get(flag, f"{spec.architecture} has no {flag}")}
        if (on or keys) and flag not in applies:
            found.append(Finding("eagle31-flag-ignored", "error",
                                 f"the draft was trained with {flag} ({meaning}"
                                 f"{', weights ' + ', '.join(keys[:3]) if keys else ''}) but "
                                 f"{exp.label}'s {spec.architecture} does not implement it: the "
                                 "draft gets features it was not trained on, silently",
                                 f"serve it with an engine version whose {spec.architecture} applies "
                                 f"{flag}, or use a draft trained without it", ev))
        elif keys and not on:
            found.append(Finding("eagle31-weights-without-flag", "error",
                                 f"the checkpoint holds trained {flag} weights ({', '.join(keys[:3])}) "
                                 f"but config.json does not set {flag}: {name} builds no such norm "
                                 f"({meaning}) and drops the weights without a word",
                                 f"set {NORM_FLAG_PATH[flag]}: true in config.json", ev,
                                 patch=[{"op": "config_set", "path": NORM_FLAG_PATH[flag], "value": True}]))
        elif on and keys == []:
            found.append(Finding("eagle31-flag-without-weights", "warning",
                                 f"config.json sets {flag} but the checkpoint has no weights for it: "
                                 f"{name} applies {meaning} with unit weights, not trained ones",
                                 f"ship the trained {flag} weights, or unset {flag} if the draft was "
                                 "trained without it", ev))
    return found
