"""``draftscope stats``: measure the target's hidden-state norms at the draft's trained aux layers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from draftscope.spec import SpecError, read_draft, read_target
from draftscope.spec.feature_stats import (DEFAULT_PROMPTS, STATS_FILE, compute_feature_stats,
                                           read_prompts)
from draftscope.spec.target import check_target_matches


def stats(
    target_dir: Annotated[Path, typer.Argument(help="Target model directory (safetensors + tokenizer).")],
    draft: Annotated[Path, typer.Option("--draft", help="Draft checkpoint directory; its spec names the aux layers.")],
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Prompts: one per line, or a .json list of strings (default: a built-in set).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help=f"Output JSON (default: DRAFT/{STATS_FILE}, which the draft spec reader picks up).")] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=0, help="Greedy tokens generated after each prompt; their states count too.")] = 32,
) -> None:
    """Write training-time feature statistics: per aux chunk, the distribution of per-token L2
    norms of the target's hidden states at the layers the draft was trained on.

    Exit 0: written; 2: an input could not be read.
    """
    try:
        target = read_target(target_dir)
        spec = read_draft(draft, target_layers=target.num_layers)
        check_target_matches(spec, target)
        if spec.aux_layers_physical is None:
            raise SpecError(draft / "config.json", "does not say which target layers the draft was "
                            "trained on. Add eagle_config.eagle_aux_hidden_state_layer_ids.")
        texts = read_prompts(prompts) if prompts else DEFAULT_PROMPTS
        result = compute_feature_stats(target_dir, spec.aux_layers_physical, texts, max_tokens)
    except SpecError as exc:
        typer.echo(f"error: cannot compute feature statistics: {exc.path} {exc.problem}", err=True)
        raise typer.Exit(2)
    result["draft"] = {"path": str(draft), "aux_layer_ids": spec.aux_layer_ids,
                       "aux_convention": spec.aux_convention,
                       "aux_layers_physical": spec.aux_layers_physical}
    path = out or draft / STATS_FILE
    try:
        path.write_text(json.dumps(result, indent=1) + "\n")
    except OSError as exc:
        typer.echo(f"error: cannot write {path} ({exc.strerror or exc}). Pass a writable --out.", err=True)
        raise typer.Exit(2)
    typer.echo(f"wrote {path}: {result['tokens']} tokens from {result['prompts']} prompts")
    for chunk in result["aux"]:
        typer.echo(f"  aux[{chunk['index']}] = output of layer {chunk['layer']}: L2 mean "
                   f"{chunk['mean']:.4g}, q01..q99 {chunk['q01']:.4g}..{chunk['q99']:.4g}")
