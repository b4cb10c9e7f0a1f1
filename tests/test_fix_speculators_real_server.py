"""speculators' and EAGLE's formats on the real CPU servers (SGLang 0.5.23 and vLLM 0.32): the test bed's
trained draft relabelled in each format's own convention (``tests/spec_fixtures/relabel.py``).

Where an engine feeds the trained layers its run carries no warning or error and accepts as the healthy
SpecForge draft does on SGLang (``healthy_demo``); where it does not, doctor and the run page name the exact
mismatch and the ids that fix it, ``doctor --fix`` writes them, and the fixed copy served again accepts as
the healthy draft does. Greedy decoding: a draft fed exactly its trained layers proposes the same tokens,
so the accept lengths agree well within the 5% allowed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from draftscope.cli.app import app as cli
from draftscope.store import db
from draftscope.store.analyze import refresh_run
from testbed.models import ensure_models
from testbed.server import ServerStartError, start_server
from testbed.texts import DEMO_NEW_TOKENS, DEMO_PROMPTS
from testbed.vllm_server import start_vllm_server
from tests.fixtures.sglang_server import IDLE_SLEEP
from tests.fixtures.wait import ended, until
from tests.spec_fixtures import relabel
from tests.test_fix_real_server import accept_length
from tests.test_vllm_server import read

pytestmark = [pytest.mark.sglang, pytest.mark.vllm, pytest.mark.scenario("healthy")]



def doctor(draft: Path, target: Path, engine: str, fix: Path | None = None) -> dict:
    out = CliRunner().invoke(cli, ["doctor", str(draft), "--target", str(target), "--engine", engine, "--json"]
                             + (["--fix", str(fix)] if fix else []))
    assert out.exit_code in (0, 1), out.output
    return json.loads(out.output)


def serious(findings) -> list[tuple[str, str]]:
    return [(f["rule_id"], f["severity"]) if isinstance(f, dict) else (f.rule_id, f.severity)
            for f in findings if (f["severity"] if isinstance(f, dict) else f.severity) != "info"]


def _store(root: Path, name: str) -> tuple[str, dict]:
    path = root / f"{name}.db"
    url = f"sqlite:///{path}"
    db.upgrade(url)
    return url, {"DRAFTSCOPE_DB": str(path), "DRAFTSCOPE_SAMPLE_RATE": "1"}


def _diagnosis(url: str) -> tuple[float | None, list]:
    """(the run's accept length over its requests: output tokens per verify step, the dashboard's
    findings of the run: static and runtime)."""
    [(run_id, out, steps)] = read(url, "SELECT r.id, sum(q.output_len), sum(q.spec_verify_ct) FROM runs r "
                                       "LEFT JOIN requests q ON q.run_id = r.id GROUP BY r.id")
    engine = db.make_engine(url)
    try:
        return (out / steps if steps else None), refresh_run(engine, run_id)
    finally:
        engine.dispose()


def served_vllm(draft: Path, target: Path, root: Path, name: str) -> tuple[float, list]:
    """The demo prompts on a traced vLLM server, the run ended: (accept length, the run's findings)."""
    url, env = _store(root, name)
    with start_vllm_server(target, draft, root / f"{name}.log", env=env) as server:
        for prompt in DEMO_PROMPTS:
            server.complete(prompt, DEMO_NEW_TOKENS)
    ended(url)
    until(lambda: read(url, "SELECT count(*) FROM requests WHERE spec_verify_ct IS NOT NULL AND "
                            "traced_verify_ct IS NOT NULL")[0][0] == len(DEMO_PROMPTS),
          f"every request's record complete in {url}")
    return _diagnosis(url)


def served_sglang(draft: Path, target: Path, root: Path, name: str, prompts=DEMO_PROMPTS) -> tuple[float | None, list]:
    """The demo prompts on a traced SGLang server, stopped so the run ends (a server that dies at a
    request ends its run crashed): (SGLang's accept length or None, the run's findings)."""
    url, env = _store(root, name)
    answers = []
    with start_server(target, draft, IDLE_SLEEP, root / f"{name}.log",
                      env={**env, "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}) as server:
        try:
            answers = [server.generate(p, DEMO_NEW_TOKENS) for p in prompts]
        except (RuntimeError, OSError):  # the scheduler died at the request
            pass
    ended(url)
    return (accept_length(answers) if answers else None), _diagnosis(url)[1]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    models = ensure_models()
    root = tmp_path_factory.mktemp("speculators")
    return models.target, models.draft, root


@pytest.fixture(scope="module")
def healthy(healthy_demo) -> float:
    return accept_length(healthy_demo)


def close(value: float | None, healthy: float) -> bool:
    return value is not None and abs(value - healthy) <= 0.05 * healthy


def test_speculators_layout_serves_on_vllm_and_converts_for_sglang(bed, healthy):
    target, draft, root = bed
    layout = relabel.speculators_layout(draft, root / "layout")
    assert serious(doctor(layout, target, "vllm")["findings"]) == []
    accepted, findings = served_vllm(layout, target, root, "vllm-layout")
    print(f"speculators' layout on vLLM: accept length {accepted:.3f} (healthy on SGLang {healthy:.3f})")
    assert close(accepted, healthy) and serious(findings) == [], (accepted, findings)

    said = doctor(layout, target, "sglang", fix=root / "layout-fixed")
    [finding] = [f for f in said["findings"] if f["severity"] == "error"]
    assert finding["rule_id"] == "draft-arch-unsupported" and "model_type" in finding["message"], finding
    assert "[0, 3, 6]" in finding["fix"] and said["fix"]["after"]["findings"] == [], said
    with pytest.raises(ServerStartError, match="model_type"):  # SGLang's config parser, as doctor said
        start_server(target, layout, [], root / "sglang-layout.log")
    assert serious(doctor(root / "layout-fixed", target, "vllm")["findings"]) == []  # still right for vLLM


def test_speculators_keys_fixed_for_sglang_then_for_vllm(bed, healthy):
    """``LlamaForCausalLMEagle3`` with speculators' keys and ids [1, 4, 7] in eagle_config: vLLM feeds the
    trained layers; SGLang adds one, drops 8 and dies at the first request. Fixed for SGLang ([0, 3, 6],
    the trained layers recorded) it serves there, and is the reverse case on vLLM, whose fix (top-level
    [1, 4, 7], read first by vLLM) leaves a config both engines feed right."""
    target, draft, root = bed
    keys = relabel.speculators_keys(draft, root / "keys")
    assert serious(doctor(keys, target, "vllm")["findings"]) == []
    said = doctor(keys, target, "sglang", fix=root / "for-sglang")
    [short] = [f for f in said["findings"] if f["severity"] == "error"]
    assert short["rule_id"] == "aux-count-short" and "[0, 3, 6]" in short["fix"], short
    assert said["fix"]["not_fixed"] == [] and said["fix"]["after"]["findings"] == [], said["fix"]
    accepted, findings = served_sglang(keys, target, root, "sglang-keys", prompts=DEMO_PROMPTS[:1])
    assert accepted is None, "SGLang served a draft fed two of its three aux states"
    short = [f for f in findings if f.rule_id == "aux-count-short"]  # the run page's: same ids as doctor's
    assert short and all("[0, 3, 6]" in f.fix for f in short), findings

    accepted, findings = served_sglang(root / "for-sglang", target, root, "sglang-fixed")
    print(f"fixed for SGLang: accept length {accepted:.3f} (healthy {healthy:.3f})")
    assert close(accepted, healthy) and serious(findings) == [], (accepted, findings)

    said = doctor(root / "for-sglang", target, "vllm", fix=root / "for-both")
    [differ] = [f for f in said["findings"] if f["severity"] == "error"]
    assert differ["rule_id"] == "captured-layers-differ" and "[1, 4, 7]" in differ["fix"], differ
    accepted, findings = served_vllm(root / "for-sglang", target, root, "vllm-for-sglang")
    print(f"fixed for SGLang, on vLLM: accept length {accepted:.3f}")
    assert not close(accepted, healthy)
    assert [f.rule_id for f in findings if f.severity != "info"] == ["captured-layers-differ"], findings
    assert "eagle_aux_hidden_state_layer_ids [1, 4, 7]" in findings[0].fix, findings  # doctor's ids

    for engine in ("sglang", "vllm"):
        assert serious(doctor(root / "for-both", target, engine)["findings"]) == [], engine
    accepted, findings = served_vllm(root / "for-both", target, root, "vllm-for-both")
    print(f"fixed for both, on vLLM: accept length {accepted:.3f} (healthy {healthy:.3f})")
    assert close(accepted, healthy) and serious(findings) == [], (accepted, findings)


def test_eagle_layout_serves_on_vllm(bed, healthy):
    """EAGLE's ``LlamaForCausalLM`` layout: vLLM builds Eagle3LlamaForCausalLM and feeds the trained
    layers; SGLang would build a full target model from it."""
    target, draft, root = bed
    eagle = relabel.eagle_layout(draft, root / "eagle")
    assert serious(doctor(eagle, target, "vllm")["findings"]) == []
    assert [f["rule_id"] for f in doctor(eagle, target, "sglang")["findings"]][:1] == ["draft-arch-unsupported"]
    accepted, findings = served_vllm(eagle, target, root, "vllm-eagle")
    print(f"EAGLE's layout on vLLM: accept length {accepted:.3f} (healthy on SGLang {healthy:.3f})")
    assert close(accepted, healthy) and serious(findings) == [], (accepted, findings)
