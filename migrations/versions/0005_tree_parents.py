"""Tree drafting: each verify step's drafted nodes' parents (``verify_steps.tree_parents``; null for a chain).

Revision ID: 0005_tree_parents
Revises: 0004_gaps
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_tree_parents"
down_revision = "0004_gaps"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("verify_steps") as batch:
        batch.add_column(sa.Column("tree_parents", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("verify_steps") as batch:
        batch.drop_column("tree_parents")
