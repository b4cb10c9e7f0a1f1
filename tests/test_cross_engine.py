"""The cross-engine diff: one draft (the test bed's, its config naming aux ids ``[0, 1, 2]``: the
``ids-0-1-2`` scenario) served by the real SGLang server and by the real vLLM server, each traced, both
runs imported (as bundles, paths kept) into one dashboard store, and compared: the compare page says
which target layers each engine fed the draft as Hugging Face ``hidden_states[i]`` indices (SGLang id i
-> hidden_states[i+1], vLLM id i -> hidden_states[i]), with a note naming the config change for each
engine.
"""

from __future__ import annotations

import io

import pytest

from draftscope.bundle.export import export_bundle
from draftscope.bundle.loader import store_bundle
from draftscope.bundle.reader import read_bundle
from draftscope.store import db
from draftscope.store.ingest import BatchWriter
from testbed.texts import DEMO_NEW_TOKENS, DEMO_PROMPTS
from tests.fixtures.store import settle
from tests.test_scenario_findings import wait_for_run
from tests.test_vllm_server import the_run

pytestmark = [pytest.mark.sglang, pytest.mark.vllm]

SCENARIO = "ids-0-1-2"
IDS = [0, 1, 2]  # its eagle_config ids


def _import(source_url: str, run_id: str, store_url: str) -> dict:
    """Export the run as a bundle (paths kept) and store it in the dashboard's store; the manifest."""
    source, store = db.make_engine(source_url), db.make_engine(store_url)
    try:
        out = io.BytesIO()
        manifest = export_bundle(source, run_id, out, keep_paths=True)
        store_bundle(BatchWriter(store), read_bundle(io.BytesIO(out.getvalue())), f"{run_id}.zip")
        return manifest
    finally:
        source.dispose()
        store.dispose()


def test_one_draft_on_both_engines(sglang_server, vllm_runs, store_url, make_client):
    vllm_id = the_run(vllm_runs(SCENARIO).store_url)[0]
    server = sglang_server(SCENARIO)
    before = wait_for_run(server.trace_db_url, 0, False, run_counts=(0, 1))[1]
    for prompt in DEMO_PROMPTS[:2]:
        server.generate(prompt, DEMO_NEW_TOKENS)
    sglang_id = wait_for_run(server.trace_db_url, before + 2, False)[0]
    manifests = [_import(server.trace_db_url, sglang_id, store_url),
                 _import(vllm_runs(SCENARIO).store_url, vllm_id, store_url)]
    assert [(m["engine"], m["versions"][m["engine"]][:4]) for m in manifests] == [("sglang", "0.5."), ("vllm", "0.32")]

    client = make_client()
    settle(client)
    data = client.get("/compare.json", params={"a": sglang_id, "b": vllm_id}).json()["engines"]
    a, b = data["a"], data["b"]
    assert (a["engine"], b["engine"]) == ("sglang", "vllm")
    assert a["aux_ids"] == b["aux_ids"] == IDS
    assert a["fed_hf"] == [i + 1 for i in IDS] and b["fed_hf"] == IDS, (a, b)
    assert a["fc_in_features"] == b["fc_in_features"] == 3 * 128
    assert a["per_position"] and b["per_position"]
    note = data["note"]
    assert note and note["fed"] == {"A": [1, 2, 3], "B": [0, 1, 2]}, note
    assert "SGLang" in note["message"] and "hidden_states[1, 2, 3]" in note["message"], note
    assert "vLLM" in note["message"] and "hidden_states[0, 1, 2]" in note["message"], note
    trained = {tuple(t["hidden_states"]): t["fixes"] for t in note["trained"]}
    # trained on what SGLang fed: vLLM needs every id one higher; trained on what vLLM fed: SGLang one lower
    assert "[1, 2, 3]" in trained[(1, 2, 3)]["vllm"] and "no change" in trained[(1, 2, 3)]["sglang"], trained
    assert "no change" in trained[(0, 1, 2)]["vllm"], trained

    # the vLLM run's own diagnosis says the ids read one layer lower there than under SpecForge's convention
    found = {rid: {f["rule_id"]: f for f in client.get(f"/api/v1/runs/{rid}").json()["findings"]}
             for rid in (sglang_id, vllm_id)}
    ambiguous = found[vllm_id].get("aux-convention-ambiguous")
    assert ambiguous and "hidden_states[0, 1, 2]" in ambiguous["message"], found[vllm_id]
    assert "aux-convention-ambiguous" not in found[sglang_id], found[sglang_id]

    page = client.get("/compare", params={"a": sglang_id, "b": vllm_id})
    assert page.status_code == 200 and 'id="engines-fed"' in page.text and 'id="engines-note"' in page.text
    assert "1, 2, 3" in page.text and "0, 1, 2" in page.text
