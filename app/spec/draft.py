"""Read a draft checkpoint directory into a normalised DraftFeatureSpec (what the draft expects)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from draftscope.spec.checkpoint import Checkpoint, read_checkpoint
from draftscope.spec.config_file import derived_context_length, load_config, rope_of
from draftscope.spec.errors import SpecError
from draftscope.spec.feature_stats import find_feature_stats
from draftscope.spec.training import find_training_config, read_training
from draftscope.spec.vocab_map import VocabMapCheck, check_vocab_map

# architecture -> source format
FORMATS = {
    "LlamaForCausalLMEagle3": "specforge",  # SGLang / SpecForge
    "Eagle3DeepseekV2ForCausalLM": "eagle3-mla",  # MLA draft for DeepSeek / Kimi targets
    "Eagle3Speculator": "speculators",  # vLLM speculators
    "LlamaForCausalLM": "eagle",  # SafeAILab EAGLE-3 training config (recognised by its fc.weight)
}
# Layer-index conventions for the same physical tensor "output of decoder layer j (0-based)":
#   output_of: id j (SpecForge, SGLang explicit ids); input_to: id j+1 (EAGLE, speculators, vLLM);
#   boundary: id j+1 where id N means after the last block (gpt-oss Eagle3-v3).
# Written by ``doctor --fix`` when it rewrites the ids in one engine's reading for one target class:
# the trained layers as "output of decoder layer j", so the rewritten ids are not re-read.
RECORDED_KEY = "draftscope_trained_aux_layers"
FORMAT_CONVENTION = {"specforge": "output_of", "eagle3-mla": "output_of",
                     "speculators": "input_to", "eagle": "input_to"}


@dataclass
class DraftFeatureSpec:
    """What an EAGLE-3 draft was trained to receive and how its checkpoint is laid out."""

    path: str
    source_format: str  # specforge | eagle3-mla | speculators | eagle
    architecture: str
    config: dict[str, Any]
    # aux hidden states
    aux_layer_ids: list[int] | None  # as written
    aux_ids_location: str  # eagle_config | top_level | none
    aux_convention: str  # output_of | input_to | boundary
    aux_convention_reason: str
    aux_layers_physical: list[int] | None  # "output of decoder layer j", 0-based; None: needs target
    use_aux_hidden_state: bool
    k: int  # number of aux states the fc was trained on
    target_hidden_size: int
    expected_fc_in_width: int  # k * target hidden
    fc_in_features: int | None  # from the checkpoint's fc weight
    # draft model
    hidden_size: int
    num_layers: int
    is_mla: bool
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool
    norm_before_residual: bool | None  # None: the key is absent (engine defaults differ)
    norm_keys: dict[str, list[str]]  # EAGLE-3.1 flag -> checkpoint keys holding its weights
    max_position_embeddings: int | None
    context_length: int  # what SGLang derives from the draft config before any override
    rope: dict[str, Any]
    # vocabulary
    target_vocab_size: int | None  # the target vocab the draft config declares
    draft_vocab_size: int | None
    tie_word_embeddings: bool
    lm_head_rows: int | None
    vocab_map: VocabMapCheck
    # checkpoint layout
    key_style: str  # midlayer | layers.0 | prefixed:<prefix> | unknown
    keys: dict[str, list[int]] = field(default_factory=dict)  # name -> shape
    verifier: dict[str, Any] | None = None  # speculators verifier {name_or_path, architectures}
    training: dict[str, Any] | None = None  # the trainer's config (draftscope.spec.training)
    training_path: str | None = None
    trainer: str | None = None  # specforge | speculators | eagle, when the checkpoint says so
    trainer_source: str = ""  # how draftscope knows (or why it does not)
    feature_stats: dict[str, Any] | None = None  # draftscope_feature_stats.json (draftscope stats)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_draft(directory: str | Path, target_layers: int | None = None, allow_bin: bool = False,
               training_config: str | Path | None = None) -> DraftFeatureSpec:
    """Read ``directory`` (config.json + weights). ``target_layers`` (the target's decoder layer
    count) resolves default aux layers and the boundary convention; without it those stay None."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SpecError(directory, "is not a directory. Pass the draft checkpoint directory "
                        "(the one given to --speculative-draft-model-path).")
    config = load_config(directory / "config.json")
    ckpt = read_checkpoint(directory, allow_bin=allow_bin)
    fmt, arch = _detect_format(directory / "config.json", config, ckpt)
    body = config.get("transformer_layer_config") if fmt == "speculators" else config
    if not isinstance(body, dict) or body.get("hidden_size") is None:
        raise SpecError(directory / "config.json", "has no hidden_size"
                        f"{' in transformer_layer_config' if fmt == 'speculators' else ''}; "
                        "it is not a complete draft config.")
    eagle_config = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    ids, location = _aux_ids(config, eagle_config)
    hidden = int(body["hidden_size"])
    target_hidden = int(config.get("target_hidden_size") or body.get("target_hidden_size") or hidden)
    fc_key = _find_key(ckpt, "fc.weight")
    fc_in = ckpt.shape(fc_key)[1] if fc_key and len(ckpt.shape(fc_key)) == 2 else None
    k = _aux_count(config, ids, fc_in, target_hidden)
    if training_config is None:
        training_config = find_training_config(directory)
    training = read_training(training_config) if training_config else None
    trainer, trainer_source = trainer_of(config, fmt, arch, training)
    convention, reason = _convention(fmt, ids, target_layers, trainer, config)
    target_vocab = body.get("vocab_size")
    d2t_key, t2d_key = _find_key(ckpt, "d2t"), _find_key(ckpt, "t2d")
    vocab_map = check_vocab_map(ckpt.values(d2t_key) if d2t_key else None,
                                ckpt.values(t2d_key) if t2d_key else None,
                                int(target_vocab) if target_vocab is not None else None)
    lm_key = _find_key(ckpt, "lm_head.weight")
    spec = DraftFeatureSpec(
        path=str(directory), source_format=fmt, architecture=arch, config=config,
        aux_layer_ids=ids, aux_ids_location=location, aux_convention=convention,
        aux_convention_reason=reason,
        aux_layers_physical=physical_layers(ids, convention, target_layers, config),
        use_aux_hidden_state=bool(eagle_config.get("use_aux_hidden_state", True)),
        k=k, target_hidden_size=target_hidden, expected_fc_in_width=k * target_hidden,
        fc_in_features=fc_in, hidden_size=hidden,
        num_layers=int(body.get("num_hidden_layers") or 1),
        is_mla=fmt == "eagle3-mla" or body.get("kv_lora_rank") is not None,
        norm_before_fc=bool(eagle_config.get("norm_before_fc", config.get("norm_before_fc", False))),
        fc_norm=bool(config.get("fc_norm") or config.get("use_aux_norm")),
        norm_output=bool(config.get("norm_output", False)),
        norm_before_residual=config.get("norm_before_residual"),
        norm_keys=norm_keys(ckpt.names()),
        max_position_embeddings=body.get("max_position_embeddings"),
        context_length=derived_context_length(body), rope=rope_of(body),
        target_vocab_size=int(target_vocab) if target_vocab is not None else None,
        draft_vocab_size=config.get("draft_vocab_size"),
        tie_word_embeddings=bool(body.get("tie_word_embeddings", False)),
        lm_head_rows=ckpt.shape(lm_key)[0] if lm_key else None, vocab_map=vocab_map,
        key_style=_key_style(ckpt, fc_key),
        keys={name: list(ckpt.shape(name)) for name in ckpt.names()},
        verifier=(config.get("speculators_config") or {}).get("verifier"),
        training=training, training_path=str(training_config) if training_config else None,
        trainer=trainer, trainer_source=trainer_source,
        feature_stats=find_feature_stats(directory))
    return spec


def physical_layers(ids: list[int] | None, convention: str, target_layers: int | None,
                    config: dict | None = None) -> list[int] | None:
    """The trained aux layers as "output of decoder layer j" (0-based)."""
    if convention == "recorded":
        return list(config[RECORDED_KEY])
    if ids is None:
        if target_layers is None:
            return None
        n = target_layers
        # Every format's default is the same three tensors: SpecForge writes [1, N//2-1, N-4]
        # (output-of), EAGLE and speculators write [2, N//2, N-3] (input-to).
        return [1, n // 2 - 1, n - 4]
    return list(ids) if convention == "output_of" else [i - 1 for i in ids]


# Keys of SpecForge's train_eagle3 arguments (scripts/train_eagle3_*.py), as a saved training config.
SPECFORGE_TRAINING_KEYS = {"target_model_path", "draft_model_config", "train_data_path", "ttt_length",
                           "chat_template"}
TRAINERS = {"specforge": "SpecForge", "speculators": "speculators", "eagle": "EAGLE (SafeAILab)"}


def trainer_of(config: dict, fmt: str, arch: str,
               training: dict[str, Any] | None) -> tuple[str | None, str]:
    """(trainer, how known): from the trainer's own metadata, else None with what the format implies."""
    train_keys = sorted(SPECFORGE_TRAINING_KEYS & {k.replace("-", "_") for k in training or {}})
    if len(train_keys) >= 2:  # the weights' trainer, also when a converter wrote the config after it
        return "specforge", f"the training config has SpecForge's arguments ({', '.join(train_keys)})"
    spec_keys = sorted(k for k in config if k.startswith("speculators_"))
    if spec_keys:
        return "speculators", f"config.json has {', '.join(spec_keys)} (written by the speculators library)"
    if fmt == "eagle":
        return "eagle", f"architectures {arch} with an fc weight is EAGLE's own training layout"
    if fmt == "speculators":
        return "speculators", f"the speculators layout ({arch}, transformer_layer_config) is speculators' own"
    return None, (f"not recorded: the {fmt} layout ({arch}) is written by more than one trainer; "
                  "no speculators_* key or training config names the trainer")


def layers_of_ids(fmt: str, ids: list[int], target_layers: int | None,
                  trainer: str | None) -> list[int] | None:
    """The layers ("output of layer j") that ``ids`` name for a draft of this format and trainer."""
    convention, _ = _convention(fmt, ids, target_layers, trainer)
    return physical_layers(ids, convention, target_layers)


@dataclass(frozen=True)
class ConfigIds:
    """The aux ids of a draft config alone (e.g. the config the tracer recorded) and how they read."""

    source_format: str
    ids: list[int] | None
    convention: str
    reason: str
    trainer: str | None
    physical: list[int] | None  # "output of decoder layer j" under ``convention``


def config_ids(config: dict, target_layers: int | None) -> ConfigIds | None:
    """The aux ids of a draft config alone, when the checkpoint directory cannot be read here;
    None when the config is not an EAGLE-3 draft's."""
    found = format_of(config)
    if found is None:
        return None
    fmt = found[0]
    eagle_config = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    ids, _ = _aux_ids(config, eagle_config)
    trainer = trainer_of(config, fmt, "", None)[0]
    convention, reason = _convention(fmt, ids, target_layers, trainer, config)
    return ConfigIds(fmt, ids, convention, reason, trainer,
                     physical_layers(ids, convention, target_layers, config))


def config_fc_width(config: dict, hidden: int | None = None) -> int | None:
    """The fc width a draft config implies, one ``target_hidden_size`` (else ``hidden``) per aux id;
    None without ids. For a trace whose live draft has no fc (vLLM builds none without aux capture)."""
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") or config.get("eagle_aux_hidden_state_layer_ids")
    k = config.get("num_aux_hidden_states") or (len(ids) if ids else None)
    width = config.get("target_hidden_size") or hidden
    return int(k) * int(width) if k and width else None


def _detect_format(config_path: Path, config: dict, ckpt: Checkpoint) -> tuple[str, str]:
    found = format_of(config, has_fc=_find_key(ckpt, "fc.weight") is not None)
    if found is None:
        archs = config.get("architectures") or []
        raise SpecError(config_path, f"declares architectures {archs or 'none'}, which is not an "
                        "EAGLE-3 draft draftscope knows (LlamaForCausalLMEagle3, "
                        "Eagle3DeepseekV2ForCausalLM, Eagle3Speculator, or an EAGLE LlamaForCausalLM "
                        "draft with an fc weight). Check that this is the draft, not the target.")
    return found


def format_of(config: dict, has_fc: bool = True) -> tuple[str, str] | None:
    """(source format, the architecture config.json declares) by the checkpoint's layout: speculators'
    own (``Eagle3Speculator``, or the model under ``transformer_layer_config``), else the first known
    architecture (an EAGLE ``LlamaForCausalLM`` only with an fc weight); None when none is known.
    A ``LlamaForCausalLMEagle3`` config with ``speculators_*`` keys keeps SGLang's layout: the keys
    name its trainer (``trainer_of``), not its layout."""
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    if "Eagle3Speculator" in archs or (config.get("speculators_model_type") == "eagle3"
                                       and isinstance(config.get("transformer_layer_config"), dict)):
        return "speculators", archs[0] if archs else "Eagle3Speculator"
    for arch in archs:
        if arch in FORMATS and (arch != "LlamaForCausalLM" or has_fc):
            return FORMATS[arch], arch
    return None


def _aux_ids(config: dict, eagle_config: dict) -> tuple[list[int] | None, str]:
    key = "eagle_aux_hidden_state_layer_ids"
    if eagle_config.get(key) is not None:
        return [int(i) for i in eagle_config[key]], "eagle_config"
    if config.get(key) is not None:
        return [int(i) for i in config[key]], "top_level"
    return None, "none"


def _aux_count(config: dict, ids: list[int] | None, fc_in: int | None, target_hidden: int) -> int:
    if fc_in and fc_in % target_hidden == 0:
        return fc_in // target_hidden
    if config.get("num_aux_hidden_states"):
        return int(config["num_aux_hidden_states"])
    return len(ids) if ids else 3


def _convention(fmt: str, ids: list[int] | None, target_layers: int | None,
                trainer: str | None = None, config: dict | None = None) -> tuple[str, str]:
    """How the ids count layers, from the evidence in this order: what the checkpoint records
    (draftscope's recorded layers, the trainer its keys or training config name, speculators' own
    layout), ids only one convention can mean, then the format's convention. Where that last is a
    guess (a layout more than one trainer writes), ``convention.is_ambiguous`` says so."""
    if ids is not None and isinstance((config or {}).get(RECORDED_KEY), list):
        return "recorded", (f"{RECORDED_KEY} records the trained layers beside ids rewritten for the "
                            "engine by draftscope doctor --fix")
    if ids and target_layers is not None and max(ids) >= target_layers:
        return "boundary", (f"id {max(ids)} >= the target's {target_layers} layers: only hidden_states "
                            "counting names it (boundary indices)")
    if trainer == "specforge":
        what = ("a SpecForge training config beside speculators' layout: a conversion copies SpecForge's "
                "eagle_config ids as they are" if fmt == "speculators" else "its training config says so")
        return "output_of", f"SpecForge counts decoder-layer outputs ({what})"
    if fmt == "speculators":
        return "input_to", "speculators' own layout counts hidden_states[i] (the format's definition)"
    if trainer == "speculators":
        return "input_to", "speculators counts hidden_states[i] (config.json's speculators_* keys name it the trainer)"
    if fmt == "eagle":
        return "input_to", "EAGLE's layout counts hidden_states[i] (the input of layer i)"
    if fmt == "eagle3-mla" and ids and ids[0] != 1:
        return "input_to", ("a guess: MLA drafts whose first id is not 1 count input-to "
                            "(SGLang's DeepSeek path reads them so, sglang PR #25454)")
    return FORMAT_CONVENTION[fmt], f"the {fmt} format's convention"


# EAGLE-3.1 flag -> checkpoint key patterns of its weights (legacy aux_norm_low/mid/high = fc_norm.0-2;
# norm_output has none: it only picks which hidden state feeds the next draft step).
NORM_KEY_PATTERNS = {"norm_before_fc": re.compile(r"(^|\.)input_norm\.weight$"),
                     "fc_norm": re.compile(r"(^|\.)(fc_norm\.\d+|aux_norm_(low|mid|high))\.weight$")}


def norm_keys(names: list[str]) -> dict[str, list[str]]:
    """EAGLE-3.1 flag -> the checkpoint keys that hold its trained weights."""
    return {flag: [n for n in names if pattern.search(n)] for flag, pattern in NORM_KEY_PATTERNS.items()}


def _find_key(ckpt: Checkpoint, suffix: str) -> str | None:
    """The checkpoint key equal to ``suffix`` or ending in ``.suffix`` (shortest wins)."""
    hits = [n for n in ckpt.names() if n == suffix or n.endswith("." + suffix)]
    return min(hits, key=len) if hits else None


def _key_style(ckpt: Checkpoint, fc_key: str | None) -> str:
    names = ckpt.names()
    if any(n.startswith("midlayer.") for n in names):
        return "midlayer"
    if any(n.startswith("layers.0.") for n in names):
        return "layers.0"
    if fc_key and fc_key != "fc.weight":
        return "prefixed:" + fc_key[: -len("fc.weight")]
    return "unknown"
