"""Which rows of a batch the hooks record (``requests.Sampled``): worked out in one pass over the batch, then kept
while the same requests run in the same order (the next hooks and iterations, and the copy of the batch SGLang hands
result processing, compare lists instead of asking every request again); a change of the batch, or of which
requests are sampled, works them out again."""

from __future__ import annotations

from draftscope_tracer.engine.sglang.requests import Sampled


class Req:
    """A request that counts how often the hooks read its id and ask whether it finished."""

    asked = 0

    def __init__(self, rid: str, finished: bool = False, retracted: bool = False):
        self._rid, self._finished, self.is_retracted = rid, finished, retracted

    @property
    def rid(self) -> str:
        Req.asked += 1
        return self._rid

    def finished(self) -> bool:
        Req.asked += 1
        return self._finished


def brute_force(reqs, live) -> list:
    return [(i, r._rid) for i, r in enumerate(reqs) if r._rid in live]


def test_the_same_requests_in_the_same_order_are_not_asked_again():
    s = Sampled(step_stride=1)
    reqs = [Req(f"r{i}") for i in range(64)]
    for i in (3, 19, 35, 51):
        s.admit(f"r{i}")
    assert s.found(reqs) == brute_force(reqs, s.live)
    Req.asked = 0
    assert s.found(list(reqs)) == brute_force(reqs, s.live)  # a copy of the batch's list: the same requests
    assert s.rows_of(reqs) == [(i, rid, 0) for i, rid in brute_force(reqs, s.live)]
    assert s.counted_rows(list(reqs)) == brute_force(reqs, s.live)
    assert Req.asked == 4  # result processing asked the four sampled requests whether they finished, no other


def test_a_changed_batch_or_sampled_set_is_worked_out_again():
    s = Sampled(step_stride=1)
    reqs = [Req(f"r{i}") for i in range(8)]
    s.admit("r1")
    s.admit("r5")
    batches = [reqs, reqs[:5], reqs[::-1], [*reqs[:5], Req("r9"), *reqs[6:]], [*reqs, Req("r8")]]
    for batch in batches:  # a finished request left, the order changed, one replaced in place, one joined
        assert s.found(batch) == brute_force(batch, s.live)
    s.admit("r8")  # sampled from now on: found at once in the same batch
    assert s.found(batches[-1]) == brute_force(batches[-1], s.live) and (8, "r8") in s.found(batches[-1])
    assert s.finish("r1") and not s.finish("r2")
    assert s.found(batches[-1]) == [(5, "r5"), (8, "r8")]


def test_result_processing_counts_the_live_sampled_requests_only():
    s = Sampled(step_stride=1)
    reqs = [Req("a"), Req("b", finished=True), Req("c", retracted=True), Req("d")]
    for rid in ("b", "c", "d"):
        s.admit(rid)
    assert s.counted_rows(reqs) == [(3, "d")]
    assert Sampled(step_stride=1).counted_rows(reqs) == []


def test_the_recorded_rows_follow_each_counted_step_and_each_change():
    for stride in (1, 2, 3):
        s = Sampled(step_stride=stride)
        reqs = [Req(f"r{i}") for i in range(8)]
        s.admit("r1")
        s.admit("r5")

        def expected(batch, back):
            return [(i, rid, s.live[rid] - back) for i, rid in brute_force(batch, s.live)
                    if s.live[rid] >= back and (s.live[rid] - back) % stride == 0]

        for n, batch in enumerate([reqs] * 5 + [reqs[::-1]] * 3 + [reqs[:4]] * 2):
            if n == 6:
                s.admit("r6")
            assert s.rows_of(batch) == expected(batch, 0)
            s.step(batch)
            assert s.rows_of(batch, back=1) == expected(batch, 1) and s.rows_of(batch) == expected(batch, 0)
        assert s.finish("r1") and s.rows_of(reqs) == expected(reqs, 0)
