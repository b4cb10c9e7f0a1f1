"""A request's prompt key (``requests.prompt_key``): equal for the same prompt within one tracer
process, so that acceptance over time compares the same prompts (tracer/engine/prompt_key.py).

Revision ID: 0008_prompt_key
Revises: 0007_login_sessions
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_prompt_key"
down_revision = "0007_login_sessions"
branch_labels = None
depends_on = None


ACCEPT_LENGTH = ("ix_requests_run_accept_length", "CAST(output_len AS FLOAT) / NULLIF(spec_verify_ct, 0)")


def upgrade() -> None:
    op.add_column("requests", sa.Column("prompt_key", sa.String(), nullable=True))


def downgrade() -> None:
    # SQLite's batch mode rebuilds the table and cannot carry the expression index across: re-made after
    op.drop_index(ACCEPT_LENGTH[0], table_name="requests")
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("prompt_key")
    op.create_index(ACCEPT_LENGTH[0], "requests", ["run_id", sa.text(f"({ACCEPT_LENGTH[1]})")])
