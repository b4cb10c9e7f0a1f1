"""`draftscope stats` on the real tiny target, and the `aux-norm-drift` rule on real layer norms."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import typer
from typer.testing import CliRunner

from draftscope.cli.stats import stats
from draftscope.findings import Observation, runtime_findings
from draftscope.spec import read_draft
from draftscope.spec.feature_stats import STATS_FILE, config_hash
from testbed.models import ensure_models

app = typer.Typer()
app.command()(stats)
# Served traffic: different text from the statistics' built-in prompts.
RUNTIME_PROMPTS = ["A cat sat on the mat and watched the rain fall on the window.",
                   "Numbers like 1, 2, 3 and 42 appear in text; so do questions? Yes!",
                   "In the beginning the server started, and every request came back with tokens."]


def run(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


@pytest.fixture(scope="module")
def models():
    return ensure_models()


@pytest.fixture(scope="module")
def draft_with_stats(models, tmp_path_factory):
    """A copy of the tiny draft with statistics written by `draftscope stats` (default --out)."""
    draft = tmp_path_factory.mktemp("stats") / "draft"
    shutil.copytree(models.draft, draft)
    result = run(models.target, "--draft", draft, "--max-tokens", 16)
    assert result.exit_code == 0, result.output
    return draft


def runtime_norms(target_dir, layers: list[int], new_tokens: int = 16) -> dict[int, float]:
    """What the tracer's target.aux[i] l2_mean averages to when SGLang captures the output of
    decoder layers ``layers`` while serving other prompts (prefill and greedy continuation rows):
    row L2 norms, mean per request, mean over requests."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, use_safetensors=True).eval()
    outputs: dict[int, torch.Tensor] = {}
    hooks = [model.model.layers[j].register_forward_hook(
        lambda _m, _i, out, i=i: outputs.__setitem__(i, out[0] if isinstance(out, tuple) else out))
        for i, j in enumerate(layers)]
    per_request = []
    with torch.no_grad():
        for text in RUNTIME_PROMPTS:
            ids = tok(text, return_tensors="pt").input_ids
            if new_tokens:
                ids = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=new_tokens, pad_token_id=tok.pad_token_id)
            model(input_ids=ids)
            per_request.append([outputs[i][0].norm(dim=-1).mean().item() for i in range(len(layers))])
    for h in hooks:
        h.remove()
    return {i: sum(r[i] for r in per_request) / len(per_request) for i in range(len(layers))}


def test_stats_file_describes_the_trained_layers(models, draft_with_stats):
    data = json.loads((draft_with_stats / STATS_FILE).read_text())
    assert [c["layer"] for c in data["aux"]] == [0, 3, 6]  # the draft's eagle_config ids, output-of
    assert data["target"]["config_hash"] == config_hash(models.target)
    assert data["target"]["num_layers"] == 8 and data["target"]["dtype"] == "float32"
    assert data["draft"]["aux_layers_physical"] == [0, 3, 6]
    for chunk in data["aux"]:
        assert chunk["count"] == data["tokens"] > 12 * 8
        assert 0 < chunk["q01"] <= chunk["q50"] <= chunk["q99"] and chunk["std"] > 0
    # residual norms grow with depth: what makes a layer off by one visible
    means = [c["mean"] for c in data["layers"]]
    assert means[0] < means[3] < means[6]
    # the spec reader picks the file up
    assert read_draft(draft_with_stats, target_layers=8).feature_stats["aux"] == data["aux"]


def test_same_layers_are_silent(models, draft_with_stats):
    spec = read_draft(draft_with_stats, target_layers=8)
    assert drift_of(spec, runtime_norms(models.target, [0, 3, 6])) == []
    assert drift_of(spec, runtime_norms(models.target, [0, 3, 6], new_tokens=0)) == []  # prefill only


def drift_of(spec, norms):
    return [f for f in runtime_findings(spec, Observation(aux_l2_mean=norms))
            if f.rule_id == "aux-norm-drift"]


@pytest.mark.parametrize("captured, named, word", [
    ([1, 4, 7], {0: 1, 1: 4}, "deeper"),  # ids read input-to instead of output-of: all one deeper
    ([0, 2, 6], {1: 2}, "shallower"),
])
def test_layers_off_by_one_fire_and_name_the_layer(models, draft_with_stats, captured, named, word):
    spec = read_draft(draft_with_stats, target_layers=8)
    drift = drift_of(spec, runtime_norms(models.target, captured))
    found = {f.evidence["aux_index"]: f.evidence["best_matching_layer"] for f in drift}
    # adjacent deep layers differ by ~8% in the tiny target, within traffic spread: aux[2]'s
    # shift 6 -> 7 may go unnamed, but it must never be attributed to another layer
    assert named.items() <= found.items() and found.items() <= {**named, 2: 7}.items()
    assert all(f.severity == "error" and "off by one" in f.message and word in f.message
               for f in drift if f.evidence["aux_index"] in named)
    i, layer = next(iter(named.items()))
    first = next(f for f in drift if f.evidence["aux_index"] == i)
    assert f"target.aux[{i}]" in first.message and f"matches the output of layer {layer}" in first.message
    spec.feature_stats = None  # no statistics: silent
    assert drift_of(spec, runtime_norms(models.target, captured)) == []


def test_norms_no_layer_explains_warn_of_a_changed_target(models, draft_with_stats):
    spec = read_draft(draft_with_stats, target_layers=8)
    norms = runtime_norms(models.target, [0, 3, 6])
    drift = drift_of(spec, {i: v * 10 for i, v in norms.items()})  # e.g. a rescaled or rotated target
    assert drift and all(f.severity == "warning" and "quantised or rotated" in f.message
                         for f in drift)


@pytest.mark.parametrize("case, expected", [
    ("no-draft", "is not a directory"),
    ("pickle-target", "has no *.safetensors weights"),
    ("empty-prompts", "holds no prompts"),
    ("bad-json-prompts", "is not valid JSON"),
])
def test_bad_input_exits_2_with_the_message(models, tmp_path, case, expected):
    target, draft, extra = models.target, models.draft, []
    if case == "no-draft":
        draft = tmp_path / "missing"
    elif case == "pickle-target":
        target = tmp_path / "t"
        target.mkdir()
        shutil.copy(models.target / "config.json", target)
        (target / "pytorch_model.bin").write_bytes(b"not loaded")
    elif case == "empty-prompts":
        (tmp_path / "p.txt").write_text("\n  \n")
        extra = ["--prompts", tmp_path / "p.txt"]
    else:
        (tmp_path / "p.json").write_text("[\"a\",")
        extra = ["--prompts", tmp_path / "p.json"]
    result = run(target, "--draft", draft, "--out", tmp_path / "s.json", *extra)
    assert result.exit_code == 2
    assert result.output.startswith("error: cannot compute feature statistics:")
    assert expected in result.output
    assert not (tmp_path / "s.json").exists()


def test_corrupt_stats_file_names_it(models, tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(models.draft, draft)
    (draft / STATS_FILE).write_text('{"format": "something else"}')
    result = run(models.target, "--draft", draft)
    assert result.exit_code == 2
    assert STATS_FILE in result.output and "draftscope stats" in result.output
