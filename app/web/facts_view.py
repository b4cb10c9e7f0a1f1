"""A run's attach-time facts (``RunRecord.facts``, recorded by ``draftscope_tracer.engine.sglang.facts``) as
labelled rows for a definition list: the facts that decide whether the draft gets what it was
trained on."""

from __future__ import annotations

from typing import Any

NOT_READ = "not read"  # a fact recorded as null: the tracer could not read it

_TOP = [("SGLang version", "sglang_version"), ("Algorithm", "algorithm"),
        ("Speculative steps", "spec_num_steps"), ("Draft tokens per verify", "spec_num_draft_tokens"),
        ("Top-k", "spec_topk"), ("CUDA graph", "cuda_graph"), ("Tensor parallel size", "tp_size")]
_TARGET = [("Path", "path"), ("Architecture", "architecture"), ("Layers", "num_layers"),
           ("Hidden size", "hidden_size"), ("Vocabulary", "vocab_size"),
           ("EAGLE-3 capture supported", "eagle3_capture_supported"),
           ("Capturing aux hidden states", "capture_aux_hidden_states"),
           ("Layers to capture", "layers_to_capture")]
_DRAFT = [("Path", "path"), ("Architecture", "architecture"), ("Hidden size", "hidden_size"),
          ("Embedding width", "embed_width"), ("fc input width", "fc_in_features"),
          ("lm_head rows", "lm_head_rows"), ("Config draft_vocab_size", "config_draft_vocab_size"),
          ("lm_head shared with target", "lm_head_shared_with_target"),
          ("Max positions", "max_position_embeddings")]
_HOT = [("Present", "present"), ("Size", "size"), ("Smallest id", "min_id"), ("Largest id", "max_id"),
        ("All ids in target vocabulary", "in_target_vocab"),
        ("Equals d2t + arange", "equals_d2t_plus_arange")]
_DEVICE = [("Rows per summary launch", "prepared_rows"), ("Summary layouts", "layouts"),
           ("Recomputes as CUDA graphs", "graphed_recomputes"), ("GPU memory reserved at attach", "reserved_bytes"),
           ("GPU memory reserved for the step tap", "step_tap_reserved_bytes"),
           ("The server's PyTorch GPU memory after attach", "process_reserved_bytes")]
_BYTES = ("reserved_bytes", "step_tap_reserved_bytes", "process_reserved_bytes")
_WEIGHTS = [("Parameters checked", "checked"), ("Matched the checkpoint", "matched"),
            ("Differ from the checkpoint", "mismatched"), ("Not in the checkpoint", "not_in_checkpoint"),
            ("Checkpoint keys unused", "checkpoint_keys_unused"), ("Non-finite", "nonfinite")]


def show(value: Any) -> str:
    """A fact value as text: null is 'not read', booleans yes/no, lists comma-separated."""
    if value is None:
        return NOT_READ
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(map(str, value)) if value else "none"
    return str(value)


def mib(value: Any) -> Any:
    """Bytes as MiB text; a negative count as not measured (tracers before b6fb5cb read the allocator's total, which
    a CUDA graph capture lowers); any other value as it is (``show`` writes it)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            return f"not measured ({value:,} bytes recorded: this tracer version misread it)"
        return f"{value / 2**20:,.1f} MiB"
    return value


def _rows(facts: dict[str, Any], fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(label, show(facts.get(key))) for label, key in fields]


def fact_sections(facts: dict[str, Any] | None) -> list[tuple[str, list[tuple[str, str]]]]:
    """(section title, [(label, value text)]) for the key attach-time facts; [] when none."""
    if not facts:
        return []
    target, draft = facts.get("target") or {}, facts.get("draft") or {}
    sections = [("Server", _rows(facts, _TOP)), ("Target", _rows(target, _TARGET)),
                ("Draft", _rows(draft, _DRAFT))]
    if draft.get("hot_token_id") is not None:
        sections.append(("Draft hot_token_id", _rows(draft["hot_token_id"], _HOT)))
    if draft.get("weights") is not None:
        sections.append(("Draft weights check", _rows(draft["weights"], _WEIGHTS)))
    tracing = facts.get("tracing")
    device = tracing.get("device") if isinstance(tracing, dict) else None
    if isinstance(device, dict):  # what the tracer built on the GPU at attach, as far as its engine records it
        shown = {**device, **{key: mib(device.get(key)) for key in _BYTES}}
        sections.append(("Tracer on the GPU", [(label, show(shown[key])) for label, key in _DEVICE if key in device]))
    return sections
