"""The run page, the request page and their JSON twins, from a batch ingested through the API
(SQLite and PostgreSQL)."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.fixtures.store import make_batch, run_record, sample_record, step_record

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
        health=[{"at": 1.0, "drops": {"queue_full": 0}, "errors": {}, "heartbeats": {"verify": 1},
                 "disabled_probes": []},
                {"at": 2.0, "drops": {"queue_full": 3}, "errors": {"draft_input": 1},
                 "heartbeats": {"verify": 14}, "disabled_probes": ["draft_logits"]}])


@pytest.fixture
def run_id(client) -> str:
    rid = uuid.uuid4().hex
    response = client.post("/api/v1/batches", json=realistic_batch(rid))
    assert response.status_code == 200, response.text
    return rid


def section(page: str, name: str) -> str:
    match = re.search(rf'<section id="{name}">(.*?)</section>', page, re.S)
    assert match, f"no section {name}"
    return match.group(1)


def test_runs_list_links_to_the_run_page(client, run_id) -> None:
    assert f'href="/runs/{run_id}"' in client.get("/").text


def test_run_page_puts_findings_first_by_severity(client, run_id) -> None:
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200
    text = page.text
    order = [text.index(f'<section id="{s}">') for s in ("findings", "identity", "facts", "health", "requests")]
    assert order == sorted(order)
    findings = section(text, "findings")
    assert [findings.index(r) for r in ("aux-capture-off", "hot-token-map", "draft-low-acceptance")] \
        == sorted(findings.index(r) for r in ("aux-capture-off", "hot-token-map", "draft-low-acceptance"))
    assert "--speculative-algorithm EAGLE3" in findings and "fc_in_features" in findings
    assert f'href="/runs/{run_id}/requests/{RID_URL}"' in findings


def test_run_page_shows_identity_facts_and_latest_health(client, run_id) -> None:
    text = client.get(f"/runs/{run_id}").text
    identity = section(text, "identity")
    assert "sglang 0.5.23" in identity and "/models/EAGLE3-LLaMA3.1-Instruct-8B" in identity
    assert "speculative_algorithm" in identity
    facts = section(text, "facts")
    for label, value in [("Layers to capture", "not read"), ("fc input width", "384"),
                         ("Capturing aux hidden states", "no"), ("Equals d2t + arange", "yes"),
                         ("Differ from the checkpoint", "fc.weight"), ("Algorithm", "EAGLE3")]:
        assert re.search(rf"<dt>{re.escape(label)}</dt><dd>{re.escape(value)}</dd>", facts), label
    health = section(text, "health")
    assert "queue_full" in health and ">3<" in health and "draft_input" in health
    assert ">14<" in health and "draft_logits" in health  # the latest snapshot, not the first


def test_requests_table_highlights_counter_mismatch(client, run_id) -> None:
    requests = section(client.get(f"/runs/{run_id}").text, "requests")
    rows = re.findall(r"<tr(.*?)</tr>", requests, re.S)[1:]
    bad, ok = rows
    assert 'class="mismatch"' in bad and "accepted_drafts" in bad and "10 / 7" in bad
    assert f'href="/runs/{run_id}/requests/{RID_URL}"' in bad
    assert "2 / 2" in bad and "mismatch" not in ok  # mean accept length 24 / 12 = 2 (SGLang), steps 2 / 2


def test_request_page_shows_steps_and_flags_the_draft_input_width(client, run_id) -> None:
    page = client.get(f"/runs/{run_id}/requests/{RID_URL}")
    assert page.status_code == 200
    steps = section(page.text, "steps")
    assert "Step 0 · seq pos 40 · accept length 2" in steps
    first = re.search(r'<table class="step">.*?<tbody>(.*?)</tbody>', steps, re.S).group(1)
    positions = re.findall(r"<tr>(.*?)</tr>", first, re.S)
    assert len(positions) == 3
    assert ">yes<" in positions[0] and ">no<" in positions[1]
    assert "<code>12</code> 0.6" in positions[1] and "<code>77</code> 0.7" in positions[1]
    samples = section(page.text, "samples")
    rows = re.findall(r"<tr(.*?)</tr>", samples, re.S)[1:]
    draft_input, aux = rows
    assert 'class="mismatch"' in draft_input and "≠ 384" in draft_input and "draft.input" in draft_input
    assert "mismatch" not in aux and "13.2" in aux
    assert "differ" in page.text  # SGLang's accepted drafts 10 vs the tracer's 7


def test_content_is_escaped(client, run_id) -> None:
    for url in (f"/runs/{run_id}", f"/runs/{run_id}/requests/{RID_URL}"):
        text = client.get(url).text
        assert EVIL not in text and "<b>7</b>" not in text
        assert "req-&lt;b&gt;7&lt;/b&gt;" in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in client.get(f"/runs/{run_id}").text


def test_json_twins(client, run_id) -> None:
    run = client.get(f"/api/v1/runs/{run_id}").json()
    assert run["run"]["facts"]["draft"]["fc_in_features"] == 384
    assert [f["severity"] for f in run["findings"]] == ["error", "warning", "info"]
    assert run["health"]["drops"] == {"queue_full": 3}
    bad = next(r for r in run["requests"] if r["rid"] == RID)
    assert bad["mismatches"] == ["accepted_drafts"] and bad["spec_accept_length"] == 2.0
    request = client.get(f"/api/v1/runs/{run_id}/requests/{RID_URL}").json()
    assert request["run_id"] == run_id and request["expected_draft_input_width"] == 384
    assert [s["step_index"] for s in request["steps"]] == [0, 1]
    assert request["steps"][0]["accept_flags"] == [True, False, False]
    assert [(s["point"], s["width"], s["width_mismatch"]) for s in request["samples"]] == [
        ("draft.input", 128, True), ("target.aux[0]", 384, False)]


def test_htmx_refresh_gets_only_the_live_part(client, run_id) -> None:
    fragment = client.get(f"/runs/{run_id}", headers={"HX-Request": "true"}).text
    assert '<section id="findings">' in fragment and "<html" not in fragment


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
