"""Build an Observation of a stored run and replace the run's findings with fresh diagnoses."""

from __future__ import annotations

import time
from pathlib import Path

from sqlmodel import Session, delete, func, select

from draftscope import models
from draftscope.findings import Finding, Observation, runtime_findings, static_findings
from draftscope.spec import (SpecError, TargetSpec, VocabMapCheck, expect_sglang, read_draft,
                             read_target)
from draftscope.spec.draft import DraftFeatureSpec
from draftscope.spec.target import check_target_matches
from draftscope_tracer.redact import redact_server_args


def build_observation(session: Session, run_id: str) -> Observation:
    """Condense a run's samples, steps, requests and health snapshots for the runtime rules."""
    run = session.get(models.Run, run_id)
    if run is None:
        raise KeyError(f"no run {run_id!r} in the store")
    obs = Observation(facts=run.facts or {})
    S = models.TensorSample
    rows = session.exec(select(S.point, S.phase, S.width, S.l2_mean, S.nan_count, S.inf_count)
                        .where(S.run_id == run_id)).all()
    widths: dict[str, set[int]] = {}
    norms: dict[int, list[float]] = {}
    for point, phase, width, l2, nans, infs in rows:
        if point == "draft.input":
            widths.setdefault(phase, set()).add(width)
        elif point.startswith("target.aux[") and point.endswith("]"):
            i = int(point[len("target.aux["):-1])
            obs.aux_widths[i] = width
            if l2 is not None:
                norms.setdefault(i, []).append(l2)
        elif point == "draft.fc.out":
            obs.fc_out_samples += 1
        elif point.startswith("draft.logits"):
            obs.draft_logits_samples += 1
            obs.draft_logits_nonfinite += (nans or 0) + (infs or 0)
    obs.draft_input_widths = {p: sorted(w) for p, w in widths.items()}
    obs.aux_l2_mean = {i: sum(v) / len(v) for i, v in norms.items()}
    V = models.VerifyStep
    for rid, step, seq_pos, flags in session.exec(
            select(V.rid, V.step_index, V.seq_pos, V.accept_flags).where(V.run_id == run_id)).all():
        obs.verify_steps += 1
        obs.proposed_drafts += len(flags or [])
        obs.accepted_drafts += sum(bool(f) for f in flags or [])
        if seq_pos is not None and (obs.max_seq_pos is None or seq_pos > obs.max_seq_pos):
            obs.max_seq_pos, obs.max_seq_pos_at = seq_pos, (rid, step)
    if not obs.verify_steps:  # no sampled steps: fall back on SGLang's own per-request counters
        R = models.Request
        for acc, prop, ct in session.exec(select(R.spec_accepted_drafts, R.spec_proposed_drafts,
                                                 R.spec_verify_ct).where(R.run_id == run_id)).all():
            obs.accepted_drafts += acc or 0
            obs.proposed_drafts += prop or 0
    R = models.Request
    obs.sampled_verify_ct = session.exec(select(func.coalesce(func.sum(R.spec_verify_ct), 0))
                                         .where(R.run_id == run_id, R.sampled.is_(True))).one()
    H = models.TracerHealth
    latest = session.exec(select(H).where(H.run_id == run_id).order_by(H.at.desc())).first()
    if latest is not None:
        obs.heartbeats = dict(latest.heartbeats or {})
    return obs


def analyze_run(session: Session, run_id: str) -> list[Finding]:
    """Diagnose a stored run: runtime findings from what was traced, plus static findings when the
    recorded draft and target directories are readable here. Replaces the run's findings rows
    (static and runtime; tracer-recorded findings without a source stay)."""
    run = session.get(models.Run, run_id)
    if run is None:
        raise KeyError(f"no run {run_id!r} in the store")
    obs = build_observation(session, run_id)
    spec, static = _static(run, _imported_spec(session, run_id))
    static_ids = {f.rule_id for f in static}
    if "aux-convention-ambiguous" in static_ids:  # it already names both readings of the ids
        static_ids.add("captured-layers-differ")
    static_error = any(f.severity == "error" for f in static)
    # A static finding already names the cause: drop the runtime echo of the same rule, and the
    # "quality, not plumbing" verdict when the plumbing is statically broken.
    findings = static + [f for f in runtime_findings(spec, obs) if f.rule_id not in static_ids
                         and not (static_error and f.rule_id == "acceptance-collapse-quality")]
    F = models.Finding
    session.exec(delete(F).where(F.run_id == run_id, F.source.in_(["static", "runtime"])))
    now = time.time()
    for f in findings:
        session.add(F(run_id=run_id, rule_id=f.rule_id, severity=f.severity, message=f.message,
                      fix=f.fix, evidence=f.evidence, source=f.source, rid=f.evidence.get("rid"),
                      first_step=f.first_step, at=now))
    session.commit()
    return findings


def _static(run: models.Run, imported: tuple[DraftFeatureSpec, TargetSpec] | None
            ) -> tuple[DraftFeatureSpec | None, list[Finding]]:
    """Static findings from the recorded draft and target directories when they are readable
    here, else from the feature spec an imported bundle carried."""
    facts = run.facts or {}
    draft_path = (facts.get("draft") or {}).get("path") or run.draft_path
    target_path = (facts.get("target") or {}).get("path") or run.target_path
    if draft_path and target_path and Path(draft_path).is_dir():
        try:
            target = read_target(target_path)
            spec = read_draft(draft_path, target_layers=target.num_layers)
            check_target_matches(spec, target)
        except SpecError:
            return None, []
    elif imported is not None:
        spec, target = imported
    else:
        return None, []
    server_args = redact_server_args(run.server_args or {})
    server_args.setdefault("speculative_algorithm", run.algorithm or facts.get("algorithm"))
    return spec, static_findings(spec, target, expect_sglang(spec, target, server_args))


def _imported_spec(session: Session, run_id: str) -> tuple[DraftFeatureSpec, TargetSpec] | None:
    """The (draft, target) specs in the manifest of the bundle ``run_id`` was imported from."""
    manifest = session.exec(select(models.BundleImport.manifest)
                            .where(models.BundleImport.run_id == run_id)).first()
    spec = (manifest or {}).get("feature_spec") or {}
    if not spec.get("draft") or not spec.get("target"):
        return None
    draft = dict(spec["draft"], vocab_map=VocabMapCheck(**spec["draft"]["vocab_map"]))
    return DraftFeatureSpec(**draft), TargetSpec(**spec["target"])


class FindingsRefresher:
    """Re-diagnoses a run when new batches have arrived since its last analysis.

    The key of a run's state is (number of stored batches, newest receipt time) from
    ``ingest_batches``, which both the ingest API and the tracer's SQLite sink write. A run whose
    batches carried findings of their own (an imported bundle) keeps them as they came.
    """

    def __init__(self, engine) -> None:
        self.engine = engine
        self._seen: dict[str, tuple] = {}

    def refresh(self, run_id: str) -> None:
        B = models.IngestBatch
        with Session(self.engine) as session:
            key = tuple(session.exec(select(func.count(), func.max(B.received_at),
                                            func.sum(B.finding_rows))
                                     .where(B.run_id == run_id)).one())
            if self._seen.get(run_id) == key or key[2] or session.get(models.Run, run_id) is None:
                return
            analyze_run(session, run_id)
            self._seen[run_id] = key
