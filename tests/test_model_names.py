"""The pages name a model by what tells it apart in its path (templating.model_name), never by the
content hash of a cache folder, and cut long names in the middle (templating.middle)."""

from __future__ import annotations

import pytest

from draftscope.web.templating import middle, model_name, run_names


@pytest.mark.parametrize("path, name", [
    ("/work/x/.cache/testbed-models/37dd3ae0c2922bf5/scenarios/37dd3ae0c2922bf5-aux-off-v1", "aux-off-v1"),
    ("/work/x/.cache/testbed-models/37dd3ae0c2922bf5/draft", "testbed-models/draft"),
    ("testbed-models/37dd3ae0c2922bf5/target", "testbed-models/target"),
    ("/tmp/gpu-testbed-work/kimi-models/kimi-aux-off", "kimi-aux-off"),
    ("/tmp/gpu-testbed-work/kimi-models/target/", "kimi-models/target"),
    ("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
    ("/root/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B/snapshots/0123456789abcdef01234567",
     "meta-llama/Llama-3.1-8B"),
    ("draft", "draft"),
    (None, ""),
])
def test_a_model_is_named_by_its_own_folder_without_the_cache_hash(path, name):
    assert model_name(path) == name


def test_a_long_name_is_cut_in_its_middle_keeping_both_ends():
    text = "eagle3-llama-3.1-70b-instruct-sharegpt-ultrachat-v2"
    cut = middle(text, 30)
    assert len(cut) == 30 and cut.startswith(text[:14]) and cut.endswith(text[-15:]) and "…" in cut
    assert middle("short", 30) == "short"


def test_runs_of_one_draft_are_told_apart_by_algorithm_and_tree():
    runs = [{"id": "a", "draft_path": "./draft", "algorithm": "EAGLE3"},
            {"id": "b", "draft_path": "./draft", "algorithm": "EAGLE"},
            {"id": "c", "draft_path": "./draft", "algorithm": "EAGLE3"},
            {"id": "d", "draft_path": "/m/scenarios/aux-off-v1", "algorithm": "EAGLE3"}]
    facts = {"a": {"spec_topk": 1}, "b": {"spec_topk": 1}, "c": {"spec_topk": 4},
             "d": {"spec_topk": 4}}  # a name no other run has keeps no brackets
    names = run_names(runs, lambda ids: {i: facts[i] for i in ids})
    assert names == {"a": "draft", "b": "draft (EAGLE)", "c": "draft (tree, top-4)", "d": "aux-off-v1"}
