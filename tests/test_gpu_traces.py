"""What the dashboard reads from traces recorded on the GPU (``tests/gpu_traces/``, their provenance in its
README): the cross-engine compare of one draft served by SGLang and by vLLM with CUDA graphs on, and the seed's
case (7168-wide features where the draft was trained on 21504) read from vLLM at Kimi-K2.5's widths, on a Llama
target and on DeepSeek-V3's MLA, and the healthy MLA run read as trained."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from draftscope.store import db
from draftscope.store.importer import import_files
from tests.fixtures.store import settle

TRACES = Path(__file__).parent / "gpu_traces"


def _import(store_url: str, tmp_path: Path, *names: str) -> None:
    """The named traces stored through the importer (as ``draftscope import`` stores them)."""
    paths = []
    for name in names:
        paths.append(tmp_path / name.removesuffix(".gz"))
        paths[-1].write_bytes(gzip.decompress((TRACES / name).read_bytes()))
    engine = db.make_engine(store_url)
    try:
        report = import_files(engine, paths)
    finally:
        engine.dispose()
    assert report.stored and not report.errors, report


def _runs(client) -> dict:
    """Engine -> run id of the store's runs."""
    return {r["engine"]: r["id"] for r in client.get("/api/v1/runs").json()}


def test_cross_engine_compare_of_gpu_runs(store_url, make_client, tmp_path):
    _import(store_url, tmp_path, "sglang-ids-0-1-2.jsonl.gz", "vllm-ids-0-1-2.jsonl.gz")
    client = make_client()
    settle(client)
    runs = _runs(client)
    data = client.get("/compare.json", params={"a": runs["sglang"], "b": runs["vllm"]}).json()["engines"]
    a, b = data["a"], data["b"]
    assert (a["engine"], b["engine"]) == ("sglang", "vllm")
    assert a["aux_ids"] == b["aux_ids"] == [0, 1, 2]
    assert a["fed_hf"] == [1, 2, 3] and b["fed_hf"] == [0, 1, 2], (a, b)
    assert a["fc_in_features"] == b["fc_in_features"] == 384
    assert a["per_position"] and b["per_position"]
    assert data["note"]["fed"] == {"A": [1, 2, 3], "B": [0, 1, 2]}, data["note"]
    page = client.get("/compare", params={"a": runs["sglang"], "b": runs["vllm"]})
    assert page.status_code == 200 and 'id="engines-fed"' in page.text and 'id="engines-note"' in page.text


@pytest.mark.parametrize("trace", ["vllm-kimi-width-aux-off.jsonl.gz", "vllm-mla-kimi-aux-off.jsonl.gz"])
def test_seed_case_read_from_vllm_at_kimi_width(store_url, make_client, tmp_path, trace):
    _import(store_url, tmp_path, trace)
    client = make_client()
    settle(client)
    run_id = _runs(client)["vllm"]
    findings = {f["rule_id"]: f for f in client.get(f"/api/v1/runs/{run_id}").json()["findings"]}
    assert "7168 instead of 21504" in findings["fc-bypassed"]["message"], findings
    assert findings["fc-bypassed"]["severity"] == "error"
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200 and "7168 instead of 21504" in page.text


def test_healthy_kimi_shaped_mla_run_on_vllm_reads_as_trained(store_url, make_client, tmp_path):
    _import(store_url, tmp_path, "vllm-mla-kimi-healthy.jsonl.gz")
    client = make_client()
    settle(client)
    run_id = _runs(client)["vllm"]
    run = client.get(f"/api/v1/runs/{run_id}").json()
    facts = run["run"]["facts"]
    assert facts["target"]["aux_layer_ids"] == [20, 40, 60] and facts["draft"]["fc_in_features"] == 21504
    # random weights on both sides: nothing is accepted, and the run says so without blaming the wiring
    findings = {f["rule_id"]: f for f in run["findings"]}
    assert set(findings) == {"acceptance-collapse-quality"}, findings
    assert "every plumbing check passed" in findings["acceptance-collapse-quality"]["message"]
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200 and "instead of 21504" not in page.text
