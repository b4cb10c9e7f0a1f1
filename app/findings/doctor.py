"""``draftscope doctor``: check a draft checkpoint against its target and the serving engine (SGLang
0.5.23 by default, vLLM 0.32 with ``--engine vllm``), before serving.

Standard library only (plus numpy, through the spec reader), so that it runs from the base install
inside an SGLang environment: the command line is argparse, the colours plain ANSI on a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from draftscope.findings import Finding, static_findings
from draftscope.findings.fix import FixError, apply_fixes
from draftscope.spec import ENGINES, SpecError, expect, parse_server_args, read_draft, read_target
from draftscope.spec.describe import SpecRow, describe_spec, render_text
from draftscope.spec.expectations import NAMES, engine_label
from draftscope.spec.sglang import format_server_args
from draftscope.spec.target import check_target_matches

SUMMARY = ("Diagnose a draft + target pair for SGLang (or vLLM) from headers and configs only (no weights "
           "loaded).")
COLOURS = {"error": "1;31", "warning": "33", "info": "36", "ok": "32", "dim": "2", "bold": "1"}


def diagnose(draft_dir: Path, target_dir: Path, server_args: str = "", allow_bin: bool = False,
             training_config: Path | None = None, server_env: dict[str, str] | None = None,
             engine: str = "sglang") -> tuple[dict, list[Finding]]:
    """Read both models, derive the engine's behaviour, return (summary, findings); raises SpecError.
    ``summary["spec"]`` is the spec block's rows (draftscope.spec.describe)."""
    target = read_target(target_dir)
    spec = read_draft(draft_dir, target_layers=target.num_layers, allow_bin=allow_bin,
                      training_config=training_config)
    check_target_matches(spec, target)
    exp = expect(engine, spec, target, parse_server_args(server_args), server_env)
    summary = {"draft": str(draft_dir), "target": str(target_dir), "format": spec.source_format,
               "engine": engine, "engine_label": exp.label,
               "algorithm": exp.algorithm, "aux_layer_ids": spec.aux_layer_ids,
               "trained_physical": spec.aux_layers_physical,
               "layers_to_capture": exp.layers_to_capture,
               "captured_physical": exp.captured_physical,
               "aux_count": exp.aux_count, "fc_runs": exp.fc_runs,
               "draft_input_width": exp.draft_input_width, "load_error": exp.load_error,
               "expected_fc_in_width": spec.expected_fc_in_width,
               "training_config": spec.training_path,
               "spec": [row.to_dict() for row in describe_spec(spec, target, exp)]}
    return summary, static_findings(spec, target, exp)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="draftscope doctor", description=SUMMARY + " Prints the spec first (the draft as "
        "trained beside what the engine will do), then the findings.",
        epilog="Exit 0: no error findings in the input; 1: at least one error finding; 2: the input "
        "could not be read or the fix could not be written.")
    p.add_argument("draft_dir", type=Path, metavar="DRAFT_DIR",
                   help="Draft checkpoint directory (config.json + weights).")
    p.add_argument("--target", type=Path, required=True, help="Target model directory or its config.json.")
    p.add_argument("--engine", default="sglang", choices=ENGINES,
                   help="Serving engine whose behaviour to predict: sglang (0.5.23, the default) or vllm (0.32).")
    p.add_argument("--server-args", default="",
                   help="The engine's launch flags, quoted (one flag alone: --server-args=--flag); for "
                   "vllm only --speculative-config's method is read.")
    p.add_argument("--allow-bin", action="store_true", help="Read *.bin with torch.load(weights_only=True).")
    p.add_argument("--json", dest="as_json", action="store_true", help="Machine-readable output.")
    p.add_argument("--training-config", type=Path, help="The trainer's config (YAML or JSON), when it "
                   "is not saved next to the draft as training_config.yaml/.yml/.json.")
    p.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                   help="A variable of the server's environment that changes what SGLang does at start "
                   "(SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN, SGLANG_IS_IN_CI); repeatable.")
    p.add_argument("--fix", type=Path, metavar="OUT_DIR", help="Write a corrected copy of the draft to "
                   "OUT_DIR (a new or empty directory) for every finding with a mechanical fix, print "
                   "what changed and the server flags to use, and diagnose the copy. The input is "
                   "never edited.")
    return p


def main(argv: list[str]) -> int:
    """Run ``draftscope doctor ARGV``; returns the exit code."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed by argparse
        return int(exc.code or 0)
    paint = _painter(sys.stdout)
    env = {}
    for item in args.server_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            return _fail(paint, args.as_json, item, "is not NAME=VALUE; write e.g. --server-env "
                         "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1.")
        env[name] = value
    try:
        summary, findings = diagnose(args.draft_dir, args.target, args.server_args, args.allow_bin,
                                     args.training_config, env, args.engine)
    except SpecError as exc:
        return _fail(paint, args.as_json, exc.path, exc.problem)
    errors = sum(f.severity == "error" for f in findings)
    fixed = None
    if args.fix is not None:
        try:
            fixed = fix_and_recheck(args.draft_dir, args.target, args.server_args, args.allow_bin,
                                    findings, args.fix, args.training_config, env, args.engine)
        except (FixError, SpecError) as exc:
            return _fail(paint, args.as_json, args.fix, str(exc))
    if args.as_json:
        out = {"summary": summary, "findings": [f.to_dict() for f in findings], "errors": errors}
        if fixed is not None:
            out["fix"] = fixed
        print(json.dumps(out, indent=2))
    else:
        _print_human(paint, summary, findings)
        if fixed is not None:
            _print_fix(paint, fixed)
    return 1 if errors else 0


def fix_and_recheck(draft_dir: Path, target: Path, server_args: str, allow_bin: bool,
                    findings: list[Finding], out_dir: Path, training_config: Path | None = None,
                    server_env: dict[str, str] | None = None, engine: str = "sglang") -> dict:
    """Apply the findings' patches to a copy in ``out_dir`` and diagnose the copy with the fixed
    flags; a summary of both for printing or JSON."""
    result = apply_fixes(draft_dir, out_dir, findings, parse_server_args(server_args))
    _, after = diagnose(out_dir, target, format_server_args(result.server_args), allow_bin,
                        training_config, server_env, engine)
    return {"out_dir": str(out_dir), "changes": result.changes, "applied": result.applied,
            "not_fixed": result.skipped, "server_flags": result.flags(),
            "after": {"errors": sum(f.severity == "error" for f in after),
                      "findings": [f.to_dict() for f in after]}}


def _painter(stream):
    """ANSI styling on a terminal (unless NO_COLOR is set); plain text otherwise."""
    on = stream.isatty() and not os.environ.get("NO_COLOR")
    return lambda text, style: f"\x1b[{COLOURS[style]}m{text}\x1b[0m" if on else text


def _print_fix(paint, fixed: dict) -> None:
    print(f"fix: wrote {fixed['out_dir']} (the input is unchanged)")
    for line in fixed["changes"]:
        print(f"  changed  {line}")
    for rule in fixed["not_fixed"]:
        print(f"  {paint('not fixed', 'warning')} {rule}: no mechanical fix; see its fix above")
    print(f"serve with: {fixed['server_flags']}")
    after = fixed["after"]
    left = ", ".join(f"{f['severity']} {f['rule_id']}" for f in after["findings"]) or "no findings"
    print(f"the fixed copy: {left}")


def _print_human(paint, summary: dict, findings: list[Finding]) -> None:
    engine = summary["engine"]
    method = (f"--speculative-config method {summary['algorithm'].lower()}" if engine == "vllm"
              else f"--speculative-algorithm {summary['algorithm']}")
    print(f"draft {summary['draft']} ({summary['format']}) for target {summary['target']}, "
          f"{engine_label(engine)} {method}")
    print(render_text([SpecRow(**row) for row in summary["spec"]], engine))
    if not findings:
        print(f"{paint('ok', 'ok')} no findings: {NAMES[engine]} will feed the draft what it was trained on "
              f"(output of layers {summary['captured_physical']}, {summary['draft_input_width']} wide).")
    for f in findings:
        print(f"{paint(f'{f.severity:<7}', f.severity)} {paint(f.rule_id, 'bold')}: {f.message}. "
              f"{paint('fix:', 'dim')} {f.fix}")


def _fail(paint, as_json: bool, path: object, problem: str) -> int:
    if as_json:
        print(json.dumps({"error": {"path": str(path), "problem": problem}}))
    else:
        print(f"{paint('error', 'error')}: cannot diagnose: {path} {problem}", file=sys.stderr)
    return 2
