"""The spec block: what the draft was trained on beside what the engine (SGLang 0.5.23 or vLLM 0.32)
will feed it, row by row.

One source for ``draftscope doctor``'s first lines and the run page's spec diff. Pure: the inputs
are what ``read_draft``, ``read_target`` and ``engines.expect`` return.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from draftscope.spec import engines
from draftscope.spec.convention import SHORT, Reading, aux_readings, verdicts
from draftscope.spec.draft import TRAINERS, DraftFeatureSpec
from draftscope.spec.expectations import NAMES, Expectations, engine_label
from draftscope.spec.target import TargetSpec

CONVENTION_NAME = {"output_of": "output-of", "input_to": "input-to", "boundary": "boundary",
                   "recorded": "rewritten by doctor --fix, the trained layers recorded"}


@dataclass
class SpecRow:
    """One line of the spec block: the trained value beside the engine's, and whether they disagree."""

    key: str  # stable: format, trainer, algorithm, aux_ids, aux_ids_engine, layers, aux_width, ...
    label: str
    trained: str
    predicted: str  # what the engine will do
    note: str | None = None
    mismatch: bool = False
    ambiguous: bool = False  # right under one convention the checkpoint does not settle, wrong under another

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_spec(spec: DraftFeatureSpec, target: TargetSpec,
                  exp: Expectations) -> list[SpecRow]:
    """The spec block rows, in reading order."""
    readings = aux_readings(spec, target, exp)
    return [_format(spec, exp), _trainer(spec), _algorithm(exp), _aux_ids(spec, exp, len(readings) > 1),
            _aux_ids_engine(readings, exp), _layers(readings, exp, target), _aux_width(spec, target),
            _fc(spec, exp, target), _vocab(spec, target, exp), _mapping(spec, target, exp),
            _positions(spec, exp), _norms(spec, exp), _weights(spec, exp)]


def render_text(rows: list[SpecRow], engine: str = "sglang") -> str:
    """Plain text, one row a line (``!`` marks a mismatch, ``?`` a verdict that depends on the
    unrecorded convention), notes indented beneath."""
    width = max(len(r.label) for r in rows)
    lines = [f"spec: the draft as trained -> what {engine_label(engine)} will do"]
    for r in rows:
        mark = "!" if r.mismatch else "?" if r.ambiguous else " "
        lines.append(f"{mark} {r.label:<{width}}  {r.trained}  ->  {r.predicted}")
        if r.note:
            lines.append(f"  {'':<{width}}  ({r.note})")
    return "\n".join(lines)


def _format(spec: DraftFeatureSpec, exp: Expectations) -> SpecRow:
    predicted = (f"draft class {exp.draft_class}" if exp.draft_class_supported else
                 f"no EAGLE-3 draft head: {exp.draft_class_reason}")
    return SpecRow("format", "format", f"{spec.source_format} ({spec.architecture})", predicted,
                   mismatch=not exp.draft_class_supported)


def _trainer(spec: DraftFeatureSpec) -> SpecRow:
    trained = TRAINERS[spec.trainer] if spec.trainer else "unknown"
    return SpecRow("trainer", "trainer", trained, "-", note=spec.trainer_source)


def _algorithm(exp: Expectations) -> SpecRow:
    note = None if exp.aux_capture else f"no aux capture: {exp.capture_reason}"
    flag = (f"--speculative-config method {exp.algorithm.lower()}" if exp.engine == "vllm"
            else f"--speculative-algorithm {exp.algorithm}")
    return SpecRow("algorithm", "algorithm", "EAGLE3 (fc over aux hidden states)", flag, note=note,
                   mismatch=exp.algorithm != "EAGLE3")


def _aux_ids(spec: DraftFeatureSpec, exp: Expectations, ambiguous: bool) -> SpecRow:
    """``ambiguous``: no trainer settles the convention and the engine reads the ids unlike the format."""
    if spec.aux_layer_ids is None:
        trained = "none written (the format's default)"
    else:
        trained = (f"{spec.aux_layer_ids} in {'eagle_config' if spec.aux_ids_location == 'eagle_config' else 'the top level'} "
                   f"({'convention not recorded' if ambiguous else CONVENTION_NAME[spec.aux_convention]})")
    reason = (f"no trainer recorded: {spec.aux_convention_reason} is {CONVENTION_NAME[spec.aux_convention]}, "
              f"{NAMES[exp.engine]} reads them the other way" if ambiguous else spec.aux_convention_reason)
    where = "the top level" if exp.engine == "vllm" and spec.aux_ids_location == "top_level" else "eagle_config"
    if not exp.aux_capture:
        predicted = "not read (no aux capture)"
    elif exp.ids_passed is None:
        predicted = "not read: default [2, L//2, L-3]"
    else:
        predicted = f"{exp.ids_passed} read from {where}"
    missed = spec.aux_layer_ids is not None and exp.aux_capture and exp.ids_passed is None
    return SpecRow("aux_ids", "aux ids (checkpoint)", trained, predicted,
                   note=reason if spec.aux_layer_ids is not None else None,
                   mismatch=missed)


RULES = {"plus1": "+1 to every id", "first1": "+1 only when the first id is 1",
         "as_is": "the ids as they are, sorted"}


def _aux_ids_engine(readings: list[Reading], exp: Expectations) -> SpecRow:
    """The ids that would make the engine capture the trained layers, beside the ids it is given."""
    parts = []
    for r in readings:
        ids = str(r.fix_ids) if r.fix_ids is not None else "none can capture them"
        parts.append(ids + (f" ({SHORT[r.convention]})" if len(readings) > 1 else ""))
    given = ("no capture" if not exp.aux_capture else
             str(exp.ids_passed) if exp.ids_passed is not None else "default [2, L//2, L-3]")
    note = None
    if exp.layers_to_capture is not None:
        attr = "aux_hidden_state_layers" if exp.engine == "vllm" else "layers_to_capture"
        note = (f"{NAMES[exp.engine]} sets {attr} {exp.layers_to_capture} ({RULES[exp.shift_rule]}; "
                "capture = input of layer i = hidden_states[i])")
    wrong = [r.fix_ids != exp.ids_passed for r in readings] if exp.aux_capture else [False]
    return SpecRow("aux_ids_engine", f"aux ids ({NAMES[exp.engine]}'s convention)", " | ".join(parts),
                   given, note=note, mismatch=all(wrong), ambiguous=any(wrong) and not all(wrong))


def _layers(readings: list[Reading], exp: Expectations, target: TargetSpec) -> SpecRow:
    parts = []
    for r in readings:
        layers = str(r.physical) if r.physical is not None else "unknown"
        parts.append(layers + (f" ({SHORT[r.convention]})" if len(readings) > 1 else ""))
    if not exp.aux_capture:
        predicted = f"none: the final hidden state ({target.hidden_size} wide)"
    elif exp.captured_physical is None:
        predicted = f"unknown ({target.architecture}'s capture rule is not known to draftscope)"
    else:
        predicted = f"{exp.captured_physical} of {target.num_layers}"
        if exp.dropped_layers:
            predicted += f"; layers_to_capture {exp.dropped_layers} do not exist (never captured)"
    note = None
    if len(readings) > 1 and exp.captured_physical is not None:
        note = ("the checkpoint does not say which convention: " + verdicts(
            [(r.convention, r.physical) for r in readings], exp.captured_physical, target.architecture,
            exp.engine))
    wrong = [r.matches_engine is False for r in readings]
    mismatch = not exp.aux_capture or all(wrong)
    return SpecRow("layers", "layers fed (output of j)", " | ".join(parts), predicted, note=note,
                   mismatch=mismatch, ambiguous=not mismatch and any(wrong))


def _aux_width(spec: DraftFeatureSpec, target: TargetSpec) -> SpecRow:
    return SpecRow("aux_width", "width per aux layer", f"{spec.target_hidden_size} (target_hidden_size)",
                   f"{target.hidden_size} (target hidden_size)",
                   mismatch=spec.target_hidden_size != target.hidden_size)


def _fc(spec: DraftFeatureSpec, exp: Expectations, target: TargetSpec) -> SpecRow:
    trained = f"{spec.k} × {spec.target_hidden_size} = {spec.expected_fc_in_width}"
    if spec.fc_in_features is not None:
        trained += f" (fc.weight {spec.fc_in_features} -> {spec.hidden_size})"
    if exp.draft_input_width is None:
        predicted = f"unknown width fed; fc built for {exp.fc_in_features}"
    elif not exp.fc_runs:
        predicted = f"{exp.draft_input_width} fed (== the draft's hidden size): fc is skipped"
    else:
        predicted = (f"{exp.aux_count} × {target.hidden_size} = {exp.draft_input_width} fed; "
                     f"fc built for {exp.fc_in_features}")
    trained_in = spec.fc_in_features or spec.expected_fc_in_width
    mismatch = bool(exp.fc_in_features != trained_in or not exp.fc_runs
                    or (exp.draft_input_width is not None and exp.draft_input_width != trained_in))
    return SpecRow("fc_in", "k × hidden = fc in-features", trained, predicted, mismatch=mismatch)


def _vocab(spec: DraftFeatureSpec, target: TargetSpec, exp: Expectations) -> SpecRow:
    v_d = spec.draft_vocab_size
    trained = (f"{v_d} of {spec.target_vocab_size}" if v_d is not None
               else f"the full {spec.target_vocab_size}") + " target tokens"
    if spec.lm_head_rows is not None:
        trained += f" (lm_head {spec.lm_head_rows} rows)"
    predicted = {"draft": f"the draft's lm_head ({v_d} rows)",
                 "target": f"the target's lm_head ({target.vocab_size} rows)",
                 "draft_embed": "the draft's embedding (tied)"}[exp.lm_head_source]
    sizes = {s for s in (spec.lm_head_rows, v_d, spec.vocab_map.d2t_size) if s is not None}
    mismatch = (spec.target_vocab_size not in (None, target.vocab_size)
                or (exp.lm_head_source == "draft" and len(sizes) > 1)
                or (exp.lm_head_source == "target" and v_d is not None and v_d < target.vocab_size))
    return SpecRow("vocab", "draft vocabulary", trained, predicted, mismatch=bool(mismatch))


def _mapping(spec: DraftFeatureSpec, target: TargetSpec, exp: Expectations) -> SpecRow:
    vm = spec.vocab_map
    if not vm.d2t_present:
        trained = "no d2t (draft ids are target ids)"
    elif vm.looks_absolute:
        trained = f"d2t holds absolute target ids ({vm.d2t_size} entries)"
    else:
        trained = (f"d2t offsets: draft id i -> i + d2t[i], target ids {vm.target_id_min}.."
                   f"{vm.target_id_max}{'' if vm.target_ids_unique else ', not unique'}")
    if vm.t2d_present:
        trained += f"; t2d marks {vm.t2d_sum} of {vm.t2d_size}"
    predicted = (("draft id i -> i + d2t[i] (used)" if exp.engine == "vllm" else
                  "hot_token_id = d2t + arange (used)") if exp.d2t_used else
                 "d2t ignored" if vm.d2t_present else "no map: draft id = target id")
    v_d = spec.draft_vocab_size
    mismatch = bool(vm.d2t_present and exp.d2t_used and (vm.looks_absolute or vm.target_ids_in_range is False
                                                         or vm.target_ids_unique is False)) \
        or (not vm.d2t_present and v_d is not None and v_d < target.vocab_size and exp.algorithm == "EAGLE3")
    return SpecRow("mapping", "draft -> target token map", trained, predicted, mismatch=mismatch)


def _positions(spec: DraftFeatureSpec, exp: Expectations) -> SpecRow:
    trained = f"{spec.context_length} (draft context length)"
    if exp.context_len is None and not exp.startup_error:
        return SpecRow("positions", "max positions", trained, f"not predicted for {exp.label}")
    if exp.startup_error:
        predicted, note = "refuses to start", exp.startup_error
    elif exp.draft_max_position_override:
        predicted = f"{exp.context_len}: the draft's limit overwritten ({exp.override_env}=1)"
        note = None
    else:
        predicted, note = f"{exp.context_len} (the target's context length)", None
    return SpecRow("positions", "max positions", trained, predicted, note=note,
                   mismatch=bool(exp.startup_error or exp.draft_max_position_override))


def _norms(spec: DraftFeatureSpec, exp: Expectations) -> SpecRow:
    applies = engines.draft_norms(exp.engine).get(spec.architecture, {})
    trained, predicted, mismatch = [], [], False
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        on, keys = getattr(spec, flag), spec.norm_keys.get(flag)
        if not (on or keys):
            continue
        trained.append(flag + ("" if on else " weights without the flag")
                       + (f" ({len(keys)} weight{'s' if len(keys) != 1 else ''})" if keys else
                          " (no weights)" if keys == [] else ""))
        predicted.append(f"{flag} {'applied' if on and flag in applies else 'not applied'}")
        mismatch |= not (on and flag in applies) or keys == []
    return SpecRow("norms", "EAGLE-3.1 norms", ", ".join(trained) or "none",
                   ", ".join(predicted) or "-", mismatch=mismatch)


def _weights(spec: DraftFeatureSpec, exp: Expectations) -> SpecRow:
    predicted = (f"{len(exp.keys_loaded)} loaded, {len(exp.keys_ignored)} ignored, "
                 f"{len(exp.params_missing)} parameters unfilled")
    if exp.load_error:
        predicted = f"refuses to start: {exp.load_error}"
    return SpecRow("weights", "checkpoint tensors", f"{len(spec.keys)} ({spec.key_style} keys)",
                   predicted if exp.sources.get("load_weights") else "-",
                   mismatch=bool(exp.params_missing or exp.load_error))
