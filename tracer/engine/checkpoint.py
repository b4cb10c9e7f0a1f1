"""What the tracer reads of a draft checkpoint folder, whichever engine serves it: each draft parameter compared
with the checkpoint tensor(s) of the same role (``weights_check``), one tensor by name (``checkpoint_tensor``),
the hash of ``config.json``. Every reader returns None for what it cannot read."""

from __future__ import annotations

import glob
import hashlib
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

# Checkpoint key fragments SGLang renames on load (llama_eagle3.LlamaForCausalLMEagle3.load_weights).
LEGACY_NAMES = {"midlayer": "layers.0", "aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1",
                "aux_norm_high": "fc_norm.2"}
# Separate checkpoint projections stacked into one parameter, in stacking order.
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
NOT_PARAMETERS = ("d2t", "t2d")


def safe(fn, *args) -> Any:
    """``fn(*args)``, or None when it raises (a fact that cannot be read is left out, never guessed)."""
    try:
        return fn(*args)
    except Exception:
        return None



def _checkpoint_files(path: Optional[str]) -> List[str]:
    if not path or not os.path.isdir(path):
        return []
    return sorted(glob.glob(os.path.join(path, "*.safetensors")))


def checkpoint_tensor(path: Optional[str], key_suffix: str) -> Optional[torch.Tensor]:
    for file, key, load in _checkpoint_items(path):
        if key == key_suffix or key.endswith("." + key_suffix):
            return load()
    return None


def _checkpoint_items(path: Optional[str]) -> Iterable[Tuple[str, str, Any]]:
    files = _checkpoint_files(path)
    if not files:
        return
    from safetensors import safe_open  # present wherever SGLang is

    for file in files:
        with safe_open(file, framework="pt") as f:
            for key in f.keys():
                yield file, key, (lambda f=f, key=key: f.get_tensor(key))


def param_role(key: str, params: Dict[str, Any]) -> Tuple[Optional[str], Optional[int]]:
    """The parameter a checkpoint key loads into, and its slot in a fused parameter (None: unfused)."""
    name = key
    for old, new in LEGACY_NAMES.items():
        name = name.replace(old, new)
    slot = None
    for fused, parts in FUSED.items():
        for i, part in enumerate(parts):
            if f".{part}." in name:
                name, slot = name.replace(f".{part}.", f".{fused}."), i
    for candidate in (name, f"model.{name}", re.sub(r"^model\.", "", name)):
        if candidate in params:
            return candidate, slot
    return None, slot


def fingerprint(t: torch.Tensor, n: int = 4096) -> Tuple[float, float]:
    """(sum, abs-sum) of a strided subset of at most ``n`` elements, in float64."""
    flat = t.detach().reshape(-1)
    step = max(1, flat.numel() // n)
    sub = flat[::step].to("cpu", torch.float64)
    return float(sub.sum()), float(sub.abs().sum())


def _close(a: Tuple[float, float], b: Tuple[float, float]) -> bool:
    return all(abs(x - y) <= 1e-3 * max(1.0, abs(y)) for x, y in zip(a, b))


def weights_check(model, path: Optional[str], target_model) -> Optional[Dict[str, Any]]:
    """Compare every draft parameter with the checkpoint tensor(s) of the same role."""
    if not _checkpoint_files(path):
        return None
    params = dict(model.named_parameters())
    target_ptrs = {p.data_ptr() for p in target_model.parameters()}
    shared = {n for n, p in params.items() if p.data_ptr() in target_ptrs}  # e.g. the target's embedding
    pieces: Dict[str, Dict[int, torch.Tensor]] = {}
    unused: List[str] = []
    for _file, key, load in _checkpoint_items(path):
        if key.split(".")[-1] in NOT_PARAMETERS:
            continue
        name, slot = param_role(key, params)
        if name is None:
            unused.append(key)
        elif name not in shared:
            pieces.setdefault(name, {})[slot if slot is not None else 0] = load()
    mismatched, nonfinite = [], []
    for name, parts in pieces.items():
        param = params[name].detach()
        ckpt = torch.cat([parts[i] for i in sorted(parts)], dim=0) if len(parts) > 1 else next(iter(parts.values()))
        if tuple(ckpt.shape) != tuple(param.shape) or not _close(fingerprint(param), fingerprint(ckpt)):
            mismatched.append(name)
    for name, p in params.items():
        if not bool(torch.isfinite(p.detach()).all()):
            nonfinite.append(name)
    checked = len(pieces)
    return {"checked": checked, "matched": checked - len(mismatched), "mismatched": sorted(mismatched),
            "not_in_checkpoint": sorted(n for n in params if n not in pieces and n not in shared),
            "checkpoint_keys_unused": sorted(unused), "nonfinite": sorted(nonfinite)}


def config_hash(path: Optional[str]) -> Optional[str]:
    if not path:
        return None
    try:
        with open(os.path.join(path, "config.json"), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]
    except OSError:
        return None
