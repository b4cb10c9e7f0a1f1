"""The vLLM hooks' whole per-step path on CUDA never waits for the GPU (issue 35: as on SGLang).

``testbed.gpu.vllm_hooks_path.VllmStepPath`` runs engine steps through the vLLM plugin's own AROUND hooks with a
real ``VLLMTracer`` attached as on CUDA (batch 64, every request sampled, Llama-8B widths: hidden 4096, 3 aux
layers, 128,256-token vocabulary, 3 drafts) under ``DRAFTSCOPE_SYNC_DEBUG`` (every hook body in
``torch.cuda.set_sync_debug_mode("error")``) with half a second of GPU work queued ahead. Runs in the vLLM GPU
kit's ``hooks`` phase (``testbed/gpu/vllm_serve.py``).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: runs on the H200 through testbed/gpu (docs/testbed.md)")]

WIDTHS = dict(hidden=4096, aux=3, vocab=128_256, k=3, dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def cycles_per_ms():
    from testbed.gpu.hooks_path import gpu_sleep_cycles_per_ms

    return gpu_sleep_cycles_per_ms()


def test_vllm_hooks_never_synchronise_with_gpu_work_queued_ahead(cycles_per_ms):
    from testbed.gpu.vllm_hooks_path import VllmStepPath

    path = VllmStepPath(64, sample_every=1, sync_debug=True, **WIDTHS)
    for _ in range(4):  # warm-up (Triton compiles, ring and pinned slots), under sync-debug too
        path.step()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(cycles_per_ms * 500))  # half a second of GPU work ahead of the hooks
    for _ in range(12):
        path.step()
    gpu_busy = not torch.cuda.current_stream().query()
    in_flight = len(path.tracer.steps.cuda.verify_steps.ledger)  # steps whose ids the hooks could not read yet (none waited)
    report = path.close()
    assert report["errors"] == {} and report["relay_error"] is None, report
    assert report["drops"] == {}, report
    assert gpu_busy, "the GPU finished its queued work before the hooks did: something on the path waited for it"
    assert in_flight >= 12, in_flight
    verify = [s for probe, recs in path.relay.records() if probe == "verify" for s in recs["steps"]]
    assert len(verify) == 64 * 16, len(verify)  # every step of every request recorded once its ids were read


def test_the_sync_debug_switch_catches_a_read_of_the_samplers_output(cycles_per_ms):
    """The negative control: a hook body that reads the sampler's ids as the CPU branch does (``tolist``) fails its
    probe under the switch."""
    from testbed.gpu.vllm_hooks_path import VllmStepPath

    path = VllmStepPath(8, sample_every=1, sync_debug=True, **WIDTHS)
    torch.cuda._sleep(int(cycles_per_ms * 50))
    sampled = torch.zeros(8, 4, dtype=torch.int32, device="cuda")
    path.tracer.guard("verify", sampled.tolist)
    report = path.close()
    assert report["errors"] == {"verify": 1}, report
    assert "synchroniz" in report["last_error"]["verify"], report


def test_shared_draft_launches_are_read_or_freed_never_lost(cycles_per_ms):
    """Steps where some requests verify no drafts (vLLM trims them at a request's length limit): a draft top-k
    launch the batch's requests share is freed only once no record will read it (on the H100 at 64 concurrent
    requests, freed early, about 1% of the verify records could not be built). No error, no drop, and at the
    end only the last step's draft launch still held (one for every draft position, for verifies that never
    come): none leaked."""
    from testbed.gpu.vllm_hooks_path import VllmStepPath

    path = VllmStepPath(64, sample_every=1, sync_debug=True, **WIDTHS)
    k = WIDTHS["k"]
    for i in range(48):
        path.step(num_drafts=[0 if (j + i) % 5 == 0 else k for j in range(64)] if i % 2 else None)
    report = path.close()
    assert report["errors"] == {} and report["relay_error"] is None, report
    assert report["drops"] == {}, report
    busy = sum(sum(s._ring._busy) for s in path.tracer.steps.cuda.summaries.summaries._by_shape.values())
    assert busy <= 1, busy
