"""Tiny, deterministic models for the CPU SGLang test bed: a Llama target and its EAGLE-3 draft.

Everything is built offline from a seed (no hub access) and cached under a directory named by a
content hash of the build inputs, so a clean clone builds once and later calls reuse it:

    from testbed.models import ensure_models
    paths = ensure_models()          # ModelPaths(target=.../target, draft=.../draft)

    python -m testbed.models [--out DIR]

Cache root: ``DRAFTSCOPE_MODEL_CACHE``, else ``.cache/testbed-models`` in the repository.

Target: ``LlamaForCausalLM``, hidden 128, 8 layers, 4 heads / 2 KV heads, intermediate 256,
vocab 1024, fp32, weights ~N(0, 0.08), with a locally trained byte-level BPE tokenizer.
Draft: SGLang's ``LlamaForCausalLMEagle3`` layout, trained briefly on the target's own aux hidden
states and greedy continuations (see ``testbed/train_draft.py``).

Aux layer ids: ``[0, 3, 6]``. SGLang adds 1 to explicit ids (id i captures the *input* of layer
i+1, i.e. the output of layer i, which is HF's ``hidden_states[i+1]``), and an id equal to
``num_layers - 1`` is silently dropped. So valid ids are 0..6 with 8 layers; ``[0, 3, 6]`` spans
low/mid/high and captures layers ``[1, 4, 7]``, which differs from SGLang's fallback
``[2, L//2, L-3] = [2, 4, 5]`` (what it captures when the ids are missing), so that mistake changes
the draft's inputs while staying silent, as it does in production. SpecForge's own default for 8
layers, ``[1, 3, 4]``, would coincide with SGLang's fallback and hide it.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import tokenizers
import torch
import transformers
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
from tokenizers.models import BPE
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from testbed import train_draft
from testbed.texts import DEMO_PROMPTS, TOKENIZER_CORPUS

REPO_ROOT = Path(__file__).resolve().parent.parent
# Bump when a code change in this module, eagle3_draft.py or train_draft.py changes what gets written
# (the spec, the texts and the library versions are hashed on their own).
BUILD_VERSION = 2


@dataclass(frozen=True)
class TargetSpec:
    hidden: int = 128
    layers: int = 8
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 256
    vocab: int = 1024
    init_std: float = 0.08
    final_norm_std: float = 1.0
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    max_positions: int = 2048


@dataclass(frozen=True)
class DraftSpec:
    aux_layer_ids: tuple[int, ...] = (0, 3, 6)
    draft_vocab: int = 256
    intermediate: int = 256
    ttt_steps: int = 3
    train_steps: int = 800
    batch_size: int = 32
    learning_rate: float = 3e-3
    corpus_prompts: int = 2048
    corpus_new_tokens: int = 48


@dataclass(frozen=True)
class BuildSpec:
    seed: int = 20261129
    target: TargetSpec = field(default_factory=TargetSpec)
    draft: DraftSpec = field(default_factory=DraftSpec)


class ModelPaths(NamedTuple):
    target: Path
    draft: Path


def cache_root(override: Path | str | None = None) -> Path:
    if override is not None:
        return Path(override)
    env = os.environ.get("DRAFTSCOPE_MODEL_CACHE")
    return Path(env) if env else REPO_ROOT / ".cache" / "testbed-models"


def build_hash(spec: BuildSpec) -> str:
    """Content hash of what decides the bytes written: code version, spec, texts, library versions."""
    inputs = {
        "build_version": BUILD_VERSION,
        "spec": asdict(spec),
        "tokenizer_corpus": TOKENIZER_CORPUS,
        "training_prompts": [DEMO_PROMPTS, train_draft.DEMO_REPEATS],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def ensure_models(cache_root_dir: Path | str | None = None, spec: BuildSpec | None = None) -> ModelPaths:
    """Return the cached target/draft directories, building them first if needed (safe across processes)."""
    spec = spec or BuildSpec()
    root = cache_root(cache_root_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / build_hash(spec)
    paths = ModelPaths(final / "target", final / "draft")
    if (final / "build.json").is_file():
        return paths
    with open(root / f"{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (final / "build.json").is_file():
            tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
            try:
                build_models(tmp, spec)
                if final.exists():  # an interrupted earlier build
                    shutil.rmtree(final)
                tmp.rename(final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return paths


def build_models(out: Path, spec: BuildSpec) -> dict:
    """Write ``out/target``, ``out/draft`` and ``out/build.json`` (written last: marks completion)."""
    started = time.monotonic()
    torch.manual_seed(spec.seed)
    tokenizer = build_tokenizer(spec.target.vocab)
    target = build_target(spec.target, spec.seed)
    target_dir = out / "target"
    target.save_pretrained(target_dir, safe_serialization=True)
    tokenizer.save_pretrained(target_dir)

    trained = train_draft.train(target, tokenizer, spec)
    write_draft(out / "draft", spec, trained.state, trained.hot_ids)
    info = {
        "hash": build_hash(spec),
        "spec": asdict(spec),
        "train": trained.stats,
        "build_s": round(time.monotonic() - started, 1),
    }
    (out / "build.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


# -- tokenizer ------------------------------------------------------------------------------------
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|user|>", "<|assistant|>", "<|pad|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|user|>{% else %}<|assistant|>{% endif %}"
    "{{ message['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer(vocab: int):
    """Byte-level BPE trained on a few sentences, padded with reserved added tokens to exactly `vocab` ids."""
    tok = Tokenizer(BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab // 2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TOKENIZER_CORPUS, trainer=trainer)
    reserved = [f"<|reserved_{i}|>" for i in range(vocab - tok.get_vocab_size())]
    tok.add_special_tokens(reserved)
    if tok.get_vocab_size() != vocab:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} ids, expected {vocab}")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )


# -- target ---------------------------------------------------------------------------------------
def build_target(t: TargetSpec, seed: int):
    config = LlamaConfig(
        vocab_size=t.vocab,
        hidden_size=t.hidden,
        intermediate_size=t.intermediate,
        num_hidden_layers=t.layers,
        num_attention_heads=t.heads,
        num_key_value_heads=t.kv_heads,
        max_position_embeddings=t.max_positions,
        rms_norm_eps=t.rms_eps,
        rope_theta=t.rope_theta,
        initializer_range=t.init_std,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=4,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        # Mean-zero final norm weights: the final post-norm hidden (what the draft receives when aux
        # capture is off) is then uncorrelated with the residual stream the aux states come from,
        # as different as it is at scale, where learned final norms are far from ones.
        model.model.norm.weight.normal_(0.0, t.final_norm_std)
    model.generation_config.do_sample = False
    return model


# -- draft checkpoint -----------------------------------------------------------------------------
def draft_config(spec: BuildSpec) -> dict:
    t, d = spec.target, spec.draft
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": t.hidden,
        "intermediate_size": d.intermediate,
        "num_hidden_layers": 1,
        "num_attention_heads": t.heads,
        "num_key_value_heads": t.kv_heads,
        "head_dim": t.hidden // t.heads,
        "hidden_act": "silu",
        "rms_norm_eps": t.rms_eps,
        "rope_theta": t.rope_theta,
        "max_position_embeddings": t.max_positions,
        "vocab_size": t.vocab,
        "draft_vocab_size": d.draft_vocab,
        "target_hidden_size": t.hidden,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "float32",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(d.aux_layer_ids),
            "use_aux_hidden_state": True,
        },
    }


def d2t_t2d(hot_ids, vocab: int):
    """SGLang's token maps: d2t[i] = target id of draft id i minus i (offsets); t2d: membership mask."""
    hot = torch.as_tensor(sorted(hot_ids), dtype=torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[hot] = True
    return hot - torch.arange(hot.numel()), t2d


def write_draft(out: Path, spec: BuildSpec, state: dict, hot_ids) -> None:
    out.mkdir(parents=True)
    d2t, t2d = d2t_t2d(hot_ids, spec.target.vocab)
    tensors = dict(state) | {"d2t": d2t, "t2d": t2d}
    save_file(dict(sorted(tensors.items())), out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(draft_config(spec), indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="cache root (default: $DRAFTSCOPE_MODEL_CACHE, else .cache/testbed-models)")
    args = parser.parse_args(argv)
    paths = ensure_models(args.out)
    info = json.loads((paths.target.parent / "build.json").read_text())
    print(json.dumps({"target": str(paths.target), "draft": str(paths.draft), "train": info["train"]}, indent=2))


if __name__ == "__main__":
    main()
