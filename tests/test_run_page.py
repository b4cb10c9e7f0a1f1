"""The run page, the request page and their JSON twins, from a batch ingested through the API
(SQLite and PostgreSQL)."""

from __future__ import annotations

import csv
import io
import json
import re
import time
import uuid

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from draftscope.settings import Settings
from draftscope.store import db
from draftscope.web.app import create_app
from tests.fixtures.store import make_batch, run_record, sample_record, settle, step_record

EVIL = "<script>alert(1)</script>"
RID = "req-<b>7</b>"  # markup in a request id: escaped in pages, percent-encoded in links
RID_URL = "req-%3Cb%3E7%3C/b%3E"

FACTS = {
    "sglang_version": "0.5.23", "algorithm": "EAGLE3", "spec_num_steps": 3,
    "spec_num_draft_tokens": 4, "spec_topk": 1, "cuda_graph": False, "tp_size": 1,
    "target": {"path": "/models/tiny-llama", "architecture": "LlamaForCausalLM", "num_layers": 6,
               "hidden_size": 128, "vocab_size": 1000, "eagle3_capture_supported": True,
               "capture_aux_hidden_states": False, "layers_to_capture": None},
    "draft": {"path": "/models/tiny-eagle3", "architecture": "LlamaForCausalLMEagle3",
              "hidden_size": 128, "embed_width": 128, "fc_in_features": 384, "lm_head_rows": 500,
              "config_draft_vocab_size": 500, "lm_head_shared_with_target": False,
              "max_position_embeddings": 2048, "config": {"draft_vocab_size": 500},
              "hot_token_id": {"present": True, "size": 500, "max_id": 998, "min_id": 0,
                               "in_target_vocab": True, "equals_d2t_plus_arange": True},
              "weights": {"checked": 12, "matched": 11, "mismatched": ["fc.weight"],
                          "not_in_checkpoint": [], "checkpoint_keys_unused": [], "nonfinite": []}},
    "tracing": {"device": {"prepared_rows": 64, "layouts": 5, "graphed_recomputes": ["draft logits", "fc"],
                           "reserved_bytes": 1_256_194_048}},
}
FINDINGS = [
    {"rule_id": "draft-low-acceptance", "severity": "info", "message": "accept length 1.2",
     "source": "runtime"},
    {"rule_id": "aux-capture-off", "severity": "error",
     "message": f"draft.input is 128 wide but fc takes 384 {EVIL}",
     "fix": "Start SGLang with --speculative-algorithm EAGLE3 so the target captures aux layers.",
     "evidence": {"draft_input_width": 128, "fc_in_features": 384}, "source": "runtime",
     "rid": RID, "first_step": 0},
    {"rule_id": "hot-token-map", "severity": "warning", "message": "d2t looks shifted",
     "source": "static"},
]


def realistic_batch(run_id: str) -> dict:
    steps = [step_record(RID, 0, seq_pos=40, drafted_tokens=[11, 12, 13], accept_len=2,
                         accept_flags=[True, False, False],
                         draft_topk=[[[11, 0.9], [5, 0.05]], [[12, 0.6]], [[13, 0.4]]],
                         target_topk=[[[11, 0.8]], [[77, 0.7]], [[78, 0.5]]]),
             step_record(RID, 1, seq_pos=42)]
    samples = [sample_record(0, rid=RID, point="draft.input", phase="prefill", width=128,
                             shape=[40, 128]),
               sample_record(1, rid=RID, point="target.aux[0]", phase="verify", width=384,
                             shape=[4, 384], l2_mean=13.25)]
    return make_batch(
        run_id, run=run_record(target_path=f"/models/{EVIL}", facts=FACTS,
                               server_args={"speculative_algorithm": "EAGLE3", "tp_size": 1}),
        requests=[{"rid": RID, "sampled": True, "prompt_len": 40, "output_len": 24,
                   "spec_verify_ct": 12, "spec_accepted_drafts": 10, "spec_proposed_drafts": 36,
                   "traced_verify_ct": 12, "traced_accepted_drafts": 7, "traced_proposed_drafts": 36},
                  {"rid": "req-ok", "prompt_len": 8, "output_len": 4, "spec_verify_ct": 2,
                   "traced_verify_ct": 2}],
        steps=steps, samples=samples, findings=FINDINGS,
        health=[{"at": time.time() - 2, "drops": {"queue_full": 0}, "errors": {}, "heartbeats": {"verify": 1},
                 "disabled_probes": []},
                {"at": time.time() - 1, "drops": {"queue_full": 3}, "errors": {"draft_input": 1},
                 "heartbeats": {"verify": 14}, "disabled_probes": ["draft_logits"]}])


@pytest.fixture
def run_id(client) -> str:
    rid = uuid.uuid4().hex
    response = client.post("/api/v1/batches", json=realistic_batch(rid))
    assert response.status_code == 200, response.text
    settle(client)
    return rid


def section(page: str, name: str) -> str:
    match = re.search(rf'<section class="card" id="{name}">(.*?)</section>', page, re.S)
    assert match, f"no section {name}"
    return match.group(1)


def rows_of(html: str) -> list[str]:
    return re.findall(r"<tr(.*?)</tr>", html, re.S)


def test_runs_list_names_the_root_cause(client, run_id) -> None:
    page = client.get("/").text
    row = re.search(rf'<tr data-run="{run_id}">(.*?)</tr>', page, re.S).group(1)
    assert f'href="/runs/{run_id}"' in row
    assert '<span class="badge error">aux-capture-off</span>' in row and "+2" in row


def test_run_page_reads_top_to_bottom(client, run_id) -> None:
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200
    text = page.text
    order = [text.index(f'id="{s}"') for s in ("diagnosis", "spec-diff", "acceptance", "features",
                                                "requests", "health", "facts")]
    assert order == sorted(order)
    diagnosis = section(text, "diagnosis")
    root, rest = diagnosis.split('<details class="finding', 1)
    assert "aux-capture-off" in root and "--speculative-algorithm EAGLE3" in root
    assert f'href="/runs/{run_id}/requests/{RID_URL}"' in root
    assert rest.index("hot-token-map") < rest.index("draft-low-acceptance")


def test_spec_diff_highlights_only_what_differs(client, run_id) -> None:
    diff = section(client.get(f"/runs/{run_id}").text, "spec-diff")
    rows = {re.search(r'data-key="([^"]+)"', r).group(1): r for r in rows_of(diff) if "data-key" in r}
    assert rows["input_prefill"].startswith(' class="mismatch"')
    assert "384" in rows["input_prefill"] and "128 (1 sample)" in rows["input_prefill"]
    assert rows["capture"].startswith(' class="mismatch"')  # trained with capture, served without
    assert rows["weights"].startswith(' class="mismatch"') and "1 differ" in rows["weights"]
    assert rows["vocab"].startswith(' class="ok"')


def test_run_page_shows_facts_and_latest_health(client, run_id) -> None:
    text = client.get(f"/runs/{run_id}").text
    facts = section(text, "facts")
    for label, value in [("Layers to capture", "not read"), ("fc input width", "384"),
                         ("Capturing aux hidden states", "no"), ("Equals d2t + arange", "yes"),
                         ("Differ from the checkpoint", "fc.weight"), ("Algorithm", "EAGLE3"),
                         ("Recomputes as CUDA graphs", "draft logits, fc"),
                         ("GPU memory reserved at attach", "1,198.0 MiB")]:
        assert re.search(rf"<dt>{re.escape(label)}</dt><dd>{re.escape(value)}</dd>", facts), label
    assert "speculative_algorithm" in facts
    health = section(text, "health")
    assert "queue_full" in health and ">3<" in health and "draft_input" in health
    assert ">14<" in health and "draft_logits" in health  # the latest snapshot, not the first


def test_acceptance_charts_are_plotly_figures(client, run_id) -> None:
    text = client.get(f"/runs/{run_id}").text
    figures = dict(re.findall(r'<script type="application/json" id="fig-([^"]+)">(.*?)</script>', text, re.S))
    per_position = json.loads(figures["per-position"])
    assert per_position["data"][0]["type"] == "bar" and per_position["data"][0]["y"][0] == 1.0
    assert "plotly-basic-4.1.1.min.js" in text
    assert client.get("/static/plotly-basic-4.1.1.min.js").status_code == 200


def test_requests_fragment_filters_sorts_and_pages(client, run_id) -> None:
    def rids(**params) -> list[str]:
        html = client.get(f"/runs/{run_id}/requests", params=params).text
        assert "<html" not in html
        return re.findall(r"<code class=\"trunc\">(.*?)</code>", html)

    assert rids() == ["req-&lt;b&gt;7&lt;/b&gt;", "req-ok"]
    assert rids(status="incomplete") == ["req-&lt;b&gt;7&lt;/b&gt;"]
    assert rids(sort="output_len", desc=1) == ["req-&lt;b&gt;7&lt;/b&gt;", "req-ok"]
    assert rids(sort="output_len") == ["req-ok", "req-&lt;b&gt;7&lt;/b&gt;"]
    assert rids(accept_min=2.5) == []
    assert rids(finding="aux-capture-off") == ["req-&lt;b&gt;7&lt;/b&gt;"]
    assert rids(offset=1) == ["req-ok"]
    bad = client.get(f"/runs/{run_id}/requests", params={"sort": "nope"})
    assert bad.status_code == 400 and "Unknown sort key" in bad.text


def test_request_page_timeline_and_step_detail(client, run_id) -> None:
    url = f"/runs/{run_id}/requests/{RID_URL}"
    page = client.get(url)
    assert page.status_code == 200
    assert 'id="fig-timeline"' in page.text and "incomplete trace" in page.text
    detail = client.get(url + "/steps/0", headers={"HX-Request": "true"}).text
    assert "<html" not in detail and 'id="step-detail"' in detail
    positions = rows_of(detail.split("<tbody>")[1])
    assert positions[0].startswith(' class="accepted"') and 'class="agree"' in positions[0]
    assert positions[1].startswith(' class="first-rejected"') and "agree" not in positions[1]
    assert positions[2].startswith(' class="not-reached"')
    assert "<code>77</code>" in positions[1]
    samples = section(page.text, "samples")
    draft_input = next(r for r in rows_of(samples) if "draft.input" in r)
    assert draft_input.startswith(' class="mismatch"') and "<td>384</td>" in draft_input
    assert client.get(url + "/steps/9").status_code == 404


def test_content_is_escaped(client, run_id) -> None:
    for url in ("/", f"/runs/{run_id}", f"/runs/{run_id}/requests/{RID_URL}",
                f"/runs/{run_id}/requests/{RID_URL}/steps/0", f"/runs/{run_id}/requests",
                f"/compare?a={run_id}&b={run_id}"):
        text = client.get(url).text
        assert EVIL not in text and "<b>7</b>" not in text, url
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in client.get(f"/runs/{run_id}").text


def test_json_and_csv_twins(client, run_id) -> None:
    run = client.get(f"/runs/{run_id}.json").json()
    assert run["run"]["facts"]["draft"]["fc_in_features"] == 384
    assert [f["severity"] for f in run["findings"]] == ["error", "warning", "info"]
    assert {r["key"]: r["state"] for r in run["diff"]}["input_prefill"] == "mismatch"
    assert run["summary"]["acceptance"]["verify_steps"] == 2
    request = client.get(f"/runs/{run_id}/requests/{RID_URL}.json").json()
    assert [s["step_index"] for s in request["steps"]] == [0, 1]
    assert request["expected_widths"]["prefill"] == 384
    for url, first_column, n in (("/runs.csv", "id", None), (f"/runs/{run_id}/requests.csv", "rid", 2),
                                 (f"/runs/{run_id}/findings.csv", "severity", 3),
                                 (f"/runs/{run_id}/spec.csv", "key", None),
                                 (f"/runs/{run_id}/requests/{RID_URL}/steps.csv", "step_index", 2),
                                 (f"/runs/{run_id}/requests/{RID_URL}/samples.csv", "point", 2)):
        response = client.get(url)
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
        table = list(csv.reader(io.StringIO(response.text)))
        assert table[0][0] == first_column, url
        if n is not None:
            assert len(table) == n + 1, url
    assert client.get("/runs.json").json()[0]["id"] == run_id


def test_htmx_refresh_gets_only_the_live_part(client, run_id) -> None:
    fragment = client.get(f"/runs/{run_id}", headers={"HX-Request": "true"}).text
    assert 'id="diagnosis"' in fragment and "<html" not in fragment


def test_compare(client, run_id) -> None:
    other = uuid.uuid4().hex
    assert client.post("/api/v1/batches", json=make_batch(other, run=run_record())).status_code == 200
    settle(client)
    page = client.get("/compare", params=[("run", run_id), ("run", other)])
    assert page.status_code == 200 and 'id="spec-compare"' in page.text
    assert 'id="fig-cmp-per-position"' in page.text
    data = client.get(f"/compare.json?a={run_id}&b={other}").json()
    assert data["a"]["run"]["id"] == run_id and data["b"]["run"]["id"] == other
    assert 'id="engines-fed"' in page.text and 'id="engines-note"' not in page.text
    assert [data["engines"][s]["engine"] for s in "ab"] == ["sglang", "sglang"] and data["engines"]["note"] is None
    one = client.get("/compare", params={"a": run_id})
    assert one.status_code == 400 and "exactly two runs" in one.text


@pytest.mark.parametrize("path, words", [
    ("/runs/nope", ["No run 'nope'", "runs list"]),
    ("/runs/{run_id}/requests/nope", ["has no request 'nope'", "/runs/{run_id}"]),
])
def test_unknown_run_or_request_is_a_clear_404(client, run_id, path, words) -> None:
    path = path.format(run_id=run_id)
    page = client.get(path)
    assert page.status_code == 404 and "Not found" in page.text
    as_json = client.get(f"/api/v1{path}")
    assert as_json.status_code == 404
    for word in words:
        word = word.format(run_id=run_id)
        assert word in page.text.replace("&#39;", "'") and word in as_json.json()["error"]


def test_unknown_path_and_bad_parameters_get_error_pages(client, run_id) -> None:
    missing = client.get("/no/such/page")
    assert missing.status_code == 404 and "Nothing is served at /no/such/page" in missing.text
    bad = client.get(f"/runs/{run_id}/requests", params={"offset": "many"})
    assert bad.status_code == 400 and "offset" in bad.text and "<html" in bad.text


def test_a_broken_store_row_gets_a_500_page_not_a_traceback(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"  # SQLite stores what PostgreSQL's JSON type refuses
    db.upgrade(url)
    with TestClient(create_app(Settings(database_url=url)), base_url="http://127.0.0.1",
                    raise_server_exceptions=False) as client:
        run_id = uuid.uuid4().hex
        assert client.post("/api/v1/batches", json=realistic_batch(run_id)).status_code == 200
        settle(client)
        with client.app.state.engine.begin() as conn:  # a row no draftscope wrote: facts not JSON
            conn.execute(sa.text("UPDATE runs SET facts = '{oops' WHERE id = :id"), {"id": run_id})
        page = client.get(f"/runs/{run_id}")
        assert page.status_code == 500
        assert "Something went wrong" in page.text and "reference" in page.text
        assert "Traceback" not in page.text and "JSONDecodeError" not in page.text
        as_json = client.get(f"/runs/{run_id}.json")
        assert as_json.status_code == 500 and as_json.json()["error"] == "internal error"


# --- a Kimi-K2.5-shaped run with random weights (the GPU bed's healthy run) ------------------------

KIMI_FACTS = {
    "sglang_version": "0.5.23", "algorithm": "EAGLE3", "spec_num_steps": 3, "spec_num_draft_tokens": 4,
    "spec_topk": 1, "cuda_graph": True, "tp_size": 1,
    "target": {"path": "/models/kimi-shaped", "architecture": "DeepseekV3ForCausalLM", "num_layers": 61,
               "hidden_size": 7168, "vocab_size": 163840, "eagle3_capture_supported": True,
               "capture_aux_hidden_states": True, "layers_to_capture": [20, 40, 60]},
    "draft": {"path": "/models/kimi-eagle3", "architecture": "LlamaForCausalLMEagle3", "hidden_size": 7168,
              "embed_width": 7168, "fc_in_features": 21504, "lm_head_rows": 32000,
              "config_draft_vocab_size": 32000, "lm_head_shared_with_target": False,
              "config": {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000,
                         "eagle_config": {"eagle_aux_hidden_state_layer_ids": [20, 40, 60],
                                          "use_aux_hidden_state": True}},
              "hot_token_id": {"present": True, "size": 32000, "max_id": 163000, "min_id": 0,
                               "in_target_vocab": True, "equals_d2t_plus_arange": True},
              "weights": {"checked": 13, "matched": 13, "mismatched": [], "not_in_checkpoint": [],
                          "checkpoint_keys_unused": [], "nonfinite": []}},
}
TOPK = [[[5, 0.5], [6, 0.2]]] * 3


def kimi_batch(run_id: str) -> dict:
    """Zero acceptance (random target weights), 21504 into fc, three steps of req-a and one of req-b
    lacking part of their top-k while the ring and the tap were full."""
    def step(rid, i, **lost):
        return step_record(rid, i, accept_len=1, accept_flags=[False] * 3,
                           **{"draft_topk": TOPK, "target_topk": TOPK, **lost})
    steps = [step("req-a", i) for i in range(8)] + [step("req-b", i) for i in range(8)]
    steps[2] = step("req-a", 2, target_topk=None)
    steps[3] = step("req-a", 3, draft_topk=[[]] + TOPK[1:])
    steps[4] = step("req-a", 4, draft_topk=TOPK[:1])
    steps[9] = step("req-b", 1, target_topk=None)
    samples = [sample_record(i, rid="req-a", point=p, phase=ph, width=w, shape=[1, w])
               for i, (p, ph, w) in enumerate([("draft.input", "prefill", 21504), ("draft.fc.out", "prefill", 7168),
                                              ("target.aux[0]", "verify", 7168), ("target.aux[1]", "verify", 7168),
                                              ("target.aux[2]", "verify", 7168),
                                              ("draft.logits", "draft_extend", 32000)])]
    return make_batch(
        run_id, run=run_record(facts=KIMI_FACTS, server_args={
            "speculative_algorithm": "EAGLE3", "load_format": "dummy",
            "speculative_draft_load_format": "safetensors"}),
        steps=steps, samples=samples,
        health=[{"at": time.time(), "drops": {"summary_ring_full": 108, "draft_tap_full": 3}, "errors": {},
                 "heartbeats": {}, "disabled_probes": []}])


@pytest.fixture
def kimi_run(client) -> str:
    rid = uuid.uuid4().hex
    response = client.post("/api/v1/batches", json=kimi_batch(rid))
    assert response.status_code == 200, response.text
    settle(client)
    return rid


def test_random_weights_run_says_so_and_highlights_nothing(client, kimi_run) -> None:
    text = client.get(f"/runs/{kimi_run}").text
    diagnosis = section(text, "diagnosis")
    assert 'id="random-weights"' in diagnosis and "acceptance means nothing" in diagnosis
    assert "the target (--load-format dummy) was loaded with random values" in diagnosis
    assert "rootcause" not in diagnosis and "No check failed" in diagnosis
    assert "expected with random weights: not one of" in diagnosis  # zero acceptance, stated as expected
    assert "acceptance means nothing here" in section(text, "acceptance")
    diff = section(text, "spec-diff")
    assert 'class="mismatch"' not in diff
    layers = next(r for r in rows_of(diff) if 'data-key="layers"' in r)
    assert layers.startswith(' class="depends"') and "speculators&#39; they match" in layers
    assert ("under SpecForge&#39;s convention these ids mean hidden_states[21, 41, 61] and SGLang&#39;s "
            "DeepSeek path feeds hidden_states[20, 40, 60]: off by one") in layers
    findings = client.get(f"/runs/{kimi_run}.json").json()["findings"]
    assert {f["severity"] for f in findings} == {"info"}
    assert {f["rule_id"] for f in findings} == {"weights-random", "acceptance-zero-finite-logits",
                                                "aux-convention-ambiguous"}


def test_steps_that_lost_their_topk_are_said_plainly(client, kimi_run) -> None:
    health = section(client.get(f"/runs/{kimi_run}").text, "health")
    said = re.sub(r"\s+", " ", re.search(r'<p id="topk-lost">(.*?)</p>', health, re.S).group(1))
    assert "4 verify steps of 2 requests lack top-k" in said
    assert "2 lack the target&#39;s top-k (the summary ring was full" in said and "summary_ring_full</code> 108" in said
    assert "1 lacks the draft&#39;s top-k at position 1" in said
    assert "1 lacks the draft&#39;s top-k at positions 2.. (more than 16 sampled requests" in said
    assert "draft_tap_full</code> 3" in said
    assert "req-a</code></a> (3 steps), " in said and "req-b</code></a> (1 step)" in said
    page = client.get(f"/runs/{kimi_run}/requests/req-a").text
    assert "3 of 8 sampled steps lack top-k" in page
    marked = [r for r in rows_of(section(page, "timeline")) if "lost:" in r]
    assert len(marked) == 3 and "the target&#39;s top-k" in marked[0] and "positions 2.." in marked[2]
    detail = client.get(f"/runs/{kimi_run}/requests/req-a/steps/3", headers={"HX-Request": "true"}).text
    assert 'id="step-topk-lost"' in detail and "position 1 (the summary ring was full" in detail
    assert 'id="step-topk-lost"' not in client.get(f"/runs/{kimi_run}/requests/req-a/steps/0").text
    steps = client.get(f"/runs/{kimi_run}/requests/req-a.json").json()["steps"]
    assert [s["topk_lost"] for s in steps][2:5] == [["target"], ["draft_first"], ["draft_later"]]


def test_the_tracer_on_the_gpu_shows_what_its_engine_recorded() -> None:
    """vLLM's tracer records no recomputes; a run from before the memory figure has none; odd values show as
    they are."""
    from draftscope.web.facts_view import fact_sections

    def device(d):
        return dict(fact_sections({"tracing": {"device": d}})).get("Tracer on the GPU")

    assert device({"prepared_rows": 16, "layouts": 4, "reserved_bytes": 3 * 2**20}) == [
        ("Rows per summary launch", "16"), ("Summary layouts", "4"), ("GPU memory reserved at attach", "3.0 MiB")]
    assert device({"prepared_rows": 64, "layouts": 5, "graphed_recomputes": []}) == [
        ("Rows per summary launch", "64"), ("Summary layouts", "5"), ("Recomputes as CUDA graphs", "none")]
    assert device({"reserved_bytes": 78 * 2**20, "step_tap_reserved_bytes": 2 * 2**20,
                   "process_reserved_bytes": 36_000 * 2**20}) == [
        ("GPU memory reserved at attach", "78.0 MiB"), ("GPU memory reserved for the step tap", "2.0 MiB"),
        ("The server's PyTorch GPU memory after attach", "36,000.0 MiB")]
    assert device({"reserved_bytes": "lots", "layouts": True}) == [
        ("Summary layouts", "yes"), ("GPU memory reserved at attach", "lots")]
    assert device({"reserved_bytes": -3_443_523_584}) == [  # what a tracer before b6fb5cb recorded on the Kimi bed
        ("GPU memory reserved at attach", "not measured (-3,443,523,584 bytes recorded: this tracer version misread it)")]
    assert device(None) is None and device("odd") is None
