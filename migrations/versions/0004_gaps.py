"""What the tracer lost: tracer_health records the records and requests it dropped on their way to
the store, the ids of those requests and the time windows they came from.

New SQLite stores are created with ``auto_vacuum=INCREMENTAL`` (``draftscope.store.db.make_engine``), so
that ``draftscope prune`` gives space back in small steps; a store made before keeps the mode it was
made with until ``draftscope prune --vacuum`` rewrites it once (docs/dashboard.md, "Retention").

Revision ID: 0004_gaps
Revises: 0003_run_stats
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_gaps"
down_revision = "0003_run_stats"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tracer_health") as batch:
        batch.add_column(sa.Column("records_lost", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("requests_lost", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("lost_rids", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("gaps", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tracer_health") as batch:
        for column in ("gaps", "lost_rids", "requests_lost", "records_lost"):
            batch.drop_column(column)
