"""The hooks' whole per-iteration path on CUDA never waits for the GPU (issue 14: no host sync).

``testbed.gpu.hooks_path.HooksPath`` runs the real ``Tracer`` methods of a sampled decode iteration at
Kimi-K2.5 widths, batch 64, one request in 16 sampled, under ``DRAFTSCOPE_SYNC_DEBUG`` (every hook body
in ``torch.cuda.set_sync_debug_mode("error")``) with about half a second of GPU work queued ahead.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: runs on the H200 through testbed/gpu (docs/testbed.md)")]


@pytest.fixture(scope="module")
def cycles_per_ms():
    from testbed.gpu.hooks_path import gpu_sleep_cycles_per_ms

    return gpu_sleep_cycles_per_ms()


def test_hooks_path_never_synchronises_with_gpu_work_queued_ahead(cycles_per_ms):
    from testbed.gpu.hooks_path import HooksPath

    path = HooksPath(64, sample_every=16, sync_debug=True)
    for _ in range(9):  # warm-up (Triton compiles, ring and pinned blocks), under sync-debug too
        path.iteration()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(cycles_per_ms * 500))  # half a second of GPU work ahead of the hooks
    for _ in range(16):  # steps 9..24 of each sampled request: periodic (every 8th) steps included
        path.iteration()
    gpu_busy = not torch.cuda.current_stream().query()
    report = path.close()
    assert report["errors"] == {} and report["relay_error"] is None, report
    assert report["relay_calls"] >= 16 * 3, report  # verify, draft extend, draft seeds: each iteration
    assert gpu_busy, "the GPU finished its queued work before the hooks did: something on the path waited for it"


def test_the_sync_debug_switch_catches_a_sync(cycles_per_ms):
    """The negative control: a hook body that reads a device value fails its probe under the switch."""
    from testbed.gpu.hooks_path import HooksPath

    path = HooksPath(8, sample_every=1, sync_debug=True)
    torch.cuda._sleep(int(cycles_per_ms * 50))
    path.tracer.guard("verify", lambda: path.result.accept_lens.sum().item())
    report = path.close()
    assert report["errors"] == {"verify": 1}, report
    assert "synchroniz" in report["last_error"]["verify"], report
