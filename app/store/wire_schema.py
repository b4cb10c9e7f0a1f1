"""Ingest's wire schema: pydantic records generated from the tracer's wire TypedDicts
(``draftscope_tracer.transport.wire``), with the dashboard's bounds on top. What ingest accepts.

Each record class has its TypedDict's fields, in order, with their types; a field that may be absent
(``NotRequired``) may be null and defaults to None (a batch's record lists to ``[]``). So a field the
tracer adds is a field ingest takes, and the store's table is checked against it (tests/test_wire_schema.py).
What the store needs beyond the wire's types is stated once, below: ``_bounded`` (by type) and ``BOUNDS``
(by field). Strict types and ``extra="forbid"``: a misspelt field or a string where a number belongs is an
error that names the field, not a silent NULL in the store. Ingest decodes with ``FastBatch``, the same
schema compiled for msgspec, and uses these models to explain what a rejected body got wrong.
"""

from __future__ import annotations

import functools
import operator
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints, is_typeddict

import msgspec
from pydantic import BaseModel, ConfigDict, Field, create_model

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
    """The constraints of one ``Annotated`` type, kept for its msgspec twin (``_fast_type``).

    ``escaped_only``: the pattern refuses only characters that a JSON string can carry as an escape
    alone (control characters, NUL) or as a raw DEL byte: a body with neither a backslash nor a DEL
    byte cannot fail it (``PlainFastBatch`` skips it)."""

    def __init__(self, escaped_only: bool = False, **limits: Any):
        self.escaped_only = escaped_only
        self.limits = limits

    def meta(self, plain: bool = False) -> msgspec.Meta:
        limits = dict(self.limits)
        limits.pop("allow_inf_nan", None)  # msgspec's ge/le refuse NaN and infinities already
        if plain and self.escaped_only:
            limits.pop("pattern")
        if "pattern" in limits:  # Python's ``$`` also matches before a final newline; ``\Z`` does not
            limits["pattern"] = limits["pattern"].removesuffix("$") + r"\Z"
        return msgspec.Meta(**limits)


def _limited(tp: Any, escaped_only: bool = False, **limits: Any) -> Any:
    return Annotated[tp, Field(**limits), _Limits(escaped_only, **limits)]


Int = _limited(int, ge=INT4[0], le=INT4[1])
JsonInt = _limited(int, ge=INT8[0], le=INT8[1])
Time = _limited(float, ge=EARLIEST, le=LATEST, allow_inf_nan=False)  # unix seconds
Text = _limited(str, pattern=r"^[^\x00]*$", escaped_only=True)  # no NUL: PostgreSQL's text cannot hold one
# Run and batch ids travel in URLs, file names and headers: a safe alphabet, bounded.
SafeId = _limited(str, min_length=1, max_length=ID_MAX, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# A request id is the engine's (a client may choose it): any printable text, no control character.
Rid = _limited(str, min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$", escaped_only=True)
PromptKey = _limited(str, pattern=r"^[0-9a-f]{16}$")  # tracer/engine/prompt_key.py

# --- the dashboard's bounds on the wire's types, in one place ------------------------------------------
BOUNDS: dict[str, Any] = {  # "Record.field": its type at ingest, in place of the wire's
    "Batch.schema_version": Literal[SUPPORTED_SCHEMA_VERSIONS],
    "Batch.batch_id": SafeId,
    "Batch.run_id": SafeId,
    "RunRecord.engine": Literal[ENGINES],
    "RunRecord.source": Literal["tracer", "bundle"],  # "bundle": written by import only (ingest_checks)
    "RunRecord.status": Literal[TRACER_STATUSES],
    "RequestRecord.prompt_key": PromptKey,
    "HealthRecord.gaps": list[list[Time]],
    "FindingRecord.severity": Literal[SEVERITIES],
}


def _bounded(tp: Any, name: str | None) -> Any:
    """The wire type ``tp`` with the store's bounds: ``name`` is the field's for a field's own value, None
    inside a list or an object. A string is ``Text`` (no NUL), ``rid`` a ``Rid``; an integer is an ``Int``
    (its column's int4), inside a list or object a ``JsonInt``; a float named ``at`` or ``*_at`` is a
    ``Time`` (unix seconds), else any float (NaN and infinities are kept: the store has null for them);
    a TypedDict is its record."""
    args = get_args(tp)
    if is_typeddict(tp):
        return _record(tp)
    if get_origin(tp) in (Union, UnionType):
        return functools.reduce(operator.or_, (_bounded(a, name) for a in args))
    if get_origin(tp) is list:
        return list[_bounded(args[0], None)]
    if get_origin(tp) is dict:
        return dict[Text, _bounded(args[1], None)]
    if tp is str:
        return Rid if name == "rid" else Text
    if tp is int:
        return Int if name else JsonInt
    if tp is float:
        return Time if name == "at" or (name or "").endswith("_at") else float
    return tp  # bool, Any, None


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=True)


@functools.cache
def _record(typed: type) -> type[BaseModel]:
    """The pydantic record of a wire TypedDict: its fields, in order, each bounded (``BOUNDS`` first)."""
    fields: dict[str, Any] = {}
    for name, tp in get_type_hints(typed, include_extras=True).items():
        absent = get_origin(tp) is wire.NotRequired
        tp = get_args(tp)[0] if absent else tp
        tp = BOUNDS.get(f"{typed.__name__}.{name}") or _bounded(tp, name)
        if not absent:
            fields[name] = (tp, ...)
        elif get_origin(tp) is list and isinstance(get_args(tp)[0], type) and issubclass(get_args(tp)[0], BaseModel):
            fields[name] = (tp, [])  # a batch's list of records
        else:
            fields[name] = (tp | None, None)
    return create_model(typed.__name__, __base__=_Record, __doc__=typed.__doc__, __module__=__name__, **fields)


RunRecord = _record(wire.RunRecord)
RequestRecord = _record(wire.RequestRecord)
StepRecord = _record(wire.StepRecord)
SampleRecord = _record(wire.SampleRecord)
HealthRecord = _record(wire.HealthRecord)
FindingRecord = _record(wire.FindingRecord)
Batch = _record(wire.Batch)


def _fast_type(annotation: Any, plain: bool) -> Any:
    """``annotation`` with every pydantic model in it replaced by its msgspec twin, and every
    ``_limited`` type by the same type under ``msgspec.Meta`` (``plain``: see ``PlainFastBatch``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _fast_struct(annotation, plain)
    args = get_args(annotation)
    if not args:
        return annotation
    if get_origin(annotation) is Annotated:
        return _with_limits(_fast_type(args[0], plain), args[1:], plain)
    fast = tuple(_fast_type(a, plain) for a in args)
    if get_origin(annotation) in (Union, UnionType):
        return functools.reduce(operator.or_, fast)
    return get_origin(annotation)[fast]


def _with_limits(tp: Any, metadata: Any, plain: bool) -> Any:
    limits = [m.meta(plain) for m in metadata if isinstance(m, _Limits)]
    return functools.reduce(lambda t, m: Annotated[t, m], limits, tp)


@functools.cache
def _fast_struct(model: type[BaseModel], plain: bool = False) -> type[msgspec.Struct]:
    """A msgspec Struct with the fields, order, defaults and limits of ``model``."""
    fields = []
    for name, info in model.model_fields.items():
        tp = _with_limits(_fast_type(info.annotation, plain), info.metadata, plain)
        if info.is_required():
            fields.append((name, tp))
        else:
            default = info.get_default(call_default_factory=True)
            fields.append((name, tp, msgspec.field(default_factory=list) if default == [] else default))
    return msgspec.defstruct(("Plain" if plain else "") + model.__name__, fields, kw_only=True,
                             forbid_unknown_fields=True)


FastBatch = _fast_struct(Batch)
"""``Batch`` compiled for msgspec: decodes and validates a body ~3x faster than pydantic.

It accepts no more than ``Batch`` does (same fields, strict types, no extra keys). Bodies it rejects
are handed to ``Batch`` for the error message, or accepted by it where msgspec is stricter (JSON
``NaN``/``Infinity`` literals).
"""

PlainFastBatch = _fast_struct(Batch, plain=True)
"""``FastBatch`` for a body with no backslash and no DEL byte (``is_plain``): ~2.5x faster again.

JSON carries a control character or NUL in a string only as an escape (a raw one is malformed JSON,
which msgspec refuses), so in such a body no string can hold one, and the patterns that refuse them
(``Text``, ``Rid``) are not run; every other limit is.
"""


def is_plain(body: bytes) -> bool:
    """No backslash and no DEL byte in ``body``: ``PlainFastBatch`` decodes it (two ``memchr``)."""
    return b"\\" not in body and b"\x7f" not in body


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
