"""A Finding (one diagnosis) and the Observation of a run that runtime rules read."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SEVERITIES = ("error", "warning", "info")


@dataclass
class Finding:
    """One diagnosis: a stable rule id (see docs/findings.md), the root cause in one line, the fix."""

    rule_id: str
    severity: str  # error | warning | info
    message: str
    fix: str
    evidence: dict[str, Any] = field(default_factory=dict)
    first_step: int | None = None
    source: str = "static"  # static | runtime
    # The fix as edits draftscope can apply (``draftscope doctor --fix``), empty when the fix needs a
    # human. Ops: {"op": "config_set", "path": "a.b", "value": v}, {"op": "config_delete", "path"},
    # {"op": "server_arg", "name", "value"}, {"op": "strip_key_prefix", "prefix"},
    # {"op": "d2t_to_offsets"}.
    patch: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RequestAcceptance:
    """One sampled request's verify steps and accepted drafts; ``at``: when it arrived (else finished),
    ``prompt_key``: equal for the same prompt within the run (None: the tracer recorded none)."""

    rid: str
    at: float
    steps: int
    accepted: int
    prompt_key: str | None = None


@dataclass
class Observation:
    """What the tracer saw in one run, condensed for the runtime rules.

    ``facts`` is ``RunRecord.facts`` and ``server_args`` ``RunRecord.server_args`` (tracer/transport/wire.py). Widths are the distinct widths seen per
    sample point and phase; ``aux_l2_mean`` is the mean row L2 norm of ``target.aux[i]``.
    """

    facts: dict[str, Any] = field(default_factory=dict)
    server_args: dict[str, Any] = field(default_factory=dict)  # the run's, redacted (tracer/redact.py)
    draft_input_widths: dict[str, list[int]] = field(default_factory=dict)  # phase -> widths
    aux_widths: dict[int, int] = field(default_factory=dict)  # aux index -> width
    aux_l2_mean: dict[int, float] = field(default_factory=dict)
    fc_out_samples: int = 0
    draft_logits_nonfinite: int = 0
    draft_logits_samples: int = 0
    verify_steps: int = 0
    accepted_drafts: int = 0
    proposed_drafts: int = 0
    heartbeats: dict[str, int] = field(default_factory=dict)  # latest cumulative count per hook
    heartbeats_at: float | None = None  # when the latest health record was taken
    first_sampled_finish: float | None = None  # the first sampled request with verify steps ended
    sampled_verify_ct: int = 0  # SGLang's verify steps of the finished sampled requests
    # acceptance shape (analyze.acceptance_shape): per draft position k (1-based, index k-1),
    # (steps that reached k: drafts 1..k-1 accepted, steps that accepted k);
    accept_by_position: list[tuple[int, int]] = field(default_factory=list)
    # per sequence-position bin, (first seq_pos of the bin, verify steps, accepted drafts);
    accept_by_seq_bin: list[tuple[int, int, int]] = field(default_factory=list)
    # per time bin of the run, (seconds from the first step, verify steps, accepted drafts, mean seq_pos)
    accept_by_time_bin: list[tuple[float, int, int, float]] = field(default_factory=list)
    # per sampled request with verify steps, in arrival order: the unit the acceptance signatures
    # compare (request-to-request variation, not step-to-step, is what a finding must beat)
    requests: list[RequestAcceptance] = field(default_factory=list)
    # per (request, sequence-position bin): (rid, first seq_pos of the bin, verify steps, accepted drafts)
    accept_by_rid_seq_bin: list[tuple[str, int, int, int]] = field(default_factory=list)
    time_origin: float = 0.0  # unix time of accept_by_time_bin's 0 s
    time_bin_s: float = 1.0  # width of a time bin
    # what the tracer lost on the way to the store (its latest health): records, requests whose
    # record never arrived, and the [first, last] unix time windows the lost records came from
    records_lost: int = 0
    requests_lost: int = 0
    gaps: list[list[float]] = field(default_factory=list)
    drafts_per_step: int | None = None  # draft positions per verify step (num_draft_tokens - 1)
    max_seq_pos: int | None = None
    max_seq_pos_at: tuple[str, int] | None = None  # (rid, step_index) of the furthest verify step

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_drafts / self.proposed_drafts if self.proposed_drafts else None
