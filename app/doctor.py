"""``draftscope doctor``: check a draft checkpoint against its target and SGLang, before serving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from draftscope.findings import Finding, static_findings
from draftscope.spec import (SpecError, expect_sglang, parse_server_args, read_draft, read_target)
from draftscope.spec.describe import SpecRow, describe_spec, render_text
from draftscope.spec.target import check_target_matches

STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def diagnose(draft_dir: Path, target_dir: Path, server_args: str = "",
             allow_bin: bool = False) -> tuple[dict, list[Finding]]:
    """Read both models, derive SGLang's behaviour, return (summary, findings); raises SpecError.
    ``summary["spec"]`` is the spec block's rows (draftscope.spec.describe)."""
    target = read_target(target_dir)
    spec = read_draft(draft_dir, target_layers=target.num_layers, allow_bin=allow_bin)
    check_target_matches(spec, target)
    exp = expect_sglang(spec, target, parse_server_args(server_args))
    summary = {"draft": str(draft_dir), "target": str(target_dir), "format": spec.source_format,
               "algorithm": exp.algorithm, "aux_layer_ids": spec.aux_layer_ids,
               "trained_physical": spec.aux_layers_physical,
               "captured_physical": exp.captured_physical,
               "draft_input_width": exp.draft_input_width,
               "expected_fc_in_width": spec.expected_fc_in_width,
               "spec": [row.to_dict() for row in describe_spec(spec, target, exp)]}
    return summary, static_findings(spec, target, exp)


def doctor(
    draft_dir: Annotated[Path, typer.Argument(help="Draft checkpoint directory (config.json + weights).")],
    target: Annotated[Path, typer.Option("--target", help="Target model directory or its config.json.")],
    engine: Annotated[str, typer.Option("--engine", help="Serving engine; only sglang for now.")] = "sglang",
    server_args: Annotated[str, typer.Option("--server-args", help="SGLang launch flags, quoted.")] = "",
    allow_bin: Annotated[bool, typer.Option("--allow-bin", help="Read *.bin with torch.load(weights_only=True).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Diagnose a draft + target pair for SGLang from headers and configs only (no weights loaded).

    Exit 0: no error findings; 1: at least one error finding; 2: the input could not be read.
    """
    console = Console(stderr=False, highlight=False, soft_wrap=True)
    if engine != "sglang":
        _fail(console, as_json, str(engine), f"engine {engine!r} is not supported; use --engine sglang.")
    try:
        summary, findings = diagnose(draft_dir, target, server_args, allow_bin)
    except SpecError as exc:
        _fail(console, as_json, exc.path, exc.problem)
    errors = sum(f.severity == "error" for f in findings)
    if as_json:
        print(json.dumps({"summary": summary, "findings": [f.to_dict() for f in findings],
                          "errors": errors}, indent=2))
    else:
        _print_human(console, summary, findings)
    raise typer.Exit(1 if errors else 0)


def _print_human(console: Console, summary: dict, findings: list[Finding]) -> None:
    console.print(f"draft {summary['draft']} ({summary['format']}) for target {summary['target']}, "
                  f"SGLang --speculative-algorithm {summary['algorithm']}")
    console.print(escape(render_text([SpecRow(**row) for row in summary["spec"]])), markup=True)
    if not findings:
        console.print("[green]ok[/green] no findings: SGLang will feed the draft what it was trained on "
                      f"(output of layers {summary['captured_physical']}, "
                      f"{summary['draft_input_width']} wide).")
    for f in findings:
        style = STYLE[f.severity]
        console.print(f"[{style}]{f.severity:<7}[/{style}] [bold]{f.rule_id}[/bold]: {escape(f.message)}. "
                      f"[dim]fix:[/dim] {escape(f.fix)}", markup=True)


def _fail(console: Console, as_json: bool, path: str, problem: str) -> None:
    if as_json:
        print(json.dumps({"error": {"path": path, "problem": problem}}))
    else:
        console.print(f"[bold red]error[/bold red]: cannot diagnose: {escape(str(path))} {escape(problem)}", markup=True)
    raise typer.Exit(2)
