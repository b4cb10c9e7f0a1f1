"""Bundle imports: one row per imported trace bundle (its hash, origin, manifest and run).

Revision ID: 0002_bundle_imports
Revises: 0001_initial
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_bundle_imports"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "bundle_imports",
        sa.Column("sha256", sa.String(), primary_key=True),
        sa.Column("run_id", sa.String(), sa.ForeignKey("runs.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("origin", sa.String(), nullable=False),
        sa.Column("imported_at", sa.Float(), nullable=False),
        sa.Column("manifest", sa.JSON(), nullable=False),
    )
    op.create_index("uq_bundle_imports_run_id", "bundle_imports", ["run_id"], unique=True)


def downgrade() -> None:
    op.drop_table("bundle_imports")
