"""The overhead bench's baseline server really runs without the tracer: SGLang's own plugin loader,
given the bench's ``SGLANG_PLUGINS``, skips draftscope (and loads it without)."""

import importlib.util
import os
import subprocess
import sys

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


def test_an_interrupted_run_reports_only_rounds_that_every_variant_finished():
    results = {0: {"no tracer": [1, 2, 3], "1 in 16": [1, 2]}, 1: {"no tracer": [4], "1 in 16": []}}
    assert bench.completed_rounds(results) == {0: {"no tracer": [1, 2], "1 in 16": [1, 2]}}
