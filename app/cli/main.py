"""The ``draftscope`` console script.

``doctor`` is standard-library code and runs from the base install (the tracer inside an SGLang
environment). Every other command is the dashboard's typer CLI (``draftscope.cli.app``); without the
``dashboard`` extra they say how to install it, in one line.
"""

from __future__ import annotations

import sys

from draftscope.findings import doctor

INSTALL = "pip install 'draftscope[dashboard]'"
BASE_HELP = f"""Usage: draftscope COMMAND [ARGS]...

draftscope: see what an EAGLE-3 draft model receives inside SGLang.
This is the base install (the tracer): one command.

  doctor    {doctor.SUMMARY}

The dashboard, the store and the other commands (serve, db, import, stats, ...) need:
  {INSTALL}
"""


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``draftscope [COMMAND] [ARGS]...``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["doctor"]:
        sys.exit(doctor.main(argv[1:]))
    try:
        from draftscope.cli.app import app
    except ModuleNotFoundError as exc:  # a dependency of the dashboard extra (never draftscope's own)
        if exc.name is None or exc.name.partition(".")[0] in ("draftscope", "draftscope_tracer"):
            raise
        sys.exit(_base(argv, missing=exc.name))
    app(args=argv, prog_name="draftscope")


def _base(argv: list[str], missing: str) -> int:
    """The base install's front: help, or one line saying what to install."""
    if not argv or argv[0] in ("--help", "-h"):
        print(BASE_HELP, end="")
        return 0
    print(f"draftscope {argv[0]}: needs the dashboard extra ({missing} is not installed): {INSTALL}",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    main()
