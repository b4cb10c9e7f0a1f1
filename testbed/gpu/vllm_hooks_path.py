"""vLLM engine steps through the tracer's own AROUND hooks, without vLLM: the CUDA branch's whole path.

``VllmStepPath`` runs one engine step of EAGLE-3 spec decoding as vLLM 0.32's Model Runner V1 hands it to the
hooks (``engine/vllm/plugin.py``: the runner's ``propose_draft_token_ids``, inside it the drafter's ``propose``,
the draft's ``combine_hidden_states`` and one ``compute_logits`` per draft position) with a real ``VLLMTracer``
attached as on CUDA (its ``CudaStep`` built and prepared as attach does). vLLM's methods and metadata are
stand-ins holding tensors shaped as vLLM hands them: the target's logits its sampler reads (through the runner's
``_sample`` hook), ``sampled_token_ids [R, k + 1]`` (``-1`` rejected), ``SpecDecodeMetadata.draft_token_ids``,
the scheduler's ``-1`` placeholders for the drafts (async scheduling), ``query_start_loc_cpu``, the runner's
``positions``. Every request is in decode (``k + 1`` rows each).

On CUDA (``tests/gpu/test_vllm_hooks_path.py``) it runs under ``DRAFTSCOPE_SYNC_DEBUG`` with GPU work queued
ahead; on a CPU (``tests/tracer/test_vllm_cuda_step.py``) the same branch runs on CPU tensors, and the records it
queued are read back as the recorder reads them.
"""

from __future__ import annotations

from itertools import accumulate
from types import SimpleNamespace
from typing import List, Optional

import torch

from draftscope_tracer.config import TracerConfig
from draftscope_tracer.engine.vllm import plugin
from draftscope_tracer.engine.vllm.tracer import VLLMTracer
from testbed.gpu.hooks_path import PathRelay

MAX_NUM_TOKENS = 2048  # the runner's positions buffer, as vLLM's (``max_num_batched_tokens``): longer than a step


class _Drafter:
    """vLLM's EAGLE proposer as the hooks see it: ``propose`` runs the draft's ``combine_hidden_states`` and one
    ``compute_logits`` per draft position (through the plugin's hooks, as the patched classes would)."""

    def __init__(self, path: "VllmStepPath"):
        self.path = path

    def propose(self, **kwargs):
        p = self.path
        h = plugin._around_fc(lambda model, x: x @ p.fc, p.draft_model, kwargs["target_hidden_states"])
        rows = h.index_select(0, p.last_rows)
        out = []
        for _ in range(p.k):
            logits = plugin._around_draft_logits(lambda model, x: x @ p.head, p.draft_model, rows)
            out.append(logits.argmax(-1))
            rows = rows + 0.01
        return torch.stack(out, -1)


class VllmStepPath:
    """``batch`` requests in decode, ``k`` drafts each; :meth:`step` runs one engine step through the hooks with
    the sampler's output ``sampled`` (``[batch, k + 1]``, ``-1`` rejected: random accepts when None). ``padded``:
    the drafter's batch as vLLM pads it by default (``token_indices_to_sample`` given; its input the aux hidden states
    joined row for row), else as with ``disable_padded_drafter_batch`` (the verify rows then gathered from each aux
    tensor)."""

    def __init__(self, batch: int, sample_every: int = 1, sync_debug: bool = False, device: str = "cuda",
                 hidden: int = 64, aux: int = 3, vocab: int = 512, k: int = 3, dtype=torch.float32, seed: int = 0,
                 padded: bool = True):
        torch.manual_seed(seed)
        dev = self.device = torch.device(device)
        self.batch, self.k, self.hidden, self.vocab, self.padded = batch, k, hidden, vocab, padded
        self.tracer = t = VLLMTracer(TracerConfig(file="/dev/null", sample_rate=1 / sample_every,
                                                  sync_debug=sync_debug), "0.32.0", "vllm-step-path")
        t.core.attached = True
        self.relay = t.core.transport.writer = PathRelay("vllm-path-relay", keep=True)
        t.steps.hidden = hidden
        facts = {"target": {"hidden_size": hidden, "layers_to_capture": list(range(aux))},
                 "draft": {"hidden_size": hidden}}
        self.runner = SimpleNamespace(
            device=dev, input_batch=SimpleNamespace(req_ids=[f"req-{i}" for i in range(batch)]),
            positions=torch.zeros(max(MAX_NUM_TOKENS, batch * (k + 1)), dtype=torch.int64, device=dev),  # as vLLM's
            model=SimpleNamespace(compute_logits=lambda h: h @ self.target_head),  # the model's dtype, as vLLM's
            model_config=SimpleNamespace(dtype=dtype, get_vocab_size=lambda: vocab),
            speculative_config=SimpleNamespace(num_speculative_tokens=k),
            scheduler_config=SimpleNamespace(max_num_seqs=batch))
        rows = batch * (k + 1)
        self.target_head = torch.randn(hidden, vocab, device=dev, dtype=dtype)
        self.fc = torch.randn(aux * hidden, hidden, device=dev, dtype=dtype) / (aux * hidden) ** 0.5
        self.head = torch.randn(hidden, vocab, device=dev, dtype=dtype)
        self.draft_model = SimpleNamespace()
        self.hidden_states = torch.randn(rows, hidden, device=dev, dtype=dtype)
        self.aux = [torch.randn(rows, hidden, device=dev, dtype=dtype) for _ in range(aux)]
        self.last_rows = torch.arange(k, rows, k + 1, device=dev)
        self.drafter = _Drafter(self)
        # the rows' positions: request i's verified token at 10 + 3 i, then its drafts; each step moves every
        # request on by k + 1 (on the device: no copy from the host on the hooks' way)
        self.first_positions = [10 + 3 * i for i in range(batch)]
        self.runner.positions[:rows].copy_(torch.tensor([p + j for p in self.first_positions for j in range(k + 1)]))
        self.prepared = t.steps.prepare_cuda(self.runner, facts)
        plugin.PLUGIN.tracer = t

    def step(self, sampled: Optional[List[List[int]]] = None, finished=(), drafts: Optional[List[List[int]]] = None,
             num_drafts: Optional[List[int]] = None):
        """One engine step of every request (``finished``: ids the scheduler freed since the last step). ``sampled``
        and ``drafts`` (per request) given: copied to the device here (CPU tests); else drawn on the device.
        ``num_drafts``: the drafts each request verifies (default ``k``; 0: a decode step without drafts, as
        vLLM's scheduler runs a request whose drafts it trimmed at its length limit)."""
        B, k, dev = self.batch, self.k, self.device
        nd = list(num_drafts) if num_drafts is not None else [k] * B
        if sampled is None:
            accept = torch.randint(0, k + 1, (B, 1), device=dev)
            if num_drafts is not None:  # no more accepted than drafted
                accept = torch.minimum(accept, torch.tensor(nd, device=dev).view(B, 1))
            ids = torch.randint(0, self.vocab, (B, k + 1), device=dev, dtype=torch.int32)
            sampled_t = torch.where(torch.arange(k + 1, device=dev) <= accept, ids, torch.full_like(ids, -1))
        else:
            sampled_t = torch.tensor(sampled, dtype=torch.int32, device=dev)
        draft_ids = torch.tensor([t for i, d in enumerate(drafts) for t in d[:nd[i]]], dtype=torch.int32).to(dev) \
            if drafts is not None else torch.randint(0, self.vocab, (sum(nd),), device=dev, dtype=torch.int32)
        req_ids = self.runner.input_batch.req_ids
        qsl = torch.tensor([0] + list(accumulate(1 + d for d in nd)), dtype=torch.int32)  # a CPU tensor, as vLLM's
        so = SimpleNamespace(num_scheduled_tokens={r: 1 + d for r, d in zip(req_ids, nd)},
                             finished_req_ids=set(finished),
                             scheduled_spec_decode_tokens={r: [-1] * d for r, d in zip(req_ids, nd)})
        attn = SimpleNamespace(query_start_loc_cpu=qsl)
        spec = SimpleNamespace(num_draft_tokens=nd, draft_token_ids=draft_ids)
        hidden = torch.cat(self.aux, -1)

        def propose(runner, *args):
            return plugin._around_draft(lambda drafter, **kw: drafter.propose(**kw), self.drafter,
                                        num_speculative_tokens=k, target_token_ids=None, target_positions=None,
                                        target_hidden_states=hidden, next_token_ids=None,
                                        token_indices_to_sample=self.last_rows if self.padded else None,
                                        common_attn_metadata=attn,
                                        sampling_metadata=None)

        def sample_tokens(runner):  # the target's logits (each request's d + 1 rows), sampled, then the drafter
            logits = runner.model.compute_logits(self.hidden_states[:B + sum(nd)])
            plugin._around_target_logits(lambda runner, logits, spec: None, runner, logits, spec)
            plugin._around_verify(propose, runner, so, sampled_t, None, self.hidden_states, None, self.aux, spec,
                                  attn, None)

        plugin._around_step(sample_tokens, self.runner)
        self.runner.positions.add_(k + 1)

    def finish(self, rid: str, accepted: List[int]) -> None:
        """The scheduler frees ``rid`` (same process), having counted one verify step per entry of ``accepted``
        (its accepted drafts), as vLLM's ``make_spec_decoding_stats`` does."""
        for n in accepted:
            self.tracer.requests.count_vllm({"request_id": rid, "num_draft_tokens": self.k, "num_accepted_tokens": n})
        plugin._around_finish(lambda scheduler, request: None, None, SimpleNamespace(
            request_id=rid, num_prompt_tokens=8, prompt_token_ids=list(range(8)), num_output_tokens=len(accepted),
            arrival_time=0.0, get_finished_reason=lambda: "stop"))

    def close(self) -> dict:
        """Read every step still in flight (as the tracer's close does), then let the relay read every call; the
        tracer's errors and drops, the relay's calls."""
        self.tracer._report_open_requests()
        return self.relay.close(self.tracer, plugin)
