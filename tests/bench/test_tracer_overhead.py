"""The overhead bench's baseline server really runs without the tracer: SGLang's own plugin loader,
given the bench's ``SGLANG_PLUGINS``, skips draftscope (and loads it without)."""

import importlib.util
import os
import subprocess
import sys

import pytest

from testbed.server import REPO_ROOT

spec = importlib.util.spec_from_file_location("tracer_overhead", REPO_ROOT / "bench" / "tracer_overhead.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

LOADED = ("from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group; "
          "print(sorted(load_plugins_by_group(GENERAL_PLUGINS_GROUP)))")


def loaded_plugins(env: dict) -> str:
    return subprocess.run([sys.executable, "-c", LOADED], env={**os.environ, **env}, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_sglang_skips_our_plugin_only_in_the_baseline_server():
    assert "'draftscope'" in loaded_plugins({"SGLANG_PLUGINS": ""})
    assert "'draftscope'" not in loaded_plugins({"SGLANG_PLUGINS": bench.plugins_except_ours(sys.executable)})


def test_bootstrap_interval_resamples_blocks():
    # two blocks whose rounds agree within each block: the interval spans both blocks' levels
    low, high = bench.bootstrap_interval([[0.01] * 10, [0.05] * 10])
    assert low == 0.01 and high == 0.05
    assert bench.bootstrap_interval([[0.02, 0.03, 0.04]]) == (0.02, 0.04)


def test_pairs_of_blocks_resampled_together_cancel_what_each_block_carries():
    # four blocks whose start order adds +3% or -3% (alternating), the rounds around it within 0.2%: resampling
    # single blocks spans the two levels; pairs of blocks (one of each order) stay around 0
    blocks = [[sign * 0.03 + d for d in (-0.002, -0.001, 0.0, 0.001, 0.002)] for sign in (-1, 1, -1, 1)]
    pairs = bench.order_pairs({b: None for b in range(4)})
    assert pairs == [[0, 1], [2, 3]]
    low, high = bench.bootstrap_interval(blocks)
    assert low < -0.02 and high > 0.02
    low, high = bench.bootstrap_interval(blocks, clusters=pairs)
    assert -0.03 < low <= 0 <= high < 0.03 and high - low < 0.04
    assert bench.order_pairs({0: None, 2: None, 3: None, 4: None}) == [[0], [1, 2], [3]]


def test_the_layout_runs_a_no_tracer_unit_on_both_sides_of_every_traced_unit():
    units = bench.layout(3)
    assert len(units) == 3 * 6 + 1 and units[::2] == ["no tracer"] * 10
    traced = units[1::2]
    assert [sorted(traced[i:i + 3]) for i in (0, 3, 6)] == [sorted(bench.TRACED)] * 3
    assert len({tuple(traced[i:i + 3]) for i in (0, 3, 6)}) == 3  # the order rotates per round
    servers = [bench.VARIANTS[name][0] for name in units]
    assert all(a != b for a, b in zip(servers, servers[1:]))  # every unit follows a switch of server


def _unit(cpu: float, tokens: float = 100.0) -> "bench.Unit":
    return bench.Unit(tokens, cpu, {"scheduler": cpu})


def test_each_traced_unit_is_compared_with_the_no_tracer_units_on_both_sides():
    names = bench.layout(1)
    cpu = {"no tracer": None, "tracer, nothing sampled": 2.2, "1 in 16": 3.3, "every request": 5.5}
    around = iter([1.0, 3.0, 2.0, 4.0])  # the four no-tracer units: drifting up
    measured = [(n, _unit(next(around) if n == "no tracer" else cpu[n])) for n in names]
    (rnd,) = bench.paired_rounds(measured)
    assert {n: (p.unit.cpu_ms_per_token, p.base.cpu_ms_per_token) for n, p in rnd.items()} == {
        "tracer, nothing sampled": (2.2, 2.0), "1 in 16": (3.3, 2.5), "every request": (5.5, 3.0)}
    rounds = {0: [rnd]}
    assert [round(x, 9) for x in bench.overheads(rounds, "1 in 16", "no tracer", "cpu_ms_per_token")[0]] == [0.32]
    assert [round(x, 9) for x in bench.overheads(rounds, "1 in 16", "tracer, nothing sampled",
                                                  "cpu_ms_per_token")[0]] == [0.5]


def test_an_interrupted_run_reports_only_rounds_whose_traced_units_have_both_neighbours():
    names = bench.layout(2)
    measured = [(n, _unit(1.0)) for n in names]
    assert len(bench.paired_rounds(measured)) == 2
    assert len(bench.paired_rounds(measured[:12])) == 1  # the second round's last unit lacks the N after it
    assert bench.completed_rounds({0: measured[:7], 1: measured[:6]}) == {0: bench.paired_rounds(measured[:7])}


BURN = """
import sys, threading
def burn():
    x = 0
    for i in range(3_000_000):
        x += i
t = threading.Thread(target=burn)
t.start(); t.join()
burn()
sys.stdout.write("done\\n"); sys.stdout.flush()
sys.stdin.read()
"""


def test_process_cpu_clock_counts_every_thread_of_that_process_exited_ones_too():
    child = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "done\n"  # its thread has exited; the process now waits on stdin
        stat = open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()
        ticks = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        ours = bench.process_cpu_seconds(child.pid)
        assert ticks > 0.05 and abs(ours - ticks) <= 0.03, (ours, ticks)
    finally:
        child.stdin.close()
        child.wait()


def test_cpu_cost_is_the_variants_cpu_over_the_baselines_and_tokens_the_baselines_over_the_variants():
    paired = lambda x, base: {"x": bench.Paired(x, base)}  # noqa: E731
    rounds = {0: [paired(bench.Unit(80.0, 2.5, {}), bench.Unit(100.0, 2.0, {}))],
              1: [paired(bench.Unit(50.0, 3.0, {}), bench.Unit(50.0, 4.0, {}))]}
    assert bench.overheads(rounds, "x", "no tracer", "cpu_ms_per_token") == [[0.25], [-0.25]]
    assert bench.overheads(rounds, "x", "no tracer", "tokens_per_s") == [[0.25], [0.0]]


def test_raise_priority_sets_the_autogroup_of_every_session_in_the_tree():
    if not os.path.exists(f"/proc/{os.getpid()}/autogroup"):
        pytest.skip("this kernel keeps no autogroups (CONFIG_SCHED_AUTOGROUP off)")
    # a parent in a session of its own, with a child in another session (as a server and its recorder)
    code = ("import subprocess, sys; c = subprocess.Popen(['sleep', '60'], start_new_session=True); "
            "print(c.pid, flush=True); sys.stdin.read(); c.kill()")
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        child = int(parent.stdout.readline())
        bench.raise_priority(parent.pid, 7)
        for pid in (parent.pid, child):
            assert bench.autogroup_nice(pid) == 7, pid
        assert bench.autogroup_nice(os.getpid()) != 7  # ours untouched (None in the root group, as on CI)
    finally:
        parent.stdin.close()
        parent.wait()
