"""Draft/target checkpoint directories written in tests: published config.json shapes (the JSON
files here, from anchors.md section B) and tiny safetensors weights with the documented keys."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

HERE = Path(__file__).parent


def published(name: str) -> dict[str, Any]:
    """A published config.json shape stored next to this module."""
    return json.loads((HERE / f"{name}.json").read_text())


def tiny_target(directory: Path, layers: int = 8, hidden: int = 128, vocab: int = 1024,
                arch: str = "LlamaForCausalLM", **extra: Any) -> Path:
    """A target config.json (the test bed's tiny Llama shape)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [arch], "model_type": "llama", "num_hidden_layers": layers,
              "hidden_size": hidden, "vocab_size": vocab, "max_position_embeddings": 4096,
              "rope_theta": 10000.0, **extra}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def tiny_draft_config(hidden: int = 128, vocab: int = 1024, draft_vocab: int | None = 256,
                      ids: list[int] | None = (1, 4, 6), **extra: Any) -> dict[str, Any]:
    """A SpecForge-style LlamaForCausalLMEagle3 config at test-bed scale."""
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
              "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_attention_heads": 4,
              "num_key_value_heads": 2, "num_hidden_layers": 1, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "vocab_size": vocab, "draft_vocab_size": draft_vocab, "target_hidden_size": hidden}
    if ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids),
                                  "use_aux_hidden_state": True}
    config.update(extra)
    return config


def tiny_weights(hidden: int = 128, k: int = 3, vocab: int = 1024, draft_vocab: int = 256,
                 prefix: str = "", key_style: str = "midlayer", d2t: torch.Tensor | None = None,
                 t2d: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """EAGLE-3 draft tensors with the documented keys (values small, shapes exact)."""
    layer = "midlayer." if key_style == "midlayer" else "layers.0."
    kv = hidden // 2
    tensors = {"fc.weight": torch.zeros(hidden, k * hidden),
               layer + "self_attn.q_proj.weight": torch.zeros(hidden, 2 * hidden),
               layer + "self_attn.k_proj.weight": torch.zeros(kv, 2 * hidden),
               layer + "self_attn.v_proj.weight": torch.zeros(kv, 2 * hidden),
               layer + "self_attn.o_proj.weight": torch.zeros(hidden, hidden),
               layer + "mlp.gate_proj.weight": torch.zeros(2 * hidden, hidden),
               layer + "mlp.up_proj.weight": torch.zeros(2 * hidden, hidden),
               layer + "mlp.down_proj.weight": torch.zeros(hidden, 2 * hidden),
               layer + "hidden_norm.weight": torch.ones(hidden),
               layer + "input_layernorm.weight": torch.ones(hidden),
               layer + "post_attention_layernorm.weight": torch.ones(hidden),
               "norm.weight": torch.ones(hidden),
               "lm_head.weight": torch.zeros(draft_vocab, hidden)}
    selected = torch.arange(0, 2 * draft_vocab, 2)  # every other target id
    tensors["d2t"] = d2t if d2t is not None else selected - torch.arange(draft_vocab)
    if t2d is None:
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[selected] = True
    tensors["t2d"] = t2d
    return {(prefix + name if name not in ("d2t", "t2d") else name): t for name, t in tensors.items()}


def write_draft(directory: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor],
                shards: int = 1) -> Path:
    """config.json plus ``model.safetensors`` (or an index and ``shards`` shard files)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(copy.deepcopy(config)))
    if shards == 1:
        save_file(tensors, str(directory / "model.safetensors"))
        return directory
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        part = {n: tensors[n].contiguous() for n in names[s::shards]}
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(directory / fname))
        weight_map.update({n: fname for n in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return directory


_ST_DTYPES = {"F16": 2, "BF16": 2, "F32": 4, "I64": 8, "BOOL": 1}


def write_sparse_safetensors(path: Path, shapes: dict[str, tuple[str, tuple[int, ...]]],
                             values: dict[str, Any] | None = None) -> Path:
    """A valid safetensors file of real published sizes: big tensors are zero-filled holes (a sparse
    file costs no disk), ``values`` (numpy arrays for d2t/t2d) are written for real."""
    import numpy as np

    values = values or {}
    header, offset = {}, 0
    for name, (dtype, shape) in shapes.items():
        size = int(np.prod(shape, dtype=np.int64)) * _ST_DTYPES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little") + raw)
        base = fh.tell()
        for name, array in values.items():
            fh.seek(base + header[name]["data_offsets"][0])
            fh.write(np.ascontiguousarray(array).tobytes())
        fh.truncate(base + offset)
    return path


def published_draft(directory: Path, config: dict[str, Any], k: int = 3, style: str = "midlayer",
                    target_vocab: int | None = None) -> Path:
    """A published-size draft checkpoint for ``config`` (Llama-attention layout, sparse weights)."""
    import numpy as np

    body = config.get("transformer_layer_config") or config
    h, inter = body["hidden_size"], body["intermediate_size"]
    heads, kv = body["num_attention_heads"], body["num_key_value_heads"]
    hd = body.get("head_dim") or h // heads
    v_t, v_d = target_vocab or body["vocab_size"], config["draft_vocab_size"]
    layer = "midlayer." if style == "midlayer" else "layers.0."
    shapes = {"fc.weight": ("F16", (h, k * config.get("target_hidden_size", h))),
              layer + "self_attn.q_proj.weight": ("F16", (heads * hd, 2 * h)),
              layer + "self_attn.k_proj.weight": ("F16", (kv * hd, 2 * h)),
              layer + "self_attn.v_proj.weight": ("F16", (kv * hd, 2 * h)),
              layer + "self_attn.o_proj.weight": ("F16", (h, heads * hd)),
              layer + "mlp.gate_proj.weight": ("F16", (inter, h)),
              layer + "mlp.up_proj.weight": ("F16", (inter, h)),
              layer + "mlp.down_proj.weight": ("F16", (h, inter)),
              layer + "hidden_norm.weight": ("F16", (h,)), layer + "input_layernorm.weight": ("F16", (h,)),
              layer + "post_attention_layernorm.weight": ("F16", (h,)), "norm.weight": ("F16", (h,)),
              "lm_head.weight": ("F16", (v_d, h)), "d2t": ("I64", (v_d,)), "t2d": ("BOOL", (v_t,))}
    selected = np.arange(v_d, dtype=np.int64) * 3  # a plausible hot-token set
    t2d = np.zeros(v_t, dtype=bool)
    t2d[selected] = True
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    write_sparse_safetensors(directory / "model.safetensors", shapes,
                             {"d2t": selected - np.arange(v_d, dtype=np.int64), "t2d": t2d})
    return directory


def kimi_pair(root: Path) -> tuple[Path, Path]:
    """The Kimi-K2.5-shaped pair of issue 15: a KimiK25ForConditionalGeneration target (61 layers,
    hidden 7168) and a LlamaForCausalLMEagle3 draft with fc 21504 -> 7168 and aux ids [20, 40, 60]
    that names no trainer. Returns (draft_dir, target_dir)."""
    target = root / "kimi-target"
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(published("kimi_k25_target")))
    return published_draft(root / "kimi-draft", published("kimi_k25_eagle3_llama")), target
