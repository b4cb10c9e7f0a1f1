"""Tracer overhead on the real CPU SGLang server, against a server without the tracer, in one run.

Each block starts two servers that run side by side: one **without the tracer** (SGLang's
``SGLANG_PLUGINS`` allow-list names every other general plugin but ours, so SGLang never imports
``draftscope_tracer``) and one **traced** at ``DRAFTSCOPE_SAMPLE_RATE=1/16``; both get the same sink
settings, so only the plugin loading differs. Both run with ``--sleep-on-idle``: without it an idle
SGLang scheduler spins a whole core, which would be taken from the other server (the bench prints
what each server used while the other was measured).

In each round four units of 16 greedy requests (waves of ``--concurrency``) run one after another,
in an order rotated per round: the server without the tracer; the traced server with no request
sampled; with exactly 1 of the 16 sampled ("1 in 16"); with all 16 sampled ("every request"). The
request ids decide which requests the tracer samples. Each unit ends with a pause of 0.3 s, counted
in its CPU but not in its wall time, so that the tracer's recorder finishes the unit's records
before the next unit starts. A round takes ~10 s, so the machine's drift cancels within a round;
several blocks (fresh server pairs) let a difference between two server processes average out too.

Overheads are per round (tokens/s: the baseline's over the variant's, minus 1; CPU per token: the
variant's over the baseline's, minus 1), against both baselines: no tracer, and the tracer installed
with nothing sampled. Each figure is the median over all rounds with a 95% bootstrap interval of that
median that resamples blocks, then rounds within each block (seeded). CPU counts the server's whole
process tree (scheduler with the tracer's relay thread, the tracer's recorder process, tokenizer,
detokenizer).

The server's torch runs ``--server-threads`` intra-op threads (default 1): on this 2-core machine two
threads fill both cores and every other runnable thread (the client, SGLang's tokenizer and
detokenizer, the tracer's recorder) stalls the forward pass. One thread leaves a core for them, as a
GPU host's spare cores do. ``--sink sqlite`` (default): the tracer writes the store file itself;
``--sink http``: one ``draftscope serve`` for the whole run takes the tracer's batches over HTTP.
Interrupted (SIGINT, e.g. ``timeout -s INT``), the bench reports the rounds completed so far.

    python bench/tracer_overhead.py --blocks 4 --rounds 12
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from draftscope import db as store_db  # noqa: E402
from testbed.models import ensure_models  # noqa: E402
from testbed.overhead import bootstrap_interval, request_id  # noqa: E402
from testbed.server import REPO_ROOT, start_dashboard, start_server, venv_python  # noqa: E402

PROMPTS = ["The quick brown fox", "Once upon a time there was", "Hello world, this is", "A B C D",
           "In the beginning", "She said that the"]
OURS = "draftscope"  # our entry point's name in the group "sglang.srt.plugins" (pyproject.toml)
UNIT = 16  # requests per unit
# variant -> (runs on the traced server, requests sampled among a unit's 16)
VARIANTS = {"no tracer": (False, 0), "tracer, nothing sampled": (True, 0), "1 in 16": (True, 1),
            "every request": (True, UNIT)}
BASELINES = ("no tracer", "tracer, nothing sampled")
TARGETS = {"1 in 16": 2.0, "every request": 10.0}  # percent, against no tracer
SETTLE_S = 0.3  # pause after each unit: the recorder finishes its records (relay every 100 ms)


def plugins_except_ours(python) -> str:
    """A ``SGLANG_PLUGINS`` value that loads every general plugin installed for ``python`` but ours
    (a lone "," when ours is the only one: an allow-list naming no plugin)."""
    code = ("from importlib.metadata import entry_points as e; "
            f"print(','.join(p.name for p in e(group='sglang.srt.plugins') if p.name != {OURS!r}))")
    names = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return names or ","


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and every live descendant."""
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def run_unit(server, pool: ThreadPoolExecutor, rids: list[str], width: int, new_tokens: int) -> tuple[float, float]:
    """(tokens/s, server CPU ms per token) of the requests ``rids``, in waves of ``width``; the CPU includes
    a pause of ``SETTLE_S`` after the last wave."""
    tokens, wall, cpu0 = 0, 0.0, tree_cpu_seconds(server.pid)
    for w in range(0, len(rids), width):
        t0 = time.perf_counter()
        outs = pool.map(lambda i: server.generate(PROMPTS[i % len(PROMPTS)] + f" {i}", max_new_tokens=new_tokens,
                                                  rid=rids[i]), range(w, min(w + width, len(rids))))
        tokens += sum(o["meta_info"]["completion_tokens"] for o in outs)
        wall += time.perf_counter() - t0
    time.sleep(SETTLE_S)
    return tokens / wall, 1000 * (tree_cpu_seconds(server.pid) - cpu0) / tokens


def stored_runs(store: Path) -> int:
    with contextlib.closing(sqlite3.connect(store)) as c:
        return c.execute("SELECT count(*) FROM runs").fetchone()[0]


def run_block(args, models, work: Path, block: int, sink: dict, store: Path, results: dict, idle: dict) -> None:
    """One server pair; appends each round's (tokens/s, CPU ms per token) per variant to ``results[block]``,
    and adds to ``idle[traced]`` the (CPU, wall) seconds of each server while the other one is measured."""
    python = args.python or venv_python()
    base = {"OMP_NUM_THREADS": str(args.server_threads), **sink, "DRAFTSCOPE_SAMPLE_RATE": "1/16"}
    runs_before = stored_runs(store)
    names = list(VARIANTS)
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(args.concurrency) as pool:
        envs = {False: {**base, "SGLANG_PLUGINS": plugins_except_ours(python)}, True: base}
        servers = {traced: stack.enter_context(start_server(
            models.target, models.draft, ["--sleep-on-idle"], work / f"block{block}-traced-{traced}.log", env=env,
            python=python)) for traced, env in envs.items()}
        for traced, server in servers.items():  # warm-up, not timed
            run_unit(server, pool, [request_id(f"warm{block}-{traced}-{i}", False) for i in range(UNIT)],
                     args.concurrency, args.new_tokens)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                traced, sampled = VARIANTS[name]
                rids = [request_id(f"b{block}-r{r}-{names.index(name)}-{i}", i < sampled) for i in range(UNIT)]
                other, t0 = servers[not traced], time.perf_counter()
                cpu0 = tree_cpu_seconds(other.pid)
                t, c = run_unit(servers[traced], pool, rids, args.concurrency, args.new_tokens)
                idle[not traced][0] += tree_cpu_seconds(other.pid) - cpu0
                idle[not traced][1] += time.perf_counter() - t0
                results[block][name].append((t, c))
                print(f"block {block} round {r} {name}: {t:.1f} tok/s, {c:.2f} server CPU ms/token", flush=True)
    if stored_runs(store) != runs_before + 1:  # the traced server's run, and none from the plain one
        raise SystemExit(f"block {block}: expected one new run in {store} (the traced server's), found "
                         f"{stored_runs(store) - runs_before}: the plugin was loaded in the wrong server")


def completed_rounds(results: dict) -> dict:
    """``results`` cut to the rounds that every variant finished; blocks with none left out."""
    cut = {b: min(len(xs) for xs in block.values()) for b, block in results.items()}
    return {b: {name: xs[:cut[b]] for name, xs in block.items()} for b, block in results.items() if cut[b]}


def overheads(results: dict, name: str, base: str, measure: int) -> list[list[float]]:
    """Per block, per round: the cost of ``name`` against ``base`` (``measure`` 0 tokens/s, 1 CPU per token)."""
    return [[b[measure] / x[measure] - 1 if measure == 0 else x[measure] / b[measure] - 1
             for b, x in zip(block[base], block[name])] for block in results.values()]


def cost(groups: list[list[float]]) -> str:
    low, high = bootstrap_interval(groups)
    return f"{100 * statistics.median([x for g in groups for x in g]):+.1f}% [{100 * low:+.1f}, {100 * high:+.1f}]"


def report(results: dict, idle: dict) -> None:
    for measure, title in ((0, "tokens/s (wall clock; higher is better)"),
                           (1, "server CPU ms per token, whole process tree (lower is better)")):
        print(f"\n{title}\n\n| variant | median | min-max | vs no tracer [95% interval] | "
              f"vs tracer, nothing sampled [95% interval] |\n|---|---|---|---|---|")
        for name in VARIANTS:
            xs = [x[measure] for block in results.values() for x in block[name]]
            cells = [cost(overheads(results, name, base, measure)) if name not in BASELINES[:i + 1] else ""
                     for i, base in enumerate(BASELINES)]
            print(f"| {name} | {statistics.median(xs):.2f} | {min(xs):.2f}-{max(xs):.2f} | {' | '.join(cells)} |")
    print("\ntokens/s overhead against no tracer, median per block (server pair):")
    for name in list(VARIANTS)[1:]:
        print(f"  {name}: " + ", ".join(f"{100 * statistics.median(g):+.1f}%"
                                        for g in overheads(results, name, "no tracer", 0)))
    print("\nidle, while the other server was measured: " + ", ".join(
        f"{'traced server' if traced else 'server without the tracer'} {1000 * c / w:.1f} CPU ms per s"
        for traced, (c, w) in idle.items() if w))
    print("\ntargets, tokens/s against no tracer: " + ", ".join(f"{n} <= {t:g}%" for n, t in TARGETS.items()))


def commit() -> str:
    git = ["git", "-C", str(REPO_ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout
    return head + (" with uncommitted changes" if dirty.strip() else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=1, help="server pairs, started one after another")
    ap.add_argument("--rounds", type=int, default=4, help="rounds per block (four units each)")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight (one wave)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--server-threads", type=int, default=1, help="the server's torch intra-op threads")
    ap.add_argument("--sink", choices=("sqlite", "http"), default="sqlite",
                    help="the tracer writes the SQLite store itself, or sends to a local dashboard's ingest API")
    ap.add_argument("--python", default=None, help="the test bed Python (default: $DRAFTSCOPE_VENV or .venv)")
    args = ap.parse_args()
    print(f"$ {' '.join(sys.argv)}\ncommit {commit()}; load average {os.getloadavg()[0]:.2f} (1 min), "
          f"{os.getloadavg()[1]:.2f} (5 min) on {os.cpu_count()} CPUs at the start", flush=True)
    models = ensure_models()
    work = Path(tempfile.mkdtemp(prefix="draftscope-bench-"))
    store = work / "store.db"
    store_db.upgrade(f"sqlite:///{store}")
    results = {b: {name: [] for name in VARIANTS} for b in range(args.blocks)}
    idle = {False: [0.0, 0.0], True: [0.0, 0.0]}  # per server kind: CPU and wall seconds while the other ran
    with contextlib.ExitStack() as stack:
        if args.sink == "http":
            sink = {"DRAFTSCOPE_URL": stack.enter_context(start_dashboard(store, work / "dashboard.log"))}
        else:
            sink = {"DRAFTSCOPE_DB": str(store)}
        try:
            for b in range(args.blocks):
                run_block(args, models, work, b, sink, store, results, idle)
        except KeyboardInterrupt:  # e.g. `timeout -s INT`: report the rounds completed so far
            results = completed_rounds(results)
            print(f"\ninterrupted: reporting the {sum(len(b['no tracer']) for b in results.values())} "
                  f"rounds completed in {len(results)} blocks", flush=True)
            if not results:
                raise SystemExit(f"no round completed; logs in {work}")
    report(results, idle)
    print(f"\nload average {os.getloadavg()[0]:.2f} (1 min), {os.getloadavg()[1]:.2f} (5 min), "
          f"{os.getloadavg()[2]:.2f} (15 min) at the end; logs in {work}")


if __name__ == "__main__":
    main()
