"""bench/topk_softmax.cu, the CUDA C++ top-k prototype of issue 33 item 1, run on a CPU: its source compiled by g++
against ``cuda_threads.h`` (one OS thread per CUDA thread; barriers for ``__syncthreads``, ``__syncwarp`` and the
warp shuffles), so that the merge logic is checked here before the device times it (``bench/gpu_topk_nvrtc.py``,
which checks it again on the GPU). The reference is the bench's own: float64, ties by the lower id."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch

from bench.gpu_topk_nvrtc import TOPK, reference
from testbed.server import REPO_ROOT

HERE = REPO_ROOT / "tests" / "bench"
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (C++20) to build the kernel for a CPU")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    exe = tmp_path_factory.mktemp("topk") / "topk_softmax_cpu"
    subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-o", str(exe), str(HERE / "topk_softmax_cpu.cpp")],
                   check=True, capture_output=True, timeout=300)
    return exe


def run(kernel, tmp_path, logits: torch.Tensor, rows: list, chunk: int, launches: int = 1) -> tuple:
    """The kernel's (probs [slots, K], ids [slots, K]) for ``rows`` of ``logits`` (float32 or bf16)."""
    raw = logits.view(torch.int16).numpy() if logits.dtype == torch.bfloat16 else logits.numpy()
    (tmp_path / "logits.bin").write_bytes(raw.tobytes())
    kind = "bf16" if logits.dtype == torch.bfloat16 else "f32"
    done = subprocess.run([str(kernel), kind, str(tmp_path / "logits.bin"), str(logits.stride(0)), str(logits.shape[1]),
                           str(chunk), str(launches), str(tmp_path / "out.bin"), *map(str, rows)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr)
    out = (tmp_path / "out.bin").read_bytes()
    n = len(rows) * TOPK
    return (np.frombuffer(out[:n * 4], np.float32).reshape(len(rows), TOPK),
            np.frombuffer(out[n * 4:], np.int64).reshape(len(rows), TOPK))


def assert_best(logits: torch.Tensor, rows: list, probs, ids, expected: torch.Tensor | None = None) -> None:
    for y, row in enumerate(rows):
        if row < 0:
            assert (ids[y] == -2).all() and (probs[y] == -2.0).all(), f"unused slot {y} was written"
            continue
        want_ids, want_p = reference((logits if expected is None else expected).float(), row)
        assert ids[y].tolist() == want_ids, (y, row)
        np.testing.assert_allclose(probs[y], want_p, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("vocab, chunk", [(5000, 1024), (4104, 2048), (1024, 4096)])
def test_the_best_k_of_each_used_row_best_first_ties_by_id(kernel, tmp_path, vocab, chunk):
    g = torch.Generator().manual_seed(vocab)
    lg = torch.randn(6, vocab, generator=g) * 4
    lg[0, 100:108] = 50.0 + torch.arange(8.0)  # every winner in one chunk
    lg[1, :] = 1.0  # one value everywhere: ids 0..7
    lg[2, ::97] = 9.0  # ties spread over the chunks
    lg[3, : vocab // 2] = float("-inf")
    lg[5, -3:] = 70.0  # winners in the last, short chunk
    rows = [0, 1, -1, 2, 3, 5]
    probs, ids = run(kernel, tmp_path, lg, rows, chunk, launches=2)  # the second launch after the tickets reset
    assert_best(lg, rows, probs, ids)
    assert ids[rows.index(1)].tolist() == list(range(8)) and ids[rows.index(0)].tolist() == list(range(107, 99, -1))


def test_nan_is_left_out_and_bf16_logits_are_read_as_they_are(kernel, tmp_path):
    g = torch.Generator().manual_seed(7)
    lg = torch.randn(3, 3000, generator=g) * 4
    lg[1, 5::11] = float("nan")
    probs, ids = run(kernel, tmp_path, lg, [1], 1024)
    without = lg.clone()
    without[without.isnan()] = float("-inf")
    assert_best(lg, [1], probs, ids, expected=without)
    bf = lg.to(torch.bfloat16)
    bf[1] = without[1].to(torch.bfloat16)
    probs, ids = run(kernel, tmp_path, bf, [2, 1, 0], 1024)  # bf16's coarse values tie often: ids by the lower first
    assert_best(bf, [2, 1, 0], probs, ids)


def test_a_wrong_merge_is_caught(kernel, tmp_path):
    """The check can fail: the kernel's answer for one row read as another's differs from the reference."""
    lg = torch.randn(2, 3000, generator=torch.Generator().manual_seed(3))
    probs, ids = run(kernel, tmp_path, lg, [0], 1024)
    with pytest.raises(AssertionError):
        assert_best(lg, [1], probs, ids)
