"""What a drop loses is kept by name: the requests whose finish record never reaches the store and
the time windows of the lost records, wherever the drop happens (a full queue, a failed sink)."""

from __future__ import annotations

from draftscope_tracer import health as health_mod
from draftscope_tracer.health import Health, add_gap, combined
from draftscope_tracer.transport import records
from draftscope_tracer.transport.writer import JobQueue


def test_a_dropped_batch_names_its_requests_and_its_time_window():
    h = Health()
    h.drop("summary_ring_full")  # a launch, not a record: nothing lost
    h.drop("sink_error", 3, {"requests": [{"rid": "a", "finished_at": 20.0}],
                             "steps": [{"rid": "a", "at": 12.0}, {"rid": "b", "at": 15.0}]})
    snap = h.snapshot(0)
    assert snap["drops"] == {"summary_ring_full": 1, "sink_error": 3}
    assert (snap["records_lost"], snap["requests_lost"], snap["lost_rids"]) == (3, 1, ["a"])
    assert snap["gaps"] == [[12.0, 20.0]]


def test_names_are_bounded_and_every_lost_request_counted():
    h = Health()
    rids = [f"r{i}" for i in range(health_mod.MAX_LOST_RIDS + 5)]
    h.drop("sink_error", len(rids), {"requests": [{"rid": r} for r in rids]})
    snap = h.snapshot(0)
    assert snap["requests_lost"] == len(rids) and snap["lost_rids"] == rids[:health_mod.MAX_LOST_RIDS]


def test_gaps_merge_and_stay_bounded():
    assert add_gap([[1.0, 2.0], [5.0, 6.0]], [1.5, 5.5]) == [[1.0, 6.0]]
    gaps: list = []
    for i in range(health_mod.MAX_GAPS + 3):
        gaps = add_gap(gaps, [10.0 * i, 10.0 * i + 1])
    assert len(gaps) == health_mod.MAX_GAPS and gaps[0][0] == 0.0 and gaps[-1][1] == 10.0 * (health_mod.MAX_GAPS + 2) + 1


def test_a_finish_call_dropped_at_a_full_queue_names_its_requests():
    h = Health()
    queue = JobQueue(h, max_queue_items=0, thread_name="test")
    assert not queue.submit(records.Call("finish", records.finished, ([{"rid": "x", "finished_at": 3.0}],)))
    assert not queue.submit(records.Call("verify", records.finished, ([],)))
    snap = h.snapshot(0)
    assert snap["drops"] == {"queue_full": 2} and snap["lost_rids"] == ["x"] and snap["requests_lost"] == 1


def test_the_scheduler_and_recorder_losses_add_up():
    scheduler, recorder = Health(), Health()
    scheduler.drop("queue_full", 1, {"requests": [{"rid": "s", "finished_at": 1.0}]})
    recorder.drop("sink_error", 2, {"requests": [{"rid": "r", "finished_at": 9.0}, {"rid": "q", "finished_at": 8.0}]})
    out = combined(scheduler.snapshot(0), recorder.snapshot(0))
    assert (out["records_lost"], out["requests_lost"]) == (3, 3)
    assert out["lost_rids"] == ["s", "r", "q"] and out["gaps"] == [[1.0, 1.0], [8.0, 9.0]]
