"""Ingest's wire schema and the store's tables: the same record shape as the tracer's TypedDicts (field by
field), and ingest's msgspec fast path accepts exactly what the pydantic schema accepts. (The tables
against the migrations: tests/test_migrations.py.)"""

from __future__ import annotations

import functools
import json
import operator
import time
from types import UnionType
from typing import Annotated, Any, Dict, Literal, NotRequired, Union, get_args, get_origin, get_type_hints

import msgspec
import pydantic
import pytest
import sqlalchemy as sa
from pydantic import BaseModel, create_model
from sqlmodel import SQLModel

from draftscope.store import models, wire_schema  # noqa: F401  (models: the store's tables)
from draftscope.store.ingest import IngestError, parse_batch
from draftscope.store.wire_schema import Batch, FastBatch
from draftscope_tracer.transport import wire
from tests.fixtures.store import make_batch, run_record, sample_record, step_record

DECODE = msgspec.json.Decoder(FastBatch)


def full_batch() -> dict:
    return make_batch("run-1", run=run_record(server_args={"tp_size": 1}),
                      requests=[{"rid": "a", "prompt_len": 3}], steps=[step_record("a", 0)],
                      samples=[sample_record(0), sample_record(1, rid=None, mean=None)],
                      health=[{"at": time.time(), "drops": {}, "errors": {}, "heartbeats": {"verify": 1},
                               "disabled_probes": []}],
                      findings=[{"rule_id": "r", "severity": "info", "message": "m"}])


def test_fast_path_decodes_like_pydantic() -> None:
    body = json.dumps(full_batch()).encode()
    assert msgspec.to_builtins(DECODE.decode(body)) == Batch.model_validate_json(body).model_dump()


@pytest.mark.parametrize("change", [
    lambda b: b["samples"][0].update(width="12288"),      # string for a number
    lambda b: b["samples"][0].update(width=1.5),          # float for an int
    lambda b: b["steps"][0].update(accept_flags=[1, 0]),  # ints for booleans
    lambda b: b["requests"][0].update(colour="red"),      # unknown field
    lambda b: b["steps"][0].pop("accept_len"),            # missing field
    lambda b: b.update(run_id=""),                        # empty id
    lambda b: b.update(batch_id="x" * 201),               # overlong id
    lambda b: b["run"].update(facts=[1]),                 # list for an object
])
def test_fast_path_rejects_what_pydantic_rejects(change) -> None:
    batch = full_batch()
    change(batch)
    body = json.dumps(batch).encode()
    with pytest.raises(msgspec.ValidationError):
        DECODE.decode(body)
    with pytest.raises(IngestError) as error:
        parse_batch(body)
    assert error.value.status == 422 and "wire schema" in error.value.message


def test_nan_literals_fall_back_to_pydantic_and_are_kept() -> None:
    body = json.dumps(make_batch("run-1", samples=[sample_record(0, l2_mean=float("nan"))])).encode()
    batch = parse_batch(body)
    assert batch.samples[0].l2_mean != batch.samples[0].l2_mean  # NaN


def test_a_plain_body_decodes_as_the_full_fast_path_does() -> None:
    body = json.dumps(full_batch()).encode()
    assert wire_schema.is_plain(body)
    plain = msgspec.json.Decoder(wire_schema.PlainFastBatch).decode(body)
    assert msgspec.to_builtins(plain) == msgspec.to_builtins(DECODE.decode(body))


@pytest.mark.parametrize("field, value", [("rid", "a\nb"), ("rid", "a\x7fb"), ("rid", "a\x1fb"),
                                          ("point", "p\x00"), ("dtype", "bf16\x00")])
def test_a_control_character_or_nul_is_refused_naming_the_field(field, value) -> None:
    """The plain decoder skips these patterns only for bodies that cannot hold such a character."""
    batch = full_batch()
    batch["samples"][0][field] = value
    body = json.dumps(batch, ensure_ascii=False).encode()  # DEL raw, the others escaped
    assert not wire_schema.is_plain(body)
    with pytest.raises(IngestError) as error:
        parse_batch(body)
    assert error.value.status == 422 and f"samples[0].{field}" in error.value.message


# --- the tracer's TypedDicts and ingest's models are one record shape -------------------------------

RECORDS = {"run": "RunRecord", "requests": "RequestRecord", "steps": "StepRecord", "samples": "SampleRecord",
           "health": "HealthRecord", "findings": "FindingRecord"}  # batch key -> record class, in batch order


def _shape(tp: Any) -> Any:
    """A comparable form of a type: ``typing.List[int]`` and ``list[int]`` alike, unions as sets, a
    limited type (``Annotated``) as its base type, a ``Literal`` of strings as ``str``."""
    args = get_args(tp)
    if get_origin(tp) is Annotated:
        return _shape(args[0])
    if get_origin(tp) is Literal:
        return functools.reduce(operator.or_, {type(a) for a in args})
    if get_origin(tp) in (Union, UnionType):
        return frozenset(_shape(a) for a in args)
    return (get_origin(tp), tuple(_shape(a) for a in args)) if args else tp


def _without_none(tp: Any) -> tuple[Any, bool]:
    """``tp`` less ``None``, and whether ``None`` was in it."""
    if get_origin(tp) in (Union, UnionType) and type(None) in get_args(tp):
        rest = [a for a in get_args(tp) if a is not type(None)]
        return functools.reduce(operator.or_, rest), True
    return tp, False


def wire_fields(record: type) -> list[tuple]:
    """(name, type, required, nullable) per field of a tracer TypedDict, in order. A field that may be
    absent (``NotRequired``) may also be null: absent fields are stored as NULL, and a bundle's records
    come back from the store with that NULL as null."""
    fields = []
    for name, tp in get_type_hints(record, include_extras=True).items():
        required = get_origin(tp) is not NotRequired
        tp, nullable = _without_none(tp if required else get_args(tp)[0])
        fields.append((name, _shape(tp), required, nullable or not required))
    return fields


def schema_fields(model: type[BaseModel]) -> list[tuple]:
    """(name, type, required, nullable) per field of an ingest model, in order."""
    fields = []
    for name, info in model.model_fields.items():
        tp, nullable = _without_none(info.annotation)
        fields.append((name, _shape(tp), info.is_required(), nullable))
    return fields


@pytest.mark.parametrize("record", sorted(set(RECORDS.values())))
def test_each_record_has_the_tracers_fields_order_types_and_nullability(record) -> None:
    assert schema_fields(getattr(wire_schema, record)) == wire_fields(getattr(wire, record))


def test_a_batch_holds_every_record_list_the_store_has_a_table_for() -> None:
    fields = wire_schema.Batch.model_fields
    assert list(fields)[:5] == ["schema_version", "batch_id", "run_id", "sent_at", "run"]
    assert list(fields)[5:] == list(wire.RECORD_TABLES) == list(RECORDS)[1:]
    assert fields["run"].annotation == wire_schema.RunRecord | None
    for key in wire.RECORD_TABLES:
        assert fields[key].annotation == list[getattr(wire_schema, RECORDS[key])], key



def test_a_field_the_tracer_adds_is_a_field_ingest_takes() -> None:
    """The records are generated from the TypedDicts: a new field arrives bounded like its kind."""
    class StepRecord(wire.StepRecord):
        retried_at: float
        retries: NotRequired[int]
        reasons: NotRequired[Dict[str, int]]

    model = wire_schema._record(StepRecord)
    assert list(model.model_fields)[-3:] == ["retried_at", "retries", "reasons"]
    step = {**step_record("a", 0), "retried_at": time.time(), "retries": 2, "reasons": {"slow": 2**40}}
    assert model.model_validate(step).retries == 2 and model.model_validate({**step, "retries": None}).retries is None
    for bad in ({"retried_at": 1.0}, {"retries": 2**31}, {"reasons": {"slow": 2**63}}, {"reasons": {"a\x00": 1}}):
        with pytest.raises(pydantic.ValidationError, match=next(iter(bad))):
            model.model_validate({**step, **bad})
    with pytest.raises(pydantic.ValidationError, match="retried_at"):
        model.model_validate(step_record("a", 0))


def test_every_bound_names_a_field_of_the_wire() -> None:
    """A bound left behind by a renamed field would bound nothing."""
    for key in wire_schema.BOUNDS:
        record, _, field = key.partition(".")
        assert field in get_type_hints(getattr(wire, record)), key
        assert get_type_hints(getattr(wire_schema, record))[field] is not None

@pytest.mark.parametrize("change", [
    lambda f: f.update(seq_pos=(float | None, None)),  # another type
    lambda f: f.update(seq_pos=(int, ...)),            # required, not nullable
    lambda f: f.update(bonus_token=(int, 0)),          # optional but not nullable
    lambda f: f.update(at=f.pop("at")),                # another order
])
def test_the_comparison_sees_each_kind_of_difference(change) -> None:
    fields = {n: (i.annotation, i if i.is_required() else i.default)
              for n, i in wire_schema.StepRecord.model_fields.items()}
    assert schema_fields(create_model("Same", **fields)) == wire_fields(wire.StepRecord)
    change(fields)
    assert schema_fields(create_model("Changed", **fields)) != wire_fields(wire.StepRecord)


COLUMN_TYPES = {str: (sa.String, sa.Text), int: (sa.Integer,), float: (sa.Float,), bool: (sa.Boolean,)}


def column_fields(table: str) -> list[tuple]:
    """(name, column type, nullable) per column of a store table, in order, less its keys (its own, its run's)."""
    return [(c.name, type(c.type), c.nullable) for c in SQLModel.metadata.tables[table].columns
            if c.name not in ("id", "run_id", "run_key") and not (table == "runs" and c.name == "key")]


def wire_columns(record: type) -> list[tuple]:
    """The columns a tracer TypedDict asks for: JSON for lists and objects, NULL where it may be absent or null."""
    return [(name, sa.JSON if isinstance(shape, tuple) else shape, nullable)
            for name, shape, _, nullable in wire_fields(record)]


@pytest.mark.parametrize("key", list(RECORDS))
def test_each_store_table_has_the_records_columns_types_and_nullability(key) -> None:
    table = "runs" if key == "run" else wire.RECORD_TABLES[key]
    got, want = column_fields(table), wire_columns(getattr(wire, RECORDS[key]))
    assert [(n, nullable) for n, _, nullable in got] == [(n, nullable) for n, _, nullable in want], table
    for (name, column, _), (_, kind, _) in zip(got, want):
        assert issubclass(column, COLUMN_TYPES.get(kind, (kind,))), f"{table}.{name}: {column.__name__} for {kind}"
