"""Runtime rules: what the tracer saw in a run (facts, widths, acceptance, heartbeats), on SGLang or
vLLM (``engines.engine_of(facts)``): a finding names what the engine of the run did."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from draftscope.findings import significance
from draftscope.findings.model import Finding, Observation, RequestAcceptance
from draftscope.spec.convention import IN_HF, OWNER, config_readings, other_engine, spec_readings, verdicts
from draftscope.spec.draft import ConfigIds, DraftFeatureSpec, config_fc_width, config_ids
from draftscope.spec.feature_stats import relative_gap
from draftscope.spec import engines
from draftscope.spec.expectations import NAMES
from draftscope.spec.sglang import random_weights
from draftscope.spec.vllm import last_index
from draftscope.spec.target import TargetSpec, recorded_target

EAGLE3_DRAFT_CLASSES = {"LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM", "Eagle3LlamaForCausalLM"}
COLLAPSE_RATE = 0.10  # draft acceptance rate under which acceptance has "collapsed"
MIN_PROPOSED = 20  # proposals needed before judging acceptance
TARGET_PHASES = ("prefill", "draft_extend")  # draft.input right after a target forward
HEALTH_LAG_S = 1.0  # a hook's calls reach the health records within the relay's poll (0.1 s)
# aux-norm-drift: z-score of a chunk's mean norm against the spread of the training per-prompt means
# (at least 2% of the mean). Past DRIFT_Z a clearly better-matching other layer means a layer shift
# (served traffic moves the tiny test-bed target's means by up to z 1.8); past DRIFT_Z_FAR, drift.
DRIFT_Z, DRIFT_Z_FAR, DRIFT_FLOOR = 2.0, 4.0, 0.02


def runtime_findings(spec: DraftFeatureSpec | None, obs: Observation) -> list[Finding]:
    """Findings for one run; ``spec`` (the draft read from disk) sharpens them when available. The
    facts are the writer's (a tracer's batch, an imported bundle): facts in a shape this draftscope's
    tracer does not write give ``run-facts-unreadable``, not an exception, so that the run is still
    stored, imported and shown."""
    try:
        return _findings(spec, obs)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
        error = f"{type(exc).__name__}: {str(exc)[:200]}"
        return [_f("run-facts-unreadable", "warning",
                   f"the runtime rules could not read this run's facts ({error}): its runtime findings are missing",
                   "record the run with this draftscope's tracer (the facts came from another version, or were "
                   "altered)", {"error": error})]


def _findings(spec: DraftFeatureSpec | None, obs: Observation) -> list[Finding]:
    facts = obs.facts or {}
    target, draft = facts.get("target") or {}, facts.get("draft") or {}
    engine = engines.engine_of(facts)
    if isinstance(facts.get("start_error"), dict):  # nothing was served: the exception is the story
        error = facts["start_error"]
        doctor = "draftscope doctor --engine vllm predicts vLLM's" if engine == "vllm" else \
            "draftscope doctor predicts SGLang's"
        return [_f("server-start-failed", "error",
                   f"the server failed while starting, before serving: {error.get('type')}: "
                   f"{error.get('message')}",
                   f"see the static findings for the cause ({doctor} start-up refusals), fix it and restart",
                   {"start_error": error})]
    found: list[Finding] = []
    algorithm = facts.get("algorithm")
    eagle3_draft = draft.get("architecture") in EAGLE3_DRAFT_CLASSES or spec is not None
    if algorithm and algorithm != "EAGLE3" and eagle3_draft:
        found.append(_f("eagle-algorithm-with-eagle3-draft", "error",
                        f"the server runs --speculative-algorithm {algorithm} with an EAGLE-3 draft: "
                        "no aux capture, the target's lm_head, d2t ignored",
                        "launch with --speculative-algorithm EAGLE3",
                        {"algorithm": algorithm, "lm_head_shared_with_target":
                         draft.get("lm_head_shared_with_target")}))
    else:
        found += _widths(spec, obs, target, draft, engine)
    random = random_weights(obs.server_args)
    fc_off = any(f.rule_id == "fc-bypassed" for f in found)
    found += _weights(obs, draft, engine, draft_random="draft" in random, fc_off=fc_off)
    found += _vocab(target, draft)
    found += _positions(spec, obs, draft)
    if not any(f.severity == "error" for f in found):  # a wiring error already explains odd norms
        found += _norm_drift(spec, obs)
    found += _coverage(facts)
    found += _hooks(obs)
    found += _signatures(obs, draft, spec, explained=any(f.severity == "error" for f in found))
    if obs.proposed_drafts >= MIN_PROPOSED and (obs.acceptance_rate or 0) < COLLAPSE_RATE \
            and not any(f.severity == "error" or (f.rule_id in SIGNATURES and f.severity != "info")
                        for f in found):  # a signature said as info explains nothing
        found.append(_f("acceptance-collapse-quality", "warning",
                        f"acceptance collapsed ({obs.accepted_drafts}/{obs.proposed_drafts} drafts "
                        f"accepted, {obs.acceptance_rate:.1%}) while every plumbing check passed: a "
                        "draft-quality or data-distribution problem, not a wiring one",
                        "compare the served prompts, chat template and sampling with the draft's "
                        "training data; retrain or pick a draft trained for this traffic",
                        {"accepted": obs.accepted_drafts, "proposed": obs.proposed_drafts,
                         "verify_steps": obs.verify_steps}))
    if obs.records_lost or obs.requests_lost:
        found = [_with_gaps(f, obs) if f.rule_id in ACCEPTANCE else f for f in found]
    if random:
        found = _expected_with_random_weights(found, random)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(found, key=lambda f: order[f.severity])


def _with_gaps(finding: Finding, obs: Observation) -> Finding:
    """An acceptance finding of a trace with gaps says how much of the run it could not see."""
    lost = {"records_lost": obs.records_lost, "requests_lost": obs.requests_lost, "gaps": obs.gaps}
    return replace(finding, message=f"{finding.message} (judged on what the store holds: the tracer lost "
                                    f"{obs.records_lost} records and {obs.requests_lost} whole requests "
                                    "of this run on their way to it)",
                   evidence={**finding.evidence, "lost": lost})


def _expected_with_random_weights(found: list[Finding], random: dict[str, str]) -> list[Finding]:
    """Random weights accept nothing: the acceptance findings become expected (info), the plumbing
    ones stay as they are, and ``weights-random`` says why first."""
    who = " and ".join(f"the {model} ({flag})" for model, flag in random.items())
    stated = _f("weights-random", "info",
                f"{who} {'were' if len(random) > 1 else 'was'} loaded with random values instead of "
                "the checkpoint, so acceptance means nothing here and the acceptance findings are "
                "expected; the plumbing checks (widths, fc, aux layers, loaded weights, d2t) hold as usual",
                "serve the checkpoints' weights to judge acceptance", {"random_weights": random})
    return [stated] + [replace(f, severity="info", message=f"expected with random weights: {f.message}",
                               fix="nothing to fix: random weights accept nothing")
                       if f.rule_id in ACCEPTANCE else f for f in found]


SIGNATURES = {"acceptance-zero-finite-logits", "acceptance-position1-collapse",
              "acceptance-decays-with-position", "acceptance-drift-over-time"}
# Acceptance signatures (the shape of acceptance, not its level). Thresholds are on rates of
# accepted drafts; each needs SIGNATURE_MIN steps on every side it compares.
SIGNATURE_MIN = 20
POS1_MAX, LATER_MIN = 0.25, 0.5  # position 1 under 25% while positions 2.. keep 50% once reached
# ... and at most a third of theirs: a step that reached position 2 got position 1 right, so later
# positions always look better once reached; a healthy draft on unfamiliar traffic shows 30% / 57%
# on the test bed (and every draft corruption tried there lowers the later positions as well).
POS1_RATIO = 3.0
DECAY_RATIO = 0.5  # acceptance past the knee at most half of before it
DRIFT_RATIO = 0.5  # acceptance in the last third of the run's requests at most half of the first third
# Decay and drift compare requests, not steps (significance.py): each side needs MIN_REQUESTS of
# them, and the fall must be beyond request-to-request variation at P_MAX (2,000 permutations or
# bootstrap resamples over requests, fixed seed). On the test bed's healthy runs this keeps both
# silent (bench/signature_false_alarms.py, docs/findings.md).
MIN_REQUESTS = 8
P_MAX = 0.01
KNEE_LIMIT_SHARE = 0.5  # a knee past half the checkpoint's max_position_embeddings is the context window's
TRAINED_MIN = 256  # drafts are trained on longer sequences (SpecForge and speculators: 2048): a knee before
# this, far inside the checkpoint's window, is not a context window (the test bed's healthy draft: 32)
ACCEPTANCE = SIGNATURES | {"acceptance-collapse-quality"}  # judged on acceptance alone


def _f(rule_id: str, severity: str, message: str, fix: str, evidence: dict[str, Any],
       first_step: int | None = None) -> Finding:
    return Finding(rule_id, severity, message, fix, evidence, first_step, source="runtime")


def _widths(spec: DraftFeatureSpec | None, obs: Observation, target: dict, draft: dict,
            engine: str) -> list[Finding]:
    found = []
    hidden = target.get("hidden_size") or (spec.target_hidden_size if spec else None)
    embed = draft.get("embed_width") or (spec.hidden_size if spec else None)
    expected = draft.get("fc_in_features") or (spec.expected_fc_in_width if spec else None) \
        or config_fc_width(draft.get("config") or {}, hidden)
    k = spec.k if spec else (expected // hidden if expected and hidden else None)
    seen = sorted({w for phase in TARGET_PHASES for w in obs.draft_input_widths.get(phase, [])})
    ev = {"draft_input_widths": obs.draft_input_widths, "expected_width": expected,
          "embed_width": embed, "target_hidden": hidden,
          "capture_aux_hidden_states": target.get("capture_aux_hidden_states"),
          "layers_to_capture": target.get("layers_to_capture")}
    layers = target.get("layers_to_capture")
    n = target.get("num_layers")
    last = (last_index(target.get("architecture"), n) if engine == "vllm" else n - 1) if n else None
    captured = [i for i in range(last + 1) if i in layers] if layers is not None and n else None
    if expected and embed and expected != embed and embed in seen:
        why = ("the target captures no aux states (capture_aux_hidden_states is false)"
               if target.get("capture_aux_hidden_states") is False
               else "the draft receives the target's final hidden state instead of the aux states")
        parts = f" ({k} aux layers × {hidden})" if k and hidden and k * hidden == expected else ""
        found.append(_f("fc-bypassed", "error",
                        f"the draft received {embed}-wide features, {embed} instead of {expected}{parts}: "
                        f"{why}, and {embed} is its embed width, so fc is silently skipped",
                        _capture_fix(obs.facts or {}, draft, engine), ev))
    elif captured is not None and k and len(captured) < k:
        found.append(_f("aux-count-short", "error",
                        f"the target captures {len(captured)} aux states (input of layers {captured}"
                        f"{', ' + str(sorted(set(layers) - set(captured))) + ' do not exist' if set(layers) - set(captured) else ''}"
                        f") but the draft's fc expects {k}",
                        _fix_all(_readings(spec, draft, target, engine), recorded_target(target), engine)
                        or ("use distinct ids vLLM can capture (0..L)" if engine == "vllm" else
                            "use eagle_config ids SGLang can capture (<= L-2, distinct, inside eagle_config)"),
                        {**ev, "captured": captured}))
    elif expected and any(w not in (expected, embed) for w in seen):
        bad = [w for w in seen if w not in (expected, embed)]
        rule = "aux-count-short" if hidden and all(w % hidden == 0 and w < expected for w in bad) else "aux-width-mismatch"
        found.append(_f(rule, "error",
                        f"the draft received {bad[0]}-wide features after a target forward; its fc "
                        f"expects {expected}",
                        "make the captured aux layers match the draft's eagle_config ids", ev))
    if captured is not None and n and not found:
        found += _layers(spec, draft, target, captured, ev, engine)
    return found


def _readings(spec: DraftFeatureSpec | None, draft: dict, target: dict,
              engine: str) -> list[tuple[str, list[int]]]:
    """(convention, trained layers) per reading of the ids: from the checkpoint read from disk, else
    from the draft config the tracer recorded."""
    t = recorded_target(target)
    read = config_ids(draft.get("config") or {}, t.num_layers) if spec is None else None
    readings = spec_readings(spec, t, engine) if spec is not None else \
        config_readings(read, t, engine) if read else []
    return [(c, p) for c, p in readings if p is not None]


def _layers(spec: DraftFeatureSpec | None, draft: dict, target: dict, captured: list[int],
            ev: dict, engine: str) -> list[Finding]:
    """The captured layers against the trained ones, in the convention the draft records. When it
    records none: ``aux-convention-ambiguous`` (info) if one reading is what the engine fed, both
    verdicts in ``captured-layers-differ`` if none is."""
    arch, t = target.get("architecture"), recorded_target(target)
    read = config_ids(draft.get("config") or {}, t.num_layers) if spec is None else None
    readings = _readings(spec, draft, target, engine)
    out = [i - 1 for i in captured]
    wrong = [(c, p) for c, p in readings if p != out]
    if not wrong:
        return []
    ev = {**ev, "captured": captured, "readings": [{"convention": c, "physical": p, "matches_engine": p == out}
                                                   for c, p in readings]}
    said = verdicts(readings, out, arch, engine) + other_engine(_ids(spec, read), engine, t.num_layers)
    fix = _fix_all(readings, t, engine, skip=out)
    if len(readings) > 1 and len(wrong) < len(readings):
        return [_f("aux-convention-ambiguous", "info",
                   f"the draft's config names no trainer, so its ids {_ids(spec, read)} read two ways: {said}",
                   fix, ev)]
    if len(readings) > 1:
        return [_f("captured-layers-differ", "error",
                   f"the target captures the output of layers {out}, which match the draft's ids "
                   f"{_ids(spec, read)} under no convention (its config names no trainer): {said}", fix, ev)]
    conv, trained = readings[0]
    return [_f("captured-layers-differ", "error",
               f"the target captures the output of layers {out} but the draft was trained on {trained} "
               f"({OWNER[conv]} convention: {IN_HF[conv]}); {said}", fix, ev)]


def _ids(spec: DraftFeatureSpec | None, read: ConfigIds | None) -> list[int] | None:
    return spec.aux_layer_ids if spec is not None else read.ids if read else None


def _capture_fix(facts: dict, draft: dict, engine: str) -> str:
    """Enable aux capture, naming first what this run has that turns it off (the draft's config, the
    algorithm), then the other conditions."""
    config = draft.get("config") if isinstance(draft.get("config"), dict) else {}
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    method = "--speculative-config method eagle3" if engine == "vllm" else "--speculative-algorithm EAGLE3"
    found = []
    if eagle.get("use_aux_hidden_state") is False:
        found.append("set use_aux_hidden_state: true in eagle_config (this draft's config says false)")
    if engine != "vllm" and facts.get("algorithm") not in (None, "EAGLE3"):
        found.append(f"serve with {method} (this run used {facts.get('algorithm')})")
    if found:
        return "; ".join(found) + ("" if len(found) > 1 else "; that is the one condition this run misses")
    rest = ["use_aux_hidden_state true in eagle_config", method]
    if engine != "vllm":
        rest.append("a target class with set_eagle3_layers_to_capture")
    return "enable aux capture: " + ", ".join(rest)


def _fix_all(readings: list[tuple[str, list[int]]], target: TargetSpec, engine: str,
             skip: list[int] | None = None) -> str:
    """The fix of ``static._fix`` in words: the ids that capture the trained layers; per reading (but
    the one whose layers are ``skip``, what the engine fed) when the convention is not recorded; ""
    without readings."""
    if len(readings) == 1:
        return _fix(readings[0][1], target, engine)
    if not readings:
        return ""
    return "record the trainer (speculators_* keys, or the training config beside the checkpoint); " + "; ".join(
        f"if it was trained in {OWNER[c]} convention: {_fix(p, target, engine)}" for c, p in readings if p != skip)


def _fix(trained: list[int], target: TargetSpec, engine: str) -> str:
    ids = engines.ids_capturing(trained, target, engine)
    return engines.ids_fix(engine, ids, trained) if ids is not None else engines.no_ids_fix(trained, target, engine)


def _weights(obs: Observation, draft: dict, engine: str, draft_random: bool = False,
             fc_off: bool = False) -> list[Finding]:
    """``draft_random``: the draft was loaded with random values, so its parameters differing from
    the checkpoint is expected (its keys and finiteness still count). ``fc_off``: ``fc-bypassed`` was
    found, which explains an fc weight no parameter took (vLLM builds no fc then)."""
    weights = draft.get("weights") or {}
    missing, nonfinite = weights.get("not_in_checkpoint") or [], weights.get("nonfinite") or []
    mismatched = [] if draft_random else weights.get("mismatched") or []
    unused = [k for k in weights.get("checkpoint_keys_unused") or [] if not (fc_off and k.endswith("fc.weight"))]
    found = []
    if missing or nonfinite or mismatched or obs.draft_logits_nonfinite:
        example = (missing or nonfinite or mismatched or ["draft logits"])[0]
        found.append(_f("draft-weights-not-loaded", "error",
                        f"the live draft has parameters the checkpoint did not fill (e.g. {example}; "
                        f"{len(missing)} missing, {len(mismatched)} differing, {len(nonfinite)} "
                        f"non-finite, {obs.draft_logits_nonfinite} non-finite logits): it proposes garbage",
                        f"rename the checkpoint keys to the names {NAMES[engine]}'s load_weights expects "
                        "(fc.weight, midlayer.*, norm.weight, lm_head.weight)",
                        {"not_in_checkpoint": missing[:50], "mismatched": mismatched[:50],
                         "nonfinite": nonfinite[:50], "checkpoint_keys_unused": unused[:50],
                         "draft_logits_nonfinite": obs.draft_logits_nonfinite}))
    elif unused:
        found.append(_f("checkpoint-keys-ignored", "warning",
                        f"{len(unused)} checkpoint keys were consumed by no parameter (e.g. {unused[0]})",
                        "rename or drop those keys", {"checkpoint_keys_unused": unused[:50]}))
    return found


def _vocab(target: dict, draft: dict) -> list[Finding]:
    found = []
    hot = draft.get("hot_token_id") or {}
    if hot.get("present") and hot.get("in_target_vocab") is False:
        found.append(_f("d2t-not-offsets", "error",
                        f"the draft->target id map reaches id {hot.get('max_id')} but the target "
                        f"vocabulary has {target.get('vocab_size')} ids: d2t holds absolute ids, not offsets",
                        "store offsets: d2t = selected_target_ids - arange(draft_vocab_size)",
                        {"hot_token_id": hot, "target_vocab": target.get("vocab_size")}))
    rows, cfg = draft.get("lm_head_rows"), draft.get("config_draft_vocab_size")
    if rows and cfg and rows != cfg and not draft.get("lm_head_shared_with_target"):
        found.append(_f("draft-vocab-lm-head-mismatch", "error",
                        f"the draft's lm_head has {rows} rows but draft_vocab_size is {cfg}",
                        "make draft_vocab_size, lm_head.weight rows and d2t length equal",
                        {"lm_head_rows": rows, "config_draft_vocab_size": cfg}))
    return found


def _positions(spec: DraftFeatureSpec | None, obs: Observation, draft: dict) -> list[Finding]:
    # The checkpoint's own limit: SGLang may have overwritten the live one with the target's.
    limit = draft.get("checkpoint_max_position_embeddings") or draft.get("max_position_embeddings") \
        or (spec.max_position_embeddings if spec else None)
    if limit and obs.max_seq_pos is not None and obs.max_seq_pos > limit:
        rid, step = obs.max_seq_pos_at or (None, None)
        return [_f("position-beyond-draft-max", "warning",
                   f"requests reached position {obs.max_seq_pos}, beyond the draft's "
                   f"max_position_embeddings {limit}: acceptance past it is unreliable",
                   "use a draft trained for this context length, or cap the context length",
                   {"max_seq_pos": obs.max_seq_pos, "draft_max_position_embeddings": limit, "rid": rid},
                   first_step=step)]
    return []


def _norm_drift(spec: DraftFeatureSpec | None, obs: Observation) -> list[Finding]:
    """``target.aux[i]`` norms against the draft's training-time feature statistics."""
    stats = spec.feature_stats if spec is not None else None
    if not stats or not obs.aux_l2_mean:
        return []
    layers = stats["layers"]
    found = []
    for chunk in stats["aux"]:
        seen = obs.aux_l2_mean.get(chunk["index"])
        if seen is None:
            continue
        z = _z(seen, chunk)
        best = min(layers, key=lambda c: relative_gap(seen, c["mean"]))
        shifted = best["layer"] != chunk["layer"] and abs(z) > DRIFT_Z and \
            abs(_z(seen, best)) <= DRIFT_Z_FAR and \
            relative_gap(seen, best["mean"]) < relative_gap(seen, chunk["mean"]) / 2
        far = abs(z) > DRIFT_Z_FAR or not chunk["q01"] / 2 <= seen <= chunk["q99"] * 2
        if not (shifted or far):
            continue
        ev = {"aux_index": chunk["index"], "observed_l2_mean": seen, "trained_layer": chunk["layer"],
              "training": {k: chunk[k] for k in ("mean", "std", "q01", "q50", "q99")},
              "robust_z": z, "best_matching_layer": best["layer"],
              "best_matching_mean": best["mean"], "stats_config_hash": stats["target"]["config_hash"]}
        where = (f"target.aux[{chunk['index']}] has a mean L2 norm of {seen:.4g} but the draft was "
                 f"trained on the output of layer {chunk['layer']} (mean {chunk['mean']:.4g}, "
                 f"q01..q99 {chunk['q01']:.4g}..{chunk['q99']:.4g}; z {z:+.1f})")
        if shifted:
            off = best["layer"] - chunk["layer"]
            found.append(_f("aux-norm-drift", "error",
                            f"{where}: it matches the output of layer {best['layer']} (mean "
                            f"{best['mean']:.4g}), {abs(off)} layer{'s' if abs(off) > 1 else ''} "
                            f"{'deeper' if off > 0 else 'shallower'}; residual norms grow with depth, "
                            f"so the captured layer is off by {'one' if abs(off) == 1 else abs(off)}",
                            "capture the layers the draft was trained on: write eagle_config ids in "
                            "SGLang's output-of convention (id j = output of layer j), "
                            f"{spec.aux_layers_physical}", ev))
        else:
            found.append(_f("aux-norm-drift", "warning",
                            f"{where}: no layer of the target the statistics were computed on "
                            "matches; a quantised or rotated (QuaRot/SpinQuant) target, another "
                            "checkpoint, or traffic far from the statistics' prompts",
                            "serve the target the draft was trained on (statistics config hash "
                            f"{stats['target']['config_hash']}), or recompute the statistics "
                            "with `draftscope stats` on this target if it is the intended one", ev))
    return found


def _z(norm: float, stats: dict) -> float:
    return (norm - stats["mean"]) / max(stats["prompt_means"]["std"], DRIFT_FLOOR * stats["mean"])


def _hooks(obs: Observation) -> list[Finding]:
    """A hook that must fire on a sampled request (``facts.tracing.expected_to_fire``) never did,
    by the first health record taken after a sampled request with verify steps finished (an
    earlier one predates the hooks' calls: health goes out every 10 s, steps as they come)."""
    if (obs.heartbeats_at is None or obs.first_sampled_finish is None
            or obs.heartbeats_at < obs.first_sampled_finish + HEALTH_LAG_S):
        return []
    if obs.verify_steps and not obs.heartbeats.get("verify"):
        return []  # stored verify steps come from the verify hook: this record's counters predate them (older relays)
    expected = (obs.facts.get("tracing") or {}).get("expected_to_fire")
    if expected is None:  # a run recorded before the tracer listed them
        expected = list(obs.heartbeats)
    starved = sorted(h for h in expected if not obs.heartbeats.get(h))
    steps = max(obs.verify_steps, obs.sampled_verify_ct)
    if steps and starved:
        return [_f("hooks-starved", "warning",
                   f"tracer hooks {starved} never fired during {steps} verify steps of sampled requests: "
                   "their points are missing (CUDA-graph replay or a code path that bypasses the hook)",
                   "run with --disable-cuda-graph to confirm, or read the points the tracer's "
                   "worker hooks see", {"heartbeats": obs.heartbeats, "verify_steps": steps})]
    return []


def _coverage(facts: dict[str, Any]) -> list[Finding]:
    """The running speculative worker is one the tracer cannot see, or SGLang did not apply its hooks
    (``facts.tracing``, recorded at attach by the tracer's ``coverage.check``)."""
    tracing = facts.get("tracing")
    if not tracing:
        return []
    if not tracing.get("covered"):
        worker = tracing.get("worker_class")
        what = f"this server runs {worker}" if worker else "this server runs no speculative decoding"
        return [_f("worker-not-traced", "warning",
                   f"{what}: draftscope traces nothing of it (only requests and SGLang's own counters "
                   "are recorded)",
                   "draftscope traces EAGLEWorkerV2 (--speculative-algorithm EAGLE, EAGLE3 or STANDALONE "
                   "without --enable-multi-layer-eagle); for this server, read SGLang's own metrics",
                   {k: tracing.get(k) for k in ("worker_class", "draft_worker_class", "algorithm",
                                                "hooks_not_reached")})]
    if tracing.get("hooks_not_applied"):
        missing = tracing["hooks_not_applied"]
        return [_f("hooks-not-applied", "warning",
                   f"SGLang did not apply the tracer's hooks {missing}: what they record is missing",
                   "the server log names the failure (\"Failed to apply hooks to ...\"); run the SGLang "
                   "version the tracer supports (0.5.23)", {"hooks_not_applied": missing})]
    return []


def _signatures(obs: Observation, draft: dict, spec: DraftFeatureSpec | None,
                explained: bool) -> list[Finding]:
    """The four acceptance signatures. ``explained``: a wiring error already accounts for low
    acceptance, so only a zero-acceptance head (which it may corroborate) is reported."""
    found = []
    zero = _zero_acceptance(obs)
    if zero:
        found.append(zero)
    if explained or zero:
        return found
    decay = _decay_with_position(obs, draft, spec)
    # Steps past the knee fail at position 1 and dominate it: decay explains that shape too.
    for hit in (decay, None if decay else _position1(obs, draft, spec), _drift(obs)):
        if hit:
            found.append(hit)
    return found


def _rate(accepted: int, steps: int, per_step: int = 1) -> float:
    return accepted / (steps * per_step) if steps else 0.0


def _zero_acceptance(obs: Observation) -> Finding | None:
    if obs.proposed_drafts < MIN_PROPOSED or obs.accepted_drafts or not obs.draft_logits_samples \
            or obs.draft_logits_nonfinite:
        return None
    return _f("acceptance-zero-finite-logits", "error",
              f"not one of {obs.proposed_drafts} drafts was accepted while all "
              f"{obs.draft_logits_samples} sampled draft logits were finite: the draft head is "
              "computing, but on no knowledge of this vocabulary (a randomly initialised lm_head, e.g. "
              "a checkpoint without lm_head.weight whose loader only warns: SGLang #27829)",
              "check that the checkpoint has lm_head.weight with draft_vocab_size rows (or drop "
              "draft_vocab_size so the target's head is used), and that d2t maps onto the target's ids",
              {"accepted": 0, "proposed": obs.proposed_drafts,
               "draft_logits_samples": obs.draft_logits_samples})


def _position1(obs: Observation, draft: dict, spec: DraftFeatureSpec | None) -> Finding | None:
    pos = obs.accept_by_position
    if len(pos) < 2 or pos[0][0] < SIGNATURE_MIN:
        return None
    first = _rate(pos[0][1], pos[0][0])
    later_reached = sum(r for r, _ in pos[1:])
    if later_reached < SIGNATURE_MIN // 4 or first > POS1_MAX:
        return None
    later = _rate(sum(a for _, a in pos[1:]), later_reached)
    if later < LATER_MIN or later < POS1_RATIO * first:
        return None
    rates = [round(_rate(a, r), 3) if r else None for r, a in pos]
    return _f("acceptance-position1-collapse", "warning",
              f"draft position 1 is accepted in {first:.0%} of verify steps while positions 2.. are "
              f"accepted in {later:.0%} once reached: the draft's first step, the one fed the "
              "target's aux features, is what fails (an off-by-one in the captured layers or in their "
              "alignment with the tokens: vLLM #43671)",
              "compare the captured layers with the trained ones (draftscope stats, then the run's "
              "aux-norm-drift) and the aux ids' convention with the trainer's",
              {"accept_rate_by_position": rates, "reached_by_position": [r for r, _ in pos]})


def _decay_with_position(obs: Observation, draft: dict, spec: DraftFeatureSpec | None) -> Finding | None:
    """Acceptance past a sequence-position knee at most half of before it, pooled over steps, then
    judged over requests: within the same requests when enough of them cross the knee (like with
    like: a request past the knee is otherwise another, longer prompt), across requests only where
    the checkpoint's max_position_embeddings puts the knee at the end of its window. A warning needs
    the knee to be a plausible context window: near the checkpoint's max_position_embeddings, or
    past TRAINED_MIN positions; a fall far inside both is only info (it is not the window)."""
    knee = _knee(obs.accept_by_seq_bin, obs.drafts_per_step or 1)
    if knee is None:
        return None
    limit = draft.get("checkpoint_max_position_embeddings") or (spec.max_position_embeddings if spec else None)
    live = draft.get("max_position_embeddings")
    sides: dict[str, list[int]] = {}
    for rid, start, n, accepted in obs.accept_by_rid_seq_bin:
        side = sides.setdefault(rid, [0, 0, 0, 0])
        i = 0 if start < knee else 2
        side[i] += n
        side[i + 1] += accepted
    per = obs.drafts_per_step or 1
    at_window = bool(limit) and knee >= KNEE_LIMIT_SHARE * limit
    crossing = [u for u in sides.values() if u[0] and u[2]]
    if len(crossing) >= MIN_REQUESTS and _falls(crossing, per):
        units, within = crossing, True
    elif at_window and _falls(list(sides.values()), per):
        units, within = list(sides.values()), False
    else:
        return None
    if sum(1 for u in units if u[0]) < MIN_REQUESTS or sum(1 for u in units if u[2]) < MIN_REQUESTS:
        return None
    r_b = _rate(sum(u[1] for u in units), sum(u[0] for u in units), per)
    r_a = _rate(sum(u[3] for u in units), sum(u[2] for u in units), per)
    ev = {"knee_seq_pos": knee, "accept_rate_before": round(r_b, 3), "accept_rate_after": round(r_a, 3),
          "steps_before": sum(u[0] for u in units), "steps_after": sum(u[2] for u in units),
          "requests": len(units), "within_requests": within, "p_value": round(significance.drop_p(units), 4),
          "checkpoint_max_position_embeddings": limit, "live_max_position_embeddings": live}
    who = (f"in the same {len(units)} requests, which ran on both sides of it" if within else
           f"across {len(units)} requests (those past it are other, longer prompts, not the same ones "
           "run further)")
    fell = f"{r_b:.0%} of drafts accepted before position {knee}, {r_a:.0%} beyond it, {who}"
    if not at_window and knee < TRAINED_MIN:
        inside = f"the checkpoint's max_position_embeddings of {limit}" if limit else "any draft's training length"
        return _f("acceptance-decays-with-position", "info",
                  f"acceptance falls with sequence position ({fell}), but position {knee} is far inside "
                  f"{inside}, so this is not the draft's context window: the text the requests go on to "
                  "generate is less like the draft's training data",
                  "nothing to change for the context window; compare the served traffic with the "
                  "draft's training data if acceptance matters here", ev)
    if at_window:
        why = f"; the checkpoint's max_position_embeddings is {limit}" + \
            (f" (SGLang overwrote it with {live})" if live and live != limit else "")
    elif limit:
        why = (f", well inside the checkpoint's max_position_embeddings of {limit}: the draft was "
               "likely trained on shorter sequences than its config allows")
    else:
        why = ""
    return _f("acceptance-decays-with-position", "warning",
              f"acceptance falls with sequence position: {fell}{why}: the draft's context window is "
              "shorter than the traffic's (SpecForge #271, speculators #684)",
              "use a draft trained on sequences as long as the served ones (or cap --context-length "
              "where acceptance holds)", ev)


def _knee(bins: list[tuple[int, int, int]], per: int) -> int | None:
    """The sequence position past which pooled acceptance falls the most, to at most DECAY_RATIO of
    before it (SIGNATURE_MIN steps each side), or None."""
    steps, accepted = sum(b[1] for b in bins), sum(b[2] for b in bins)
    best, n_b, a_b = None, 0, 0
    for i in range(1, len(bins)):  # every split point, with running sums on each side
        n_b, a_b = n_b + bins[i - 1][1], a_b + bins[i - 1][2]
        n_a, a_a = steps - n_b, accepted - a_b
        if n_b < SIGNATURE_MIN or n_a < SIGNATURE_MIN:
            continue
        r_b, r_a = _rate(a_b, n_b, per), _rate(a_a, n_a, per)
        if r_a <= DECAY_RATIO * r_b and (best is None or r_b - r_a > best[1]):
            best = (bins[i][0], r_b - r_a)
    return None if best is None else best[0]


def _falls(units: list[list[int]], per: int) -> bool:
    """Pooled over ``units`` [(steps, accepted) before, after], acceptance after is at most
    DECAY_RATIO of before, on SIGNATURE_MIN steps each side, beyond request-to-request variation."""
    n_b, n_a = sum(u[0] for u in units), sum(u[2] for u in units)
    if n_b < SIGNATURE_MIN or n_a < SIGNATURE_MIN:
        return False
    r_b, r_a = _rate(sum(u[1] for u in units), n_b, per), _rate(sum(u[3] for u in units), n_a, per)
    return r_a <= DECAY_RATIO * r_b and significance.drop_p(units) <= P_MAX


def _drift(obs: Observation) -> Finding | None:
    """Acceptance of the last third of the run's requests at most half of the first third's, beyond
    request-to-request variation, never across a gap. Like with like: where the tracer recorded
    prompt keys, only prompts sent in both thirds are compared (the labels permuted within each
    prompt), so traffic that changes kind along the run is not a drift; without keys the finding
    is only info and says that it could not tell."""
    reqs = _gap_free(obs.requests, obs.gaps)
    third = len(reqs) // 3
    early, late = reqs[:third], reqs[len(reqs) - third:]
    keyed = bool(reqs) and all(r.prompt_key for r in reqs)
    if keyed:
        shared = {r.prompt_key for r in early} & {r.prompt_key for r in late}
        early = [r for r in early if r.prompt_key in shared]
        late = [r for r in late if r.prompt_key in shared]
    per = obs.drafts_per_step or 1
    n_e, n_l = sum(r.steps for r in early), sum(r.steps for r in late)
    if min(len(early), len(late)) < MIN_REQUESTS or min(n_e, n_l) < SIGNATURE_MIN:
        return None
    r_e, r_l = _rate(sum(r.accepted for r in early), n_e, per), _rate(sum(r.accepted for r in late), n_l, per)
    if r_l > DRIFT_RATIO * r_e:
        return None
    p = significance.fall_p([(r.steps, r.accepted, r.prompt_key or "") for r in early],
                            [(r.steps, r.accepted, r.prompt_key or "") for r in late])
    if p > P_MAX:
        return None
    if keyed:
        severity, what = "warning", (f"for the same {len(shared)} prompts sent in both: something changed "
                                     "while serving (a stale cache, a reloaded model, other sampling)")
    else:
        severity, what = "info", ("but the tracer recorded no prompt keys for this run, so these may be "
                                  "other prompts: traffic that changes kind along the run looks the same")
    return _f("acceptance-drift-over-time", severity,
              f"acceptance drifted from {r_e:.0%} of drafts in the first third of the run's requests "
              f"({len(early)}) to {r_l:.0%} in the last ({len(late)}), {what}",
              "compare the late requests with the early ones (prompts, template, sampling) and "
              "restart to see whether acceptance recovers",
              {"accept_rate_first_third": round(r_e, 3), "accept_rate_last_third": round(r_l, 3),
               "requests_first_third": len(early), "requests_last_third": len(late),
               "same_prompts": keyed, "p_value": round(p, 4),
               **({"judged_between": [reqs[0].at, reqs[-1].at]} if obs.gaps else {})})


def _gap_free(reqs: list[RequestAcceptance], gaps: list[list[float]]) -> list[RequestAcceptance]:
    """The longest stretch (in requests) of consecutive requests that no lost-record window falls
    between: a comparison over time never spans records the tracer lost."""
    stretches: list[list[RequestAcceptance]] = [[]]
    for r in reqs:
        last = stretches[-1][-1] if stretches[-1] else None
        if last is not None and any(g0 <= r.at and last.at <= g1 for g0, g1 in gaps):
            stretches.append([])
        stretches[-1].append(r)
    return max(stretches, key=len)
