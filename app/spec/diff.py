"""Trained against served: the draft's training-time feature spec held row by row against what the
server fed it (the tracer's attach-time facts and the widths, counts and norms of the run's samples).

Pure functions over plain data (a run's ``facts``, its ``run_summary`` and optional training-time
feature statistics): no I/O, usable by the pages, their JSON twins and the compare view.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from draftscope.spec import engines
from draftscope.spec.convention import IN_HF, OWNER, config_readings, verdicts
from draftscope.spec.describe import SpecRow
from draftscope.spec.draft import config_fc_width, config_ids
from draftscope.spec.sglang import random_weights
from draftscope.spec.target import recorded_target

EAGLE3_DRAFT_CLASSES = {"LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM", "Eagle3Speculator",
                        "Eagle3LlamaForCausalLM"}  # the last: vLLM's class
# depends: right under one layer-id convention, wrong under the other, and the draft does not say
# which it was trained in (never highlighted as a mismatch; the note gives both verdicts)
OK, MISMATCH, UNKNOWN, DEPENDS = "ok", "mismatch", "unknown", "depends"
NOT_SEEN = "not seen"


@dataclass(frozen=True)
class DiffRow:
    """One line of the diff; ``state`` is ok, mismatch (highlighted), depends (on a convention the
    draft does not record) or unknown (not recorded)."""

    key: str
    label: str
    trained: str
    served: str
    state: str
    note: str = ""
    predicted: str = ""  # what the engine will do, predicted from the checkpoint (doctor's spec block)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Phase:
    """A place where the draft takes features, and the width its training makes it expect there."""

    name: str
    label: str
    via_fc: bool  # True: k target layers concatenated through fc; False: the draft's own hidden state


PHASES = (
    Phase("prefill", "prefill (after the target's prefill)", True),
    Phase("draft_extend", "draft extend (after each verify, position 1)", True),
    Phase("draft_decode", "draft decode (positions 2..n, its own hidden state)", False),
)


def _ints(d: dict | None) -> dict[int, int]:
    return {int(k): int(v) for k, v in (d or {}).items()}


def _list(values: list | None) -> str:
    return "[" + ", ".join(map(str, values)) + "]" if values is not None else "not recorded"


def _widths_text(widths: dict[int, int]) -> str:
    if not widths:
        return NOT_SEEN
    return ", ".join(f"{w} ({n} sample{'s' if n != 1 else ''})" for w, n in sorted(widths.items()))


class _Spec:
    """What the facts say the draft was trained on."""

    def __init__(self, facts: dict[str, Any]) -> None:
        self.engine = engines.engine_of(facts)
        self.target = facts.get("target") or {}
        self.draft = facts.get("draft") or {}
        config = self.draft.get("config") or {}
        self.eagle_config = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
        key = "eagle_aux_hidden_state_layer_ids"
        self.ids = self.eagle_config.get(key) if self.eagle_config.get(key) is not None else config.get(key)
        self.ids_where = ("eagle_config" if self.eagle_config.get(key) is not None
                          else "top level of config.json" if config.get(key) is not None else None)
        self.num_layers = self.target.get("num_layers")
        self.read = config_ids(config, self.num_layers) if config else None
        self.hidden = config.get("target_hidden_size") or self.target.get("hidden_size")
        self.embed = self.draft.get("embed_width") or self.draft.get("hidden_size")
        self.fc_in = self.draft.get("fc_in_features") or config_fc_width(config, self.hidden)
        self.k = self.fc_in // self.hidden if self.fc_in and self.hidden and self.fc_in % self.hidden == 0 else None
        self.eagle3 = self.draft.get("architecture") in EAGLE3_DRAFT_CLASSES
        self.uses_fc = bool(self.eagle3 and self.fc_in and self.fc_in != self.embed)
        # the engine recorded that it captures no aux layer (capture off, or an empty layer list)
        self.nothing_captured = (self.target.get("capture_aux_hidden_states") is False
                                 or self.target.get("layers_to_capture") == [])

    def expected_width(self, phase: Phase) -> int | None:
        if not phase.via_fc:
            return self.embed
        return self.fc_in if self.uses_fc else self.embed


def expected_widths(facts: dict[str, Any] | None) -> dict[str, int | None]:
    """The ``draft.input`` width the draft's training implies for each phase."""
    spec = _Spec(facts or {})
    return {p.name: spec.expected_width(p) for p in PHASES}


def spec_diff(run: dict[str, Any], summary: dict[str, Any],
              feature_stats: dict[str, Any] | None = None) -> list[DiffRow]:
    """The rows of the trained-vs-served table for one run (``run`` as ``queries.get_run``)."""
    facts = run.get("facts") or {}
    spec = _Spec(facts)
    widths = summary.get("widths") or {}
    rows = [_algorithm(spec, run.get("algorithm") or facts.get("algorithm")),
            _capture(spec), _layers(spec), _aux_widths(spec, widths), _concat(spec, widths)]
    rows += [_phase(spec, p, _ints((widths.get("draft.input") or {}).get(p.name))) for p in PHASES]
    random = random_weights(run.get("server_args"))
    rows += [_fc(spec, widths), _vocab(spec), _weights(spec, random.get("draft")), _positions(spec, summary)]
    if feature_stats:
        rows += _norms(feature_stats, summary)
    return rows


def _algorithm(spec: _Spec, served: str | None) -> DiffRow:
    arch = spec.draft.get("architecture")
    trained = f"EAGLE3 ({arch})" if spec.eagle3 else (f"EAGLE ({arch})" if arch else "not recorded")
    if not arch or not served:
        return DiffRow("algorithm", "Algorithm", trained, served or "not recorded", UNKNOWN)
    bad = spec.eagle3 and served != "EAGLE3"
    return DiffRow("algorithm", "Algorithm", trained, served, MISMATCH if bad else OK,
                   "an EAGLE-3 draft served as EAGLE gets no aux states and the target's lm_head"
                   if bad else "")


def _capture(spec: _Spec) -> DiffRow:
    """Trained with aux states when its fc takes k target layers, whatever the config flag says."""
    want = spec.uses_fc
    served = spec.target.get("capture_aux_hidden_states")
    trained = f"on: fc takes {spec.k or '?'} target layers" if want else "off"
    if want and spec.eagle_config.get("use_aux_hidden_state") is False:
        trained += " (though its config says use_aux_hidden_state: false)"
    if served is None:
        return DiffRow("capture", "Aux hidden-state capture", trained, "not recorded", UNKNOWN)
    bad = bool(want) and not served
    return DiffRow("capture", "Aux hidden-state capture", trained, "on" if served else "off",
                   MISMATCH if bad else OK,
                   "the target captures nothing: the draft gets the final hidden state" if bad else "")


def _layers(spec: _Spec) -> DiffRow:
    """The trained layers in the convention the draft records (both, when it records none) against
    what the engine captures, in HF ``hidden_states`` indices (0 = the embedding output)."""
    captured, n, arch = spec.target.get("layers_to_capture"), spec.num_layers, spec.target.get("architecture")
    where = f" in {spec.ids_where}" if spec.ids_where else " (none written: format default)"
    readings = config_readings(spec.read, recorded_target(spec.target), spec.engine) if spec.read and n else []
    known = [(c, p) for c, p in readings if p is not None]
    if len(known) == 1:
        conv, physical = known[0]
        trained = (f"ids {_list(spec.ids)}{where}, {OWNER[conv]} convention ({IN_HF[conv]}; "
                   f"{spec.read.reason}) → hidden_states{_list([j + 1 for j in physical])}")
    elif known:
        trained = f"ids {_list(spec.ids)}{where}; no trainer recorded, so " + ", ".join(
            f"hidden_states{_list([j + 1 for j in p])} under {OWNER[c]} convention" for c, p in known)
    else:
        trained = f"ids {_list(spec.ids)}{where} → trained layers not resolved"
    if captured is None:
        return DiffRow("layers", "Aux layers", trained, "not recorded", UNKNOWN)
    last = n if spec.engine == "vllm" else n - 1 if n else None  # vLLM also captures hidden_states[L]
    fed = [i for i in range(last + 1) if i in captured] if n else list(captured)
    served = (f"{engines.path(arch, spec.engine)} captures the input of layers {_list(fed)} = "
              f"hidden_states{_list(fed)}"
              if fed else "none captured")
    out = [i - 1 for i in fed]
    right = [p == out for _, p in known]
    state = UNKNOWN if not known else OK if all(right) else MISMATCH if not any(right) else DEPENDS
    note = verdicts(known, out, arch, spec.engine) if known and (len(known) > 1 or state == MISMATCH) else ""
    return DiffRow("layers", "Aux layers", trained, served, state, note)


def _aux_widths(spec: _Spec, widths: dict) -> DiffRow:
    points = sorted((p for p in widths if p.startswith("target.aux[")), key=lambda p: int(p[11:-1]))
    trained = f"{spec.k} × {spec.hidden}" if spec.k and spec.hidden else str(spec.hidden or "not recorded")
    if not points:
        return DiffRow("aux_widths", "Width of each aux layer", trained,
                       "no aux samples", MISMATCH if spec.uses_fc else UNKNOWN)
    seen = {p: sorted({int(w) for ph in widths[p].values() for w in ph}) for p in points}
    if spec.nothing_captured:  # the verify's hidden states are then the target's final one, not a layer's
        final = "/".join(str(w) for ws in seen.values() for w in ws)
        return DiffRow("aux_widths", "Width of each aux layer", trained,
                       f"no aux layer captured (the draft gets the target's final hidden state, {final} wide)",
                       MISMATCH if spec.uses_fc else UNKNOWN)
    served = ", ".join(f"{p[7:]}: {'/'.join(map(str, ws))}" for p, ws in seen.items())
    bad = any(ws != [spec.hidden] for ws in seen.values()) if spec.hidden else False
    return DiffRow("aux_widths", "Width of each aux layer", trained, served, MISMATCH if bad else OK)


def _concat(spec: _Spec, widths: dict) -> DiffRow:
    label = "Concatenated width into fc"
    trained = (f"{spec.k} × {spec.hidden} = {spec.fc_in}" if spec.k and spec.hidden
               else str(spec.fc_in or "not recorded"))
    aux = [p for p in widths if p.startswith("target.aux[")]
    per = [max(int(w) for ph in widths[p].values() for w in ph) for p in aux]
    if not spec.uses_fc:
        return DiffRow("concat", label, trained, "no fc in this draft", UNKNOWN)
    if not per or spec.nothing_captured:
        final = f": the final hidden state alone, {per[0]} wide" if per and len(per) == 1 else ""
        return DiffRow("concat", label, trained, f"nothing captured{final}", MISMATCH)
    total = sum(per)
    served = f"{len(per)} × {per[0]} = {total}" if len(set(per)) == 1 else f"{' + '.join(map(str, per))} = {total}"
    return DiffRow("concat", label, trained, served, OK if total == spec.fc_in else MISMATCH)


def _phase(spec: _Spec, phase: Phase, seen: dict[int, int]) -> DiffRow:
    expected = spec.expected_width(phase)
    label = f"Draft input: {phase.label}"
    trained = str(expected) if expected else "not recorded"
    if not seen or expected is None:
        return DiffRow(f"input_{phase.name}", label, trained, _widths_text(seen), UNKNOWN)
    bad = [w for w in seen if w != expected]
    note = ""
    if bad and phase.via_fc and spec.embed in bad:
        note = f"{spec.embed} is the draft's embed width: fc is silently skipped"
    return DiffRow(f"input_{phase.name}", label, trained, _widths_text(seen),
                   MISMATCH if bad else OK, note)


def _fc(spec: _Spec, widths: dict) -> DiffRow:
    n = sum(int(c) for ws in (widths.get("draft.fc.out") or {}).values() for c in ws.values())
    inputs = sum(int(c) for ph, ws in (widths.get("draft.input") or {}).items()
                 if ph in ("prefill", "draft_extend") for c in ws.values())
    trained = f"yes: {spec.fc_in} → {spec.embed}" if spec.uses_fc else "no fc"
    if not spec.uses_fc or not inputs:
        return DiffRow("fc", "fc ran", trained, f"{n} fc samples" if n else NOT_SEEN, UNKNOWN)
    if n:
        return DiffRow("fc", "fc ran", trained, f"yes ({n} samples)", OK)
    return DiffRow("fc", "fc ran", trained, f"no: 0 fc samples over {inputs} draft inputs", MISMATCH,
                   "vLLM skips fc when eagle_config.use_aux_hidden_state is false" if spec.engine == "vllm"
                   else "SGLang skips fc when the input is already the embed width")


def _vocab(spec: _Spec) -> DiffRow:
    d = spec.draft
    rows, cfg, hot = d.get("lm_head_rows"), d.get("config_draft_vocab_size"), d.get("hot_token_id") or {}
    trained = f"draft_vocab_size {cfg}" if cfg else "not recorded"
    parts, bad = [], False
    if rows is not None:
        parts.append(f"lm_head {rows} rows" + (" (shared with the target)" if d.get("lm_head_shared_with_target") else ""))
        bad |= bool(cfg and rows != cfg and not d.get("lm_head_shared_with_target"))
    if hot.get("present"):
        in_vocab = hot.get("in_target_vocab")
        parts.append(f"hot_token_id ids {hot.get('min_id')}..{hot.get('max_id')}"
                     + (" within" if in_vocab else " beyond") + f" the target's {spec.target.get('vocab_size')}")
        bad |= in_vocab is False
        if hot.get("equals_d2t_plus_arange") is False:
            parts.append("≠ d2t + arange")
    served = "; ".join(parts) or "not recorded"
    state = MISMATCH if bad else (OK if parts and cfg else UNKNOWN)
    return DiffRow("vocab", "Draft vocabulary and d2t", trained, served, state,
                   "d2t holds absolute ids, not offsets" if hot.get("in_target_vocab") is False else "")


def _weights(spec: _Spec, random: str | None) -> DiffRow:
    """``random``: the flag that loaded the draft with random values (its values then differ from
    the checkpoint as expected; missing keys and non-finite values still count)."""
    w = spec.draft.get("weights")
    if not w:
        return DiffRow("weights", "Loaded weights vs checkpoint", "checkpoint tensors", "not checked", UNKNOWN)
    missing, diff, nonfinite = (len(w.get(k) or []) for k in ("not_in_checkpoint", "mismatched", "nonfinite"))
    served = f"{w.get('matched', 0)} of {w.get('checked', 0)} parameters equal the checkpoint"
    if missing or diff or nonfinite:
        served += f"; {missing} not in it, {diff} differ, {nonfinite} non-finite"
    note = f"random values ({random}): differing from the checkpoint is expected" if random else ""
    bad = missing or nonfinite or (diff and not random)
    return DiffRow("weights", "Loaded weights vs checkpoint", "every parameter from the checkpoint",
                   served, MISMATCH if bad else OK, note)


def _positions(spec: _Spec, summary: dict) -> DiffRow:
    limit = spec.draft.get("max_position_embeddings")
    bins = summary.get("by_seq_pos") or []
    reached = max((b["hi"] for b in bins if b.get("steps")), default=None)
    trained = f"max_position_embeddings {limit}" if limit else "not recorded"
    if reached is None or not limit:
        return DiffRow("positions", "Sequence positions", trained,
                       f"up to {reached}" if reached is not None else NOT_SEEN, UNKNOWN)
    return DiffRow("positions", "Sequence positions", trained, f"up to {reached}",
                   MISMATCH if reached > limit else OK)


def _norms(stats: dict[str, Any], summary: dict) -> list[DiffRow]:
    rows = []
    norms = summary.get("norms") or {}
    for chunk in stats.get("aux") or []:
        i = chunk["index"]
        bins = norms.get(f"target.aux[{i}]") or []
        n = sum(b["n"] for b in bins)
        seen = sum(b["l2_mean"] * b["n"] for b in bins) / n if n else None
        trained = f"layer {chunk['layer']}: mean {chunk['mean']:.4g}, q01..q99 {chunk['q01']:.4g}..{chunk['q99']:.4g}"
        if seen is None:
            rows.append(DiffRow(f"norm_{i}", f"aux[{i}] L2 norm", trained, NOT_SEEN, UNKNOWN))
            continue
        inside = chunk["q01"] / 2 <= seen <= chunk["q99"] * 2
        rows.append(DiffRow(f"norm_{i}", f"aux[{i}] L2 norm", trained, f"mean {seen:.4g}",
                            OK if inside else MISMATCH))
    return rows


# Which observed row sits on which row of doctor's spec block; observed-only rows follow their anchor.
_ANCHOR = {"algorithm": "algorithm", "capture": "layers", "layers": "layers",
           "aux_widths": "aux_width", "concat": "fc_in", "input_prefill": "fc_in",
           "input_draft_extend": "fc_in", "input_draft_decode": "fc_in", "fc": "fc_in",
           "weights": "weights", "positions": "positions"}
_SAME = {"algorithm": "algorithm", "layers": "layers", "aux_widths": "aux_width",
         "concat": "fc_in", "vocab": "vocab", "weights": "weights", "positions": "positions"}


def combine(static: list[SpecRow] | None, observed: list[DiffRow]) -> list[DiffRow]:
    """One table: doctor's spec block (trained, and what the engine will do) with what the tracer saw
    on the same row where both speak of one thing; observed-only rows after their anchor row.
    Without a readable checkpoint the observed rows stand alone, trained values from the facts."""
    if not static:
        return observed
    by_static = {v: k for k, v in _SAME.items()}
    seen = {r.key: r for r in observed}
    rows: list[DiffRow] = []
    for s in static:
        mine = seen.get(by_static.get(s.key, ""))
        if s.mismatch or (mine and mine.state == MISMATCH):
            state = MISMATCH
        elif s.ambiguous:
            state = DEPENDS
        else:  # the checkpoint read here may settle what the recorded config alone could not
            state = OK if not mine or mine.state == DEPENDS else mine.state
        mine_note = mine.note if mine and mine.state != DEPENDS else ""  # else the static note says it
        note = "; ".join(n for n in (s.note, mine_note) if n)
        rows.append(DiffRow(s.key, s.label, s.trained, mine.served if mine else "", state, note,
                            predicted=s.predicted))
        rows += [r for r in observed if _ANCHOR.get(r.key) == s.key and r.key not in _SAME]
    placed = {r.key for r in rows} | set(_SAME)
    return rows + [r for r in observed if r.key not in placed]
