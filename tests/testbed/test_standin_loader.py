"""Both stand-in folders' ``sitecustomize`` patch through the one loader, ``testbed/standin_loader.py``,
with only their folder and the checkout on ``PYTHONPATH`` (as the CPU and GPU servers have them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_with(folder: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(folder), str(REPO)])
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": path, **env},
                          cwd=folder, capture_output=True, text=True, timeout=120)


def test_a_named_module_is_patched_right_after_its_import(tmp_path) -> None:
    (tmp_path / "sitecustomize.py").write_text(
        "from testbed.standin_loader import patch_after_import\n"
        "patch_after_import({'colorsys': lambda m: setattr(m, 'PATCHED', m.ONE_THIRD)})\n")
    result = run_with(tmp_path, "import colorsys, json; print(colorsys.PATCHED, hasattr(json, 'PATCHED'))")
    assert result.stdout.split() == [str(1.0 / 3.0), "False"], result.stderr


def test_each_bed_installs_its_patches_through_the_loader() -> None:
    """The GPU bed's patches themselves run on the device (``tests/gpu``); here: both folders' hooks are the
    loader's, holding their patches."""
    code = "import sys; f = sys.meta_path[0]; print(type(f).__module__, *sorted(f.patches))"
    cpu = run_with(REPO / "testbed" / "cpu_standins", code, DRAFTSCOPE_TESTBED_GRAPHS="emulate")
    assert cpu.stdout.split() == ["testbed.standin_loader", "sglang.srt.runtime_context",
                                  "sglang.srt.speculative.eagle_worker_v2"], cpu.stderr
    gpu = run_with(REPO / "testbed" / "gpu" / "cuda_standins", code, SGLANG_GPU_TESTBED_NO_JIT="1")
    assert gpu.stdout.split() == ["testbed.standin_loader", "sglang.kernels.jit.utils.compile",
                                  "sglang.kernels.ops.speculative.spec_tree", "sglang.kernels.ops.speculative.tree",
                                  "sglang.srt.layers.dual_gemm", "sglang.srt.mem_cache.memory_pool"], gpu.stderr
