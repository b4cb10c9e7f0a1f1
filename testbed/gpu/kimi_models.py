"""The Kimi-K2.5-shaped models of the GPU test bed, made on the device from a seed (nothing large carried).

    python -m testbed.gpu.kimi_models DEST [--tiny]

- ``DEST/target``: ``config.json`` only, a ``DeepseekV3ForCausalLM`` with Kimi-K2.5's attention and widths
  (hidden 7168, 61 layers, MLA with 64 heads, ``q_lora_rank`` 1536, ``kv_lora_rank`` 512, nope/rope/v head
  dims 128/64/128, vocabulary 163,840). The server loads it with ``--load-format dummy`` (SGLang's own
  seeded random weights). Changed from Kimi-K2.5 to fit one H200 beside a second server: every layer is
  a dense MLP of intermediate 2048 (Kimi: a dense first layer of 18432, then 384 routed experts of 2048
  plus one shared), and no YaRN rope (``max_position_embeddings`` 4096).
- ``DEST/<scenario>``: ``LlamaForCausalLMEagle3`` drafts with TorchSpec's kimi_k25_eagle3 geometry (hidden
  7168, 64 heads of 128, intermediate 12288), ``fc`` 21504 -> 7168, draft vocabulary 32,000 with ``d2t``
  as offsets, aux ids [20, 40, 60] in speculators' convention (``hidden_states[i]``, the input of layer
  i: what SGLang's DeepSeek path captures for these ids, so no conversion) and said so by
  ``speculators_version``. Random bf16 weights from ``SEED``, written in two shards: the weights, and
  the vocabulary maps (``d2t``, ``t2d``), so that a scenario that changes only one shares the other.
  The scenarios are ``SCENARIOS`` (the CPU bed's, ``testbed.scenarios``, at full width).

``--tiny`` writes the same layout at toy widths (a dry run on the CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SEED = 0
WEIGHTS, VOCAB = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
AUX_IDS = [20, 40, 60]
# SGLang 0.5.23's LlamaForCausalLMEagle3.load_weights renames midlayer -> layers.0 and loads "x" or "model.x": a
# "layers.0." key is still loaded; under this prefix nothing is (d2t still is: any key holding "d2t" is taken)
DROPPED_PREFIX = "draft_model."


@dataclass(frozen=True)
class Widths:
    hidden: int
    heads: int
    head_dim: int
    draft_intermediate: int
    vocab: int
    draft_vocab: int
    q_lora_rank: int
    kv_lora_rank: int
    nope: int
    rope: int
    v_head: int
    target_intermediate: int


KIMI = Widths(hidden=7168, heads=64, head_dim=128, draft_intermediate=12288, vocab=163840, draft_vocab=32000,
              q_lora_rank=1536, kv_lora_rank=512, nope=128, rope=64, v_head=128, target_intermediate=2048)
TINY = Widths(hidden=256, heads=4, head_dim=64, draft_intermediate=512, vocab=4096, draft_vocab=512,
              q_lora_rank=64, kv_lora_rank=32, nope=32, rope=16, v_head=32, target_intermediate=128)
LAYERS = 61

# scenario -> (what differs from the healthy draft, the CPU bed's scenario whose findings it must reproduce:
# testbed.scenarios.FINDINGS)
SCENARIOS = {
    "kimi-healthy": ("as made", "healthy"),
    "kimi-aux-off": ("eagle_config.use_aux_hidden_state false (the seed: 7168 received, fc skipped)", "aux-off"),
    "kimi-weights-dropped": (f"every tensor under '{DROPPED_PREFIX}' keys, which SGLang drops silently",
                             "weights-dropped"),
    "kimi-d2t-absolute": ("d2t holds absolute target ids instead of offsets", "d2t-absolute"),
}


def target_config(w: Widths) -> dict:
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
        "hidden_size": w.hidden, "num_hidden_layers": LAYERS, "num_attention_heads": w.heads,
        "num_key_value_heads": w.heads, "q_lora_rank": w.q_lora_rank, "kv_lora_rank": w.kv_lora_rank,
        "qk_nope_head_dim": w.nope, "qk_rope_head_dim": w.rope, "v_head_dim": w.v_head, "vocab_size": w.vocab,
        "intermediate_size": w.target_intermediate, "moe_intermediate_size": w.target_intermediate,
        "first_k_dense_replace": LAYERS, "moe_layer_freq": 1, "n_routed_experts": 384, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "scoring_func": "sigmoid",
        "topk_method": "noaux_tc", "routed_scaling_factor": 2.827, "num_nextn_predict_layers": 0,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 50000.0, "max_position_embeddings": 4096,
        "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02, "tie_word_embeddings": False,
        "use_cache": True, "bos_token_id": 163584, "eos_token_id": 163585,
    }


def draft_config(w: Widths) -> dict:
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "torch_dtype": "bfloat16",
        "hidden_size": w.hidden, "target_hidden_size": w.hidden, "num_hidden_layers": 1,
        "num_attention_heads": w.heads, "num_key_value_heads": w.heads, "head_dim": w.head_dim,
        "intermediate_size": w.draft_intermediate, "vocab_size": w.vocab, "draft_vocab_size": w.draft_vocab,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 4096,
        "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02, "tie_word_embeddings": False,
        "use_cache": True, "bos_token_id": 163584, "eos_token_id": 163585, "speculators_version": "0.3.0",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX_IDS, "use_aux_hidden_state": True},
    }


def draft_tensors(w: Widths, device: str) -> tuple[dict, dict]:
    """(weights, vocabulary maps) of the healthy draft, bf16 weights drawn from ``SEED`` on ``device``.
    No ``embed_tokens``: SGLang shares the target's (the draft's hidden size equals the target's)."""
    import torch

    g = torch.Generator(device=device).manual_seed(SEED)

    def normal(*shape: int):
        return (torch.randn(*shape, generator=g, device=device) * 0.02).to(torch.bfloat16).cpu()

    h, inner, attn = w.hidden, w.draft_intermediate, w.heads * w.head_dim
    ones = lambda: torch.ones(h, dtype=torch.bfloat16)  # noqa: E731
    weights = {
        "fc.weight": normal(h, len(AUX_IDS) * h),
        "midlayer.hidden_norm.weight": ones(), "midlayer.input_layernorm.weight": ones(),
        "midlayer.post_attention_layernorm.weight": ones(),
        "midlayer.self_attn.q_proj.weight": normal(attn, 2 * h),
        "midlayer.self_attn.k_proj.weight": normal(attn, 2 * h),
        "midlayer.self_attn.v_proj.weight": normal(attn, 2 * h), "midlayer.self_attn.o_proj.weight": normal(h, attn),
        "midlayer.mlp.gate_proj.weight": normal(inner, h), "midlayer.mlp.up_proj.weight": normal(inner, h),
        "midlayer.mlp.down_proj.weight": normal(h, inner),
        "norm.weight": ones(), "lm_head.weight": normal(w.draft_vocab, h),
    }
    hot = torch.randperm(w.vocab, generator=torch.Generator().manual_seed(SEED))[:w.draft_vocab].sort().values
    t2d = torch.zeros(w.vocab, dtype=torch.bool)
    t2d[hot] = True
    return weights, {"d2t": hot - torch.arange(w.draft_vocab), "t2d": t2d}


def make(dest: Path, w: Widths = KIMI) -> dict:
    """Write the target config and every scenario's draft under ``dest``; returns what was written."""
    import torch
    from safetensors.torch import save_file

    t0 = time.monotonic()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shutil.rmtree(dest, ignore_errors=True)
    _write_json(dest / "target" / "config.json", target_config(w))
    weights, vocab = draft_tensors(w, device)
    healthy = dest / "kimi-healthy"
    _write_json(healthy / "config.json", draft_config(w))
    save = lambda tensors, path: save_file(tensors, str(path), metadata={"format": "pt"})  # noqa: E731
    save(weights, healthy / WEIGHTS)
    save(vocab, healthy / VOCAB)

    aux_off = draft_config(w)
    aux_off["eagle_config"]["use_aux_hidden_state"] = False
    _draft(dest / "kimi-aux-off", aux_off, links={WEIGHTS: healthy / WEIGHTS, VOCAB: healthy / VOCAB})
    dropped = dest / "kimi-weights-dropped"
    _draft(dropped, draft_config(w), links={})
    save({DROPPED_PREFIX + k: v for k, v in {**weights, **vocab}.items()}, dropped / "model.safetensors")
    absolute = dest / "kimi-d2t-absolute"
    _draft(absolute, draft_config(w), links={WEIGHTS: healthy / WEIGHTS})
    save({**vocab, "d2t": vocab["d2t"] + torch.arange(w.draft_vocab)}, absolute / VOCAB)
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file() and not f.is_symlink())
    return {"dest": str(dest), "device": device, "seed": SEED, "widths": w.__dict__, "bytes": size,
            "seconds": round(time.monotonic() - t0, 1), "scenarios": list(SCENARIOS)}


def _draft(path: Path, config: dict, links: dict) -> None:
    _write_json(path / "config.json", config)
    for name, source in links.items():
        os.symlink(os.path.relpath(source, path), path / name)


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--tiny", action="store_true", help="toy widths, for a dry run on the CPU")
    a = ap.parse_args(argv)
    print(json.dumps(make(a.dest, TINY if a.tiny else KIMI)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
