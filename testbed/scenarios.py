"""Named EAGLE-3 draft misconfigurations for the CPU SGLang test bed.

Each scenario is a draft checkpoint directory derived from the healthy tiny draft
(``testbed.models.ensure_models``) plus the server arguments that differ from the default EAGLE-3
flags. ``prepare(name)`` writes it once (cached next to the models) and returns the paths:

    from testbed.scenarios import prepare
    s = prepare("aux-off")   # PreparedScenario(name, target_dir, draft_dir, server_args)

The behaviours listed are those of SGLang 0.5.23 with the 8-layer tiny target (measured; see
``docs/testbed.md``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file

from testbed.models import ModelPaths, ensure_models

# Bump when a scenario's derivation changes (the directory name carries it).
SCENARIO_VERSION = 1


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    expected: str
    edit: Callable[[Path, ModelPaths], None] | None = None  # edits a copy of the healthy draft in place
    server_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class PreparedScenario:
    name: str
    target_dir: Path
    draft_dir: Path
    server_args: list[str]


def _edit_config(draft: Path, change: Callable[[dict], None]) -> None:
    path = draft / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _rewrite_tensors(draft: Path, change: Callable[[dict], dict]) -> None:
    path = draft / "model.safetensors"
    tensors = change(load_file(path))
    save_file(dict(sorted(tensors.items())), path, metadata={"format": "pt"})


def _aux_off(draft: Path, models: ModelPaths) -> None:
    _edit_config(draft, lambda c: c["eagle_config"].update(use_aux_hidden_state=False))


def _weights_dropped(draft: Path, models: ModelPaths) -> None:
    # SGLang 0.5.23 maps "name" and "model.name" onto its parameters, so a "model." prefix would still
    # load; "draft_model." matches nothing and is skipped without a word. d2t is still taken (its
    # loader matches any key containing "d2t"), so only the weights are missing.
    _rewrite_tensors(draft, lambda t: {f"draft_model.{k}": v for k, v in t.items()})


def _d2t_absolute(draft: Path, models: ModelPaths) -> None:
    def absolute(t: dict) -> dict:
        t["d2t"] = t["d2t"] + torch.arange(t["d2t"].numel())
        return t

    _rewrite_tensors(draft, absolute)


def _last_layer_id(draft: Path, models: ModelPaths) -> None:
    layers = json.loads((models.target / "config.json").read_text())["num_hidden_layers"]

    def change(c: dict) -> None:
        ids = c["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [*ids[:-1], layers - 1]

    _edit_config(draft, change)


def _top_level_ids(draft: Path, models: ModelPaths) -> None:
    def change(c: dict) -> None:
        c["eagle_aux_hidden_state_layer_ids"] = c["eagle_config"].pop("eagle_aux_hidden_state_layer_ids")

    _edit_config(draft, change)


def _short_context(draft: Path, models: ModelPaths) -> None:
    _edit_config(draft, lambda c: c.update(max_position_embeddings=64))


def _layers_shifted(draft: Path, models: ModelPaths) -> None:
    # Every id one lower: SGLang captures the input of layers [0, 3, 6] (the embedding output and
    # the outputs of layers 2 and 5) while the draft was trained on the outputs of 0, 3 and 6.
    _edit_config(draft, lambda c: c["eagle_config"].update(
        eagle_aux_hidden_state_layer_ids=[i - 1 for i in c["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]))


def _ids_0_1_2(draft: Path, models: ModelPaths) -> None:
    _edit_config(draft, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[0, 1, 2]))


def _lm_head_removed(draft: Path, models: ModelPaths) -> None:
    _rewrite_tensors(draft, lambda t: {k: v for k, v in t.items() if k != "lm_head.weight"})


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("healthy", "the trained tiny draft as built", "reference acceptance (accept length well above 1)"),
        Scenario(
            "aux-off",
            "eagle_config.use_aux_hidden_state: false",
            "silent: the draft gets the target's 128-wide final hidden, fc never runs, acceptance ~1.0",
            _aux_off,
        ),
        Scenario(
            "algo-eagle",
            "--speculative-algorithm EAGLE with the EAGLE-3 draft",
            "silent: 128-wide input, fc skipped, the target's lm_head replaces the draft's, d2t ignored; "
            "acceptance ~1.0",
            server_args=("--speculative-algorithm", "EAGLE"),
        ),
        Scenario(
            "weights-dropped",
            "weights saved under keys SGLang does not load (draft_model. prefix)",
            "silent: loads 'normally', the draft runs on uninitialised weights; acceptance ~1.0",
            _weights_dropped,
        ),
        Scenario(
            "d2t-absolute",
            "d2t written as absolute target ids instead of offsets",
            "proposals map to wrong ids; once a mapped id >= vocab is drafted the scheduler dies "
            "(IndexError in embed_tokens): data-dependent",
            _d2t_absolute,
        ),
        Scenario(
            "last-layer-id",
            "an aux layer id equal to num_layers-1",
            "SGLang drops it: 2 aux states (256 wide) reach fc (384 in); the first request fails with "
            "'mat1 and mat2 shapes cannot be multiplied' and the server exits",
            _last_layer_id,
        ),
        Scenario(
            "top-level-ids",
            "aux layer ids only at the config's top level, not in eagle_config",
            "silent with 8 layers: SGLang falls back to layers [2, 4, 5] instead of [1, 4, 7]; width 384, fc runs, "
            "acceptance drops",
            _top_level_ids,
        ),
        Scenario(
            "short-context",
            "the draft's max_position_embeddings is 64 (the target's 2048)",
            "SGLang refuses to start (ValueError: the target's context_length 2048 > the draft's 64); with "
            "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 it overwrites the draft's limit and serves",
            _short_context,
        ),
        Scenario(
            "layers-shifted",
            "eagle_config ids each one lower than the trained layers ([-1, 2, 5] for [0, 3, 6])",
            "silent: the config is self-consistent, so only the features (and acceptance) show it",
            _layers_shifted,
        ),
        Scenario(
            "tree",
            "the trained draft drafting a tree: --speculative-eagle-topk 4, 8 draft tokens",
            "healthy: each verify step checks 7 tree nodes (up to 4 children each), accept length above 1",
            server_args=("--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8"),
        ),
        Scenario(
            "ids-0-1-2",
            "eagle_config ids [0, 1, 2] (the trained draft's weights unchanged)",
            "the engines part: SGLang 0.5.23 feeds fc the outputs of layers 0-2 (HF hidden_states[1, 2, 3]), "
            "vLLM 0.32 the embeddings and the outputs of layers 0-1 (hidden_states[0, 1, 2]); width 384 on both",
            _ids_0_1_2,
        ),
        Scenario(
            "lm-head-removed",
            "lm_head.weight dropped from the checkpoint (draft_vocab_size still set)",
            "silent: SGLang keeps a randomly initialised draft head",
            _lm_head_removed,
        ),
    ]
}


# scenario -> (doctor's root cause, the runtime root cause, the server dies serving the demo prompts): what the
# CPU bed finds (tests/test_scenario_findings.py), and the GPU bed must find the same (tests/gpu).
FINDINGS = {
    "healthy": (None, None, False),
    "tree": (None, None, False),
    "aux-off": ("fc-bypassed", "fc-bypassed", False),
    "algo-eagle": ("eagle-algorithm-with-eagle3-draft", "eagle-algorithm-with-eagle3-draft", False),
    "weights-dropped": ("draft-weights-not-loaded", "draft-weights-not-loaded", False),
    "d2t-absolute": ("d2t-not-offsets", "d2t-not-offsets", True),
    "last-layer-id": ("aux-count-short", "aux-count-short", True),
    # Static: the ids sit outside eagle_config. Runtime twin: the captured layers are SGLang's
    # fallback, not the trained ones.
    "top-level-ids": ("aux-ids-not-read", "captured-layers-differ", False),
}
# The same checkpoints on vLLM 0.32 (tests/test_vllm_scenarios.py): scenario -> (doctor --engine vllm's root
# cause, the runtime root cause, what the vLLM server did with the demo prompts: served | died | refused to
# start). None: no error or warning; vLLM's reading of the test bed's SpecForge-style ids one layer below
# SGLang's is aux-convention-ambiguous (info: the checkpoint names no trainer).
VLLM_FINDINGS = {
    "healthy": (None, None, "served"),
    "aux-off": ("fc-bypassed", "fc-bypassed", "served"),
    # an unknown key stops vLLM at start (SGLang loads the draft uninitialised)
    "weights-dropped": ("draft-weights-not-loaded", "server-start-failed", "refused"),
    # vLLM scatters every mapped id at the first draft (SGLang crashes once such an id is drafted)
    "d2t-absolute": ("d2t-not-offsets", "d2t-not-offsets", "died"),
    # vLLM reads top-level ids (SGLang falls back to its default) and id L-1 (SGLang drops it)
    "top-level-ids": (None, None, "served"),
    "last-layer-id": (None, None, "served"),
}
# Scenarios whose diagnosis needs more than the demo prompts, proven by their own tests: a start-up
# refusal, and acceptance signatures that need their own traffic.
ELSEWHERE = {"short-context": "tests/test_startup_refusal.py",
             "layers-shifted": "tests/test_acceptance_signatures.py",
             "lm-head-removed": "tests/test_acceptance_signatures.py",
             "ids-0-1-2": "tests/test_cross_engine.py"}


def prepare(name: str, root: Path | str | None = None) -> PreparedScenario:
    """Write (once) and return the scenario's target/draft directories and extra server arguments.

    Models come from `ensure_models()` (the shared cache); edited drafts are written under `root`
    (default: ``scenarios/`` next to the cached models) and reused when already there.
    """
    if name not in SCENARIOS:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    scenario = SCENARIOS[name]
    models = ensure_models()
    draft = models.draft
    if scenario.edit is not None:
        base = Path(root) if root is not None else models.draft.parent / "scenarios"
        draft = base / f"{models.draft.parent.name}-{name}-v{SCENARIO_VERSION}"
        if not draft.is_dir():
            base.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=base)) / "draft"
            shutil.copytree(models.draft, tmp)
            scenario.edit(tmp, models)
            try:
                tmp.rename(draft)
            except OSError:  # another process finished the same scenario first
                if not draft.is_dir():
                    raise
            finally:
                shutil.rmtree(tmp.parent, ignore_errors=True)
    return PreparedScenario(name, models.target, draft, list(scenario.server_args))
