"""The store tables mirror the wire contract: same tables, same columns, JSON where the wire says."""

from __future__ import annotations

import sqlalchemy as sa
from sqlmodel import SQLModel

from draftscope.store import models  # noqa: F401
from draftscope_tracer.transport import wire


def test_record_tables_have_the_wire_columns() -> None:
    for table, columns in wire.TABLE_COLUMNS.items():
        stored = [c.name for c in SQLModel.metadata.tables[table].columns if c.name != "id"]
        assert stored == columns, table


def test_runs_table_has_every_run_record_field() -> None:
    stored = [c.name for c in SQLModel.metadata.tables["runs"].columns]
    assert stored == ["id", *wire.RunRecord.__annotations__, "key"]  # key: the store's own, for the large tables


def test_json_columns_are_json_and_only_those() -> None:
    for name in [*wire.TABLE_COLUMNS, "runs"]:
        for column in SQLModel.metadata.tables[name].columns:
            assert isinstance(column.type, sa.JSON) == (column.name in wire.JSON_COLUMNS), \
                f"{name}.{column.name}"
