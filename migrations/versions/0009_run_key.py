"""An integer run key (``runs.key``) in place of the 32-character run id in the two largest tables.

``verify_steps`` and ``tensor_samples`` hold 99% of a store's bytes, and the run id was in every row
and every index entry of theirs: ~190 bytes per verify step of ~790 (with its 2 samples). Their
``run_id`` becomes ``run_key``, a foreign key to ``runs.key`` (PostgreSQL: an identity column; SQLite:
assigned by the inserting writer, ``draftscope.store.models.NextRunKey``), indexed the same way.
Both tables are copied whole into their new shape, ids kept.

Revision ID: 0009_run_key
Revises: 0008_prompt_key
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_run_key"
down_revision = "0008_prompt_key"
branch_labels = None
depends_on = None

# each table's index on (run, rid, step_index): name, unique
INDEXES = {"verify_steps": ("uq_verify_steps_run_rid_step", True),
           "tensor_samples": ("ix_tensor_samples_run_rid_step", False)}


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.add_column("runs", sa.Column("key", sa.Integer(), sa.Identity(), nullable=False))
    else:  # SQLite adds a NOT NULL column only with a default; batch mode would rebuild runs (FK cascades)
        op.add_column("runs", sa.Column("key", sa.Integer(), nullable=False, server_default="0"))
        op.execute("UPDATE runs SET key = rowid")
    op.create_index("uq_runs_key", "runs", ["key"], unique=True)
    for table in INDEXES:
        _rebuild(table, "run_id", sa.Column("run_key", sa.Integer(), nullable=False),
                 sa.ForeignKeyConstraint(["run_key"], ["runs.key"], ondelete="CASCADE",
                                         name=f"{table}_run_key_fkey"),
                 "(SELECT r.key FROM runs r WHERE r.id = t.run_id)")


def downgrade() -> None:
    for table in INDEXES:
        _rebuild(table, "run_key", sa.Column("run_id", sa.String(), nullable=False),
                 sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE",
                                         name=f"{table}_run_id_fkey"),
                 "(SELECT r.id FROM runs r WHERE r.key = t.run_key)")
    op.drop_index("uq_runs_key", table_name="runs")
    op.execute("ALTER TABLE runs DROP COLUMN key")  # SQLite's own (batch mode would rebuild runs)


def _rebuild(name: str, old: str, new: sa.Column, fk: sa.ForeignKeyConstraint, value: str) -> None:
    """Copy table ``name`` into a new one whose column ``old`` is ``new`` (``value``: SQL over the old
    row ``t``), ids kept, and put it in the old one's place with its index on (``new``, rid, step_index)."""
    bind = op.get_bind()
    columns = [new if c.name == old else
               sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable, autoincrement=False)
               for c in sa.Table(name, sa.MetaData(), autoload_with=bind).columns]
    tmp = f"_{name}_0009"
    op.create_table(tmp, *columns, fk)
    names = ", ".join(c.name for c in columns)
    values = ", ".join(value if c is new else f"t.{c.name}" for c in columns)
    op.execute(f"INSERT INTO {tmp} ({names}) SELECT {values} FROM {name} t")
    if bind.dialect.name == "postgresql":  # the old table's id sequence goes on (it would go with the table)
        op.execute(f"ALTER SEQUENCE {name}_id_seq OWNED BY {tmp}.id")
        op.execute(f"ALTER TABLE {tmp} ALTER COLUMN id SET DEFAULT nextval('{name}_id_seq'::regclass)")
    op.drop_table(name)
    op.rename_table(tmp, name)
    if bind.dialect.name == "postgresql":
        op.execute(f"ALTER TABLE {name} RENAME CONSTRAINT {tmp}_pkey TO {name}_pkey")
    index, unique = INDEXES[name]
    op.create_index(index, name, [new.name, "rid", "step_index"], unique=unique)
