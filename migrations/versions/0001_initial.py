"""Initial store schema: runs, their records (requests, verify steps, tensor samples, tracer health,
findings) and the ingest batch ledger.

Revision ID: 0001_initial
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer(), primary_key=True)


def _run_id() -> sa.Column:
    return sa.Column("run_id", sa.String(), sa.ForeignKey("runs.id", ondelete="CASCADE"),
                     nullable=False)


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column("engine", sa.String(), nullable=False),
        sa.Column("engine_version", sa.String(), nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("host", sa.String(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("algorithm", sa.String(), nullable=True),
        sa.Column("target_path", sa.String(), nullable=True),
        sa.Column("target_arch", sa.String(), nullable=True),
        sa.Column("target_config_hash", sa.String(), nullable=True),
        sa.Column("draft_path", sa.String(), nullable=True),
        sa.Column("draft_arch", sa.String(), nullable=True),
        sa.Column("draft_config_hash", sa.String(), nullable=True),
        sa.Column("server_args", sa.JSON(), nullable=True),
        sa.Column("tracer_config", sa.JSON(), nullable=True),
        sa.Column("facts", sa.JSON(), nullable=True),
    )
    op.create_index("ix_runs_started_at", "runs", ["started_at"])

    op.create_table(
        "requests",
        _id(),
        _run_id(),
        sa.Column("rid", sa.String(), nullable=False),
        sa.Column("sampled", sa.Boolean(), nullable=True),
        sa.Column("prompt_len", sa.Integer(), nullable=True),
        sa.Column("output_len", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("finish_reason", sa.String(), nullable=True),
        sa.Column("spec_verify_ct", sa.Integer(), nullable=True),
        sa.Column("spec_accepted_drafts", sa.Integer(), nullable=True),
        sa.Column("spec_proposed_drafts", sa.Integer(), nullable=True),
        sa.Column("traced_verify_ct", sa.Integer(), nullable=True),
        sa.Column("traced_accepted_drafts", sa.Integer(), nullable=True),
        sa.Column("traced_proposed_drafts", sa.Integer(), nullable=True),
    )
    op.create_index("uq_requests_run_rid", "requests", ["run_id", "rid"], unique=True)

    op.create_table(
        "verify_steps",
        _id(),
        _run_id(),
        sa.Column("rid", sa.String(), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("seq_pos", sa.Integer(), nullable=True),
        sa.Column("drafted_tokens", sa.JSON(), nullable=False),
        sa.Column("accept_len", sa.Integer(), nullable=False),
        sa.Column("accept_flags", sa.JSON(), nullable=False),
        sa.Column("bonus_token", sa.Integer(), nullable=True),
        sa.Column("draft_topk", sa.JSON(), nullable=True),
        sa.Column("target_topk", sa.JSON(), nullable=True),
    )
    op.create_index("uq_verify_steps_run_rid_step", "verify_steps",
                    ["run_id", "rid", "step_index"], unique=True)

    op.create_table(
        "tensor_samples",
        _id(),
        _run_id(),
        sa.Column("point", sa.String(), nullable=False),
        sa.Column("phase", sa.String(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("rid", sa.String(), nullable=True),
        sa.Column("step_index", sa.Integer(), nullable=True),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("dtype", sa.String(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("l2_mean", sa.Float(), nullable=True),
        sa.Column("l2_max", sa.Float(), nullable=True),
        sa.Column("mean", sa.Float(), nullable=True),
        sa.Column("std", sa.Float(), nullable=True),
        sa.Column("absmax", sa.Float(), nullable=True),
        sa.Column("nan_count", sa.Integer(), nullable=True),
        sa.Column("inf_count", sa.Integer(), nullable=True),
        sa.Column("raw_b64", sa.Text(), nullable=True),
        sa.Column("raw_shape", sa.JSON(), nullable=True),
    )
    op.create_index("ix_tensor_samples_run_rid_step", "tensor_samples",
                    ["run_id", "rid", "step_index"])
    op.create_index("ix_tensor_samples_run_point", "tensor_samples", ["run_id", "point"])

    op.create_table(
        "tracer_health",
        _id(),
        _run_id(),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("drops", sa.JSON(), nullable=False),
        sa.Column("errors", sa.JSON(), nullable=False),
        sa.Column("heartbeats", sa.JSON(), nullable=False),
        sa.Column("disabled_probes", sa.JSON(), nullable=False),
        sa.Column("queue_depth", sa.Integer(), nullable=True),
    )
    op.create_index("ix_tracer_health_run_at", "tracer_health", ["run_id", "at"])

    op.create_table(
        "findings",
        _id(),
        _run_id(),
        sa.Column("rule_id", sa.String(), nullable=False),
        sa.Column("severity", sa.String(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("fix", sa.Text(), nullable=True),
        sa.Column("evidence", sa.JSON(), nullable=True),
        sa.Column("source", sa.String(), nullable=True),
        sa.Column("rid", sa.String(), nullable=True),
        sa.Column("first_step", sa.Integer(), nullable=True),
        sa.Column("at", sa.Float(), nullable=True),
    )
    op.create_index("ix_findings_run_id", "findings", ["run_id"])

    op.create_table(
        "ingest_batches",
        sa.Column("batch_id", sa.String(), primary_key=True),
        _run_id(),
        sa.Column("sent_at", sa.Float(), nullable=True),
        sa.Column("received_at", sa.Float(), nullable=False),
        sa.Column("request_rows", sa.Integer(), nullable=False),
        sa.Column("step_rows", sa.Integer(), nullable=False),
        sa.Column("sample_rows", sa.Integer(), nullable=False),
        sa.Column("health_rows", sa.Integer(), nullable=False),
        sa.Column("finding_rows", sa.Integer(), nullable=False),
    )
    op.create_index("ix_ingest_batches_run_id", "ingest_batches", ["run_id"])


def downgrade() -> None:
    # Dropping a table drops its indexes; children go before the runs they reference.
    for table in ("ingest_batches", "findings", "tracer_health", "tensor_samples",
                  "verify_steps", "requests", "runs"):
        op.drop_table(table)
