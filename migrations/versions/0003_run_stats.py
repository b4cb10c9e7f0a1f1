"""Per-run aggregates maintained on arrival (run_stats, run_stat_bins); ingest_batches indexed by
receipt time so that new batches are found cheaply.

Revision ID: 0003_run_stats
Revises: 0002_bundle_imports
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_run_stats"
down_revision = "0002_bundle_imports"
branch_labels = None
depends_on = None


def _run_id(primary_key: bool) -> sa.Column:
    return sa.Column("run_id", sa.String(), sa.ForeignKey("runs.id", ondelete="CASCADE"),
                     primary_key=primary_key, nullable=False)


def upgrade() -> None:
    op.create_table(
        "run_stats",
        _run_id(True),
        sa.Column("batches_seen", sa.Integer(), nullable=False),
        sa.Column("last_batch_at", sa.Float(), nullable=True),
        sa.Column("step_id_max", sa.Integer(), nullable=False),
        sa.Column("sample_id_max", sa.Integer(), nullable=False),
        sa.Column("t0", sa.Float(), nullable=True),
        sa.Column("time_bin_s", sa.Float(), nullable=False),
        sa.Column("seq_bin", sa.Integer(), nullable=False),
        sa.Column("verify_steps", sa.Integer(), nullable=False),
        sa.Column("accept_len_sum", sa.Integer(), nullable=False),
        sa.Column("proposed", sa.Integer(), nullable=False),
        sa.Column("accepted", sa.Integer(), nullable=False),
        sa.Column("per_position", sa.JSON(), nullable=False),
        sa.Column("max_seq_pos", sa.Integer(), nullable=True),
        sa.Column("max_seq_pos_rid", sa.String(), nullable=True),
        sa.Column("max_seq_pos_step", sa.Integer(), nullable=True),
        sa.Column("traced_accept_length", sa.Float(), nullable=True),
        sa.Column("sglang_accept_length", sa.Float(), nullable=True),
        sa.Column("requests_count", sa.Integer(), nullable=False),
        sa.Column("request_totals", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=True),
    )
    op.create_table(
        "run_stat_bins",
        _run_id(True),
        sa.Column("series", sa.String(), primary_key=True),
        sa.Column("key", sa.String(), primary_key=True),
        sa.Column("bucket", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("total", sa.Float(), nullable=False),
        sa.Column("lo", sa.Float(), nullable=True),
        sa.Column("hi", sa.Float(), nullable=True),
    )
    with op.batch_alter_table("ingest_batches") as batch:
        batch.drop_index("ix_ingest_batches_run_id")
        batch.create_index("ix_ingest_batches_run_received", ["run_id", "received_at"])
        batch.create_index("ix_ingest_batches_received_at", ["received_at"])


def downgrade() -> None:
    with op.batch_alter_table("ingest_batches") as batch:
        batch.drop_index("ix_ingest_batches_received_at")
        batch.drop_index("ix_ingest_batches_run_received")
        batch.create_index("ix_ingest_batches_run_id", ["run_id"])
    op.drop_table("run_stat_bins")
    op.drop_table("run_stats")
