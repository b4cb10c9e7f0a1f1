"""Tracer overhead on the real CPU SGLang server: tokens/s without the tracer, at 1/16, at every request.

One run, variants interleaved: each round starts the three servers in turn (order rotated per round)
and times the same greedy request set on each, ``--concurrency`` requests in flight. The request ids
are chosen so that the tracer samples exactly every 16th request at rate 1/16 (SGLang's own ids are
random, which makes the number of sampled requests vary from run to run).

The server's torch runs ``--server-threads`` intra-op threads (default 1). On this 2-core machine two
threads fill both cores, and then any other runnable thread (the benchmark's client, SGLang's tokenizer
and detokenizer, the tracer's writer) stalls the forward pass's parallel regions: the noise of the
machine dominates. One thread leaves a core for them, as a GPU host's spare cores do.

``--sink sqlite`` (default) has the tracer write the store file itself (``DRAFTSCOPE_DB``); ``--sink
http`` starts one ``draftscope serve`` on the same machine for the whole run and has the tracer send
to its ingest API (``DRAFTSCOPE_URL``), as ``docker compose up`` does: the store's writes then happen
in the dashboard's process, whose CPU the second measure does not count.

Prints Markdown tables for two measures: wall-clock tokens/s, and the CPU time the server's whole
process tree (scheduler with the tracer's relay thread, the tracer's recorder process, tokenizer,
detokenizer) spends per generated token. The overhead column is the median over rounds of each round's
ratio to that round's first variant ("no tracer"; in waves, "no request sampled"), with a 95% bootstrap
interval of that median.

``--method waves`` measures the same thing inside one traced server (rate 1/16), so that the machine's
drift between server starts (several percent on this shared machine) cancels out: requests go in
waves of ``--concurrency``, and units of 16 requests (four waves) of three kinds are interleaved,
their order rotated per round: none sampled, exactly 1 sampled ("1 in 16"), all 16 sampled. The
request ids decide which requests the tracer samples. The baseline is then the tracer installed with
nothing sampled, which differs from no tracer by the per-request finish record and the hooks'
"nothing sampled" checks (see docs/benchmarks.md for both measured).

    python bench/tracer_overhead.py --rounds 8 --requests 64 --new-tokens 32 --concurrency 4
    python bench/tracer_overhead.py --method waves --rounds 30 --new-tokens 32
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
from concurrent.futures import ThreadPoolExecutor
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from draftscope import db as store_db  # noqa: E402
from testbed.models import ensure_models  # noqa: E402
from testbed.server import start_dashboard, start_server  # noqa: E402
from draftscope_tracer.sampling import request_sampled  # noqa: E402

PROMPTS = ["The quick brown fox", "Once upon a time there was", "Hello world, this is", "A B C D",
           "In the beginning", "She said that the"]


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and every live descendant."""
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def request_id(name: str, sampled: bool, rate: float = 1 / 16) -> str:
    """A request id starting with ``name`` that the tracer samples at ``rate`` exactly when ``sampled``."""
    j = 0
    while request_sampled(f"{name}-{j}", rate) != sampled:
        j += 1
    return f"{name}-{j}"


def request_ids(n: int, rate: float = 1 / 16) -> list[str]:
    """``n`` request ids of which exactly every ``1/rate``-th is sampled at ``rate``."""
    every = round(1 / rate)
    return [request_id(f"bench-{i}", i % every == 0, rate) for i in range(n)]


def measure(models, env, rids: list[str], new_tokens: int, concurrency: int, log: Path,
            python: str) -> tuple[float, float]:
    """(tokens/s, server CPU milliseconds per token) for one server with ``env``."""
    with start_server(models.target, models.draft, [], log, env=env, python=python) as server:
        server.generate(PROMPTS[0], max_new_tokens=4)  # warm-up, not timed

        def one(i: int) -> int:
            out = server.generate(PROMPTS[i % len(PROMPTS)] + f" {i}", max_new_tokens=new_tokens,
                                  rid=rids[i])
            return out["meta_info"]["completion_tokens"]

        cpu0, t0 = tree_cpu_seconds(server.pid), time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            tokens = sum(pool.map(one, range(len(rids))))
        wall, cpu = time.perf_counter() - t0, tree_cpu_seconds(server.pid) - cpu0
        return tokens / wall, 1000 * cpu / tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--server-threads", type=int, default=1, help="the server's torch intra-op threads")
    ap.add_argument("--sink", choices=("sqlite", "http"), default="sqlite",
                    help="the tracer writes the SQLite store itself, or sends to a local dashboard's ingest API")
    ap.add_argument("--python", default=None, help="the test bed Python (default: $DRAFTSCOPE_VENV or .venv)")
    ap.add_argument("--method", choices=("servers", "waves"), default="servers",
                    help="a fresh server per variant and round, or request waves inside one traced server")
    args = ap.parse_args()
    models = ensure_models()
    work = Path(tempfile.mkdtemp(prefix="draftscope-bench-"))
    store = work / "store.db"
    store_db.upgrade(f"sqlite:///{store}")
    with contextlib.ExitStack() as stack:
        if args.sink == "http":
            sink = {"DRAFTSCOPE_URL": stack.enter_context(start_dashboard(store, work / "dashboard.log"))}
        else:
            sink = {"DRAFTSCOPE_DB": str(store)}
        (run if args.method == "servers" else run_waves)(args, models, work, sink)


def run(args, models, work: Path, sink: dict) -> None:
    """``--method servers``: a fresh server per variant and round."""
    threads = {"OMP_NUM_THREADS": str(args.server_threads)}
    variants = {"no tracer": threads,
                "rate 1/16": {**threads, **sink, "DRAFTSCOPE_SAMPLE_RATE": "1/16"},
                "every request": {**threads, **sink, "DRAFTSCOPE_SAMPLE_RATE": "1"}}
    rids = request_ids(args.requests)
    report("", *rounds(list(variants), args.rounds, lambda r, name: measure(
        models, variants[name], rids, args.new_tokens, args.concurrency,
        work / f"{r}-{name.replace('/', '-in-')}.log", args.python)))


WAVE_UNITS = {"no request sampled": 0, "1 in 16": 1, "every request": 16}  # sampled among a unit's 16


def run_waves(args, models, work: Path, sink: dict) -> None:
    """``--method waves``: all rounds in one traced server (baseline: nothing sampled)."""
    env = {"OMP_NUM_THREADS": str(args.server_threads), **sink, "DRAFTSCOPE_SAMPLE_RATE": "1/16"}
    names, width = list(WAVE_UNITS), args.concurrency
    with start_server(models.target, models.draft, [], work / "waves.log", env=env, python=args.python) as server:
        server.generate(PROMPTS[0], max_new_tokens=4)  # warm-up, not timed
        with ThreadPoolExecutor(width) as pool:

            def unit(r: int, name: str) -> tuple[float, float]:
                rids = [request_id(f"w{r}-{names.index(name)}-{i}", i < WAVE_UNITS[name]) for i in range(16)]
                tokens, wall, cpu0 = 0, 0.0, tree_cpu_seconds(server.pid)
                for w in range(0, 16, width):
                    t0 = time.perf_counter()
                    outs = pool.map(lambda i: server.generate(PROMPTS[i % len(PROMPTS)] + f" {i}",
                                                              max_new_tokens=args.new_tokens, rid=rids[i]),
                                    range(w, min(w + width, 16)))
                    tokens += sum(o["meta_info"]["completion_tokens"] for o in outs)
                    wall += time.perf_counter() - t0
                return tokens / wall, 1000 * (tree_cpu_seconds(server.pid) - cpu0) / tokens

            results = rounds(names, args.rounds, unit)
    report(" in waves", *results)


def rounds(names: list[str], n: int, measure_one) -> tuple[dict, dict]:
    """``measure_one(round, name) -> (tokens/s, CPU ms per token)`` for every name in every round, the
    order rotated per round; both measures by name."""
    tps = {name: [] for name in names}
    cpu = {name: [] for name in names}
    for r in range(n):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t, c = measure_one(r, name)
            tps[name].append(t)
            cpu[name].append(c)
            print(f"round {r} {name}: {t:.1f} tok/s, {c:.2f} server CPU ms/token", flush=True)
    return tps, cpu


def report(where: str, tps: dict, cpu: dict) -> None:
    table(f"tokens/s{where} (wall clock; higher is better)", tps, higher_is_better=True)
    table(f"server CPU ms per token{where} (lower is better)", cpu, higher_is_better=False)


def table(title: str, results: dict[str, list[float]], higher_is_better: bool) -> None:
    """Markdown table: median, spread, runs, and the cost of each variant against the first: the median
    of the per-round ratios, with a 95% bootstrap interval of that median."""
    base = next(iter(results.values()))
    print(f"\n{title}\n\n| variant | median | min-max | runs | overhead vs the first [95% interval] |\n"
          f"|---|---|---|---|---|")
    for name, xs in results.items():
        ratios = [b / x - 1 if higher_is_better else x / b - 1 for b, x in zip(base, xs)]
        low, high = bootstrap_interval(ratios)
        print(f"| {name} | {statistics.median(xs):.2f} | {min(xs):.2f}-{max(xs):.2f} | "
              f"{', '.join(f'{x:.2f}' for x in xs)} | "
              f"{100 * statistics.median(ratios):+.1f}% [{100 * low:+.1f}, {100 * high:+.1f}] |")


def bootstrap_interval(xs: list[float], resamples: int = 4000) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the median of ``xs`` resampled with replacement (seeded)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples)]


if __name__ == "__main__":
    main()
