"""Each draft misconfiguration behaves on the real SGLang 0.5.23 server (CPU test bed) as documented.

The server is SGLang's own engine; only its CPU kernel build is replaced by pure-PyTorch stand-ins
(`testbed/cpu_standins/`). Acceptance comes from SGLang's own `meta_info` counters. The per-prompt
accept lengths are also recomputed offline with `testbed.eagle3_draft` and must agree exactly: that
checks the reimplemented draft forward against SGLang's `LlamaForCausalLMEagle3`, and shows which
features the server fed the draft (aux layers, the fallback layers, or the final hidden).
"""

from __future__ import annotations

import json
import time

import pytest
import torch

from testbed import models, scenarios, train_draft
from testbed.server import ServerStartError
from testbed.texts import DEMO_NEW_TOKENS, DEMO_PROMPTS

sglang = pytest.mark.sglang

HEALTHY_FLOOR = 1.9  # measured 2.16 (docs/testbed.md)
COLLAPSED_CEILING = 1.25  # aux-off measured 1.17: the draft reads tokens too, so a little survives


def test_unknown_scenario_names_the_known_ones():
    with pytest.raises(KeyError, match="known: healthy, aux-off"):
        scenarios.prepare("no-such-scenario")


def run_demo(server) -> list[dict]:
    """The demo prompts' answers, sent side by side as ``healthy_demo``'s were."""
    return server.generate_many(DEMO_PROMPTS, DEMO_NEW_TOKENS)


def mean_accept(results: list[dict]) -> float:
    tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    return tokens / sum(r["meta_info"]["spec_verify_ct"] for r in results)


def per_prompt(results: list[dict]) -> list[float]:
    return [r["meta_info"]["completion_tokens"] / r["meta_info"]["spec_verify_ct"] for r in results]


@pytest.fixture(scope="session")
def offline():
    """The cached target (HF) and the draft in the pure-PyTorch reimplementation."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, LlamaForCausalLM

    paths = models.ensure_models()
    spec = models.BuildSpec()
    target = LlamaForCausalLM.from_pretrained(paths.target).eval()
    tensors = load_file(paths.draft / "model.safetensors")
    hot = (tensors["d2t"] + torch.arange(tensors["d2t"].numel())).tolist()
    draft = train_draft.init_draft(target, spec, hot)
    draft.load_sglang(tensors)
    tok = AutoTokenizer.from_pretrained(paths.target)

    def simulate(aux_layer_ids) -> list[float]:
        return [
            train_draft.simulated_accept_length(target, draft, hot, aux_layer_ids, tok.encode(p), DEMO_NEW_TOKENS, 3)
            for p in DEMO_PROMPTS
        ]

    return simulate


@pytest.fixture(scope="session")
def target_alone():
    """The cached target in HF transformers, no draft: ``(prompt, n)`` -> its greedy next ``n`` token ids."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    paths = models.ensure_models()
    target = LlamaForCausalLM.from_pretrained(paths.target).eval()
    tok = AutoTokenizer.from_pretrained(paths.target)

    def greedy(prompt: str, n: int) -> list[int]:
        ids = tok.encode(prompt)
        return train_draft.greedy_continue(target, torch.tensor([ids]), n)[0, len(ids):].tolist()

    return greedy


@sglang
@pytest.mark.scenario("healthy")
def test_healthy_draft_is_accepted(healthy_demo):
    assert all(r["meta_info"]["completion_tokens"] == DEMO_NEW_TOKENS for r in healthy_demo)
    assert mean_accept(healthy_demo) >= HEALTHY_FLOOR


@sglang
@pytest.mark.scenario("healthy")
def test_greedy_speculation_equals_the_target_alone(healthy_demo, target_alone):
    """EAGLE-3 is lossless: SGLang's greedy answers with the draft are the target's own greedy tokens,
    computed without speculation by another implementation (HF transformers)."""
    assert [r["output_ids"] for r in healthy_demo] == [target_alone(p, DEMO_NEW_TOKENS) for p in DEMO_PROMPTS]


@sglang
@pytest.mark.scenario("healthy")
def test_server_acceptance_equals_the_reimplemented_draft(healthy_demo, offline):
    ids = json.loads((models.ensure_models().draft / "config.json").read_text())["eagle_config"][
        "eagle_aux_hidden_state_layer_ids"
    ]
    assert per_prompt(healthy_demo) == pytest.approx(offline(ids), abs=1e-6)


@sglang
@pytest.mark.scenario("aux-off")
def test_aux_off_collapses_silently(sglang_server, healthy_demo, offline):
    results = run_demo(sglang_server("aux-off"))
    assert [r["output_ids"] for r in results] == [r["output_ids"] for r in healthy_demo]  # verification hides it
    assert mean_accept(results) <= COLLAPSED_CEILING < mean_accept(healthy_demo)
    # What the server fed the draft is the target's final post-norm hidden, not aux states.
    assert per_prompt(results) == pytest.approx(offline(None), abs=1e-6)


@sglang
@pytest.mark.scenario("algo-eagle")
def test_algo_eagle_collapses_silently(sglang_server, healthy_demo):
    results = run_demo(sglang_server("algo-eagle"))
    assert [r["output_ids"] for r in results] == [r["output_ids"] for r in healthy_demo]
    assert mean_accept(results) <= COLLAPSED_CEILING


@sglang
@pytest.mark.scenario("weights-dropped")
def test_dropped_weights_collapse_silently(sglang_server, healthy_demo):
    results = run_demo(sglang_server("weights-dropped"))
    assert [r["output_ids"] for r in results] == [r["output_ids"] for r in healthy_demo]
    assert mean_accept(results) <= 1.1


@sglang
@pytest.mark.scenario("top-level-ids")
def test_top_level_ids_fall_back_to_sglangs_default_layers(sglang_server, healthy_demo, offline):
    results = run_demo(sglang_server("top-level-ids"))
    assert [r["output_ids"] for r in results] == [r["output_ids"] for r in healthy_demo]
    assert mean_accept(results) < mean_accept(healthy_demo)
    # SGLang's fallback captures layers [2, 4, 5], i.e. explicit ids [1, 3, 4].
    assert per_prompt(results) == pytest.approx(offline([1, 3, 4]), abs=1e-6)


def _wait_dead(server, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return True
        time.sleep(0.5)
    return False


@sglang
@pytest.mark.scenario("last-layer-id")
def test_last_layer_id_fails_at_the_first_request_and_the_server_exits(sglang_server):
    shape_error = "mat1 and mat2 shapes cannot be multiplied"
    try:
        server = sglang_server("last-layer-id")
    except ServerStartError as e:
        # SGLang's /health runs a one-token generation: when the launcher probes it, that is the
        # first request, and the scheduler dies on it before start-up is confirmed.
        assert shape_error in str(e)
        return
    with pytest.raises((RuntimeError, OSError)):
        server.generate(DEMO_PROMPTS[0], DEMO_NEW_TOKENS)
    assert _wait_dead(server)
    assert shape_error in server.log_path.read_text()


@sglang
@pytest.mark.scenario("d2t-absolute")
def test_d2t_absolute_kills_the_server_when_a_high_draft_id_is_drafted(sglang_server):
    server = sglang_server("d2t-absolute")
    with pytest.raises((RuntimeError, OSError)):
        run_demo(server)
    assert _wait_dead(server)
    assert "IndexError" in server.log_path.read_text()
