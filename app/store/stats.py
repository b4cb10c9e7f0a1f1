"""Per-run aggregates, maintained as data arrives: ``update_run_stats`` folds the rows stored since
its last call into ``run_stats`` and ``run_stat_bins`` with GROUP BY queries, never reading rows
one by one; ``observation`` condenses them for the runtime findings rules.

Verify steps and tensor samples are insert-only, so each run keeps an id watermark per table and
only rows above it are aggregated. Requests are upserted, so their totals are recomputed whole (one
aggregate over the run's requests). Time and sequence-position bins double their width when a run
outgrows ``MAX_BUCKETS``, merging the buckets already stored.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from draftscope.findings import Observation, topk_gaps
from draftscope.findings.model import RequestAcceptance
from draftscope.store.tables import BATCHES, BINS, HEALTH, REQUESTS, RUNS, SAMPLES, STATS, STEPS

MAX_BUCKETS = 400  # per binned series and key; the pages re-bin to fewer
NORM_POINTS = ("target.aux[", "draft.fc.out")  # prefixes whose l2_mean is binned over time
PG_WRITE_LOCK = 0x64726166  # advisory lock: batch writers share it, the stats bound takes it alone
TIME_SERIES = ("steps.time", "steps.time_seq", "norms.time")
ORPHANS = "steps.orphan"  # a set: rids with verify steps but no request row, kept whole on each fold
RID_SEQ = "steps.rid_seq"  # per request (key) and sequence-position bin: steps, accept_len sum


def _insert(conn: sa.Connection):
    return (postgresql if conn.dialect.name == "postgresql" else sqlite).insert


def _position_flags(flags: list, parents: list | None, accept_len: int) -> list:
    """Per draft position, whether the step accepted it: a chain's flags; a tree's by depth (its accepted path
    reaches depth d, for every depth it drafted). A tree step whose shape was not read has none."""
    if parents is None:
        return flags
    depth = [0]
    for parent in parents:
        depth.append(depth[parent] + 1)
    return [d <= accept_len - 1 for d in range(1, max(depth) + 1)]


def _bucket(conn: sa.Connection, value: sa.ColumnElement, width: float) -> sa.ColumnElement:
    """floor(value / width) as an integer (values are >= 0); SQLite's CAST truncates, PG's rounds."""
    if conn.dialect.name == "postgresql":
        return sa.cast(sa.func.floor(value / width), sa.Integer)
    return sa.cast(value / width, sa.Integer)


def _run_rows(table: sa.Table, key: int | None, lo: int, hi: int) -> list[sa.ColumnElement]:
    """Rows of the run whose key is ``key`` with lo < id <= hi. The key is a value, not a subquery on
    ``runs``: PostgreSQL plans by it, so a new run's first pass reads its rows through the run_key index
    (unknown at planning, with one large run in the table, the key was taken to match every row and each
    new run's first fold scanned the whole table). Past the first pass the id range is the cheap way
    in (``run_key + 0`` keeps the planner off the run_key index, which would scan the whole run)."""
    run = table.c.run_key if lo == 0 else table.c.run_key + 0
    return [run == key, table.c.id > lo, table.c.id <= hi]


def id_bounds(conn: sa.Connection) -> tuple[int, int]:
    """The newest committed verify step and tensor sample ids. On PostgreSQL this first waits for
    the batch writers in flight (``PG_WRITE_LOCK``) so that no lower id can commit later."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(PG_WRITE_LOCK)))
    steps = conn.execute(sa.select(sa.func.coalesce(sa.func.max(STEPS.c.id), 0))).scalar_one()
    samples = conn.execute(sa.select(sa.func.coalesce(sa.func.max(SAMPLES.c.id), 0))).scalar_one()
    return steps, samples


def batch_counts(conn: sa.Connection, run_ids: list[str] | None = None) -> dict[str, tuple[int, float]]:
    """(number of stored batches, newest receipt time) per run."""
    query = sa.select(BATCHES.c.run_id, sa.func.count(), sa.func.max(BATCHES.c.received_at)) \
        .group_by(BATCHES.c.run_id)
    if run_ids is not None:
        query = query.where(BATCHES.c.run_id.in_(run_ids))
    return {r: (n, at) for r, n, at in conn.execute(query)}


def update_run_stats(engine: sa.Engine, run_id: str) -> bool:
    """Fold what arrived for ``run_id`` since the last call into its aggregates.

    The reads run outside the write transaction, so ingest is not held up; the write checks that
    the watermarks are still the ones read (another process may have folded the same rows) and
    otherwise stores nothing. Returns False when the run does not exist or another writer got
    there first.
    """
    with engine.connect() as conn:
        with conn.begin():
            if conn.execute(sa.select(RUNS.c.id).where(RUNS.c.id == run_id)).first() is None:
                return False
            batches = batch_counts(conn, [run_id]).get(run_id, (0, None))
            step_hi, sample_hi = id_bounds(conn)
        with conn.begin():
            fold, requests = _read(conn, run_id, step_hi, sample_hi)
    with engine.connect().execution_options(draftscope_write=True) as conn, conn.begin():
        return _write(conn, fold, batches, requests)


def fold_run_stats(conn: sa.Connection, run_id: str) -> bool:
    """``update_run_stats`` inside the caller's write transaction ``conn``."""
    batches = batch_counts(conn, [run_id]).get(run_id, (0, None))
    step_hi, sample_hi = id_bounds(conn)
    fold, requests = _read(conn, run_id, step_hi, sample_hi)
    return _write(conn, fold, batches, requests)


def _read(conn: sa.Connection, run_id: str, step_hi: int, sample_hi: int) -> tuple[_Fold, dict[str, Any]]:
    stats = _load(conn, run_id)
    step_hi, sample_hi = max(step_hi, stats["step_id_max"]), max(sample_hi, stats["sample_id_max"])
    fold = _Fold(conn, run_id, stats, step_hi, sample_hi)
    fold.read()
    fold.read_orphans()
    return fold, _request_totals(conn, run_id)


def _load(conn: sa.Connection, run_id: str) -> dict[str, Any]:
    row = conn.execute(sa.select(STATS).where(STATS.c.run_id == run_id)).mappings().first()
    if row is not None:
        return dict(row)
    return {"run_id": run_id, "batches_seen": 0, "last_batch_at": None, "step_id_max": 0,
            "sample_id_max": 0, "t0": None, "time_bin_s": 1.0, "seq_bin": 16, "verify_steps": 0,
            "accept_len_sum": 0, "proposed": 0, "accepted": 0, "per_position": [],
            "max_seq_pos": None, "max_seq_pos_rid": None, "max_seq_pos_step": None, "new": True}


class _Fold:
    """The aggregates of one id range of one run, read with GROUP BY (``_write`` stores them in one go)."""

    def __init__(self, conn: sa.Connection, run_id: str, stats: dict[str, Any], step_hi: int,
                 sample_hi: int):
        self.conn, self.run_id, self.old = conn, run_id, stats
        self.new = {k: v for k, v in stats.items() if k != "new"}
        key = conn.execute(sa.select(RUNS.c.key).where(RUNS.c.id == run_id)).scalar()
        self.step_where = _run_rows(STEPS, key, stats["step_id_max"], step_hi)
        self.sample_where = _run_rows(SAMPLES, key, stats["sample_id_max"], sample_hi)
        self.new.update(step_id_max=step_hi, sample_id_max=sample_hi)
        self.bins: list[dict[str, Any]] = []
        self.step_rids: set[str] = set()  # rids of the new steps
        self.orphans: set[str] | None = None  # the run's rids with steps but no request row

    def read(self) -> None:
        conn, s = self.conn, self.new
        steps = conn.execute(sa.select(sa.func.count(), sa.func.sum(STEPS.c.accept_len),
                                       sa.func.min(STEPS.c.at), sa.func.max(STEPS.c.at),
                                       sa.func.max(STEPS.c.seq_pos)).where(*self.step_where)).one()
        samples = conn.execute(sa.select(sa.func.count(), sa.func.min(SAMPLES.c.at),
                                         sa.func.max(SAMPLES.c.at)).where(*self.sample_where)).one()
        if not steps[0] and not samples[0]:
            return
        times = [t for t in (steps[2], steps[3], samples[1], samples[2]) if t is not None]
        if s["t0"] is None:
            s["t0"] = min(times)
        while (max(times) - s["t0"]) / s["time_bin_s"] >= MAX_BUCKETS:
            s["time_bin_s"] *= 2
        if steps[4] is not None:
            while steps[4] / s["seq_bin"] >= MAX_BUCKETS:
                s["seq_bin"] *= 2
        if steps[0]:
            self._steps(steps)
        if samples[0]:
            self._samples()

    def read_orphans(self) -> None:
        """The run's orphans (``ORPHANS``): the last ones and the new steps' rids, less those that
        now have a request row. Request rows are never deleted, so no other rid can be one."""
        stored = set(self.conn.execute(sa.select(BINS.c.key).where(
            BINS.c.run_id == self.run_id, BINS.c.series == ORPHANS)).scalars())
        candidates = sorted(stored | self.step_rids)
        rowed: set[str] = set()
        for i in range(0, len(candidates), 500):
            rowed.update(self.conn.execute(sa.select(REQUESTS.c.rid).where(
                REQUESTS.c.run_id == self.run_id, REQUESTS.c.rid.in_(candidates[i:i + 500]))).scalars())
        self.orphans = set(candidates) - rowed
        if self.orphans == stored:
            self.orphans = None  # unchanged: nothing to write

    def _bin(self, series: str, key: str, bucket: int, n: int, total: float = 0.0,
             lo: float | None = None, hi: float | None = None) -> None:
        self.bins.append({"run_id": self.run_id, "series": series, "key": key, "bucket": int(bucket),
                          "n": int(n), "total": float(total or 0.0), "lo": lo, "hi": hi})

    def _since_t0(self, column: sa.ColumnElement) -> sa.ColumnElement:
        t0 = self.new["t0"]
        return _bucket(self.conn, sa.case((column < t0, 0.0), else_=column - t0), self.new["time_bin_s"])

    def _steps(self, totals: sa.Row) -> None:
        conn, s, where = self.conn, self.new, self.step_where
        s["verify_steps"] += totals[0]
        s["accept_len_sum"] += int(totals[1] or 0)
        flags_text = sa.cast(STEPS.c.accept_flags, sa.Text)
        parents_text = sa.cast(STEPS.c.tree_parents, sa.Text)
        per_position = [list(p) for p in s["per_position"]]
        for text, parents, accept_len, n in conn.execute(
                sa.select(flags_text, parents_text, STEPS.c.accept_len, sa.func.count()).where(*where)
                .group_by(flags_text, parents_text, STEPS.c.accept_len)):
            flags = _position_flags(orjson.loads(text), orjson.loads(parents) if parents else None, accept_len)
            self._bin("steps.flags", text, 0, n)
            while len(per_position) < len(flags):
                per_position.append([0, 0])
            for i, flag in enumerate(flags):
                per_position[i][0] += n
                per_position[i][1] += n if flag else 0
        s["per_position"] = per_position
        s["proposed"] = sum(p for p, _ in per_position)
        s["accepted"] = s["accept_len_sum"] - s["verify_steps"]  # every step's accepted drafts, trees' too
        bucket = self._since_t0(STEPS.c.at).label("b")
        for b, n, total, seq_n, seq_total in conn.execute(
                sa.select(bucket, sa.func.count(), sa.func.sum(STEPS.c.accept_len),
                          sa.func.count(STEPS.c.seq_pos), sa.func.sum(STEPS.c.seq_pos))
                .where(*where).group_by(bucket)):
            self._bin("steps.time", "", b, n, total)
            if seq_n:  # sequence positions over time: drift is judged at like positions
                self._bin("steps.time_seq", "", b, seq_n, seq_total)
        lost = topk_gaps.lost_conditions(STEPS)
        for rid, n, total, lo, hi, *gaps in conn.execute(
                sa.select(STEPS.c.rid, sa.func.count(), sa.func.sum(STEPS.c.accept_len),
                          sa.func.min(STEPS.c.step_index), sa.func.max(STEPS.c.step_index),
                          *(sa.func.sum(sa.case((c, 1), else_=0)) for c in lost.values()))
                .where(*where).group_by(STEPS.c.rid)):
            self._bin("steps.rid", rid, 0, n, total, lo, hi)
            self.step_rids.add(rid)
            for part, k in zip(lost, gaps):
                if k:  # steps that lost part of their top-k (topk_gaps)
                    self._bin(topk_gaps.SERIES, f"{part}|{rid}", 0, k)
        seq = (STEPS.c.seq_pos // s["seq_bin"]).label("b")
        for b, n, total in conn.execute(sa.select(seq, sa.func.count(), sa.func.sum(STEPS.c.accept_len))
                                        .where(*where, STEPS.c.seq_pos.is_not(None)).group_by(seq)):
            self._bin("steps.seq_pos", "", b, n, total)
        for rid, b, n, total in conn.execute(  # per request too: decay is judged within the same requests
                sa.select(STEPS.c.rid, seq, sa.func.count(), sa.func.sum(STEPS.c.accept_len))
                .where(*where, STEPS.c.seq_pos.is_not(None)).group_by(STEPS.c.rid, seq)):
            self._bin(RID_SEQ, rid, b, n, total)
        if totals[4] is not None and (s["max_seq_pos"] is None or totals[4] > s["max_seq_pos"]):
            rid, step = conn.execute(sa.select(STEPS.c.rid, STEPS.c.step_index)
                                     .where(*where, STEPS.c.seq_pos == totals[4])
                                     .order_by(STEPS.c.id).limit(1)).one()
            s.update(max_seq_pos=totals[4], max_seq_pos_rid=rid, max_seq_pos_step=step)

    def _samples(self) -> None:
        """The new sample rows read once: widths per point and phase, ``l2_mean`` per norm point and time
        bucket, non-finite counts of the draft's logits (``_add_bins`` merges the groups' repeats)."""
        S = SAMPLES.c
        bucket = self._since_t0(S.at).label("b")
        nonfinite = sa.func.sum(sa.func.coalesce(S.nan_count, 0) + sa.func.coalesce(S.inf_count, 0))
        for point, phase, width, b, n, normed, total, lo, hi, bad in self.conn.execute(
                sa.select(S.point, S.phase, S.width, bucket, sa.func.count(), sa.func.count(S.l2_mean),
                          sa.func.sum(S.l2_mean), sa.func.min(S.l2_mean), sa.func.max(S.l2_mean), nonfinite)
                .where(*self.sample_where).group_by(S.point, S.phase, S.width, bucket)):
            self._bin("widths", f"{point}|{phase}", width, n)
            if normed and point.startswith(NORM_POINTS):
                self._bin("norms.time", point, b, normed, total, lo, hi)
            if point.startswith("draft.logits"):
                self._bin("nonfinite", point, 0, n, bad)


def _write(conn: sa.Connection, fold: _Fold, batches: tuple[int, float | None], requests: dict[str, Any]) -> bool:
    """Store ``fold`` (its bins, the run's new stats row) unless another writer moved the watermarks since it
    was read."""
    old, s, run_id = fold.old, fold.new, fold.run_id
    query = sa.select(STATS.c.step_id_max, STATS.c.sample_id_max).where(STATS.c.run_id == run_id)
    current = conn.execute(query.with_for_update() if conn.dialect.name == "postgresql" else query).first()
    if (current is None) != bool(old.get("new")) or \
            (current is not None and tuple(current) != (old["step_id_max"], old["sample_id_max"])):
        return False
    if conn.execute(sa.select(RUNS.c.id).where(RUNS.c.id == run_id)).first() is None:
        return False
    for series in TIME_SERIES:
        _rebin(conn, run_id, series, old["time_bin_s"], s["time_bin_s"])
    for series in ("steps.seq_pos", RID_SEQ):
        _rebin(conn, run_id, series, old["seq_bin"], s["seq_bin"])
    _add_bins(conn, fold.bins)
    if fold.orphans is not None:
        conn.execute(BINS.delete().where(BINS.c.run_id == run_id, BINS.c.series == ORPHANS))
        _add_bins(conn, [{"run_id": run_id, "series": ORPHANS, "key": rid, "bucket": 0,
                               "n": 0, "total": 0.0, "lo": None, "hi": None} for rid in fold.orphans])
    s.update(batches_seen=batches[0], last_batch_at=batches[1], updated_at=time.time(),
             requests_count=requests.pop("requests"), request_totals=requests,
             traced_accept_length=s["accept_len_sum"] / s["verify_steps"] if s["verify_steps"] else None,
             sglang_accept_length=requests["sglang_output_len"] / requests["sglang_verify_ct"]
             if requests["sglang_verify_ct"] else None)
    values = {k: v for k, v in s.items() if k != "run_id"}
    if current is None:
        conn.execute(STATS.insert().values(run_id=run_id, **values))
    else:
        conn.execute(STATS.update().where(STATS.c.run_id == run_id).values(**values))
    return True


def _rebin(conn: sa.Connection, run_id: str, series: str, old_width: float, width: float) -> None:
    """Merge the stored buckets of ``series`` into buckets ``width / old_width`` times wider."""
    if width == old_width:
        return
    factor = round(width / old_width)
    where = (BINS.c.run_id == run_id, BINS.c.series == series)
    rows = conn.execute(sa.select(BINS).where(*where)).mappings().all()
    conn.execute(BINS.delete().where(*where))
    _add_bins(conn, [{**r, "bucket": r["bucket"] // factor} for r in rows])


def _add_bins(conn: sa.Connection, bins: list[dict[str, Any]]) -> None:
    """Upsert ``bins``, adding counts and totals to stored buckets (and to each other)."""
    merged: dict[tuple, dict[str, Any]] = {}
    for b in bins:
        key = (b["series"], b["key"], b["bucket"])
        m = merged.get(key)
        merged[key] = dict(b) if m is None else _merge(m, b)
    if not merged:
        return
    stmt = _insert(conn)(BINS)
    c, x = BINS.c, stmt.excluded
    stmt = stmt.on_conflict_do_update(
        index_elements=["run_id", "series", "key", "bucket"],
        set_={"n": c.n + x.n, "total": c.total + x.total,
              "lo": sa.case((c.lo.is_(None), x.lo), (x.lo.is_(None), c.lo),
                            (x.lo < c.lo, x.lo), else_=c.lo),
              "hi": sa.case((c.hi.is_(None), x.hi), (x.hi.is_(None), c.hi),
                            (x.hi > c.hi, x.hi), else_=c.hi)})
    conn.execute(stmt, list(merged.values()))


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    lows = [v for v in (a["lo"], b["lo"]) if v is not None]
    highs = [v for v in (a["hi"], b["hi"]) if v is not None]
    return {**a, "n": a["n"] + b["n"], "total": a["total"] + b["total"],
            "lo": min(lows) if lows else None, "hi": max(highs) if highs else None}


def _request_totals(conn: sa.Connection, run_id: str) -> dict[str, Any]:
    """SGLang's and the tracer's per-request counters summed over the run's requests.

    ``sglang_*``: requests with SGLang's counters (``spec_verify_ct`` set); ``sampled_*``: those
    of them the tracer sampled (``sampled``), whose own counters are ``traced_*``; ``incomplete``:
    sampled requests whose traced counters disagree with SGLang's.
    """
    R = REQUESTS.c
    counted = R.spec_verify_ct.is_not(None)
    sampled = sa.and_(counted, R.sampled.is_(True))

    def total(column: sa.ColumnElement, where: sa.ColumnElement) -> sa.ColumnElement:
        return sa.func.coalesce(sa.func.sum(sa.case((where, sa.func.coalesce(column, 0)), else_=0)), 0)

    def count(where: sa.ColumnElement) -> sa.ColumnElement:
        return sa.func.coalesce(sa.func.sum(sa.case((where, 1), else_=0)), 0)

    differs = sa.or_(*(sa.and_(R[f"spec_{c}"].is_not(None), R[f"traced_{c}"].is_not(None),
                               R[f"spec_{c}"] != R[f"traced_{c}"])
                       for c in ("verify_ct", "accepted_drafts", "proposed_drafts")))
    columns = {
        "requests": sa.func.count(),
        "sglang_requests": count(counted),
        "sglang_verify_ct": total(R.spec_verify_ct, counted),
        "sglang_accepted": total(R.spec_accepted_drafts, counted),
        "sglang_proposed": total(R.spec_proposed_drafts, counted),
        "sglang_output_len": total(R.output_len, counted),
        "sampled_requests": count(sampled),
        "sampled_verify_ct": total(R.spec_verify_ct, sampled),
        "sampled_accepted": total(R.spec_accepted_drafts, sampled),
        "sampled_output_len": total(R.output_len, sampled),
        "traced_verify_ct": total(R.traced_verify_ct, sampled),
        "traced_accepted": total(R.traced_accepted_drafts, sampled),
        "traced_proposed": total(R.traced_proposed_drafts, sampled),
        "incomplete": count(sa.and_(sampled, differs)),
        "finished": count(R.finished_at.is_not(None)),
    }
    row = conn.execute(sa.select(*(c.label(k) for k, c in columns.items()))
                       .where(R.run_id == run_id)).mappings().one()
    return {k: int(v or 0) for k, v in row.items()}


BIN_FIELDS = ("key", "bucket", "n", "total", "lo", "hi")


def bins(conn: sa.Connection, run_id: str, series: str) -> list[dict[str, Any]]:
    """The stored buckets of one series of a run, by key then bucket (dicts of ``BIN_FIELDS``)."""
    query = (sa.select(*(BINS.c[f] for f in BIN_FIELDS))
             .where(BINS.c.run_id == run_id, BINS.c.series == series)
             .order_by(BINS.c.key, BINS.c.bucket))
    # rows as tuples: a RowMapping per row costs more than the query (a run page reads ~2,000 bins)
    return [dict(zip(BIN_FIELDS, row)) for row in conn.execute(query).all()]


def get_stats(conn: sa.Connection, run_id: str) -> dict[str, Any] | None:
    row = conn.execute(sa.select(STATS).where(STATS.c.run_id == run_id)).mappings().first()
    return None if row is None else dict(row)


def observation(conn: sa.Connection, run_id: str, facts: dict[str, Any] | None) -> Observation:
    """The runtime rules' Observation of a run, from its aggregates (``update_run_stats`` first)."""
    obs = Observation(facts=facts or {})
    stats = get_stats(conn, run_id)
    if stats is None:
        return obs
    widths: dict[str, set[int]] = {}
    for b in bins(conn, run_id, "widths"):
        point, _, phase = b["key"].partition("|")
        if point == "draft.input":
            widths.setdefault(phase, set()).add(b["bucket"])
        elif _aux_index(point) is not None:
            obs.aux_widths[_aux_index(point)] = max(b["bucket"], obs.aux_widths.get(_aux_index(point), 0))
        elif point == "draft.fc.out":
            obs.fc_out_samples += b["n"]
    obs.draft_input_widths = {p: sorted(w) for p, w in widths.items()}
    norms: dict[int, list[float]] = {}
    for b in bins(conn, run_id, "norms.time"):
        i = _aux_index(b["key"])
        if i is not None:
            acc = norms.setdefault(i, [0, 0.0])
            acc[0] += b["n"]
            acc[1] += b["total"]
    obs.aux_l2_mean = {i: total / n for i, (n, total) in norms.items() if n}
    for b in bins(conn, run_id, "nonfinite"):
        obs.draft_logits_samples += b["n"]
        obs.draft_logits_nonfinite += int(b["total"])
    obs.verify_steps = stats["verify_steps"]
    obs.proposed_drafts, obs.accepted_drafts = stats["proposed"], stats["accepted"]
    if stats["max_seq_pos"] is not None:
        obs.max_seq_pos = stats["max_seq_pos"]
        obs.max_seq_pos_at = (stats["max_seq_pos_rid"], stats["max_seq_pos_step"])
    totals = stats["request_totals"] or {}
    if not obs.verify_steps:  # no sampled steps: fall back on SGLang's own per-request counters
        obs.accepted_drafts = totals.get("sglang_accepted", 0)
        obs.proposed_drafts = totals.get("sglang_proposed", 0)
    obs.sampled_verify_ct = totals.get("sampled_verify_ct", 0)
    _acceptance_shape(conn, run_id, stats, obs)
    latest = conn.execute(sa.select(HEALTH.c.heartbeats, HEALTH.c.at, HEALTH.c.records_lost,
                                    HEALTH.c.requests_lost, HEALTH.c.gaps)
                          .where(HEALTH.c.run_id == run_id)
                          .order_by(HEALTH.c.at.desc(), HEALTH.c.id.desc()).limit(1)).first()
    if latest is not None:
        obs.heartbeats, obs.heartbeats_at = dict(latest[0] or {}), latest[1]
        obs.records_lost, obs.requests_lost, obs.gaps = latest[2] or 0, latest[3] or 0, latest[4] or []
    obs.first_sampled_finish = conn.execute(
        sa.select(sa.func.min(REQUESTS.c.finished_at))
        .where(REQUESTS.c.run_id == run_id, REQUESTS.c.sampled.is_(True),
               REQUESTS.c.spec_verify_ct > 0)).scalar()
    return obs


def _acceptance_shape(conn: sa.Connection, run_id: str, stats: dict[str, Any], obs: Observation) -> None:
    """Acceptance by draft position, sequence-position bin and time bin. Flags are a prefix (a
    draft position is accepted only after every earlier one), so the steps that reached position
    k are those that accepted k-1; ``accept_len`` counts the bonus token."""
    pos = stats["per_position"] or []
    obs.drafts_per_step = len(pos) or None
    obs.accept_by_position = [(pos[0][0] if i == 0 else pos[i - 1][1], pos[i][1]) for i in range(len(pos))]
    obs.accept_by_seq_bin = [(b["bucket"] * stats["seq_bin"], b["n"], int(b["total"]) - b["n"])
                             for b in bins(conn, run_id, "steps.seq_pos")]
    obs.time_origin, obs.time_bin_s = stats["t0"] or 0.0, stats["time_bin_s"]
    seq = {b["bucket"]: b["total"] / b["n"] for b in bins(conn, run_id, "steps.time_seq") if b["n"]}
    obs.accept_by_time_bin = [(b["bucket"] * stats["time_bin_s"], b["n"], int(b["total"]) - b["n"],
                               seq.get(b["bucket"], 0.0)) for b in bins(conn, run_id, "steps.time")]
    obs.accept_by_rid_seq_bin = [(b["key"], b["bucket"] * stats["seq_bin"], b["n"], int(b["total"]) - b["n"])
                                 for b in bins(conn, run_id, RID_SEQ)]
    obs.requests = _request_acceptance(conn, run_id)


def _request_acceptance(conn: sa.Connection, run_id: str) -> list[RequestAcceptance]:
    """The run's requests with verify steps (``steps.rid``) in arrival order; those without a
    request row, or without any time, are left out (nothing says when they came)."""
    R = REQUESTS.c
    rows = {rid: (at, key) for rid, at, key in conn.execute(
        sa.select(R.rid, sa.func.coalesce(R.started_at, R.finished_at), R.prompt_key)
        .where(R.run_id == run_id))}
    found = [RequestAcceptance(b["key"], rows[b["key"]][0], b["n"], int(b["total"]) - b["n"], rows[b["key"]][1])
             for b in bins(conn, run_id, "steps.rid") if b["key"] in rows and rows[b["key"]][0] is not None]
    return sorted(found, key=lambda r: (r.at, r.rid))


def _aux_index(point: str) -> int | None:
    if point.startswith("target.aux[") and point.endswith("]"):
        return int(point[len("target.aux["):-1])
    return None
