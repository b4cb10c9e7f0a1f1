"""``draftscope doctor``: check a draft checkpoint against its target and SGLang, before serving."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from draftscope.findings import Finding, static_findings
from draftscope.fix import FixError, apply_fixes
from draftscope.spec import (SpecError, expect_sglang, parse_server_args, read_draft, read_target)
from draftscope.spec.sglang import format_server_args
from draftscope.spec.describe import SpecRow, describe_spec, render_text
from draftscope.spec.target import check_target_matches

STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def diagnose(draft_dir: Path, target_dir: Path, server_args: str = "", allow_bin: bool = False,
             training_config: Path | None = None,
             server_env: dict[str, str] | None = None) -> tuple[dict, list[Finding]]:
    """Read both models, derive SGLang's behaviour, return (summary, findings); raises SpecError.
    ``summary["spec"]`` is the spec block's rows (draftscope.spec.describe)."""
    target = read_target(target_dir)
    spec = read_draft(draft_dir, target_layers=target.num_layers, allow_bin=allow_bin,
                      training_config=training_config)
    check_target_matches(spec, target)
    exp = expect_sglang(spec, target, parse_server_args(server_args), server_env)
    summary = {"draft": str(draft_dir), "target": str(target_dir), "format": spec.source_format,
               "algorithm": exp.algorithm, "aux_layer_ids": spec.aux_layer_ids,
               "trained_physical": spec.aux_layers_physical,
               "captured_physical": exp.captured_physical,
               "draft_input_width": exp.draft_input_width,
               "expected_fc_in_width": spec.expected_fc_in_width,
               "training_config": spec.training_path,
               "spec": [row.to_dict() for row in describe_spec(spec, target, exp)]}
    return summary, static_findings(spec, target, exp)


def doctor(
    draft_dir: Annotated[Path, typer.Argument(help="Draft checkpoint directory (config.json + weights).")],
    target: Annotated[Path, typer.Option("--target", help="Target model directory or its config.json.")],
    engine: Annotated[str, typer.Option("--engine", help="Serving engine; only sglang for now.")] = "sglang",
    server_args: Annotated[str, typer.Option("--server-args", help="SGLang launch flags, quoted.")] = "",
    allow_bin: Annotated[bool, typer.Option("--allow-bin", help="Read *.bin with torch.load(weights_only=True).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    training_config: Annotated[Path | None, typer.Option(
        "--training-config", help="The trainer's config (YAML or JSON), when it is not saved next "
        "to the draft as training_config.yaml/.yml/.json.")] = None,
    server_env: Annotated[list[str] | None, typer.Option(
        "--server-env", metavar="NAME=VALUE", help="A variable of the server's environment that "
        "changes what SGLang does at start (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN, "
        "SGLANG_IS_IN_CI); repeatable.")] = None,
    fix: Annotated[Path | None, typer.Option(
        "--fix", metavar="OUT_DIR", help="Write a corrected copy of the draft to OUT_DIR (a new or "
        "empty directory) for every finding with a mechanical fix, print what changed and the "
        "server flags to use, and diagnose the copy. The input is never edited.")] = None,
) -> None:
    """Diagnose a draft + target pair for SGLang from headers and configs only (no weights loaded).

    Prints the spec first (the draft as trained beside what SGLang will do), then the findings.
    Exit 0: no error findings in the input; 1: at least one error finding; 2: the input could not
    be read or the fix could not be written.
    """
    console = Console(stderr=False, highlight=False, soft_wrap=True)
    if engine != "sglang":
        _fail(console, as_json, str(engine), f"engine {engine!r} is not supported; use --engine sglang.")
    env = {}
    for item in server_env or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            _fail(console, as_json, item, "is not NAME=VALUE; write e.g. --server-env "
                  "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1.")
        env[name] = value
    try:
        summary, findings = diagnose(draft_dir, target, server_args, allow_bin, training_config, env)
    except SpecError as exc:
        _fail(console, as_json, exc.path, exc.problem)
    errors = sum(f.severity == "error" for f in findings)
    fixed = None
    if fix is not None:
        try:
            fixed = fix_and_recheck(draft_dir, target, server_args, allow_bin, findings, fix,
                                    training_config, env)
        except (FixError, SpecError) as exc:
            _fail(console, as_json, str(fix), str(exc))
    if as_json:
        out = {"summary": summary, "findings": [f.to_dict() for f in findings], "errors": errors}
        if fixed is not None:
            out["fix"] = fixed
        print(json.dumps(out, indent=2))
    else:
        _print_human(console, summary, findings)
        if fixed is not None:
            _print_fix(console, fixed)
    raise typer.Exit(1 if errors else 0)


def fix_and_recheck(draft_dir: Path, target: Path, server_args: str, allow_bin: bool,
                    findings: list[Finding], out_dir: Path, training_config: Path | None = None,
                    server_env: dict[str, str] | None = None) -> dict:
    """Apply the findings' patches to a copy in ``out_dir`` and diagnose the copy with the fixed
    flags; a summary of both for printing or JSON."""
    result = apply_fixes(draft_dir, out_dir, findings, parse_server_args(server_args))
    _, after = diagnose(out_dir, target, format_server_args(result.server_args), allow_bin,
                        training_config, server_env)
    return {"out_dir": str(out_dir), "changes": result.changes, "applied": result.applied,
            "not_fixed": result.skipped, "server_flags": result.flags(),
            "after": {"errors": sum(f.severity == "error" for f in after),
                      "findings": [f.to_dict() for f in after]}}


def _print_fix(console: Console, fixed: dict) -> None:
    console.print(f"fix: wrote {escape(fixed['out_dir'])} (the input is unchanged)")
    for line in fixed["changes"]:
        console.print(f"  changed  {escape(line)}")
    for rule in fixed["not_fixed"]:
        console.print(f"  [yellow]not fixed[/yellow] {rule}: no mechanical fix; see its fix above")
    console.print(f"serve with: {escape(fixed['server_flags'])}")
    after = fixed["after"]
    left = ", ".join(f"{f['severity']} {f['rule_id']}" for f in after["findings"]) or "no findings"
    console.print(f"the fixed copy: {left}")


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
