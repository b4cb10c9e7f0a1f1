"""The tracer's wire format: one JSON batch per flush, and how a batch maps onto store rows.

This module is the single contract between the tracer (which builds batches) and the store (the
dashboard's ingest API and the tracer's direct SQLite sink both write one row per record into the
table ``RECORD_TABLES`` names, one column per field of ``TABLE_COLUMNS``, absent fields NULL, JSON
columns as JSON text). Standard library and orjson only: it is imported inside SGLang's scheduler
processes.

A batch (``schema_version`` 1) is a JSON object::

    {"schema_version": 1, "batch_id": "<uuid hex>", "run_id": "<uuid hex>", "sent_at": <unix s>,
     "run": RunRecord | null,            # upsert of the run; required before any other record
     "requests": [RequestRecord], "steps": [StepRecord], "samples": [SampleRecord],
     "health": [HealthRecord], "findings": [FindingRecord]}

Times are unix seconds (float), in fields named ``at`` or ``*_at``. Lists default to empty. Field meanings
are in the TypedDicts below (``Batch`` is the object above); fields marked ``NotRequired`` may be absent and
are stored as NULL. The dashboard's ingest records are generated from these TypedDicts, with its bounds on
every value (ids' alphabet and length, times, integers to their column, no NUL, JSON depth, the enums noted
below): ``draftscope.store.wire_schema`` and docs/tracer.md, "What a tracer may send".
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict

try:  # Python 3.11+
    from typing import NotRequired
except ImportError:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired

SCHEMA_VERSION = 1


class RunRecord(TypedDict):
    """One tracer attach session (or one imported bundle)."""

    engine: str  # "sglang" | "vllm"
    engine_version: str
    source: str  # "tracer" | "bundle"
    status: str  # "running" | "ended" | "crashed"
    started_at: float
    ended_at: NotRequired[Optional[float]]
    host: NotRequired[str]
    pid: NotRequired[int]
    algorithm: NotRequired[str]  # "EAGLE3", "EAGLE", ...
    target_path: NotRequired[str]
    target_arch: NotRequired[str]
    target_config_hash: NotRequired[str]
    draft_path: NotRequired[str]
    draft_arch: NotRequired[str]
    draft_config_hash: NotRequired[str]
    server_args: NotRequired[Dict[str, Any]]
    tracer_config: NotRequired[Dict[str, Any]]
    facts: NotRequired[Dict[str, Any]]  # attach-time facts; merged key by key on upsert


class RequestRecord(TypedDict):
    """One request; upserted by (run_id, rid), later records overwrite non-null fields."""

    rid: str
    sampled: NotRequired[bool]
    prompt_len: NotRequired[int]
    prompt_key: NotRequired[str]  # keyed hash of the prompt's token ids: equal for the same prompt within one tracer process (engine/prompt_key.py)
    output_len: NotRequired[int]
    started_at: NotRequired[float]
    finished_at: NotRequired[float]
    finish_reason: NotRequired[str]
    spec_verify_ct: NotRequired[int]  # SGLang's own counters (meta_info)
    spec_accepted_drafts: NotRequired[int]
    spec_proposed_drafts: NotRequired[int]
    traced_verify_ct: NotRequired[int]  # the tracer's own totals over every verify step (sampled requests only)
    traced_accepted_drafts: NotRequired[int]
    traced_proposed_drafts: NotRequired[int]


class StepRecord(TypedDict):
    """One verify step of one sampled request (chain or tree)."""

    rid: str
    step_index: int  # 0-based verify step of this request
    at: float
    seq_pos: NotRequired[int]  # sequence length before this step
    drafted_tokens: List[int]  # target-vocab ids, position 1..N-1
    accept_len: int  # accepted drafts + 1 (bonus), as SGLang's accept_lens
    accept_flags: List[bool]  # per drafted position (a tree: per node, the accepted path; [] when its shape was not read)
    bonus_token: NotRequired[Optional[int]]
    draft_topk: NotRequired[List[List[List[Optional[float]]]]]  # [position][k] = [target id, prob or null]; [] if not read
    target_topk: NotRequired[List[List[List[Optional[float]]]]]
    tree_parents: NotRequired[List[int]]  # a tree: each drafted node's parent node (0: the verified token)


class SampleRecord(TypedDict):
    """Summary statistics of one tensor at one named point."""

    point: str  # "target.aux[0]", "draft.input", "draft.fc.in", "draft.fc.out", ...
    phase: str  # "prefill" | "verify" | "draft_extend" | "draft_decode" | "attach"
    at: float
    rid: NotRequired[Optional[str]]
    step_index: NotRequired[Optional[int]]
    shape: List[int]
    dtype: str
    width: int
    rows: int
    l2_mean: NotRequired[Optional[float]]
    l2_max: NotRequired[Optional[float]]
    mean: NotRequired[Optional[float]]
    std: NotRequired[Optional[float]]
    absmax: NotRequired[Optional[float]]
    nan_count: NotRequired[int]
    inf_count: NotRequired[int]
    raw_b64: NotRequired[Optional[str]]  # zlib-compressed little-endian float16 slice, base64
    raw_shape: NotRequired[Optional[List[int]]]


class HealthRecord(TypedDict):
    """A cumulative snapshot of the tracer's own health."""

    at: float
    drops: Dict[str, int]  # by reason: queue_full, sink_error, shutdown, ...
    errors: Dict[str, int]  # by probe
    heartbeats: Dict[str, int]  # calls seen per hook
    disabled_probes: List[str]
    queue_depth: NotRequired[int]
    records_lost: NotRequired[int]  # dropped records that were meant for the store (a subset of drops)
    requests_lost: NotRequired[int]  # requests whose finish record was among them: never stored
    lost_rids: NotRequired[List[str]]  # the first 100 of those requests' ids
    gaps: NotRequired[List[List[float]]]  # [first, last] time of the lost records, merged windows


class FindingRecord(TypedDict):
    """A diagnosis: a stable rule id, what it means and how to fix it."""

    rule_id: str
    severity: str  # "error" | "warning" | "info"
    message: str
    fix: NotRequired[str]
    evidence: NotRequired[Dict[str, Any]]
    source: NotRequired[str]  # "static" | "runtime"
    rid: NotRequired[Optional[str]]
    first_step: NotRequired[Optional[int]]
    at: NotRequired[float]


class Batch(TypedDict):
    """One flush of the tracer (``schema_version`` 1)."""

    schema_version: int
    batch_id: str  # uuid hex
    run_id: str  # uuid hex
    sent_at: float
    run: NotRequired[Optional[RunRecord]]  # upsert of the run; required before any other record
    requests: NotRequired[List[RequestRecord]]
    steps: NotRequired[List[StepRecord]]
    samples: NotRequired[List[SampleRecord]]
    health: NotRequired[List[HealthRecord]]
    findings: NotRequired[List[FindingRecord]]


# Store tables and the columns a batch fills (besides each table's own integer primary key). The first
# names the run: the batch's run_id, or in the two largest tables the run's integer key (``runs.key``).
TABLE_COLUMNS: Dict[str, List[str]] = {
    "requests": ["run_id", *RequestRecord.__annotations__],
    "verify_steps": ["run_key", *StepRecord.__annotations__],
    "tensor_samples": ["run_key", *SampleRecord.__annotations__],
    "tracer_health": ["run_id", *HealthRecord.__annotations__],
    "findings": ["run_id", *FindingRecord.__annotations__],
}
RECORD_TABLES = {"requests": "requests", "steps": "verify_steps", "samples": "tensor_samples",
                 "health": "tracer_health", "findings": "findings"}
# Columns holding lists or objects: JSON in the store.
JSON_COLUMNS = {"server_args", "tracer_config", "facts", "drafted_tokens", "accept_flags",
                "draft_topk", "target_topk", "tree_parents", "shape", "raw_shape", "drops", "errors",
                "heartbeats", "disabled_probes", "lost_rids", "gaps", "evidence"}


def to_json(value: Any) -> bytes:
    """Compact JSON of a batch or of one JSON column's value; non-finite floats become null. (orjson, which
    SGLang and the dashboard require, is imported here: the hooks' modules import without it.)"""
    import orjson

    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
