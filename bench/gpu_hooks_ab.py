"""The hooks' host time of two tracers on one GPU host, in turns: an A/B whose pairs share the host's speed.

A lent GPU host's speed for Python-heavy work moves by up to 2x between calls and within one, so the hooks'
host time of two tracer versions is compared pair by pair: ``bench/gpu_hooks.py --host-time-only`` runs with
tracer A, then tracer B (each a folder holding the ``draftscope_tracer`` package, put first on
``PYTHONPATH``; the bench and its stand-ins are this checkout's), ``--pairs`` times, each run pinned to the
same cores. Each run's JSON lands in ``OUT/a1``, ``OUT/b1``, ...; the table gives per pair the tracer's own
host time per sampled iteration (median with the tracer minus median without it) at batch 64 and 8, and
their ratio A / B.

    python bench/gpu_hooks_ab.py A_DIR B_DIR --out OUT [--pairs 3] [--cores 4-7]   # on the GPU host
    python bench/gpu_hooks_ab.py --table OUT --names NEW OLD                         # the table again
    python bench/gpu_hooks_ab.py --runs DIR [DIR ...]    # one tracer's runs, by the host's speed

``--table`` also reads the folders a shell loop wrote (``new1``, ``old1``, ... with ``--names new old``). The
device call returns a limited number of files, so ``OUT/runs.json`` holds every run's results in one file
(``--table`` and ``--runs`` read it where the folders did not come back). ``--runs`` lists runs of one tracer
(folders holding ``gpu_hooks.json``) from the fastest host phase to the slowest, by the time of the same
iteration without the tracer, the tracer's own time in units of that iteration (a figure the host's speed
moves less), and the median of the tracer's own time over them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BATCHES = ("64", "8")


def run(a: Path, b: Path, out: Path, pairs: int, cores: str) -> None:
    for i in range(1, pairs + 1):
        for name, tracer in (("a", a), ("b", b)):
            dest = out / f"{name}{i}"
            dest.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "OUT": str(dest), "PYTHONPATH": str(tracer), "PYTHONUNBUFFERED": "1"}
            cmd = ["taskset", "-c", cores, sys.executable, str(HERE / "gpu_hooks.py"), "--host-time-only"]
            done = subprocess.run(cmd, env=env, cwd=HERE.parent, capture_output=True, text=True, timeout=300)
            if done.returncode:
                raise SystemExit(f"{name}{i} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    runs = {d.name: json.loads((d / "gpu_hooks.json").read_text()) for d in sorted(out.iterdir())
            if (d / "gpu_hooks.json").exists()}
    (out / "runs.json").write_text(json.dumps(runs, indent=1))


def saved(out: Path, name: str) -> dict | None:
    """One run's ``gpu_hooks.json``: its folder's, else its entry in ``out/runs.json``."""
    path = out / name / "gpu_hooks.json"
    if path.exists():
        return json.loads(path.read_text())
    runs = out / "runs.json"
    return json.loads(runs.read_text()).get(name) if runs.exists() else None


def runs_table(dirs: list) -> str:
    rows = []
    for d in dirs:
        r = saved(d.parent, d.name)
        if r is None:
            raise SystemExit(f"no {d / 'gpu_hooks.json'} and no entry {d.name!r} in {d.parent / 'runs.json'}")
        b, s = r[f"batch {BATCHES[0]}"], r[f"batch {BATCHES[1]}"]
        rows.append((b["no_tracer_us_median"], d.name, b, s))
    rows.sort(key=lambda row: row[0])
    lines = [f"| run | batch {BATCHES[0]}: without the tracer µs | with it, median | p90 | the tracer's own | "
             f"own / without | batch {BATCHES[1]}: the tracer's own |", "|---|---|---|---|---|---|---|"]
    for bare, name, b, s in rows:
        lines.append(f"| {name} | {bare:,.1f} | {b['host_us_median']:,.1f} | {b['host_us_p90']:,.1f} | "
                     f"{b['tracer_us_median']:,.1f} | {b['tracer_us_median'] / bare:.1f} | "
                     f"{s['tracer_us_median']:,.1f} |")
    own = sorted(b["tracer_us_median"] for _, _, b, _ in rows)
    lines.append(f"\nbatch {BATCHES[0]}, the tracer's own: median {statistics.median(own):,.1f} µs over {len(own)} runs, "
                 f"{sum(x <= 150 for x in own)} of them at or under 150 µs")
    return "\n".join(lines)


def table(out: Path, names: tuple) -> str:
    a, b = names
    lines = [f"| pair | batch {BATCHES[0]}: tracer's own µs, {a} / {b} | ratio | batch {BATCHES[1]}: {a} / {b} | ratio |",
             "|---|---|---|---|---|"]
    i = 1
    while (ra := saved(out, f"{a}{i}")) is not None and (rb := saved(out, f"{b}{i}")) is not None:
        cells = []
        for batch in BATCHES:
            x, y = ra[f"batch {batch}"]["tracer_us_median"], rb[f"batch {batch}"]["tracer_us_median"]
            cells += [f"{x:,.0f} / {y:,.0f}", f"{x / y:.2f}"]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
        i += 1
    if i == 1:
        raise SystemExit(f"no pair of {a}N/{b}N folders with gpu_hooks.json under {out}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tracers", nargs="*", type=Path, help="A_DIR B_DIR: folders holding draftscope_tracer")
    ap.add_argument("--out", type=Path, help="where each run's JSON goes (a1, b1, ...)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--cores", default="4-7", help="taskset's core list for every run")
    ap.add_argument("--table", type=Path, help="print the table of saved runs under this folder instead")
    ap.add_argument("--names", nargs=2, default=("a", "b"), help="the two runs' folder prefixes (default a b)")
    ap.add_argument("--runs", nargs="+", type=Path, help="list these runs of one tracer instead (folders "
                    "with gpu_hooks.json, or names in their parent's runs.json)")
    args = ap.parse_args()
    if args.runs:
        print(runs_table(args.runs))
        return
    if args.table:
        print(table(args.table, tuple(args.names)))
        return
    if len(args.tracers) != 2 or args.out is None:
        ap.error("give A_DIR B_DIR and --out (or --table OUT)")
    run(*args.tracers, args.out, args.pairs, args.cores)
    print(table(args.out, ("a", "b")))


if __name__ == "__main__":
    main()
