"""Which target layers the draft's aux ids name, read in every convention that could apply.

The same id names different tensors in different trainers: SpecForge counts decoder-layer outputs
(id j = output of layer j), while speculators, EAGLE and Hugging Face ``hidden_states[j]`` count
the embedding output as 0 (id j = output of layer j-1). SGLang's Llama-family targets read ids the
SpecForge way; its DeepSeek/Kimi path adds 1 only when the first id is 1 (sglang PR #25454), so it
reads every other id list the speculators way. When the checkpoint does not name its trainer and
the format's convention differs from SGLang's reading, both readings are possible.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftscope.spec.draft import FORMAT_CONVENTION, DraftFeatureSpec, physical_layers
from draftscope.spec.sglang import SGLangExpectations, ids_capturing, sglang_reading
from draftscope.spec.target import TargetSpec

MEANING = {"output_of": "SpecForge's convention: id j is the output of decoder layer j",
           "input_to": "speculators' / EAGLE's / HF hidden_states[j] convention (the embedding "
                       "output is 0): id j is the output of decoder layer j-1",
           "boundary": "boundary indices: id j is the output of layer j-1, id L the last layer's",
           "recorded": "the trained layers recorded beside ids written for SGLang"}
SHORT = {"output_of": "output-of, as SpecForge", "input_to": "input-to, as speculators / HF",
         "boundary": "boundary", "recorded": "recorded"}


@dataclass
class Reading:
    """One way to read the draft's aux ids, and what SGLang makes of it."""

    convention: str  # output_of | input_to | boundary
    meaning: str
    physical: list[int] | None  # the trained layers ("output of layer j") under this reading
    matches_sglang: bool | None  # SGLang captures exactly these; None: unknown
    fix_ids: list[int] | None  # eagle_config ids that make SGLang capture ``physical``; None: none can


def aux_readings(spec: DraftFeatureSpec, target: TargetSpec,
                 exp: SGLangExpectations) -> list[Reading]:
    """One reading when the convention is settled; both (the format's first) when it is not."""
    if is_ambiguous(spec, target):
        fmt_conv = FORMAT_CONVENTION[spec.source_format]
        conventions = [fmt_conv, "input_to" if fmt_conv == "output_of" else "output_of"]
        physicals = [physical_layers(spec.aux_layer_ids, c, target.num_layers) for c in conventions]
    else:
        conventions, physicals = [spec.aux_convention], [spec.aux_layers_physical]
    readings = []
    for conv, physical in zip(conventions, physicals):
        matches = None if exp.captured_physical is None or physical is None \
            else exp.captured_physical == physical
        fix = ids_capturing(physical, target) if physical is not None else None
        readings.append(Reading(conv, MEANING[conv], physical, matches, fix))
    return readings


def is_ambiguous(spec: DraftFeatureSpec, target: TargetSpec) -> bool:
    """True when no trainer metadata settles the ids and SGLang reads them unlike the format."""
    if spec.trainer is not None or spec.aux_layer_ids is None or \
            spec.aux_convention in ("boundary", "recorded"):
        return False
    seen = sglang_reading(spec.aux_layer_ids, target)
    return seen is not None and seen != FORMAT_CONVENTION[spec.source_format]
