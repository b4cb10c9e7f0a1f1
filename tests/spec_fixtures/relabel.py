"""The test bed's trained draft relabelled in other trainers' formats, weights unchanged.

The draft was trained on the outputs of target layers 0, 3 and 6 (SpecForge's ids ``[0, 3, 6]``,
Hugging Face ``hidden_states[1, 4, 7]``). Relabelled, the same features are written in each format's
own convention, so an engine that reads the format right feeds exactly the trained layers:

* ``speculators_layout``: speculators' own layout (``Eagle3Speculator``, the model under
  ``transformer_layer_config``, top-level ids ``[1, 4, 7]``, ``layers.0.*`` keys);
* ``speculators_keys``: SGLang's ``LlamaForCausalLMEagle3`` layout whose ``speculators_*`` keys name
  speculators as the trainer, ids ``[1, 4, 7]`` in ``eagle_config``;
* ``eagle_layout``: EAGLE's own ``LlamaForCausalLM`` training layout (an ``fc`` weight), ids
  ``[1, 4, 7]`` in ``eagle_config``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

HF_IDS = [1, 4, 7]  # the trained layers as hidden_states[i] (speculators', EAGLE's, vLLM's counting)
TRAINED = [0, 3, 6]  # the same as "output of layer j" (SpecForge's, SGLang's Llama path)
SPECULATORS_KEYS = {"speculators_model_type": "eagle3", "speculators_version": "0.3.0"}
# keys of SGLang's draft config that speculators keeps at the top level, not in transformer_layer_config
TOP_LEVEL = ("draft_vocab_size", "target_hidden_size")


def _copy(src: Path, dst: Path) -> dict:
    shutil.copytree(src, dst)
    return json.loads((dst / "config.json").read_text())


def _write(dst: Path, config: dict) -> Path:
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return dst


def speculators_layout(src: Path, dst: Path) -> Path:
    """speculators' own layout, as its converter writes it (norm_before_residual false: this draft's)."""
    config = _copy(src, dst)
    body = {k: v for k, v in config.items() if k not in ("architectures", "eagle_config", *TOP_LEVEL)}
    layout = {"architectures": ["Eagle3Speculator"], **SPECULATORS_KEYS, "transformer_layer_config": body,
              **{k: config[k] for k in TOP_LEVEL}, "eagle_aux_hidden_state_layer_ids": HF_IDS,
              "norm_before_residual": False,
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                                           "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                                     "verifier": {"name_or_path": "target",
                                                  "architectures": ["LlamaForCausalLM"]}}}
    path = dst / "model.safetensors"
    tensors = load_file(path)
    save_file({k.replace("midlayer.", "layers.0."): v for k, v in sorted(tensors.items())}, path,
              metadata={"format": "pt"})
    return _write(dst, layout)


def speculators_keys(src: Path, dst: Path) -> Path:
    """SGLang's layout with the speculators library's keys, ids in speculators' convention."""
    config = _copy(src, dst)
    config.update(SPECULATORS_KEYS)
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = HF_IDS
    return _write(dst, config)


def eagle_layout(src: Path, dst: Path) -> Path:
    """EAGLE's training layout: architectures LlamaForCausalLM with the fc weight."""
    config = _copy(src, dst)
    config["architectures"] = ["LlamaForCausalLM"]
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = HF_IDS
    return _write(dst, config)
