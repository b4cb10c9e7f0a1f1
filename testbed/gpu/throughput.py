"""Tracer overhead in tokens/s on the GPU test bed: real SGLang 0.5.23 servers on CUDA, graphs on.

The runner's throughput phases measure with this module (``bench/gpu_throughput.py`` prints their tables
again from a saved ``results.json``). Three servers started together (``testbed/gpu/bed.py``'s ``Bed``):
**no tracer** (the plugin's folder is not on the server's path), **1 in 16** and **every request** sampled
(file sink). Each round sends the same workload to each server, in a shuffled order, and tokens/s =
completion tokens / wall time.

- ``measure`` (the runner's ``throughput`` phase, tiny models): 32 greedy demo prompts x 64 new tokens,
  8 at a time, fixed request ids; 12 rounds, the first 3 warm-up; the ratio to no tracer per round.
- ``measure_levels`` (the ``kimi-throughput`` phase, the Kimi-K2.5-shaped server in bf16,
  ``testbed/gpu/kimi_phase.py``): at 1, 8 and 64 concurrent requests (``LEVELS``: 16 x 16, 16 x 32 and
  64 x 32 tokens of random token ids; ``WORKLOADS["long"]``: 4 x 96, 16 x 96 and 64 x 48), request ids chosen so that exactly 1 in 16 is sampled; the order
  of the servers shuffled per level and round; rounds until the phase's deadline, the first a warm-up.
  Cost = no tracer's tokens/s over the server's, minus 1, per round: the median with a 95% bootstrap
  interval (``testbed.overhead``), against ``TARGETS``. ``client`` says how a request reaches the engine
  (``SGLANG``; ``testbed/gpu/vllm_throughput.py`` has vLLM's).
"""

from __future__ import annotations

import random
import re
import statistics
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

from testbed.overhead import bootstrap_interval, request_id

WORKLOAD = {"rounds": 12, "warmup_rounds": 3, "requests": 32, "concurrency": 8, "new_tokens": 64}
CONFIGS = {"no-tracer": {}, "1/16": {"DRAFTSCOPE_SAMPLE_RATE": "1/16"}, "every": {"DRAFTSCOPE_SAMPLE_RATE": "1"},
           "unsampled": {"DRAFTSCOPE_SAMPLE_RATE": "0"}, "no-tracer-b": {}}
# the servers a phase starts unless told which. Asked for by name, beside no-tracer: "unsampled" (the tracer
# installed, nothing sampled: what every unsampled request pays; issue 33 item 4) and "no-tracer-b" (a second server
# without the tracer: what the bed reads between two identical servers, the yardstick for "within noise")
SERVERS = ("no-tracer", "1/16", "every")
LABELS = {"no-tracer": "no tracer", "1/16": "1 in 16", "every": "every request", "unsampled": "installed, nothing sampled",
          "no-tracer-b": "no tracer, a second server"}
LEVELS = {"1": (16, 16), "8": (16, 32), "64": (64, 32)}  # concurrent requests -> (requests a round, new tokens)
# The runner's --kimi-workload: "short" (LEVELS) weighs what the tracer does once per request (a sampled prompt's
# summaries and recomputes, its finish record) against 16-32 tokens; "long" against 6x more, as production
# requests do: the two tell a per-request cost from a per-step one. "long-1", "long-8", "long-64": one of long's
# levels alone, about five times the rounds in one device call, to bound a cost that three rounds could not;
# "short-1", "short-8", "short-64" the same for short's.
LONG = {"1": (4, 96), "8": (16, 96), "64": (64, 48)}
WORKLOADS = {"short": LEVELS, "long": LONG, **{f"{name}-{level}": {level: levels[level]}
                                              for name, levels in (("short", LEVELS), ("long", LONG))
                                              for level in levels}}
TARGETS = {"1/16": 0.01, "every": 0.03}  # cost in tokens/s at production widths (issue 19)


def servers(text: str) -> tuple:
    """A runner's ``--throughput-servers`` (``A,B,...``): two or more of ``CONFIGS``, no-tracer (the baseline) among
    them; ValueError naming them otherwise."""
    names = tuple(n for n in text.split(",") if n)
    if set(names) - set(CONFIGS) or "no-tracer" not in names or len(names) < 2:
        raise ValueError(f"--throughput-servers {text!r}: two or more of {list(CONFIGS)}, no-tracer among them "
                         "(the baseline)")
    return names


def measure(handles: dict, prompts: list[str]) -> dict:
    """Interleaved rounds over ``handles`` (name -> ``ServerHandle``), order shuffled per round."""
    cfg = WORKLOAD
    rng = random.Random(0)
    rounds = []
    names = list(handles)
    for r in range(cfg["rounds"]):
        order = names[:]
        rng.shuffle(order)
        row = {name: _one_round(handles[name], prompts, r) for name in order}
        rounds.append(row)
        print(f"[gpu_throughput] round {r}: " + ", ".join(f"{k} {v:.0f} tok/s" for k, v in row.items()), flush=True)
    measured = rounds[cfg["warmup_rounds"]:]
    out = {"workload": cfg, "rounds": rounds, "median_tokens_per_s": {}, "median_ratio_to_no_tracer": {}}
    for name in names:
        out["median_tokens_per_s"][name] = round(statistics.median(r[name] for r in measured), 1)
        if name != "no-tracer" and "no-tracer" in names:
            ratios = sorted(r[name] / r["no-tracer"] for r in measured)
            out["median_ratio_to_no_tracer"][name] = {"median": round(statistics.median(ratios), 4),
                                                      "min": round(ratios[0], 4), "max": round(ratios[-1], 4)}
    return out


def _one_round(handle, prompts: list[str], r: int) -> float:
    """Completion tokens per wall second of one round's requests, ``concurrency`` at a time."""
    cfg = WORKLOAD
    work = [(f"tp-{r}-{j}", prompts[j % len(prompts)]) for j in range(cfg["requests"])]
    return _tokens_per_s(handle, work, cfg["concurrency"], cfg["new_tokens"], _generate)


def _generate(handle, rid: str, prompt, new_tokens: int, **sampling) -> int:
    """One greedy SGLang request (``/generate``): its completion tokens."""
    return handle.generate(prompt, new_tokens, rid=rid, **sampling)["meta_info"]["completion_tokens"]


@dataclass(frozen=True)
class Client:
    """How the rounds reach an engine's servers: ``send(handle, rid, prompt, new_tokens)`` makes one greedy request
    of exactly ``new_tokens`` and returns its completion tokens; ``seen(rid)`` is the id the tracer samples by."""
    send: Callable
    seen: Callable = str


SGLANG = Client(partial(_generate, ignore_eos=True))


def _tokens_per_s(handle, work: list, concurrency: int, new_tokens: int, send: Callable) -> float:
    """Completion tokens per wall second of ``work`` ((request id, prompt) pairs), ``concurrency`` at a time."""
    todo = iter(work)
    tokens, failed, lock = [0], [], threading.Lock()

    def worker():
        while not failed:
            with lock:
                nxt = next(todo, None)
            if nxt is None:
                return
            try:
                done = send(handle, nxt[0], nxt[1], new_tokens)
            except Exception as exc:  # noqa: BLE001 - raised below: a failed request is no measurement
                failed.append(exc)
                return
            with lock:
                tokens[0] += done

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    return tokens[0] / (time.perf_counter() - t0)


def measure_levels(handles: dict, prompt, deadline: float, levels: dict = LEVELS, warmup_rounds: int = 1,
                   client: Client = SGLANG, on_round: Callable | None = None) -> dict:
    """Rounds over ``handles`` (name -> server handle) at each of ``levels`` until ``deadline``
    (``time.monotonic``: no round starts that the longest so far would carry past it). ``prompt(seed)`` gives a
    prompt; request ``j`` of a level is sampled at 1 in 16 exactly when ``j % 16 == 0``. ``on_round(summary)``
    after each round (the summary so far: a run cut short keeps its rounds)."""
    rng, rounds, longest = random.Random(0), [], 0.0
    names = sorted(handles, key=lambda n: list(CONFIGS).index(n) if n in CONFIGS else len(CONFIGS))
    stopped = None
    while time.monotonic() + longest < deadline:
        t0, r, row = time.monotonic(), len(rounds), {}
        try:
            for level, (n, new_tokens) in levels.items():
                work = [(request_id(f"kt{r}-c{level}-{j}", j % 16 == 0, seen=client.seen),
                         prompt(100_000 * r + 1000 * int(level) + j)) for j in range(n)]
                order = names[:]
                rng.shuffle(order)
                row[level] = {name: _tokens_per_s(handles[name], work, int(level), new_tokens, client.send)
                              for name in order}
        except Exception as exc:  # noqa: BLE001 - a server died: the rounds so far are kept, the checks fail on it
            stopped = f"round {r}: {type(exc).__name__}: {exc}"[:500]
            print(f"[gpu_throughput] stopped at {stopped}", flush=True)
            break
        rounds.append(row)
        longest = max(longest, time.monotonic() - t0)
        print(f"[gpu_throughput] round {r} ({time.monotonic() - t0:.0f} s): " + "; ".join(
            f"c{lv} " + ", ".join(f"{k} {v:.1f}" for k, v in row[lv].items()) for lv in row), flush=True)
        if on_round:
            on_round({**summarize_rounds(rounds, levels, warmup_rounds, names), "stopped": None})
    return {**summarize_rounds(rounds, levels, warmup_rounds, names), "stopped": stopped}


ROUND_LINE = re.compile(r"\[gpu_throughput\] round (\d+) \(\d+ s\): (.*)")


def rounds_from_log(text: str) -> list:
    """The rounds ``measure_levels`` printed (``[gpu_throughput] round r (s): c1 name tok/s, ...; c8 ...``), for
    a run whose ``results.json`` lost them."""
    rounds = []
    for m in filter(None, map(ROUND_LINE.match, text.splitlines())):
        rounds.append({part.split(" ", 1)[0][1:]: {kv.rsplit(" ", 1)[0]: float(kv.rsplit(" ", 1)[1])
                                                  for kv in part.split(" ", 1)[1].split(", ")}
                       for part in m.group(2).split("; ")})
    return rounds


def summarize_rounds(rounds: list, levels: dict = LEVELS, warmup_rounds: int = 1, names=None) -> dict:
    """Per level: each configuration's median tokens/s and its cost against no tracer (median of the rounds'
    ratios, 95% bootstrap interval), over the rounds after ``warmup_rounds``."""
    names = names or [n for n in CONFIGS if rounds and all(n in r[lv] for r in rounds for lv in r)]
    measured = rounds[warmup_rounds:]
    out = {"workload": {"levels": levels, "warmup_rounds": warmup_rounds, "targets": TARGETS}, "rounds": rounds,
           "levels": {}}
    for level in levels:
        tps = {name: round(statistics.median(r[level][name] for r in measured), 1) for name in names} \
            if measured else {}
        costs = {}
        for name in names:
            if name != "no-tracer" and "no-tracer" in names and measured:
                each = [r[level]["no-tracer"] / r[level][name] - 1 for r in measured]
                low, high = bootstrap_interval([each])
                costs[name] = {"median": round(statistics.median(each), 4), "low": round(low, 4),
                               "high": round(high, 4), "rounds": [round(x, 4) for x in each]}
        out["levels"][level] = {"median_tokens_per_s": tps, "cost_vs_no_tracer": costs}
    return out


def pool_runs(runs: list[dict]) -> dict:
    """Several saved runs of one levels phase as one table: each run's measured rounds (its warm-up dropped),
    tokens/s the median over all of them, and the cost's interval resampling the runs and then the rounds
    within each (``bootstrap_interval``'s groups), so two leases' hosts that differ widen it, not narrow it."""
    names = [n for n in CONFIGS if all(n in r[lv] for run in runs for r in run["rounds"] for lv in r)]
    levels = [lv for lv in runs[0]["levels"] if all(lv in run["levels"] for run in runs)]
    measured = [run["rounds"][run["workload"]["warmup_rounds"]:] for run in runs]
    out = {"workload": {"levels": levels, "warmup_rounds": 0, "targets": TARGETS, "runs": len(runs)},
           "rounds": [r for rounds in measured for r in rounds], "levels": {}}
    for level in levels:
        tps = {n: round(statistics.median(r[level][n] for r in out["rounds"]), 1) for n in names}
        costs = {}
        for name in (n for n in names if n != "no-tracer" and "no-tracer" in names):
            each = [[r[level]["no-tracer"] / r[level][name] - 1 for r in rounds] for rounds in measured]
            low, high = bootstrap_interval(each)
            costs[name] = {"median": round(statistics.median(x for run in each for x in run), 4),
                           "low": round(low, 4), "high": round(high, 4)}
        out["levels"][level] = {"median_tokens_per_s": tps, "cost_vs_no_tracer": costs}
    return out


def table(result: dict) -> str:
    """The table docs/benchmarks.md shows."""
    lines = ["| | tokens/s, median | ratio to no tracer, median of rounds | min | max |", "|---|---|---|---|---|"]
    for name, tps in result["median_tokens_per_s"].items():
        ratio = result["median_ratio_to_no_tracer"].get(name)
        cells = [f"{ratio[k]:.3f}" for k in ("median", "min", "max")] if ratio else ["", "", ""]
        lines.append(f"| {name} | {tps:,.0f} | " + " | ".join(cells) + " |")
    measured = len(result["rounds"]) - result["workload"]["warmup_rounds"]
    return "\n".join(lines) + f"\n({measured} measured rounds after {result['workload']['warmup_rounds']} warm-up)"


def levels_table(result: dict) -> str:
    """The Kimi-shaped table docs/benchmarks.md shows: tokens/s and cost against no tracer per level."""
    lines = ["| concurrent requests | | tokens/s, median | cost vs no tracer, median [95% interval] | target |",
             "|---|---|---|---|---|"]
    for level, row in result["levels"].items():
        for name, tps in row["median_tokens_per_s"].items():
            cost, target = row["cost_vs_no_tracer"].get(name), TARGETS.get(name)
            cell = f"{100 * cost['median']:+.1f}% [{100 * cost['low']:+.1f}, {100 * cost['high']:+.1f}]" if cost else ""
            lines.append(f"| {level} | {LABELS.get(name, name)} | {tps:,.1f} | {cell} | "
                         f"{f'<= {100 * target:.0f}%' if target and cost else ''} |")
    warm, runs = result["workload"]["warmup_rounds"], result["workload"].get("runs")
    measured = max(0, len(result["rounds"]) - warm)
    return "\n".join(lines) + (f"\n({measured} measured rounds from {runs} runs, each run's warm-up dropped)" if runs
                               else f"\n({measured} measured rounds after {warm} warm-up)")
