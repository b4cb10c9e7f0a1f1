"""Login sessions: one row per browser logged in with the read token, so that logout revokes it on
every dashboard process of the store (``draftscope.web.sessions``).

Revision ID: 0007_login_sessions
Revises: 0006_page_scale
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_login_sessions"
down_revision = "0006_page_scale"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "login_sessions",
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_login_sessions_expires_at", "login_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_table("login_sessions")
