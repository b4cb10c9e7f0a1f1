"""Pydantic mirrors of the wire TypedDicts in ``draftscope_tracer.transport.wire``: what ingest accepts.

Strict types and ``extra="forbid"``: a misspelt field or a string where a number belongs is an
error that names the field, not a silent NULL in the store. Ingest decodes with ``FastBatch``, the
same schema compiled for msgspec, and uses these models to explain what a rejected body got wrong.
"""

from __future__ import annotations

import functools
import operator
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from draftscope_tracer.transport import wire

SUPPORTED_SCHEMA_VERSIONS = (wire.SCHEMA_VERSION,)

INT4 = (-2**31, 2**31 - 1)  # an integer column of the store (``INTEGER``: int4 on PostgreSQL)
INT8 = (-2**63, 2**63 - 1)  # an integer inside a JSON column
EARLIEST = 946_684_800.0  # 2000-01-01T00:00:00Z: no tracer ran before
LATEST = 4_102_444_800.0  # 2100-01-01: the schema's bound; ingest also refuses a time more than a day
# ahead of its own clock (``ingest_checks.FUTURE_SLACK_S``)
ID_MAX = 128
ENGINES = ("sglang", "vllm")  # run.engine: the serving engines a tracer records from
TRACER_STATUSES = ("running", "ended", "crashed")  # run.status a tracer sends (in the order it advances)
SEVERITIES = ("error", "warning", "info")


class _Limits:
    """The constraints of one ``Annotated`` type, kept for its msgspec twin (``_fast_type``)."""

    def __init__(self, **limits: Any):
        self.limits = limits

    def meta(self) -> msgspec.Meta:
        limits = dict(self.limits)
        limits.pop("allow_inf_nan", None)  # msgspec's ge/le refuse NaN and infinities already
        if "pattern" in limits:  # Python's ``$`` also matches before a final newline; ``\Z`` does not
            limits["pattern"] = limits["pattern"].removesuffix("$") + r"\Z"
        return msgspec.Meta(**limits)


def _limited(tp: Any, **limits: Any) -> Any:
    return Annotated[tp, Field(**limits), _Limits(**limits)]


Int = _limited(int, ge=INT4[0], le=INT4[1])
JsonInt = _limited(int, ge=INT8[0], le=INT8[1])
Time = _limited(float, ge=EARLIEST, le=LATEST, allow_inf_nan=False)  # unix seconds
Text = _limited(str, pattern=r"^[^\x00]*$")  # no NUL: PostgreSQL's text cannot hold one
# Run and batch ids travel in URLs, file names and headers: a safe alphabet, bounded.
SafeId = _limited(str, min_length=1, max_length=ID_MAX, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# A request id is the engine's (a client may choose it): any printable text, no control character.
Rid = _limited(str, min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")
PromptKey = _limited(str, pattern=r"^[0-9a-f]{16}$")  # tracer/engine/prompt_key.py
TopK = list[list[list[float | None]]]  # [position][k] = [id, prob]; prob null when not finite


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=True)


class RunRecord(_Record):
    engine: Literal[ENGINES]  # type: ignore[valid-type]
    engine_version: Text
    source: Literal["tracer", "bundle"]  # "bundle": written by import only (ingest_checks)
    status: Literal[TRACER_STATUSES]  # type: ignore[valid-type]
    started_at: Time
    ended_at: Time | None = None
    host: Text | None = None
    pid: Int | None = None
    algorithm: Text | None = None
    target_path: Text | None = None
    target_arch: Text | None = None
    target_config_hash: Text | None = None
    draft_path: Text | None = None
    draft_arch: Text | None = None
    draft_config_hash: Text | None = None
    server_args: dict[Text, Any] | None = None  # JSON values: ingest_checks bounds their depth and contents
    tracer_config: dict[Text, Any] | None = None
    facts: dict[Text, Any] | None = None


class RequestRecord(_Record):
    rid: Rid
    sampled: bool | None = None
    prompt_len: Int | None = None
    prompt_key: PromptKey | None = None
    output_len: Int | None = None
    started_at: Time | None = None
    finished_at: Time | None = None
    finish_reason: Text | None = None
    spec_verify_ct: Int | None = None
    spec_accepted_drafts: Int | None = None
    spec_proposed_drafts: Int | None = None
    traced_verify_ct: Int | None = None
    traced_accepted_drafts: Int | None = None
    traced_proposed_drafts: Int | None = None


class StepRecord(_Record):
    rid: Rid
    step_index: Int
    at: Time
    seq_pos: Int | None = None
    drafted_tokens: list[JsonInt]
    accept_len: Int
    accept_flags: list[bool]
    bonus_token: Int | None = None
    draft_topk: TopK | None = None
    target_topk: TopK | None = None
    tree_parents: list[JsonInt] | None = None  # a tree: each drafted node's parent node (0: the verified token)


class SampleRecord(_Record):
    point: Text
    phase: Text
    at: Time
    rid: Rid | None = None
    step_index: Int | None = None
    shape: list[JsonInt]
    dtype: Text
    width: Int
    rows: Int
    l2_mean: float | None = None
    l2_max: float | None = None
    mean: float | None = None
    std: float | None = None
    absmax: float | None = None
    nan_count: Int | None = None
    inf_count: Int | None = None
    raw_b64: Text | None = None
    raw_shape: list[JsonInt] | None = None


class HealthRecord(_Record):
    at: Time
    drops: dict[Text, JsonInt]
    errors: dict[Text, JsonInt]
    heartbeats: dict[Text, JsonInt]
    disabled_probes: list[Text]
    queue_depth: Int | None = None
    records_lost: Int | None = None
    requests_lost: Int | None = None
    lost_rids: list[Text] | None = None
    gaps: list[list[Time]] | None = None


class FindingRecord(_Record):
    rule_id: Text
    severity: Literal[SEVERITIES]  # type: ignore[valid-type]
    message: Text
    fix: Text | None = None
    evidence: dict[Text, Any] | None = None
    source: Text | None = None
    rid: Rid | None = None
    first_step: Int | None = None
    at: Time | None = None


class Batch(_Record):
    """One flush of the tracer (``schema_version`` 1)."""

    schema_version: Literal[SUPPORTED_SCHEMA_VERSIONS]  # type: ignore[valid-type]
    batch_id: SafeId
    run_id: SafeId
    sent_at: Time
    run: RunRecord | None = None
    requests: list[RequestRecord] = []
    steps: list[StepRecord] = []
    samples: list[SampleRecord] = []
    health: list[HealthRecord] = []
    findings: list[FindingRecord] = []


def _fast_type(annotation: Any) -> Any:
    """``annotation`` with every pydantic model in it replaced by its msgspec twin, and every
    ``_limited`` type by the same type under ``msgspec.Meta``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _fast_struct(annotation)
    args = get_args(annotation)
    if not args:
        return annotation
    if get_origin(annotation) is Annotated:
        return _with_limits(_fast_type(args[0]), args[1:])
    fast = tuple(_fast_type(a) for a in args)
    if get_origin(annotation) in (Union, UnionType):
        return functools.reduce(operator.or_, fast)
    return get_origin(annotation)[fast]


def _with_limits(tp: Any, metadata: Any) -> Any:
    limits = [m.meta() for m in metadata if isinstance(m, _Limits)]
    return functools.reduce(lambda t, m: Annotated[t, m], limits, tp)


@functools.cache
def _fast_struct(model: type[BaseModel]) -> type[msgspec.Struct]:
    """A msgspec Struct with the fields, order, defaults and limits of ``model``."""
    fields = []
    for name, info in model.model_fields.items():
        tp = _with_limits(_fast_type(info.annotation), info.metadata)
        if info.is_required():
            fields.append((name, tp))
        else:
            default = info.get_default(call_default_factory=True)
            fields.append((name, tp, msgspec.field(default_factory=list) if default == [] else default))
    return msgspec.defstruct(model.__name__, fields, kw_only=True, forbid_unknown_fields=True)


FastBatch = _fast_struct(Batch)
"""``Batch`` compiled for msgspec: decodes and validates a body ~3x faster than pydantic.

It accepts no more than ``Batch`` does (same fields, strict types, no extra keys). Bodies it rejects
are handed to ``Batch`` for the error message, or accepted by it where msgspec is stricter (JSON
``NaN``/``Infinity`` literals).
"""


def batch_json_schema() -> dict[str, Any]:
    """``Batch`` as one JSON Schema with its definitions inlined (no ``$ref``): the request body the
    OpenAPI document states for ``POST /api/v1/batches`` (the records do not nest recursively), with
    ``run.source`` as ingest takes it."""
    schema = Batch.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[1]])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    schema = inline(schema)
    run = schema["properties"]["run"]["anyOf"][0]
    run["properties"]["source"]["enum"] = ["tracer"]  # "bundle": import's alone (ingest_checks)
    return schema
