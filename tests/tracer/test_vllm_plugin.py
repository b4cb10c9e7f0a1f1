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
