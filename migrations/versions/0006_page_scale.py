"""Pages at 100,000 requests per run: index the requests table's sort keys, keep each run's orphans
(rids with steps but no request row) as a folded set, and drop an index no query uses.

- ``ix_requests_run_*``: one page of a run's requests is read in index order, not sorted whole.
- ``steps.orphan`` rows of ``run_stat_bins``, filled here from the runs' ``steps.rid`` series; the
  refresh keeps them from then on (``draftscope.store.stats``).
- ``ix_tensor_samples_run_point``: no query reads samples by (run_id, point) since the pages read
  folded aggregates; it cost 125 bytes per verify step (14% of the store at two samples per step).
  ``ix_tensor_samples_run_rid_step`` serves reads by run.

Revision ID: 0006_page_scale
Revises: 0005_tree_parents
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_page_scale"
down_revision = "0005_tree_parents"
branch_labels = None
depends_on = None

SORT_COLUMNS = ("started_at", "finished_at", "prompt_len", "output_len", "spec_verify_ct",
                "finish_reason")
ACCEPT_LENGTH_SQL = "CAST(output_len AS FLOAT) / NULLIF(spec_verify_ct, 0)"


def upgrade() -> None:
    for column in SORT_COLUMNS:
        op.create_index(f"ix_requests_run_{column}", "requests", ["run_id", column])
    op.create_index("ix_requests_run_accept_length", "requests", ["run_id", sa.text(f"({ACCEPT_LENGTH_SQL})")])
    op.execute("INSERT INTO run_stat_bins (run_id, series, key, bucket, n, total) "
               "SELECT b.run_id, 'steps.orphan', b.key, 0, 0, 0.0 FROM run_stat_bins b "
               "WHERE b.series = 'steps.rid' AND NOT EXISTS "
               "(SELECT 1 FROM requests r WHERE r.run_id = b.run_id AND r.rid = b.key)")
    op.drop_index("ix_tensor_samples_run_point", table_name="tensor_samples", if_exists=True)


def downgrade() -> None:
    op.create_index("ix_tensor_samples_run_point", "tensor_samples", ["run_id", "point"])
    op.execute("DELETE FROM run_stat_bins WHERE series = 'steps.orphan'")
    op.drop_index("ix_requests_run_accept_length", table_name="requests")
    for column in SORT_COLUMNS:
        op.drop_index(f"ix_requests_run_{column}", table_name="requests")
