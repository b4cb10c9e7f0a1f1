"""Which target layers the draft's aux ids name, read in every convention that could apply.

The same id names different tensors in different trainers: SpecForge counts decoder-layer outputs
(id j = output of layer j = Hugging Face ``hidden_states[j+1]``), while speculators, EAGLE and HF
``hidden_states[j]`` count the embedding output as 0 (id j = output of layer j-1). SGLang 0.5.23's
Llama-family targets read ids the SpecForge way (``models/llama.py::set_eagle3_layers_to_capture``:
layers_to_capture = id + 1, capture = input of layer i = ``hidden_states[i]``); its DeepSeek/Kimi
path adds 1 only when the first id is 1 (``models/deepseek_v2.py::set_eagle3_layers_to_capture``,
sglang PR #25454), so it reads every other id list the speculators way. vLLM 0.32 reads every id
the speculators way (id i feeds ``hidden_states[i]``, ``spec/vllm.py``). When the checkpoint records no
convention (``draft._convention``: no recorded layers, no trainer, not speculators' or EAGLE's own
layout) and the format's convention differs from the engine's reading, both readings are possible:
each verdict then says which convention it assumes (docs/findings.md, "Aux-layer id conventions").
"""

from __future__ import annotations

from dataclasses import dataclass

from draftscope.spec import engines
from draftscope.spec.draft import FORMAT_CONVENTION, ConfigIds, DraftFeatureSpec, physical_layers
from draftscope.spec.expectations import VERSIONS, Expectations
from draftscope.spec.target import TargetSpec

MEANING = {"output_of": "SpecForge's convention: id j is the output of decoder layer j",
           "input_to": "speculators' / EAGLE's / HF hidden_states[j] convention (the embedding "
                       "output is 0): id j is the output of decoder layer j-1",
           "boundary": "boundary indices: id j is the output of layer j-1, id L the last layer's",
           "recorded": "the trained layers recorded beside ids rewritten for an engine"}
SHORT = {"output_of": "output-of, as SpecForge", "input_to": "input-to, as speculators / HF",
         "boundary": "boundary", "recorded": "recorded"}
# Whose convention, as a verdict names it ("under SpecForge's convention ...").
OWNER = {"output_of": "SpecForge's", "input_to": "speculators'", "boundary": "the boundary-index",
         "recorded": "draftscope's recorded"}
# The convention in HF hidden_states terms (hidden_states[0] is the embedding output).
IN_HF = {"output_of": "id j = output of layer j = hidden_states[j+1]",
         "input_to": "id j = hidden_states[j] = input of layer j",
         "boundary": "id j = hidden_states[j], id L the last layer's output",
         "recorded": "the trained layers, recorded by draftscope doctor --fix"}


@dataclass
class Reading:
    """One way to read the draft's aux ids, and what the engine makes of it."""

    convention: str  # output_of | input_to | boundary | recorded
    meaning: str
    physical: list[int] | None  # the trained layers ("output of layer j") under this reading
    matches_engine: bool | None  # the engine feeds exactly these; None: unknown
    fix_ids: list[int] | None  # ids that make the engine feed ``physical``; None: none can


def aux_readings(spec: DraftFeatureSpec, target: TargetSpec,
                 exp: Expectations) -> list[Reading]:
    """One reading when the convention is settled; both (the format's first) when it is not."""
    readings = []
    for conv, physical in spec_readings(spec, target, exp.engine):
        matches = None if exp.captured_physical is None or physical is None \
            else exp.captured_physical == physical
        fix = engines.ids_capturing(physical, target, exp.engine) if physical is not None else None
        readings.append(Reading(conv, MEANING[conv], physical, matches, fix))
    return readings


def spec_readings(spec: DraftFeatureSpec, target: TargetSpec,
                  engine: str = "sglang") -> list[tuple[str, list[int] | None]]:
    """(convention, trained layers as "output of layer j") per possible reading of the ids."""
    if not is_ambiguous(spec, target, engine):
        return [(spec.aux_convention, spec.aux_layers_physical)]
    return _both(spec.source_format, spec.aux_layer_ids, target.num_layers)


def config_readings(read: ConfigIds, target: TargetSpec,
                    engine: str = "sglang") -> list[tuple[str, list[int] | None]]:
    """``spec_readings`` for a draft config alone (``draft.config_ids``: no training config)."""
    if not _ambiguous(read.source_format, read.ids, read.convention, read.trainer, target, engine):
        return [(read.convention, read.physical)]
    return _both(read.source_format, read.ids, target.num_layers)


def is_ambiguous(spec: DraftFeatureSpec, target: TargetSpec, engine: str = "sglang") -> bool:
    """True when the checkpoint records no convention (no recorded layers, no trainer: speculators' and
    EAGLE's layouts name theirs) and the engine reads the ids unlike the format."""
    return _ambiguous(spec.source_format, spec.aux_layer_ids, spec.aux_convention, spec.trainer, target, engine)


def _ambiguous(fmt: str, ids: list[int] | None, convention: str, trainer: str | None,
               target: TargetSpec, engine: str) -> bool:
    if trainer is not None or ids is None or convention in ("boundary", "recorded"):
        return False
    seen = engines.reading(ids, target, engine)
    return seen is not None and seen != FORMAT_CONVENTION[fmt]


def _both(fmt: str, ids: list[int] | None, layers: int) -> list[tuple[str, list[int] | None]]:
    first = FORMAT_CONVENTION[fmt]
    conventions = [first, "input_to" if first == "output_of" else "output_of"]
    return [(c, physical_layers(ids, c, layers)) for c in conventions]


def hidden_states(physical: list[int]) -> str:
    """``[19, 39, 59]`` (outputs of layers) -> ``"hidden_states[20, 40, 60]"`` (HF indices); ``[]``
    -> "no aux hidden states" (nothing captured)."""
    if not physical:
        return "no aux hidden states"
    return "hidden_states[" + ", ".join(str(j + 1) for j in physical) + "]"


def verdicts(readings: list[tuple[str, list[int] | None]], captured: list[int],
             architecture: str | None, engine: str = "sglang") -> str:
    """Each reading's verdict, naming its convention: "under SpecForge's convention these ids mean
    hidden_states[21, 41, 61] and SGLang's DeepSeek path feeds hidden_states[20, 40, 60]: off by
    one; under speculators' they match". ``captured``: what the engine feeds, as outputs of layers."""
    fed, path, parts = hidden_states(captured), engines.path(architecture, engine), []
    for conv, physical in readings:
        if physical is None:
            parts.append(f"under {OWNER[conv]} convention the trained layers are unknown")
        elif physical == captured and parts:
            parts.append(f"under {OWNER[conv]} they match")
        elif physical == captured:
            parts.append(f"under {OWNER[conv]} convention these ids mean {hidden_states(physical)}, "
                         f"which {path} feeds: they match")
        elif not captured:
            parts.append(f"under {OWNER[conv]} convention these ids mean {hidden_states(physical)} "
                         f"and {path} captures none of them")
        else:
            parts.append(f"under {OWNER[conv]} convention these ids mean {hidden_states(physical)} "
                         f"and {path} feeds {fed}: {offset(physical, captured)}")
    return "; ".join(parts)


def offset(trained: list[int], captured: list[int]) -> str:
    """"off by one (one layer shallower)", or "other layers" when no single shift explains it."""
    shifts = {c - t for t, c in zip(trained, captured)}
    if len(trained) != len(captured) or len(shifts) != 1:
        return "other layers"
    d = shifts.pop()
    n = "one" if abs(d) == 1 else str(abs(d))
    return f"off by {n} ({n} layer{'s' if abs(d) > 1 else ''} {'deeper' if d > 0 else 'shallower'})"


def other_engine(ids: list[int] | None, engine: str, num_layers: int | None) -> str:
    """On vLLM, a clause on what SGLang's Llama-family path makes of the same ids (one layer deeper,
    and never the input of layer L); "" on SGLang."""
    if engine != "vllm" or not ids or not num_layers:
        return ""
    fed = [i + 1 for i in ids if 0 <= i + 1 < num_layers]
    lost = [i for i in ids if not 0 <= i + 1 < num_layers]
    deeper = f"hidden_states{fed} on a Llama-family target" if fed else "on a Llama-family target"
    return (f"; SGLang {VERSIONS['sglang']} reads the same ids one layer deeper ({deeper}"
            + (f", and never captures id {lost}'s hidden_states{[i + 1 for i in lost]}" if lost else "") + ")")
