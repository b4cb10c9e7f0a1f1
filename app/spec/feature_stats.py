"""Training-time feature statistics: per-token L2 norms of the target hidden states a draft was
trained on, measured by running the target (HF transformers) on sample prompts.

The file (``draftscope_feature_stats.json`` next to the draft's config.json) records, per aux chunk
and per target layer, the distribution of per-token L2 norms of "the output of decoder layer j"
(the residual stream SGLang captures). The runtime rule ``aux-norm-drift`` compares the tracer's
``target.aux[i]`` norms against it. Residual norms grow with depth, so a layer off by one shows up
as a chunk whose norm matches a neighbouring layer better than its own.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

from draftscope.spec.errors import SpecError

STATS_FILE = "draftscope_feature_stats.json"
STATS_FORMAT = "draftscope-feature-stats"
STATS_VERSION = 1
QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
STAT_KEYS = ("count", "mean", "std", "min", "max", *(f"q{round(q * 100):02d}" for q in QUANTILES))
DEFAULT_PROMPTS = [
    "Hello world, this is a tiny model that speaks in bytes.",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a draft model that guessed the next words.",
    "Speculative decoding lets a small draft propose tokens that a large target verifies.",
    "Write a short poem about the sea and the wind.",
    "Explain in two sentences why the sky is blue.",
    "List three prime numbers larger than 10 and say why they are prime.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Translate to French: the cat sat on the mat and watched the rain.",
    "Summarise the plot of a detective story in one paragraph.",
    "What is 17 times 23? Show the steps.",
    "A recipe for bread needs flour, water, salt and",
]


def config_hash(model_dir: str | Path) -> str | None:
    """The target's identity as the tracer records it: sha256 of config.json bytes, 16 hex digits."""
    try:
        return hashlib.sha256((Path(model_dir) / "config.json").read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def norm_stats(norms: "Any", prompt_means: list[float]) -> dict[str, Any]:
    """Summary of a 1-D tensor of per-token L2 norms, plus the spread of the per-prompt means."""
    import torch

    x = norms.double()
    qs = torch.quantile(x, torch.tensor(QUANTILES, dtype=torch.float64)).tolist()
    out: dict[str, Any] = {"count": int(x.numel()), "mean": x.mean().item(),
                           "std": x.std(unbiased=False).item(), "min": x.min().item(),
                           "max": x.max().item()}
    out.update({f"q{round(q * 100):02d}": v for q, v in zip(QUANTILES, qs)})
    pm = torch.tensor(prompt_means, dtype=torch.float64)
    out["prompt_means"] = {"count": len(prompt_means), "mean": pm.mean().item(),
                           "std": pm.std(unbiased=False).item(), "min": pm.min().item(),
                           "max": pm.max().item()}
    return out


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a file: a JSON list of strings (``.json``), else one prompt per non-empty line."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(path, f"cannot be read as a prompts file ({exc}). Pass a UTF-8 text file "
                        "with one prompt per line, or a .json list of strings.") from exc
    if path.suffix == ".json":
        try:
            prompts = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(path, f"is not valid JSON (line {exc.lineno}: {exc.msg}). A .json "
                            "prompts file must be a list of strings.") from exc
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise SpecError(path, "must be a JSON list of strings (one prompt each).")
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    prompts = [p for p in prompts if p.strip()]
    if not prompts:
        raise SpecError(path, "holds no prompts. Put one prompt per line.")
    return prompts


def compute_feature_stats(target_dir: str | Path, aux_layers: list[int],
                          prompts: list[str], max_new_tokens: int = 32,
                          device: str | None = None) -> dict[str, Any]:
    """Run the target on ``prompts`` (each greedily continued by ``max_new_tokens`` tokens) and
    return the statistics of the per-token L2 norms of every decoder layer's output, and of the
    chunks ``aux_layers`` (physical "output of decoder layer j" indices, 0-based). Loads
    safetensors weights only; raises SpecError when the target cannot be loaded."""
    import torch

    target_dir = Path(target_dir)
    model, tokenizer = _load_target(target_dir, device)
    layers = _decoder_layers(model, target_dir)
    bad = [j for j in aux_layers if not 0 <= j < len(layers)]
    if bad:
        raise SpecError(target_dir / "config.json",
                        f"has {len(layers)} decoder layers, but the draft was trained on layers "
                        f"{aux_layers} (output-of, 0-based): {bad} do not exist. This is not the "
                        "draft's target; pass the target model the draft was trained for.")
    captured: dict[int, Any] = {}
    hooks = [layer.register_forward_hook(_capture(captured, j)) for j, layer in enumerate(layers)]
    per_layer: dict[int, list[Any]] = {j: [] for j in range(len(layers))}
    prompt_means: dict[int, list[float]] = {j: [] for j in range(len(layers))}
    dev = next(model.parameters()).device
    try:
        with torch.no_grad():
            for prompt in prompts:
                ids = tokenizer(prompt, return_tensors="pt").input_ids.to(dev)
                if max_new_tokens > 0:
                    ids = model.generate(ids, attention_mask=torch.ones_like(ids),
                                         max_new_tokens=max_new_tokens, do_sample=False,
                                         pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
                captured.clear()
                model(input_ids=ids)
                for j in range(len(layers)):
                    norms = captured[j][0].float().norm(dim=-1).cpu()
                    per_layer[j].append(norms)
                    prompt_means[j].append(norms.double().mean().item())
    finally:
        for h in hooks:
            h.remove()
    layer_stats = [{"layer": j, **norm_stats(torch.cat(per_layer[j]), prompt_means[j])}
                   for j in range(len(layers))]
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return {
        "format": STATS_FORMAT, "version": STATS_VERSION, "created_at": time.time(),
        "target": {"path": str(target_dir), "config_hash": config_hash(target_dir),
                   "architecture": (model.config.architectures or [type(model).__name__])[0],
                   "num_layers": len(layers), "hidden_size": int(config.hidden_size),
                   "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                   "device": str(dev)},
        "prompts": len(prompts), "max_new_tokens": max_new_tokens,
        "tokens": layer_stats[0]["count"],
        "aux": [{"index": i, **layer_stats[j]} for i, j in enumerate(aux_layers)],
        "layers": layer_stats,
    }


def load_feature_stats(path: str | Path) -> dict[str, Any]:
    """A feature-statistics file (JSON only); SpecError when it is not one draftscope wrote."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(path, f"is not a readable feature-statistics JSON file ({exc}). Delete it, "
                        "then regenerate it with `draftscope stats`.") from exc
    ok = (isinstance(data, dict) and data.get("format") == STATS_FORMAT
          and data.get("version") == STATS_VERSION and isinstance(data.get("aux"), list)
          and isinstance(data.get("layers"), list)
          and all(isinstance(c, dict) and isinstance(c.get("mean"), (int, float))
                  for c in data["aux"] + data["layers"]))
    if not ok:
        raise SpecError(path, f"is not a {STATS_FORMAT} version {STATS_VERSION} file (per-chunk "
                        "'aux' and per-layer 'layers' norm statistics). Delete it, then "
                        "regenerate it with `draftscope stats`.")
    return data


def find_feature_stats(draft_dir: str | Path) -> dict[str, Any] | None:
    """The draft's feature statistics when ``draft_dir`` holds a stats file, else None."""
    path = Path(draft_dir) / STATS_FILE
    return load_feature_stats(path) if path.is_file() else None


def _load_target(target_dir: Path, device: str | None):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not any(target_dir.glob("*.safetensors")):
        raise SpecError(target_dir, "has no *.safetensors weights. draftscope loads safetensors "
                        "only (never pickles); convert the checkpoint to safetensors.")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype="auto", use_safetensors=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ... for bad dirs
        raise SpecError(target_dir, f"cannot be loaded as a Hugging Face causal LM with its "
                        f"tokenizer ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). "
                        "Pass the target model directory SGLang serves with --model-path.") from exc
    return model.to(device).eval(), tokenizer


def _decoder_layers(model, target_dir: Path):
    for owner in (getattr(model, "model", None), getattr(getattr(model, "model", None), "language_model", None),
                  getattr(model, "language_model", None)):
        layers = getattr(owner, "layers", None)
        if layers is not None and len(layers):
            return layers
    raise SpecError(target_dir, f"loads as {type(model).__name__}, whose decoder layers draftscope "
                    "cannot find (looked for model.layers). Feature statistics need them.")


def _capture(store: dict[int, Any], j: int):
    def hook(_module, _inputs, output):
        store[j] = output[0] if isinstance(output, tuple) else output
    return hook


def relative_gap(a: float, b: float) -> float:
    """|log(a/b)|: how far apart two positive norms are, symmetric in a and b."""
    return abs(math.log(a / b)) if a > 0 and b > 0 else math.inf
