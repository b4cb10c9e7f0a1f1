"""What each engine fed the draft, for the compare page: per run the engine, the config's aux ids, the
target layers fed as Hugging Face ``hidden_states[i]`` indices (0 = the embedding output), widths, norms
and per-position acceptance; and a note when the same draft fed different layers on two engines.

SGLang 0.5.23 feeds id ``i`` as ``hidden_states[i+1]`` on Llama-family targets, vLLM 0.32 as
``hidden_states[i]``; each tracer records what its engine captures (``facts.target.layers_to_capture``,
HF indices on both). An index past the last one the engine reaches (SGLang: L-1, the input of the last
layer; vLLM: L, its output) is requested but never captured, so the page lists only the captured ones.
"""

from __future__ import annotations

from typing import Any

from draftscope.spec import engines
from draftscope.spec.convention import OWNER, config_readings
from draftscope.spec.draft import config_ids
from draftscope.spec.expectations import NAMES
from draftscope.spec.target import recorded_target
from draftscope.spec.vllm import last_index


def fed(run: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """One run's column of the block: what its engine fed the draft."""
    facts = run.get("facts") or {}
    target, draft = facts.get("target") or {}, facts.get("draft") or {}
    read = config_ids(draft.get("config") or {}, target.get("num_layers")) if draft.get("config") else None
    widths = summary.get("widths") or {}
    aux = sorted((p for p in widths if p.startswith("target.aux[")), key=lambda p: int(p[11:-1]))
    norms = {p: _mean([b["l2_mean"] for b in bins if b.get("l2_mean") is not None])
             for p, bins in (summary.get("norms") or {}).items() if p.startswith("target.aux[")}
    acceptance = summary.get("acceptance") or {}
    return {
        "engine": run.get("engine") or engines.engine_of(facts),
        "engine_version": run.get("engine_version"),
        "draft": run.get("draft_path"), "draft_config_hash": run.get("draft_config_hash"),
        "aux_ids": read.ids if read else None,
        "fed_hf": captured_hf(target, run.get("engine") or engines.engine_of(facts))
        if target.get("capture_aux_hidden_states", True) else None,
        "fc_in_features": draft.get("fc_in_features"),
        "aux_widths": [sorted({int(w) for ph in widths[p].values() for w in ph}) for p in aux],
        "draft_input_widths": sorted({int(w) for ph in (widths.get("draft.input") or {}).values() for w in ph}),
        "aux_norms": [norms.get(p) for p in aux],
        "per_position": [x["rate"] for x in acceptance.get("per_position") or []],
        "accept_length": acceptance.get("traced_accept_length"),
    }


def captured_hf(target: dict[str, Any], engine: str) -> list[int] | None:
    """The HF ``hidden_states`` indices the engine captured, in layer order: its recorded
    ``layers_to_capture`` less those it never reaches (i >= L on SGLang and vLLM's DeepSeek path,
    i > L on vLLM's Llama path, i < 0)."""
    layers, n = target.get("layers_to_capture"), target.get("num_layers")
    if layers is None or not n:
        return layers
    last = last_index(target.get("architecture"), n) if engine == "vllm" else n - 1
    return [i for i in range(last + 1) if i in layers]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def same_draft(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The two runs served one draft: the same config hash, else the same path."""
    if a.get("draft_config_hash") and b.get("draft_config_hash"):
        return a["draft_config_hash"] == b["draft_config_hash"]
    return bool(a.get("draft")) and a.get("draft") == b.get("draft")


def note(run_a: dict[str, Any], run_b: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """When one draft fed different HF layers on the two runs: which each fed, what it was trained on
    (each reading, when the checkpoint names no trainer) and the config change per engine; else None."""
    if not same_draft(a, b) or a["fed_hf"] is None or b["fed_hf"] is None or a["fed_hf"] == b["fed_hf"]:
        return None
    facts = run_a.get("facts") or {}
    target = recorded_target(facts.get("target") or {})
    config = (facts.get("draft") or {}).get("config") or {}
    read = config_ids(config, target.num_layers) if config else None
    fed_text = " and ".join(f"{_name(x)} (run {side}) fed {_hs(x['fed_hf'])}" for side, x in (("A", a), ("B", b)))
    message = f"The same draft (aux ids {a['aux_ids']}) was fed different target layers: {fed_text}."
    readings = []
    if read is not None:
        readings = config_readings(read, target, "vllm")
        if len(readings) == 1:
            readings = config_readings(read, target, "sglang")
    readings = [(c, p) for c, p in readings if p is not None]
    trained = []
    for conv, physical in readings:
        hf = [p + 1 for p in physical]
        fixes = {x["engine"]: _fix(x, hf, physical, target) for x in (a, b)}
        trained.append({"convention": conv, "hidden_states": hf, "fixes": fixes})
    if not trained:
        message += " The draft's config does not say which layers it was trained on."
    elif len(trained) == 1:
        t = trained[0]
        message += (f" It was trained on {_hs(t['hidden_states'])} ({OWNER[t['convention']]} convention, "
                    f"trainer {read.trainer or 'implied by the format'}): " + "; ".join(t["fixes"].values()) + ".")
    else:
        message += " Its config names no trainer, so the ids read two ways: " + "; ".join(
            f"if trained in {OWNER[t['convention']]} convention ({_hs(t['hidden_states'])}): "
            + ", ".join(t["fixes"].values()) for t in trained) + "."
    return {"message": message, "fed": {"A": a["fed_hf"], "B": b["fed_hf"]}, "trained": trained}


def _fix(x: dict[str, Any], hf: list[int], physical: list[int], target) -> str:
    """The config change that makes this engine feed the trained layers: ``engines.ids_fix``'s words and
    ids, as the run's finding and ``doctor --fix`` give them."""
    name = NAMES.get(x["engine"], x["engine"])
    if x["fed_hf"] == hf:
        return f"{name} feeds them (no change)"
    ids = engines.ids_capturing(physical, target, x["engine"])
    if ids is None:
        return f"no aux ids make {name} feed {_hs(hf)}"
    return f"for {name} {engines.ids_fix(x['engine'], ids, physical)}"


def _name(x: dict[str, Any]) -> str:
    return f"{NAMES.get(x['engine'], x['engine'])} {x.get('engine_version') or ''}".strip()


def _hs(hf: list[int]) -> str:
    return "hidden_states[" + ", ".join(str(i) for i in hf) + "]"


def block(run_a: dict[str, Any], sum_a: dict[str, Any], run_b: dict[str, Any], sum_b: dict[str, Any]
          ) -> dict[str, Any]:
    """The compare page's "what each engine fed the draft" block: {"a", "b", "note"}."""
    a, b = fed(run_a, sum_a), fed(run_b, sum_b)
    return {"a": a, "b": b, "note": note(run_a, run_b, a, b)}
