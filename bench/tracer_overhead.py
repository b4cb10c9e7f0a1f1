"""Tracer overhead on the real CPU SGLang server, against a server without the tracer, in one run.

The figure it is built for is **server CPU time per generated token**: the kernel's per-process CPU
clock (nanoseconds, every thread, living or exited; ``/proc/<pid>/stat`` counts 10 ms ticks) summed
over the server's process tree (the HTTP/tokenizer process, the scheduler with the tracer's relay
thread, the detokenizer, the tracer's recorder). Greedy requests on fixed prompts make every unit
generate the same tokens in the same batches, so CPU per token moves only with what the server does
and with the machine's contention; wall tokens/s (also printed) moves with everything else on it.

Each block starts two servers that run side by side: one **without the tracer** (SGLang's
``SGLANG_PLUGINS`` allow-list names every other general plugin but ours, so SGLang never imports
``draftscope_tracer``) and one **traced** at ``DRAFTSCOPE_SAMPLE_RATE=1/16``; both get the same sink
settings, so only the plugin loading differs; which of the two starts (and warms up) first alternates from
block to block (the run of 2026-12-05 started the plain one first in every block). Both run with ``--sleep-on-idle``: without it an idle
SGLang scheduler spins a whole core, which would be taken from the other server (the bench prints
what each server used while the other was measured). Neither is pinned to a core: the other load on
the machine is not pinned either, so a pinned server only loses the core its own tokenizer,
detokenizer and recorder could use, and CPU time is counted on whichever core it runs. On a machine
shared with other work, ``--nice -10`` raises the servers' (and the bench's) share of the CPUs: each
server is descheduled less often, so less of its CPU time goes to refilling caches after another
process ran, the part of CPU time that moves with the machine's load.

A unit is 16 greedy requests (waves of ``--concurrency``) on one server. The traced server runs three
variants: no request sampled ("tracer, nothing sampled"), exactly 1 of the 16 ("1 in 16"), all 16
("every request"); the request ids decide which requests the tracer samples. **The layout is
symmetric:** a unit without the tracer runs before and after every traced unit, so each round is
``N T N T N T`` (N: no tracer; T: the three traced variants, their order rotated per round) and a
block ends with one more N. Every unit follows a switch of server and precedes one, so what a switch
costs the unit after it (caches refilled after the other server ran) lands on both sides alike, and
each traced unit is compared with the mean of the two N units around it, which also cancels a drift
that is linear over those three units. (The earlier layout, four units ``N T T T`` rotated, put the N
unit after a switch every time and the traced units mostly not: it leaned toward the tracer by 1-2%.)
Each unit starts with one untimed wave of unsampled requests (the server's caches warm again after the
other server ran) and ends with a pause of 0.3 s, counted in its CPU but not in its wall time, so that
the tracer's recorder finishes the unit's records before the next unit starts. A round (six units)
takes ~18 s; several blocks (fresh server pairs) let a difference between two server processes
average out. Each round's figures are printed as they come.

Overheads are per traced unit (CPU per token: the unit's over the baseline's, minus 1; tokens/s: the
baseline's over the unit's, minus 1), against both baselines: no tracer (the mean of the two N units
around it), and the tracer installed with nothing sampled (that variant's unit in the same round; both
follow a switch). Each figure is the median over all rounds with a 95% bootstrap interval of that
median that resamples pairs of blocks (blocks 2k and 2k+1, whose servers started in opposite orders), then
rounds within each block (seeded). The CPU per token is also split
by process, so a cost of the unsampled path shows where it lands.

The server's torch runs ``--server-threads`` intra-op threads (default 1): on this 2-core machine two
threads fill both cores and every other runnable thread (the client, SGLang's tokenizer and
detokenizer, the tracer's recorder) stalls the forward pass. One thread leaves a core for them, as a
GPU host's spare cores do. ``--sink sqlite`` (default): the tracer writes the store file itself;
``--sink http``: one ``draftscope serve`` for the whole run takes the tracer's batches over HTTP.
Interrupted (SIGINT, e.g. ``timeout -s INT``), the bench reports the rounds completed so far.

    python bench/tracer_overhead.py --blocks 8 --rounds 16 --nice -10
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
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from draftscope.store import db as store_db  # noqa: E402
from testbed.models import ensure_models  # noqa: E402
from testbed.overhead import bootstrap_interval, request_id  # noqa: E402
from testbed.server import REPO_ROOT, server_processes, start_dashboard, start_server, venv_python  # noqa: E402

PROMPTS = ["The quick brown fox", "Once upon a time there was", "Hello world, this is", "A B C D",
           "In the beginning", "She said that the"]
OURS = "draftscope"  # our entry point's name in the group "sglang.srt.plugins" (pyproject.toml)
UNIT = 16  # requests per unit
# variant -> (runs on the traced server, requests sampled among a unit's 16)
VARIANTS = {"no tracer": (False, 0), "tracer, nothing sampled": (True, 0), "1 in 16": (True, 1),
            "every request": (True, UNIT)}
BASELINES = ("no tracer", "tracer, nothing sampled")
TRACED = [name for name, (traced, _) in VARIANTS.items() if traced]
LAYOUT_NOTE = ("symmetric: per round N T N T N T (N: no tracer; T: " + ", ".join(TRACED) + ", rotated per "
               "round), one more N at the end of a block; every unit follows a switch of server, and each T is "
               "compared with the mean of the N units on its two sides")
TARGETS = {"1 in 16": 2.0, "every request": 10.0}  # percent of tokens/s, against no tracer
UNSAMPLED_HALF_WIDTH = 2.0  # percent: the nothing-sampled interval must be this narrow to show anything
SETTLE_S = 0.3  # pause after each unit: the recorder finishes its records (relay every 100 ms)
WARM_TOKENS = 8  # new tokens per request of the untimed wave that starts each unit
ROLES = ("scheduler", "tokenizer", "detokenizer", "recorder", "other")


class Unit(NamedTuple):
    tokens_per_s: float
    cpu_ms_per_token: float  # the whole process tree
    roles: dict  # role -> CPU ms per token


class Paired(NamedTuple):
    """A traced unit and its baseline without the tracer: the mean of the no-tracer units on both sides."""
    unit: Unit
    base: Unit


class WrongServer(RuntimeError):
    """A block's traced server stored no run, or its plain one did: that block's rounds measure nothing."""


def plugins_except_ours(python) -> str:
    """A ``SGLANG_PLUGINS`` value that loads every general plugin installed for ``python`` but ours
    (a lone "," when ours is the only one: an allow-list naming no plugin)."""
    code = ("from importlib.metadata import entry_points as e; "
            f"print(','.join(p.name for p in e(group='sglang.srt.plugins') if p.name != {OURS!r}))")
    names = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return names or ","


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid``, all its threads including exited ones: the kernel's
    per-process CPU clock (``clock_getcpuclockid``), in nanoseconds where ``/proc/<pid>/stat`` has ticks."""
    return time.clock_gettime((~pid << 3) | 2)  # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)


def role(process: psutil.Process) -> str:
    """Which part of the server ``process`` is, from the title SGLang gives it (or the tracer's module)."""
    cmdline = " ".join(process.cmdline())
    if cmdline.startswith("sglang::scheduler"):
        return "scheduler"
    if cmdline.startswith("sglang::detokenizer"):
        return "detokenizer"
    if "draftscope_tracer.transport.recorder" in cmdline:
        return "recorder"
    if "sglang.launch_server" in cmdline:
        return "tokenizer"  # the launcher runs the HTTP server and the tokenizer manager
    return "other"


def tree_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Per live process of the server under ``pid`` (itself included, and its tracer's recorder): its role
    and CPU seconds."""
    out = {}
    for p in server_processes(pid):
        with contextlib.suppress(psutil.NoSuchProcess, OSError):
            out[p.pid] = (role(p), process_cpu_seconds(p.pid))
    return out


def tree_cpu_seconds(pid: int) -> float:
    return sum(cpu for _, cpu in tree_cpu(pid).values())


def layout(rounds: int) -> list[str]:
    """A block's units in order: per round a no-tracer unit before each traced variant (their order
    rotated per round), then one closing no-tracer unit."""
    out = []
    for r in range(rounds):
        for name in TRACED[r % len(TRACED):] + TRACED[:r % len(TRACED)]:
            out += ["no tracer", name]
    return out + ["no tracer"]


def mean_unit(a: Unit, b: Unit) -> Unit:
    return Unit((a.tokens_per_s + b.tokens_per_s) / 2, (a.cpu_ms_per_token + b.cpu_ms_per_token) / 2,
                {r: (a.roles[r] + b.roles[r]) / 2 for r in a.roles})


def paired_rounds(measured: list[tuple[str, Unit]]) -> list[dict[str, Paired]]:
    """The rounds of one block's units (in ``layout`` order) whose every traced unit has its no-tracer
    unit after it: per round, each traced variant with its baseline."""
    per_round = 2 * len(TRACED)
    rounds = []
    for start in range(0, len(measured) - per_round, per_round):
        rounds.append({measured[i][0]: Paired(measured[i][1], mean_unit(measured[i - 1][1], measured[i + 1][1]))
                       for i in range(start + 1, start + per_round, 2)})
    return rounds


def run_unit(server, pool: ThreadPoolExecutor, rids: list[str], warm: list[str], width: int,
             new_tokens: int) -> Unit:
    """The requests ``rids``, in waves of ``width``, after one untimed wave of ``warm``: their tokens/s and
    the server's CPU ms per token (the whole tree, and per role), counting a pause of ``SETTLE_S`` after
    the last wave."""
    def wave(ids: list[str], first: int, max_new_tokens: int) -> int:
        outs = pool.map(lambda i: server.generate(PROMPTS[i % len(PROMPTS)] + f" {i}",
                                                  max_new_tokens=max_new_tokens, rid=ids[i - first]),
                        range(first, first + len(ids)))
        return sum(o["meta_info"]["completion_tokens"] for o in outs)

    wave(warm, 0, WARM_TOKENS)
    tokens, wall, cpu0 = 0, 0.0, tree_cpu(server.pid)
    for w in range(0, len(rids), width):
        t0 = time.perf_counter()
        tokens += wave(rids[w:w + width], w, new_tokens)
        wall += time.perf_counter() - t0
    time.sleep(SETTLE_S)
    cpu1 = tree_cpu(server.pid)
    roles = dict.fromkeys(ROLES, 0.0)
    for pid, (name, cpu) in cpu1.items():
        roles[name] += 1000 * (cpu - cpu0.get(pid, (name, 0.0))[1]) / tokens
    return Unit(tokens / wall, sum(roles.values()), roles)


def raise_priority(pid: int, nice: int) -> None:
    """Give the scheduling group (Linux autogroup: one per session) of every process of the server under
    ``pid`` (``server_processes``: its tree and its tracer's recorder) the nice level ``nice``. Each server, and the tracer's recorder, runs in a session of its own,
    and the kernel shares the CPUs between sessions first, so a plain ``nice`` would rank threads only
    within a session."""
    for p in server_processes(pid):
        if autogroup_nice(p.pid) is None:  # in the root group (the kernel refuses it a level) or gone
            continue
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            Path(f"/proc/{p.pid}/autogroup").write_text(str(nice))


def autogroup_nice(pid: int) -> int | None:
    """The nice level of ``pid``'s scheduling group, or None where it has none of its own: a process in
    the root group (never given a session of its own by ``setsid``) reads an empty file, and a kernel
    without autogroups or a process gone has no file."""
    try:
        fields = Path(f"/proc/{pid}/autogroup").read_text().split()  # "/autogroup-123 nice 0"
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[-1]) if fields else None


def stored_runs(store: Path) -> int:
    with contextlib.closing(sqlite3.connect(store)) as c:
        return c.execute("SELECT count(*) FROM runs").fetchone()[0]


def machine_load() -> str:
    """The 1-minute load average and, where the kernel keeps it, the share of the last 10 s in which some
    runnable task waited for a CPU (``/proc/pressure/cpu``)."""
    load = f"load {os.getloadavg()[0]:.2f}"
    with contextlib.suppress(OSError):
        some = Path("/proc/pressure/cpu").read_text().split()[1]  # "avg10=12.34" on the line "some ..."
        load += f", CPU pressure {some.split('=')[1]}%"
    return load


def round_line(block: int, r: int, units: list[tuple[str, Unit]]) -> str:
    """One round's units in the order they ran (and the closing no-tracer unit): CPU per token, each
    traced unit's cost against the no-tracer units on both sides, tokens/s."""
    cells = []
    for i, (name, u) in enumerate(units):
        cell = f"{'N' if name == 'no tracer' else name} {u.cpu_ms_per_token:.3f}"
        if name != "no tracer":
            base = (units[i - 1][1].cpu_ms_per_token + units[i + 1][1].cpu_ms_per_token) / 2
            cell += f" ({100 * (u.cpu_ms_per_token / base - 1):+.1f}%)"
        cells.append(cell)
    return (f"block {block} round {r}: CPU ms/token " + ", ".join(cells) + "; tok/s "
            + " ".join(f"{u.tokens_per_s:.0f}" for _, u in units) + f"; {machine_load()}")


def run_block(args, models, work: Path, block: int, sink: dict, store: Path, results: dict, idle: dict) -> None:
    """One server pair; appends each unit (variant, ``Unit``) in ``layout`` order to ``results[block]``,
    and adds to ``idle[traced]`` the (CPU, wall) seconds of each server while the other one is measured."""
    python = args.python or venv_python()
    base = {"OMP_NUM_THREADS": str(args.server_threads), **sink, "DRAFTSCOPE_SAMPLE_RATE": "1/16"}
    runs_before = stored_runs(store)
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(args.concurrency) as pool:
        envs = {False: {**base, "SGLANG_PLUGINS": plugins_except_ours(python)}, True: base}
        if block % 2:  # which server starts (and warms) first alternates: an edge of going first lands on both
            envs = dict(reversed(envs.items()))
        print(f"block {block}: {'traced' if next(iter(envs)) else 'no-tracer'} server started first", flush=True)
        servers = {traced: stack.enter_context(start_server(
            models.target, models.draft, ["--sleep-on-idle"], work / f"block{block}-traced-{traced}.log", env=env,
            python=python)) for traced, env in envs.items()}
        def unsampled(name: str, n: int) -> list[str]:
            return [request_id(f"{name}-{i}", False) for i in range(n)]

        for server in servers.values() if args.nice else ():
            raise_priority(server.pid, args.nice)
        for traced, server in servers.items():  # warm-up, not timed
            run_unit(server, pool, unsampled(f"warm{block}-{traced}", UNIT),
                     unsampled(f"warm{block}-{traced}-first", args.concurrency), args.concurrency, args.new_tokens)
        measured, per_round = results[block], 2 * len(TRACED)
        for k, name in enumerate(layout(args.rounds)):
            traced, sampled = VARIANTS[name]
            unit = f"b{block}-u{k}"
            rids = [request_id(f"{unit}-{i}", i < sampled) for i in range(UNIT)]
            other, t0 = servers[not traced], time.perf_counter()
            cpu0 = tree_cpu_seconds(other.pid)
            measured.append((name, run_unit(servers[traced], pool, rids, unsampled(f"{unit}-warm", args.concurrency),
                                            args.concurrency, args.new_tokens)))
            idle[not traced][0] += tree_cpu_seconds(other.pid) - cpu0
            idle[not traced][1] += time.perf_counter() - t0
            if k and k % per_round == 0:  # a round's traced units all have their no-tracer unit after them
                print(round_line(block, k // per_round - 1, measured[k - per_round:k + 1]), flush=True)
    if stored_runs(store) != runs_before + 1:  # the traced server's run, and none from the plain one
        raise WrongServer(f"block {block}: expected one new run in {store} (the traced server's), found "
                          f"{stored_runs(store) - runs_before}: the plugin was loaded in the wrong server")


def completed_rounds(results: dict) -> dict:
    """Per block, its complete rounds (``paired_rounds``); blocks with none left out."""
    rounds = {b: paired_rounds(measured) for b, measured in results.items()}
    return {b: rs for b, rs in rounds.items() if rs}


def units_of(rounds: dict, name: str) -> list[Unit]:
    """Every unit of variant ``name`` in complete rounds (for no tracer: the baselines, one per traced unit)."""
    if name == "no tracer":
        return [p.base for rs in rounds.values() for rnd in rs for p in rnd.values()]
    return [rnd[name].unit for rs in rounds.values() for rnd in rs]


def overheads(rounds: dict, name: str, base: str, measure: str) -> list[list[float]]:
    """Per block, per round: the cost of ``name`` against ``base`` in ``measure`` (``tokens_per_s``: the
    baseline's over the variant's, minus 1; a CPU figure: the variant's over the baseline's, minus 1).
    Against no tracer the baseline is the mean of the no-tracer units on both sides of the unit."""
    def ratio(b: Unit, x: Unit) -> float:
        if measure == "tokens_per_s":
            return b.tokens_per_s / x.tokens_per_s - 1
        return getattr(x, measure) / getattr(b, measure) - 1

    def baseline(rnd: dict) -> Unit:
        return rnd[name].base if base == "no tracer" else rnd[base].unit

    return [[ratio(baseline(rnd), rnd[name].unit) for rnd in rs] for rs in rounds.values()]


def order_pairs(results: dict) -> list[list[int]]:
    """Indices (in ``results``' order) of the blocks resampled together: blocks 2k and 2k+1, whose servers started
    in opposite orders (the second-started server of a pair ran 2-4% cheaper per token on 2026-12-05: a pair
    cancels that, a lone block carries it)."""
    pairs: dict = {}
    for i, block in enumerate(results):
        pairs.setdefault(block // 2, []).append(i)
    return list(pairs.values())


def interval(groups: list[list[float]], pairs: list[list[int]]) -> tuple[float, float, float]:
    """The median of all values and the 95% bootstrap interval of it, resampling ``pairs`` of blocks, then each
    block's rounds."""
    low, high = bootstrap_interval(groups, clusters=pairs)
    return statistics.median([x for g in groups for x in g]), low, high


def cost(groups: list[list[float]], pairs: list[list[int]]) -> str:
    mid, low, high = interval(groups, pairs)
    return f"{100 * mid:+.1f}% [{100 * low:+.1f}, {100 * high:+.1f}]"


def report(results: dict, idle: dict) -> None:
    """``results``: complete rounds per block (``completed_rounds``)."""
    rounds, pairs = sum(len(rs) for rs in results.values()), order_pairs(results)
    for measure, title, fmt in (
            ("cpu_ms_per_token", "server CPU ms per token, whole process tree (lower is better)", ".3f"),
            ("tokens_per_s", "tokens/s (wall clock; higher is better)", ".1f")):
        print(f"\n{title}; {rounds} rounds in {len(results)} blocks, layout N T N T N T (+ N)\n\n| variant | median | quartiles | min-max "
              f"| vs no tracer [95% interval] | vs tracer, nothing sampled [95% interval] |\n|---|---|---|---|---|---|")
        for name in VARIANTS:
            xs = [getattr(u, measure) for u in units_of(results, name)]
            cells = [cost(overheads(results, name, base, measure), pairs) if name not in BASELINES[:i + 1] else ""
                     for i, base in enumerate(BASELINES)]
            q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
            label = "no tracer (mean of the N units around each traced unit)" if name == "no tracer" else name
            print(f"| {label} | {statistics.median(xs):{fmt}} | {q[0]:{fmt}}-{q[2]:{fmt}} | "
                  f"{min(xs):{fmt}}-{max(xs):{fmt}} | {' | '.join(cells)} |")
    print("\nper-round CPU cost against no tracer: quartiles and min-max of the rounds' values")
    for name in list(VARIANTS)[1:]:
        xs = sorted(100 * x for g in overheads(results, name, "no tracer", "cpu_ms_per_token") for x in g)
        q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
        print(f"  {name}: {q[0]:+.1f}% to {q[2]:+.1f}%, {xs[0]:+.1f}% to {xs[-1]:+.1f}%")
    print("\nCPU per token against no tracer, median per block (server pair):")
    for name in list(VARIANTS)[1:]:
        print(f"  {name}: " + ", ".join(f"{100 * statistics.median(g):+.1f}%"
                                        for g in overheads(results, name, "no tracer", "cpu_ms_per_token")))
    print("median per pair of blocks (servers started in opposite orders; the bootstrap resamples these):")
    for name in list(VARIANTS)[1:]:
        groups = overheads(results, name, "no tracer", "cpu_ms_per_token")
        print(f"  {name}: " + ", ".join(f"{100 * statistics.median([x for i in p for x in groups[i]]):+.1f}%"
                                        for p in pairs))
    print("\nCPU µs per token by process (median over rounds); the difference to no tracer is the median of "
          "the rounds' differences [95% interval]:\n\n| variant | " + " | ".join(ROLES) + " |\n|---|"
          + "---|" * len(ROLES))
    for name in VARIANTS:
        cells = []
        for r in ROLES:
            values = [1000 * u.roles[r] for u in units_of(results, name)]
            cell = f"{statistics.median(values):.1f}"
            if name != "no tracer":
                diffs = [[1000 * (rnd[name].unit.roles[r] - rnd[name].base.roles[r]) for rnd in rs]
                         for rs in results.values()]
                mid, low, high = interval(diffs, pairs)
                cell += f" ({mid:+.1f} [{low:+.1f}, {high:+.1f}])"
            cells.append(cell)
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("\nidle, while the other server was measured: " + ", ".join(
        f"{'traced server' if traced else 'server without the tracer'} {1000 * c / w:.1f} CPU ms per s"
        for traced, (c, w) in idle.items() if w))
    mid, low, high = interval(overheads(results, "tracer, nothing sampled", "no tracer", "cpu_ms_per_token"), pairs)
    verdict = ("contains 0" if low <= 0 <= high else "does NOT contain 0") + (
        f", half-width {50 * (high - low):.1f}% "
        + ("<=" if 50 * (high - low) <= UNSAMPLED_HALF_WIDTH else "> (too wide to show anything at)")
        + f" {UNSAMPLED_HALF_WIDTH:g}%")
    print(f"\nthe unsampled path: CPU per token, tracer installed with nothing sampled against no tracer, "
          f"{100 * mid:+.1f}% [{100 * low:+.1f}, {100 * high:+.1f}]: {verdict}")
    print("targets, tokens/s against no tracer: " + ", ".join(f"{n} <= {t:g}%" for n, t in TARGETS.items()))


def commit() -> str:
    git = ["git", "-C", str(REPO_ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout
    return head + (" with uncommitted changes" if dirty.strip() else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=1, help="server pairs, started one after another")
    ap.add_argument("--rounds", type=int, default=4,
                    help="rounds per block, six units each (a no-tracer unit before each traced variant); a "
                         "block ends with one more no-tracer unit")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight (one wave)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--server-threads", type=int, default=1, help="the server's torch intra-op threads")
    ap.add_argument("--nice", type=int, default=0,
                    help="nice level of the servers' scheduling groups and the bench's own, -20 to 19 (below 0 "
                         "needs root): the servers' share of the CPUs against other load on the machine")
    ap.add_argument("--sink", choices=("sqlite", "http"), default="sqlite",
                    help="the tracer writes the SQLite store itself, or sends to a local dashboard's ingest API")
    ap.add_argument("--python", default=None, help="the test bed Python (default: $DRAFTSCOPE_VENV or .venv)")
    args = ap.parse_args()
    print(f"$ {' '.join(sys.argv)}\ncommit {commit()}; at the start {machine_load()}, load average "
          f"{os.getloadavg()[1]:.2f} (5 min) on {os.cpu_count()} CPUs; the servers' scheduling groups at nice "
          f"{args.nice}", flush=True)
    models = ensure_models()
    work = Path(tempfile.mkdtemp(prefix="draftscope-bench-"))
    store = work / "store.db"
    store_db.upgrade(f"sqlite:///{store}")
    print("layout: " + LAYOUT_NOTE, flush=True)
    results = {b: [] for b in range(args.blocks)}  # per block, (variant, Unit) in the order run
    idle = {False: [0.0, 0.0], True: [0.0, 0.0]}  # per server kind: CPU and wall seconds while the other ran
    with contextlib.ExitStack() as stack:
        own = autogroup_nice(os.getpid())
        if args.nice and own is not None:  # the bench's own session too (the client), given back its level
            raise_priority(os.getpid(), args.nice)
            stack.callback(Path(f"/proc/{os.getpid()}/autogroup").write_text, str(own))
        if args.sink == "http":
            sink = {"DRAFTSCOPE_URL": stack.enter_context(start_dashboard(store, work / "dashboard.log"))}
        else:
            sink = {"DRAFTSCOPE_DB": str(store)}
        try:
            for b in range(args.blocks):
                run_block(args, models, work, b, sink, store, results, idle)
        except WrongServer as exc:  # e.g. the tracer's install changed under the run: keep the blocks before
            del results[b]
            print(f"\n{exc}; its rounds left out, no further block run", flush=True)
            if not completed_rounds(results):
                raise SystemExit(f"no block left; logs in {work}") from None
        except KeyboardInterrupt:  # e.g. `timeout -s INT`: report the rounds completed so far
            done = completed_rounds(results)
            print(f"\ninterrupted: reporting the {sum(len(rs) for rs in done.values())} rounds completed in "
                  f"{len(done)} blocks", flush=True)
            if not done:
                raise SystemExit(f"no round completed; logs in {work}")
    report(completed_rounds(results), idle)
    print(f"\nat the end {machine_load()}, load average {os.getloadavg()[1]:.2f} (5 min), "
          f"{os.getloadavg()[2]:.2f} (15 min); logs in {work}")


if __name__ == "__main__":
    main()
