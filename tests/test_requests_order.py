"""The requests table's sorts read their indexes (migration 0006) and order rows as before: every
sort key, both directions, nulls last, ties by insertion, paged by offset; on SQLite and PostgreSQL."""

from __future__ import annotations

import random
import time
import uuid

import orjson
import pytest

from draftscope.store import db, queries
from draftscope.store.ingest import BatchWriter
from tests.fixtures.store import make_batch, run_record


T0 = float(int(time.time()) - 3600)  # whole seconds: ties stay ties


def _requests(n: int) -> list[dict]:
    rng, rows = random.Random(7), []
    for i in range(n):
        verify = rng.choice([None, 0, *range(1, 6)])
        rows.append({"rid": f"r{i:03d}", "sampled": True, "prompt_len": rng.randrange(3),
                     "output_len": None if verify is None else rng.randrange(12),
                     "started_at": rng.choice([None, T0 + 100.0 + rng.randrange(5)]),
                     "finished_at": T0 + 200.0 + rng.randrange(5), "spec_verify_ct": verify,
                     "finish_reason": rng.choice([None, "stop", "length"])})
    return rows


def _expected(rows: list[dict], sort: str, desc: bool) -> list[str]:
    def value(r):
        if sort != "accept_length":
            return r[sort]
        return r["output_len"] / r["spec_verify_ct"] if r["output_len"] is not None and r["spec_verify_ct"] else None
    present = sorted((r for r in rows if value(r) is not None), key=lambda r: r["rid"])  # rid order = id order
    present.sort(key=value, reverse=desc)  # stable: ties stay in id order
    return [r["rid"] for r in present] + [r["rid"] for r in rows if value(r) is None]


@pytest.fixture
def stored(store_url):
    run_id, rows = uuid.uuid4().hex, _requests(120)
    engine = db.make_engine(store_url)
    BatchWriter(engine).write(orjson.dumps(make_batch(run_id, run=run_record(), requests=rows)))
    yield engine, run_id, rows
    engine.dispose()


@pytest.mark.parametrize("sort", queries.REQUEST_SORTS)
def test_every_sort_orders_and_pages_as_before(stored, sort):
    engine, run_id, rows = stored
    with engine.connect() as conn:
        for desc in (False, True):
            pages = [queries.run_requests_page(conn, run_id, sort=sort, desc=desc, offset=o, limit=25)
                     for o in range(0, 125, 25)]
            assert all(total == 120 for _, total in pages)
            assert [r["rid"] for page, _ in pages for r in page] == _expected(rows, sort, desc), (sort, desc)


def test_accept_length_filter_and_sort_read_its_index(stored):
    engine, run_id, rows = stored
    with engine.connect() as conn:
        got, total = queries.run_requests_page(conn, run_id, accept_min=1.0, accept_max=2.0, limit=500)
        if conn.dialect.name == "sqlite":
            accept = queries.models.ACCEPT_LENGTH_SQL
            plan = " ".join(str(r) for r in conn.exec_driver_sql(
                f"EXPLAIN QUERY PLAN SELECT rid FROM requests WHERE run_id = ? "
                f"ORDER BY {accept} DESC NULLS LAST, id LIMIT 50", (run_id,)))
            assert "ix_requests_run_accept_length" in plan, plan
    want = {r["rid"] for r in rows if r["output_len"] is not None and r["spec_verify_ct"]
            and 1.0 <= r["output_len"] / r["spec_verify_ct"] <= 2.0}
    assert {r["rid"] for r in got} == want and total == len(want)
