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


def raw(t: torch.Tensor) -> bytes:
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()


def run(kernel, tmp_path, logits: torch.Tensor, rows: list, chunk: int, launches: int = 1,
        hidden: torch.Tensor | None = None, kc: int = 0, slices: int = 1) -> tuple:
    """The kernel's (probs [slots, K], ids [slots, K], hidden statistics [slots, kc, 5]) for ``rows`` of ``logits``
    (float32 or bf16) and of ``hidden`` (bf16, ``kc`` chunks, each read in ``slices`` blocks)."""
    (tmp_path / "logits.bin").write_bytes(raw(logits))
    (tmp_path / "hidden.bin").write_bytes(raw(hidden) if hidden is not None else b"")
    kind = "bf16" if logits.dtype == torch.bfloat16 else "f32"
    hstride, hwidth = (hidden.stride(0), hidden.shape[1] // kc) if hidden is not None else (0, 0)
    done = subprocess.run([str(kernel), kind, str(tmp_path / "logits.bin"), str(logits.stride(0)), str(logits.shape[1]),
                           str(chunk), str(launches), str(tmp_path / "out.bin"), str(tmp_path / "hidden.bin"),
                           str(hstride), str(hwidth), str(kc), str(slices), *map(str, rows)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr)
    out = (tmp_path / "out.bin").read_bytes()
    n = len(rows) * TOPK
    return (np.frombuffer(out[:n * 4], np.float32).reshape(len(rows), TOPK),
            np.frombuffer(out[n * 4:n * 12], np.int64).reshape(len(rows), TOPK),
            np.frombuffer(out[n * 12:], np.float32).reshape(len(rows), kc, 5))


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
    probs, ids, _ = run(kernel, tmp_path, lg, rows, chunk, launches=2)  # the second launch after the tickets reset
    assert_best(lg, rows, probs, ids)
    assert ids[rows.index(1)].tolist() == list(range(8)) and ids[rows.index(0)].tolist() == list(range(107, 99, -1))


def test_nan_is_left_out_and_bf16_logits_are_read_as_they_are(kernel, tmp_path):
    g = torch.Generator().manual_seed(7)
    lg = torch.randn(3, 3000, generator=g) * 4
    lg[1, 5::11] = float("nan")
    probs, ids, _ = run(kernel, tmp_path, lg, [1], 1024)
    without = lg.clone()
    without[without.isnan()] = float("-inf")
    assert_best(lg, [1], probs, ids, expected=without)
    bf = lg.to(torch.bfloat16)
    bf[1] = without[1].to(torch.bfloat16)
    probs, ids, _ = run(kernel, tmp_path, bf, [2, 1, 0], 1024)  # bf16's coarse values tie often: ids by the lower first
    assert_best(bf, [2, 1, 0], probs, ids)


def test_a_wrong_merge_is_caught(kernel, tmp_path):
    """The check can fail: the kernel's answer for one row read as another's differs from the reference."""
    lg = torch.randn(2, 3000, generator=torch.Generator().manual_seed(3))
    probs, ids, _ = run(kernel, tmp_path, lg, [0], 1024)
    with pytest.raises(AssertionError):
        assert_best(lg, [1], probs, ids)


@pytest.mark.parametrize("slices", [1, 3])
def test_the_hidden_chunks_statistics_in_the_same_launch(kernel, tmp_path, slices):
    """Each bf16 hidden chunk's sum, NaN count, non-finite count, sum of squares and absmax (NaN left out), its
    slices merged by the row's last block, beside the logits' top-k of the same launch."""
    g = torch.Generator().manual_seed(slices)
    kc, width = 3, 1024
    hidden = (torch.randn(4, kc * width, generator=g) * 30).to(torch.bfloat16)
    hidden[2, 5] = float("nan")
    hidden[2, width + 9] = float("inf")
    hidden[2, 2 * width + 1] = -70000.0  # absmax
    lg = torch.randn(4, 3000, generator=g) * 4
    rows = [2, -1, 0]
    probs, ids, stats = run(kernel, tmp_path, lg, rows, 1024, launches=2, hidden=hidden, kc=kc, slices=slices)
    assert_best(lg, rows, probs, ids)
    for y, row in enumerate(rows):
        if row < 0:
            assert (stats[y] == -2.0).all(), "an unused slot's statistics were written"
            continue
        for c in range(kc):
            x = hidden[row, c * width:(c + 1) * width].double()
            want = [x.sum().item(), x.isnan().sum().item(), (~x.isfinite()).sum().item(), (x * x).sum().item(),
                    x[~x.isnan()].abs().max().item()]
            got = stats[y, c].tolist()
            assert got[1:3] == want[1:3], (row, c, got, want)
            for a, b in ((got[0], want[0]), (got[3], want[3]), (got[4], want[4])):
                assert (np.isnan(a) and np.isnan(b)) or a == pytest.approx(b, rel=1e-4, abs=1e-2), (row, c, got, want)
