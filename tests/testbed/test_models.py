"""The tiny test-bed models: deterministic builds, and checkpoints laid out as SGLang 0.5.23 loads them."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from testbed import models, train_draft
from testbed.eagle3_draft import DraftShape, Eagle3Draft

SMALL = models.BuildSpec(
    draft=dataclasses.replace(models.DraftSpec(), train_steps=3, corpus_prompts=16, corpus_new_tokens=8)
)


def _tree_bytes(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_inputs_build_the_same_bytes(tmp_path):
    first = models.ensure_models(tmp_path / "a", spec=SMALL)
    second = models.ensure_models(tmp_path / "b", spec=SMALL)
    assert first.target.parent.name == second.target.parent.name == models.build_hash(SMALL)
    a, b = _tree_bytes(first.target.parent), _tree_bytes(second.target.parent)
    a.pop("build.json"), b.pop("build.json")  # holds timings
    assert a.keys() == b.keys() and "draft/model.safetensors" in a
    assert a == b


def test_cache_is_reused_and_keyed_by_inputs(tmp_path):
    paths = models.ensure_models(tmp_path, spec=SMALL)
    marker = paths.draft / "model.safetensors"
    stamp = marker.stat().st_mtime_ns
    assert models.ensure_models(tmp_path, spec=SMALL) == paths
    assert marker.stat().st_mtime_ns == stamp
    other = dataclasses.replace(SMALL, seed=SMALL.seed + 1)
    assert models.build_hash(other) != models.build_hash(SMALL)


def test_cache_root_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSCOPE_MODEL_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path
    assert models.cache_root(tmp_path / "x") == tmp_path / "x"


@pytest.fixture(scope="module")
def built():
    return models.ensure_models()


def test_target_is_an_8_layer_llama_with_a_1024_token_tokenizer(built):
    from transformers import AutoTokenizer

    config = json.loads((built.target / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (128, 8, 1024)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]) == (4, 2, 256)
    tok = AutoTokenizer.from_pretrained(built.target)
    assert len(tok) == 1024
    assert tok.decode(tok.encode("Once upon a time")) == "Once upon a time"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)


def test_draft_checkpoint_has_sglangs_eagle3_layout(built):
    config = json.loads((built.draft / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1 and config["draft_vocab_size"] == 256
    assert config["target_hidden_size"] == 128
    ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert config["eagle_config"]["use_aux_hidden_state"] is True
    # SGLang captures layer id+1 and drops an id equal to num_layers-1: ids must lie in 0..6.
    assert len(set(ids)) == 3 and max(ids) <= 8 - 2
    t = load_file(built.draft / "model.safetensors")
    assert t["fc.weight"].shape == (128, 3 * 128)
    for proj, rows in (("q", 128), ("k", 64), ("v", 64)):
        assert t[f"midlayer.self_attn.{proj}_proj.weight"].shape == (rows, 2 * 128)
    assert t["norm.weight"].shape == (128,) and t["lm_head.weight"].shape == (256, 128)
    assert "midlayer.hidden_norm.weight" in t and "midlayer.input_layernorm.weight" in t
    d2t, t2d = t["d2t"], t["t2d"]
    assert d2t.dtype == torch.int64 and d2t.shape == (256,)
    assert t2d.dtype == torch.bool and t2d.shape == (1024,) and int(t2d.sum()) == 256
    hot = d2t + torch.arange(256)  # what SGLang computes as hot_token_id
    assert bool((hot < 1024).all()) and bool(t2d[hot].all()) and len(set(hot.tolist())) == 256
    assert all(torch.isfinite(v.float()).all() for v in t.values())


def test_ttt_unroll_equals_chained_inference_steps():
    """Training sees, for every row at once, what SGLang's draft extend + decode steps compute one by one."""
    torch.manual_seed(0)
    shape = DraftShape()
    draft = Eagle3Draft(shape, torch.randn(1024, 128) * 0.1)
    ids = torch.randint(0, 1024, (2, 12))
    aux = torch.randn(2, 12, 3 * 128)
    unrolled = draft.forward_ttt(ids, aux, steps=3)
    n = 7  # rows 0..n-1 are extended; then two decode steps fed the draft's own hidden state
    logits, hidden, past = draft.forward_causal(ids[:, 1 : n + 1], aux[:, :n], torch.arange(n).expand(2, n))
    torch.testing.assert_close(logits[:, -1], unrolled[0][:, n - 1])
    h = hidden[:, -1:]
    for k in (1, 2):
        tok = ids[:, n + k : n + k + 1]
        logits, h, past = draft.forward_causal(tok, h, torch.full((2, 1), n - 1 + k), past)
        torch.testing.assert_close(logits[:, -1], unrolled[k][:, n - 1])


def test_fc_is_skipped_exactly_when_sglang_skips_it():
    draft = Eagle3Draft(DraftShape(), torch.zeros(1024, 128))
    wide, narrow = torch.randn(1, 384), torch.randn(1, 128)
    assert draft.project(wide).shape == (1, 128)
    assert draft.project(narrow) is narrow


def test_checkpoint_round_trip():
    torch.manual_seed(1)
    a, b = Eagle3Draft(DraftShape(), torch.zeros(1024, 128)), Eagle3Draft(DraftShape(), torch.zeros(1024, 128))
    b.load_sglang(a.state_dict_sglang())
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    with pytest.raises(KeyError, match="fc.weight"):
        b.load_sglang({})


def test_labels_are_the_targets_argmax_shifted_per_step():
    greedy = torch.tensor([[5, 6, 7, 8]])
    to_draft = torch.full((10,), -100)
    to_draft[torch.tensor([6, 7, 8])] = torch.tensor([0, 1, 2])
    step0, step1 = train_draft.ttt_labels(greedy, to_draft, 2)
    assert step0.tolist() == [[0, 1, 2, -100]]
    assert step1.tolist() == [[1, 2, -100, -100]]
