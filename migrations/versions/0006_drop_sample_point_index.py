"""Drop ``ix_tensor_samples_run_point``: no query reads samples by (run_id, point) since the pages
read folded aggregates (``run_stat_bins``), and the index cost 125 bytes per verify step (14% of
the store at two samples per step). ``ix_tensor_samples_run_rid_step`` serves reads by run.

Revision ID: 0006_drop_sample_point_index
Revises: 0005_tree_parents
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0006_drop_sample_point_index"
down_revision = "0005_tree_parents"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_tensor_samples_run_point", table_name="tensor_samples")


def downgrade() -> None:
    op.create_index("ix_tensor_samples_run_point", "tensor_samples", ["run_id", "point"])
