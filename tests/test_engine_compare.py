"""``engine_compare`` on runs as the two tracers record them (the facts' shape, not a mock): ids
``[0, 1, 2]`` fed as ``hidden_states[1, 2, 3]`` by SGLang and ``[0, 1, 2]`` by vLLM; the note takes one
reading when the config names its trainer. The real servers: tests/test_cross_engine.py."""

from __future__ import annotations

from draftscope.web import engine_compare

CONFIG = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 128, "target_hidden_size": 128,
          "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}


def _run(engine: str, fed: list[int], config: dict) -> dict:
    target = {"architecture": "LlamaForCausalLM", "num_layers": 8, "hidden_size": 128,
              "capture_aux_hidden_states": True, "layers_to_capture": fed}
    return {"engine": engine, "engine_version": "0.32.0" if engine == "vllm" else "0.5.23",
            "draft_path": "/models/draft", "draft_config_hash": "h",
            "facts": {"target": target, "draft": {"config": config, "fc_in_features": 384}}}


def _block(config: dict) -> dict:
    a, b = _run("sglang", [1, 2, 3], config), _run("vllm", [0, 1, 2], config)
    return engine_compare.block(a, {}, b, {})


def test_speculators_draft_needs_sglang_ids_one_lower() -> None:
    got = _block({**CONFIG, "speculators_version": "0.3.0"})
    assert (got["a"]["fed_hf"], got["b"]["fed_hf"], got["a"]["aux_ids"]) == ([1, 2, 3], [0, 1, 2], [0, 1, 2])
    [trained] = got["note"]["trained"]
    assert trained["hidden_states"] == [0, 1, 2] and "no change" in trained["fixes"]["vllm"]
    assert "eagle_config.eagle_aux_hidden_state_layer_ids [-1, 0, 1]" in trained["fixes"]["sglang"]
    assert "trained on hidden_states[0, 1, 2]" in got["note"]["message"]


def test_no_trainer_gives_both_readings() -> None:
    got = _block(CONFIG)
    assert [t["hidden_states"] for t in got["note"]["trained"]] == [[1, 2, 3], [0, 1, 2]]
    assert "read two ways" in got["note"]["message"]


def test_no_note_for_different_drafts_or_the_same_layers() -> None:
    a, b = _run("sglang", [1, 2, 3], CONFIG), _run("vllm", [0, 1, 2], CONFIG)
    assert engine_compare.block(a, {}, {**b, "draft_config_hash": "other"}, {})["note"] is None
    assert engine_compare.block(a, {}, _run("sglang", [1, 2, 3], CONFIG), {})["note"] is None


def test_only_captured_layers_are_listed_and_the_fix_matches_doctors() -> None:
    """A speculators draft's [1, 4, 7] in eagle_config: SGLang sets layers_to_capture [2, 5, 8] on an
    8-layer target and never reaches 8; vLLM feeds [1, 4, 7]. The page lists the two SGLang fed, and the
    note's SGLang ids are the ones doctor --fix writes ([0, 3, 6])."""
    config = {**CONFIG, "speculators_model_type": "eagle3",
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 4, 7]}}
    a, b = _run("sglang", [2, 5, 8], config), _run("vllm", [1, 4, 7], config)
    got = engine_compare.block(a, {}, b, {})
    assert (got["a"]["fed_hf"], got["b"]["fed_hf"]) == ([2, 5], [1, 4, 7])
    [trained] = got["note"]["trained"]
    assert trained["hidden_states"] == [1, 4, 7] and "no change" in trained["fixes"]["vllm"]
    assert "eagle_config.eagle_aux_hidden_state_layer_ids [0, 3, 6]" in trained["fixes"]["sglang"]
    assert "hidden_states[2, 5]" in got["note"]["message"] and "hidden_states[2, 5, 8]" not in got["note"]["message"]


def test_a_crashed_run_reads_crashed_imported_or_not(tmp_path) -> None:
    """The run's state (runs list, run page, compare page): a crashed run imported from a bundle is
    crashed, an imported one that ended reads imported (real SQLite store, migrated)."""
    import sqlalchemy as sa

    from draftscope.store import db, models, queries

    url = f"sqlite:///{tmp_path / 'store.db'}"
    db.upgrade(url)
    engine = db.make_engine(url)
    try:
        with engine.begin() as conn:
            for rid, source, status in (("a", "bundle", "crashed"), ("b", "bundle", "ended"), ("c", "tracer", "crashed")):
                conn.execute(sa.insert(models.Run.__table__).values(
                    id=rid, engine="vllm", engine_version="0.32.0", source=source, status=status, started_at=1.0))
        with engine.connect() as conn:
            assert {r: queries.get_run(conn, r)["state"] for r in "abc"} == \
                {"a": "crashed", "b": "imported", "c": "crashed"}
    finally:
        engine.dispose()
