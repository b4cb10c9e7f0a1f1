"""bench/bench_kit.sh's refusals, here where there is no GPU: an unknown command, and a device command before the kit
is built (its build needs PyPI and its device commands a GPU: the device runs them, docs/benchmarks.md)."""

import os
import subprocess

from testbed.server import REPO_ROOT

SCRIPT = REPO_ROOT / "bench" / "bench_kit.sh"


def run(*args: str, kit) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "BENCH_KIT": str(kit)})


def test_an_unknown_command_is_named_with_the_ones_there_are(tmp_path):
    done = run("profile", kit=tmp_path)
    assert done.returncode == 2
    assert "unknown command profile: build, tests, ab, stages or hooks" in done.stderr


def test_a_device_command_without_a_kit_says_to_build_it_first(tmp_path):
    for command in ("tests", "ab", "stages", "hooks"):
        done = run(command, kit=tmp_path / "kit")
        assert done.returncode == 2, command
        assert f"no {tmp_path / 'kit'}: run 'bash bench/bench_kit.sh build' here first" in done.stderr
        assert not (tmp_path / "kit").exists()


def test_no_command_is_a_usage_error(tmp_path):
    done = run(kit=tmp_path)
    assert done.returncode != 0 and "usage: bash bench/bench_kit.sh build [COMMIT]" in done.stderr
