"""The vLLM plugin without vLLM: dormant without a sink, never raising where it cannot attach; and the
verify records it builds from vLLM's step (tests/test_vllm_server.py runs it on the real server)."""

from __future__ import annotations

import logging
import os
import pickle

import torch

from draftscope_tracer.device.host_reduce import host_rows
from draftscope_tracer.engine.vllm import plugin as vllm_plugin
from draftscope_tracer.transport.vllm_records import VerifyStep, verify

SINKS = ("DRAFTSCOPE_URL", "DRAFTSCOPE_DB", "DRAFTSCOPE_FILE", "DRAFTSCOPE_DISABLE", vllm_plugin.RUN_ID_ENV)


def _fresh(monkeypatch):
    for name in SINKS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(vllm_plugin, "_CONFIG", None)


def test_dormant_without_a_sink(monkeypatch):
    _fresh(monkeypatch)
    vllm_plugin.register()
    assert vllm_plugin._CONFIG is None and not vllm_plugin.PLUGIN.handles
    assert vllm_plugin.RUN_ID_ENV not in os.environ


def test_never_raises_where_it_cannot_attach(monkeypatch, tmp_path, caplog):
    """A sink set in an environment without vLLM (this venv): one log line, no exception."""
    _fresh(monkeypatch)
    monkeypatch.setenv("DRAFTSCOPE_FILE", str(tmp_path / "trace.jsonl"))
    with caplog.at_level(logging.ERROR, logger="draftscope.tracer"):
        vllm_plugin.register()
    assert "tracer not attached" in caplog.text and not vllm_plugin.PLUGIN.handles
    assert os.environ[vllm_plugin.RUN_ID_ENV]  # the run id its children would share


def test_verify_records_pair_the_drafts_with_both_top_ks():
    """Two drafts accepted of three: flags, bonus, the target's top-k before each drafted token, the draft's
    top-k that proposed it, the aux chunks' widths; after a pickle, as the recorder gets them."""
    H, V = 4, 6
    aux = torch.arange(4 * 3 * H, dtype=torch.float32).reshape(4, 3 * H)  # the verify's 4 rows, 3 chunks
    target_logits = torch.full((4, V), -5.0)
    for row, token in enumerate([5, 0, 3, 4]):  # the target's greedy token at each row
        target_logits[row, token] = 5.0
    draft = [torch.full((1, V), -5.0) for _ in range(3)]
    for pos, token in enumerate([5, 0, 2]):  # what the draft proposed
        draft[pos][0, token] = 5.0
    target = host_rows(aux, range(4), chunk_width=H, logits=target_logits, topk=2)
    drafts = torch.stack([torch.zeros(3, V), torch.cat(draft)], 1).reshape(6, V)  # position by position: 2 picks
    copies = host_rows(drafts, range(6), chunk_width=V, logits=drafts, topk=2, stats=False)
    step = VerifyStep("r1", 7, 40, [5, 0, 2], [5, 0, 3], [0, 1, 2, 3], (copies, [1, 3, 5]))
    out = verify(*pickle.loads(pickle.dumps(([step], target, 1.0, H, 3, "float32"))))
    [rec] = out["steps"]
    assert (rec["accept_len"], rec["accept_flags"], rec["bonus_token"]) == (3, [True, True, False], 3)
    assert [k[0][0] for k in rec["target_topk"]] == [5, 0, 3]
    assert [k[0][0] for k in rec["draft_topk"]] == [5, 0, 2]
    assert [(s["point"], s["width"], s["rows"]) for s in out["samples"]] == \
        [(f"target.aux[{c}]", H, 4) for c in range(3)]


class LlamaForCausalLM(torch.nn.Module):
    """A target as the facts read it: its decoder stack holds the aux layers vLLM captures."""

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.aux_hidden_state_layers = (2, 4, 6)
        self.lm_head = torch.nn.Linear(8, 16, bias=False)


class CUDAGraphWrapper:
    """What vLLM 0.32 puts in ``runner.model`` with CUDA graphs on (``vllm.compilation.cuda_graph``): not a
    module; attributes reach the wrapped model, ``unwrap()`` returns it, as ``GPUModelRunner.get_model`` does."""

    def __init__(self, runnable):
        self.runnable = runnable

    def __getattr__(self, key):
        return getattr(self.runnable, key)

    def unwrap(self):
        return self.runnable


def test_target_facts_name_the_model_inside_vllms_cuda_graph_wrapper():
    from types import SimpleNamespace

    from draftscope_tracer.engine.vllm.facts import target_facts

    wrapped = CUDAGraphWrapper(LlamaForCausalLM())
    config = SimpleNamespace(model="/models/target", hf_config=SimpleNamespace(num_hidden_layers=8, hidden_size=8,
                                                                               vocab_size=16))
    runner = SimpleNamespace(model=wrapped, get_model=wrapped.unwrap, model_config=config,
                             use_aux_hidden_state_outputs=True)
    facts = target_facts(runner)
    assert facts["architecture"] == "LlamaForCausalLM"  # not the wrapper's class (recorded so until 2026-12-06)
    assert facts["layers_to_capture"] == [2, 4, 6] and facts["capture_aux_hidden_states"] is True
