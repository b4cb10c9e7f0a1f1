"""GPU proof and benchmark of the tracer's device-side summariser (``tracer/device/summarize.py``).

Run on a CUDA machine with torch and Triton, the tracer importable as ``draftscope_tracer`` (the checkout
installed, or the GPU kit's tracer wheel on ``PYTHONPATH`` as ``testbed/gpu/runner.py`` runs it)::

    python bench/gpu_summarize.py            # results also go to $OUT/gpu_summarize.json if OUT is set
    python bench/gpu_summarize.py --sweep    # also times the Triton kernel's tunings (chunk, warps, groups)

1. Proof of no host sync: the launch (``Summarizer.compute``) is captured in ``torch.cuda.graph`` and
   replayed; the replayed bytes must equal the eager ones, and its copy out (``publish``) decode to the
   same summary. Results: the Triton path (default on CUDA) must equal the pure-torch path (top-k ids
   exactly, statistics and probabilities to 1e-5) and float64 references (every selected row:
   ``torch.topk`` ids, softmax probabilities, L2/mean/std/absmax), also on adversarial inputs (NaN,
   Inf, ties, all winners in one block, a vocabulary that is not a multiple of the block), and bf16 logits
   read in place at rows of their own must give what the float32 rows gathered give.
2. GPU microseconds per verify step at Kimi-K2.5 widths (hidden 7168, 3 aux layers, 163,840-vocab fp32
   logits, top-8), batch 1/8/64 x 4 draft tokens, for every row and for 1 request in 16 (launches queued
   behind a GPU sleep, so that host time stays out, timed by CUDA events): the Triton path as a graph
   replay with its copy out (``publish``, as ``Graphed`` runs them) and eagerly (the kernel writing its
   pinned ring slot), the torch path (graph replay and copy out), the naive device
   summary of ``/work/shared/GPU_ANCHORS.md`` and the memory floor (bytes read / measured copy bandwidth),
   all in the same run, with the Triton path's ratio to the floor and whether it meets the target: within
   3x of the floor, or 8 µs where the floor is below the launch cost, and no slower than the torch path.
   Any failed check raises; the last line says "ALL CHECKS PASSED".
3. A bf16 model's logits (every row of the step) summarised at the picked rows: gathered and made float32 before
   the launch, against read in place at their own rows (``logit_rows``), GPU µs per step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch
import triton

from draftscope_tracer.device import summarize  # needs only torch and Triton

H, K, V, N, TOPK = 7168, 3, 163_840, 4, 8
BATCHES = (1, 8, 64)
SAMPLE_EVERY = 16  # default sampling: 1 request in 16
LAUNCH_FLOOR_US = 8.0  # the target where the memory floor is below a launch's cost (issue 33)

def capture(fn) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


_A = None


def clocks_up() -> None:
    """Keep the GPU busy for ~50 ms so that its clocks are at boost, as in a serving engine."""
    global _A
    if _A is None:
        _A = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(40):
        _A @ _A


def time_us(replay, blocks: int = 30, per_block: int = 50) -> float:
    """Median over blocks of the mean time of one replay, from CUDA events (clocks at boost)."""
    clocks_up()
    for _ in range(10):
        replay()
    times = []
    for _ in range(blocks):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(per_block):
            replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / per_block)
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read and written."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = time_us(lambda: dst.copy_(src), blocks=10, per_block=5)
    del src, dst
    return 2 * (1 << 30) / (us * 1e-6)


class Naive:
    """The naive device summary of GPU_ANCHORS.md: per-op torch, full-row topk, one copy out."""

    def __init__(self, rows: torch.Tensor):
        R = rows.numel()
        self.rows = rows
        self.host = torch.empty(R * (K * 4 + 2 * TOPK), dtype=torch.float32, pin_memory=True)

    def __call__(self, hidden: torch.Tensor, logits: torch.Tensor) -> None:
        x = hidden[self.rows].float().view(-1, K, H)
        lg = logits[self.rows]
        vals, ids = torch.topk(lg, TOPK, dim=-1)
        probs = torch.exp(vals - torch.logsumexp(lg, dim=-1, keepdim=True))
        out = torch.cat([x.norm(dim=-1), x.mean(-1), x.std(-1), x.abs().amax(-1), probs, ids.float()], dim=1)
        self.host.copy_(out.view(-1), non_blocking=True)


def sampled_rows(batch: int, every: int | None) -> list[int]:
    reqs = range(batch) if every is None else range(0, batch, every)
    return [r * N + j for r in reqs for j in range(N)]


def assert_same(a, b, rel: float = 1e-5) -> None:
    """Two decoded summaries agree: rows and top-k ids exactly, floats to ``rel``, NaN where NaN."""
    assert [r.row for r in a.rows] == [r.row for r in b.rows], "rows differ"
    for ra, rb in zip(a.rows, b.rows):
        for ca, cb in zip(ra.chunks, rb.chunks):
            assert (ca.nan_count, ca.inf_count) == (cb.nan_count, cb.inf_count), (ra.row, ca, cb)
            for key in ("l2", "mean", "std", "absmax"):
                x, y = getattr(ca, key), getattr(cb, key)
                assert (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=rel, abs_tol=1e-4), \
                    (ra.row, key, x, y)
        assert (ra.topk is None) == (rb.topk is None)
        if ra.topk is not None:
            assert [i for i, _ in ra.topk] == [i for i, _ in rb.topk], (ra.row, ra.topk, rb.topk)
            assert all(math.isclose(p, q, rel_tol=rel) for (_, p), (_, q) in zip(ra.topk, rb.topk)), (ra.row,)


def check_against_reference(summary, hidden: torch.Tensor, logits: torch.Tensor | None, picked: list[int]) -> None:
    """Every selected row vs float64 statistics and torch.topk / float64 softmax."""
    rows = torch.tensor(picked, device=hidden.device)
    x = hidden[rows].double().view(len(picked), K, H)
    ref = {"l2": x.norm(dim=-1), "mean": x.mean(-1), "std": x.std(-1, correction=0), "absmax": x.abs().amax(-1)}
    ref = {k: v.tolist() for k, v in ref.items()}
    if logits is not None:
        top = torch.topk(logits[rows], TOPK, dim=-1)
        probs = torch.softmax(logits[rows].double(), -1).gather(1, top.indices).tolist()
        ids = top.indices.tolist()
    for n, r in enumerate(summary.rows):
        assert r.row == picked[n]
        for c, st in enumerate(r.chunks):
            for key in ref:
                assert math.isclose(getattr(st, key), ref[key][n][c], rel_tol=1e-4, abs_tol=1e-3), (r.row, c, key)
        if logits is not None:
            assert [i for i, _ in r.topk] == ids[n], f"row {r.row}: top-k ids differ from torch.topk"
            assert all(math.isclose(a, b, rel_tol=1e-4) for (_, a), b in zip(r.topk, probs[n])), "probabilities"


def inputs(batch: int, vocab: int = V):
    n = batch * N
    g = torch.Generator(device="cuda").manual_seed(batch)
    hidden = (torch.randn(n, K * H, device="cuda", generator=g) * 30).to(torch.bfloat16)
    logits = torch.randn(n, vocab, device="cuda", generator=g) * 4
    return hidden, logits


def measure(summ, hidden: torch.Tensor, rows: torch.Tensor, lg: torch.Tensor | None, timed: bool = True):
    """Eager launch (into the device buffer, and into a ring slot directly: the same summary), graph capture +
    replay (bytes must match), then timing: the graph replay and its copy out (``publish``), as ``Graphed`` runs
    them, and the host time of an eager launch. Returns (summary, figures)."""
    summ.compute(hidden, rows, lg)
    eager_bytes = summ.device_buffer.cpu()
    eager = summ.publish().result()
    assert summ.summarize(hidden, rows, lg).result().rows == eager.rows, "a launch into its ring slot differs"
    graph = capture(lambda: summ.compute(hidden, rows, lg))
    summ.device_buffer.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(summ.device_buffer.cpu(), eager_bytes), f"{summ.backend}: graph replay bytes differ from eager"
    assert summ.publish().result().rows == eager.rows, "decoded replay differs from eager"
    figures = {}
    if timed:
        figures["us"] = queued_us(lambda: (graph.replay(), summ.publish())[1])
        for _ in range(3):
            summ.summarize(hidden, rows, lg).result()
        t0 = time.perf_counter()
        pend = [summ.summarize(hidden, rows, lg) for _ in range(3)]
        figures["eager_host_us"] = (time.perf_counter() - t0) * 1e6 / len(pend)
        for p in pend:
            p.result()
    del graph
    return eager, figures


def make(rows: int, backend: str, with_logits: bool = True, block: int | None = None, vocab: int = V,
         ring_size: int = 4):
    return summarize.Summarizer(max_rows=rows, width=K * H, chunk_width=H, vocab_size=vocab if with_logits else None,
                                topk=TOPK, block=block, device="cuda", backend=backend, ring_size=ring_size)


def queued_us(launch, launches: int = 16, rounds: int = 7) -> float:
    """GPU time of one ``launch()`` (which returns a ``Pending``, released unread): launches queued behind a GPU
    sleep (so that host time stays out of it), CUDA events around them; median over rounds (clocks at boost)."""
    cycles = int(2e6)  # ~1 ms at the H200's clocks: longer than queueing the launches takes
    times = []
    clocks_up()
    for _ in range(3):
        launch().release()
    for _ in range(rounds):
        torch.cuda._sleep(cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        pend = [launch() for _ in range(launches)]
        end.record()
        assert all(p is not None for p in pend), "ring full: a launch was dropped"
        end.synchronize()
        for p in pend:
            p.release()
        times.append(start.elapsed_time(end) * 1000 / launches)
    return statistics.median(times)


def run_case(batch: int, every: int | None) -> dict:
    """Triton path vs torch path vs naive at one batch and sampling; all results checked."""
    hidden, logits = inputs(batch)
    picked = sampled_rows(batch, every)
    rows = torch.tensor(picked, dtype=torch.int64, device="cuda")
    fast = make(len(picked), "auto", ring_size=17)
    got, f = measure(fast, hidden, rows, logits)
    assert fast.backend == "triton" and fast.fallbacks == 0, f"Triton path not used: {fast.fallback_error}"
    direct = queued_us(lambda: fast.summarize(hidden, rows, logits))
    assert fast.last_plan() is not None, "the eager launches were not planned (direct) launches"
    slow = make(len(picked), "torch", ring_size=17)
    want, t = measure(slow, hidden, rows, logits)
    assert_same(got, want)
    check_against_reference(got, hidden, logits, picked)
    nv = Naive(rows)
    ngraph = capture(lambda: nv(hidden, logits))
    return {"batch": batch, "rows": len(picked), "sampling": "all rows" if every is None else f"1 in {every}",
            "triton_us": f["us"], "triton_eager_us": direct, "torch_us": t["us"], "naive_us": time_us(ngraph.replay),
            "triton_host_us": f["eager_host_us"], "torch_host_us": t["eager_host_us"],
            "triton_block": fast.triton_block, "tuning": dict(fast.triton_tuning),
            "bytes_read": len(picked) * (K * H * hidden.element_size() + V * 4)}


def adversarial() -> list[str]:
    """NaN/Inf, ties, all winners in one block, vocab not a multiple of the block: Triton == torch == reference."""
    done = []
    hidden, logits = inputs(2)
    hidden = hidden.float()
    hidden[1, 3] = hidden[1, 2 * H] = math.nan
    hidden[1, H + 1], hidden[1, H + 2], hidden[1, 2 * H + 7] = math.inf, -math.inf, math.inf
    rows = torch.tensor([1, 0, -1, 1], device="cuda")
    a, b = (make(4, be, with_logits=False).summarize(hidden, rows).result() for be in ("triton", "torch"))
    assert_same(a, b)
    assert [(c.nan_count, c.inf_count) for c in a.rows[0].chunks] == [(1, 0), (0, 2), (1, 1)]
    done.append("NaN/Inf counts and NaN-propagating statistics equal the torch path")

    hidden, logits = inputs(2)
    logits[0, 4096:4104] = torch.arange(8, device="cuda", dtype=torch.float32) + 50   # all top-8 in one block
    logits[1, V - 1] = 99.0                                                           # max in the last element
    logits[2] = 0.0                                                                   # all tied
    logits[3, ::3] = 30.0                                                             # many tied maxima
    rows = torch.tensor([0, 1, 2, 3], device="cuda")
    a, b = (make(4, be).summarize(hidden, rows, logits).result() for be in ("triton", "torch"))
    check_against_reference(make(2, "triton").summarize(hidden, rows[:2], logits).result(), hidden, logits, [0, 1])
    assert [i for i, _ in a.rows[2].topk] == list(range(8)) and [i for i, _ in a.rows[3].topk] == list(range(0, 24, 3))
    for ra, rb in zip(a.rows[2:], b.rows[2:]):  # ties: ids may differ from the torch path, values may not
        assert all(math.isclose(p, q, rel_tol=1e-5) for (_, p), (_, q) in zip(ra.topk, rb.topk))
    done.append("top-8 in one block, max in the last element, all-tied and many-tied rows")

    vocab = 151_936                                                                   # not a multiple of 2048
    hidden, logits = inputs(2, vocab)
    logits[0, vocab - 1] = 60.0
    rows = torch.tensor([0, 5, 7, 1], device="cuda")
    a, b = (make(4, be, vocab=vocab).summarize(hidden, rows, logits).result() for be in ("triton", "torch"))
    assert_same(a, b)
    check_against_reference(a, hidden, logits, [0, 5, 7, 1])
    done.append(f"vocab {vocab} (partial last block), winner in the last column")

    hidden, logits = inputs(2)
    logits = torch.cat([logits, logits.flip(0) * 0.5]).to(torch.bfloat16)           # 16 rows, hidden has 8
    logits[13, 4096:4104] = 60.0                                                      # tied winners in one block
    rows = torch.tensor([0, 5, -1, 7, 1], device="cuda")
    at = torch.tensor([13, 2, -1, 9, 15], device="cuda")                             # the logits' own rows
    gathered = torch.zeros(hidden.shape[0], V, device="cuda")
    gathered[rows[rows >= 0]] = logits[at[at >= 0]].float()
    for be in ("triton", "torch"):
        summ = make(5, be)
        want = summ.summarize(hidden, rows, gathered).result()
        for _ in range(3):  # the Triton path's first launch compiles, the next ones launch directly
            got = summ.summarize(hidden, rows, logits, logit_rows=at).result()
            assert_same(got, want)  # the kernel compiled for bf16 loads may sum in another order: floats to 1e-5
        assert summ.backend == be and summ.fallbacks == 0, summ.fallback_error
    assert [i for i, _ in got.rows[0].topk] == list(range(4096, 4104))
    done.append("bf16 logits read in place at rows of their own give what the float32 rows gathered give")
    return done


def variants(sweep: bool) -> list[dict]:
    """Hidden statistics alone (batch 64, 1 in 16); with ``sweep``, the Triton kernel's tunings (logits chunk,
    warps, group width, hidden slice) at batch 64 every row and at batch 1, every result checked."""
    tried = [(64, SAMPLE_EVERY, "hidden stats only", {"with_logits": False}, {})]
    if sweep:
        for batch in (64, 1):
            for block in (4096, 8192, 16384):
                for warps in (2, 4, 8):
                    for group in (16, 32):
                        tried.append((batch, None, f"chunk {block}, {warps} warps, groups of {group}",
                                      {"block": block}, {"warps": warps, "group": group}))
            for hs in (2048, 4096, 8192):
                tried.append((batch, None, f"default, hidden slice {hs}", {}, {"hidden_slice": hs}))
    out, made = [], {}
    for batch, every, name, kw, tuning in tried:
        if (batch, every) not in made:
            made[(batch, every)] = (*inputs(batch), torch.tensor(sampled_rows(batch, every), dtype=torch.int64,
                                                                 device="cuda"))
        hidden, logits, rows = made[(batch, every)]
        summ = make(rows.numel(), "auto", ring_size=17, **kw)
        summ.triton_tuning.update(tuning)
        lg = logits if kw.get("with_logits", True) else None
        got, f = measure(summ, hidden, rows, lg)
        assert summ.backend == "triton", summ.fallback_error
        check_against_reference(got, hidden, lg, rows.tolist())
        out.append({"batch": batch, "sampling": "all rows" if every is None else f"1 in {every}", "variant": name,
                    "us": f["us"], "tuning": dict(summ.triton_tuning), "block": summ.triton_block})
        print(json.dumps(out[-1]), flush=True)
    return out


def in_place() -> list[dict]:
    """A bf16 model's logits (vLLM's target at Kimi widths: every row of the step, bf16) summarised at the picked
    rows, GPU µs per step: gathered and made float32 first (``index_select`` + ``.float()`` + the launch, as the vLLM
    tracer did before ``facea7a``) against read in place (``logit_rows``), every row and 1 in 16, batch 1/8/64,
    the results equal (ids and statistics exactly, probabilities to 1e-5)."""
    out = []
    for every in (None, SAMPLE_EVERY):
        for batch in BATCHES:
            hidden, logits = inputs(batch)
            logits = logits.to(torch.bfloat16)
            picked = sampled_rows(batch, every)
            at = torch.tensor(picked, dtype=torch.int64, device="cuda")
            first = torch.arange(len(picked), dtype=torch.int64, device="cuda")
            joined = hidden.index_select(0, at)  # the verify rows' aux, gathered as the tracer gathers them
            summ = make(len(picked), "auto", ring_size=17)
            gathered = summ.summarize(joined, first, logits.index_select(0, at).float()).result()
            read = summ.summarize(joined, first, logits, logit_rows=at).result()
            assert summ.backend == "triton", summ.fallback_error
            assert_same(read, gathered)
            r = {"batch": batch, "rows": len(picked), "sampling": "all rows" if every is None else f"1 in {every}",
                 "gathered_us": queued_us(lambda: summ.summarize(joined, first, logits.index_select(0, at).float())),
                 "in_place_us": queued_us(lambda: summ.summarize(joined, first, logits, logit_rows=at))}
            out.append(r)
            print(json.dumps(r), flush=True)
    return out


def profile() -> str:
    """Per-kernel GPU times of the Triton path (batch 64, 1 in 16), from torch.profiler."""
    hidden, logits = inputs(64)
    rows = torch.tensor(sampled_rows(64, SAMPLE_EVERY), dtype=torch.int64, device="cuda")
    summ = make(rows.numel(), "auto")
    for _ in range(5):
        summ.summarize(hidden, rows, logits).result()
    clocks_up()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            summ.summarize(hidden, rows, logits).result()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=4, max_name_column_width=32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", action="store_true", help="also time the Triton kernel's tunings")
    sweep = ap.parse_args().sweep
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    torch.backends.cuda.matmul.allow_tf32 = False
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton.__version__, "command": "python bench/gpu_summarize.py" + (" --sweep" if sweep else "")}
    bw = copy_bandwidth()
    info["copy_bandwidth_TBps"] = round(bw / 1e12, 3)
    print(json.dumps(info), flush=True)
    checks = adversarial()
    for c in checks:
        print("check passed:", c, flush=True)
    cases = []
    for every in (None, SAMPLE_EVERY):
        for batch in BATCHES:
            r = run_case(batch, every)
            r["floor_us"] = r["bytes_read"] / bw * 1e6
            r["ratio"] = r["triton_us"] / r["floor_us"]
            r["target_us"] = max(3 * r["floor_us"], LAUNCH_FLOOR_US)
            r["meets"] = r["triton_us"] <= r["target_us"] and r["triton_us"] <= r["torch_us"]
            cases.append(r)
            print(json.dumps(r), flush=True)
    checks.append("every case: graph replay bytes == eager bytes; Triton == torch path; == float64/torch.topk")
    extra = variants(sweep)
    placed = in_place()
    checks.append("bf16 logits read in place == gathered and made float32, every in_place case")
    prof = profile()
    print(prof)

    print("\n| batch | rows | sampling | Triton (graph) | Triton (eager, into its slot) | torch (graph) | naive (graph) "
          "| floor | Triton / floor | target (3x floor, >= 8 µs; <= torch) | host time of one eager launch, Triton / torch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in cases:
        print(f"| {r['batch']} | {r['rows']} | {r['sampling']} | {r['triton_us']:.1f} | {r['triton_eager_us']:.1f} "
              f"| {r['torch_us']:.1f} | {r['naive_us']:.1f} | {r['floor_us']:.1f} | {r['ratio']:.1f}x "
              f"| {r['target_us']:.1f}: {'met' if r['meets'] else 'MISSED'} "
              f"| {r['triton_host_us']:.0f} / {r['torch_host_us']:.0f} |")
    for e in extra:
        print(f"batch {e['batch']}, {e['sampling']}, {e['variant']}: {e['us']:.1f} us")
    print("\n| batch | rows | sampling | bf16 logits gathered + float32 + launch | read in place (logit_rows) |")
    print("|---|---|---|---|---|")
    for r in placed:
        print(f"| {r['batch']} | {r['rows']} | {r['sampling']} | {r['gathered_us']:.1f} | {r['in_place_us']:.1f} |")
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_summarize.json").write_text(json.dumps(
            {"info": info, "cases": cases, "variants": extra, "in_place": placed, "checks": checks, "profile": prof},
            indent=1))
    print("ALL CHECKS PASSED")


if __name__ == "__main__":
    main()
