"""What one serving engine will do with a draft + target pair (``expect_sglang``, ``expect_vllm``).

Layers are counted the same way for every engine: ``layers_to_capture`` holds Hugging Face
``hidden_states`` indices (capture = the input of layer i, 0 the embedding output) and
``captured_physical`` the same tensors as "output of layer j" (j = i - 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ENGINES = ("sglang", "vllm")
VERSIONS = {"sglang": "0.5.23", "vllm": "0.32"}
NAMES = {"sglang": "SGLang", "vllm": "vLLM"}


def engine_label(engine: str) -> str:
    """``"vllm"`` -> ``"vLLM 0.32"``: the engine and the version draftscope models."""
    return f"{NAMES[engine]} {VERSIONS[engine]}"


@dataclass
class Expectations:
    """What the engine will capture, feed, load and ignore for this pair."""

    algorithm: str
    draft_class_supported: bool
    aux_capture: bool
    capture_reason: str
    ids_passed: list[int] | None  # the ids the engine reads (SGLang: set_eagle3_layers_to_capture's argument)
    shift_rule: str | None  # plus1 | first1 (SGLang) | as_is (vLLM) | None (target class unknown to draftscope)
    layers_to_capture: list[int] | None  # the target's live attribute (capture = input of layer i)
    captured_layers: list[int] | None  # the ones that exist, in capture (layer) order
    dropped_layers: list[int]  # requested but beyond the last layer: silently never captured
    captured_physical: list[int] | None  # as "output of layer j"
    aux_count: int | None
    draft_input_width: int | None  # what the draft receives at prefill / extend
    fc_in_features: int  # the fc the engine builds
    fc_runs: bool | None
    fc_shape_error: bool | None  # fc runs on a width it was not built for: crash at request 1
    lm_head_source: str  # draft | target | draft_embed (tied)
    d2t_used: bool
    keys_loaded: dict[str, str] = field(default_factory=dict)  # checkpoint key -> parameter
    keys_renamed: dict[str, str] = field(default_factory=dict)  # legacy key -> new name
    keys_ignored: list[str] = field(default_factory=list)
    params_missing: list[str] = field(default_factory=list)  # required params no key fills
    sources: dict[str, str] = field(default_factory=dict)
    # start-up (SGLang: configs/model_config.py::_derive_context_length, for the target then the draft)
    context_len: int | None = None  # the target's, which the draft runs at (None: not predicted)
    draft_context_len: int | None = None  # derived from the draft config (before any override)
    startup_error: str | None = None  # the ValueError SGLang raises on the context length, if any
    draft_max_position_override: int | None = None  # the draft's max_position_embeddings after override
    override_env: str | None = None  # the variable that allowed an override
    load_error: str | None = None  # the error loading the draft's weights stops the server with (vLLM)
    engine: str = "sglang"
    draft_class: str | None = None  # the model class the engine builds for the draft; None: no EAGLE-3 head
    draft_class_reason: str = ""  # why not, in the engine's own terms, when ``draft_class`` is None

    @property
    def label(self) -> str:
        return engine_label(self.engine)
