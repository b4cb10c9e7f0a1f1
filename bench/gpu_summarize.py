"""GPU proof and benchmark of the tracer's device-side summariser (``tracer/summarize.py``).

Run on a CUDA machine with only torch installed::

    python bench/gpu_summarize.py            # results also go to $OUT/gpu_summarize.json if OUT is set

1. Proof of no host sync: the launch (``Summarizer.compute`` + the non-blocking copy into pinned
   memory) is captured in ``torch.cuda.graph`` and replayed; the replayed bytes must equal the eager
   ones, and the decoded results must match ``torch.topk`` and float64 statistics.
2. Microseconds per verify step (CUDA events around blocks of graph replays, median of blocks) at
   Kimi-K2.5 widths (hidden 7168, 3 aux layers, 163,840-vocab fp32 logits, top-8), batch 1/8/64 x 4
   draft tokens, for every row and for 1 request in 16, next to the naive device summary of
   ``/work/shared/GPU_ANCHORS.md`` and the bandwidth floor (bytes read / measured copy bandwidth).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
H, K, V, N, TOPK = 7168, 3, 163_840, 4, 8
BATCHES = (1, 8, 64)
SAMPLE_EVERY = 16  # default sampling: 1 request in 16


def _load_summarize():
    """Import tracer/summarize.py as draftscope_tracer.summarize without installing the package."""
    try:
        import draftscope_tracer.summarize as mod
        return mod
    except ImportError:
        spec = importlib.util.spec_from_file_location("draftscope_tracer.summarize", ROOT / "tracer" / "summarize.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        return mod


summarize = _load_summarize()


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


def check_against_reference(summary, hidden: torch.Tensor, logits: torch.Tensor) -> None:
    """Decoded results vs torch.topk and float64 statistics on two rows."""
    for r in summary.rows[:2]:
        ref = torch.topk(logits[r.row], TOPK)
        assert [i for i, _ in r.topk] == ref.indices.tolist(), "top-k ids differ from torch.topk"
        p = torch.softmax(logits[r.row].double(), -1)[ref.indices].tolist()
        assert all(math.isclose(a, b, rel_tol=1e-4) for (_, a), b in zip(r.topk, p)), "probabilities differ"
        for c, st in enumerate(r.chunks):
            x = hidden[r.row, c * H:(c + 1) * H].double()
            for got, want in ((st.l2, x.norm()), (st.mean, x.mean()), (st.std, x.std(correction=0)),
                              (st.absmax, x.abs().max())):
                assert math.isclose(got, want.item(), rel_tol=1e-4, abs_tol=1e-3), (r.row, c, got, want.item())


def run_case(batch: int, every: int | None, block: int | None = None, with_logits: bool = True,
             naive: bool = True, check: bool = True) -> dict:
    n = batch * N
    g = torch.Generator(device="cuda").manual_seed(batch)
    hidden = (torch.randn(n, K * H, device="cuda", generator=g) * 30).to(torch.bfloat16)
    logits = torch.randn(n, V, device="cuda", generator=g) * 4
    picked = sampled_rows(batch, every)
    rows = torch.tensor(picked, dtype=torch.int64, device="cuda")
    summ = summarize.Summarizer(max_rows=len(picked), width=K * H, chunk_width=H,
                                vocab_size=V if with_logits else None, topk=TOPK, block=block, device="cuda")
    lg = logits if with_logits else None
    eager = summ.summarize(hidden, rows, lg).result()
    eager_bytes = summ.device_buffer.cpu()

    pinned = torch.empty(summ.nbytes, dtype=torch.uint8, pin_memory=True)

    def launch():
        summ.compute(hidden, rows, lg)
        pinned.copy_(summ.device_buffer, non_blocking=True)

    summ.device_buffer.zero_()
    graph = capture(launch)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(pinned, eager_bytes), "graph replay bytes differ from the eager launch"
    assert summ.publish().result().rows == eager.rows, "decoded replay differs from eager"
    if check and with_logits:
        check_against_reference(eager, hidden, logits)
    result = {"batch": batch, "rows": len(picked), "block": getattr(summ, "block", None),
              "summarize_us": time_us(graph.replay)}

    # Host cost of one eager launch (Python + kernel launches on the scheduler thread).
    for _ in range(3):
        summ.summarize(hidden, rows, lg).result()
    t0 = time.perf_counter()
    pend = [summ.summarize(hidden, rows, lg) for _ in range(3)]
    result["eager_host_us"] = (time.perf_counter() - t0) * 1e6 / len(pend)
    for p in pend:
        p.result()

    if naive:
        nv = Naive(rows)
        ngraph = capture(lambda: nv(hidden, logits))
        result["naive_us"] = time_us(ngraph.replay)
    result["bytes_read"] = len(picked) * (K * H * hidden.element_size() + (V * 4 if with_logits else 0))
    del graph
    return result


def profile(batch: int = 64, every: int = SAMPLE_EVERY) -> None:
    """Per-kernel GPU times of one eager launch (torch.profiler), to see where the time goes."""
    n, picked = batch * N, sampled_rows(batch, every)
    hidden = torch.randn(n, K * H, device="cuda").to(torch.bfloat16)
    logits = torch.randn(n, V, device="cuda")
    rows = torch.tensor(picked, dtype=torch.int64, device="cuda")
    summ = summarize.Summarizer(max_rows=len(picked), width=K * H, chunk_width=H, vocab_size=V, device="cuda")
    for _ in range(5):
        summ.summarize(hidden, rows, logits).result()
    clocks_up()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            summ.compute(hidden, rows, logits)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=70))


def main() -> None:
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    if "--profile" in sys.argv:
        profile()
    torch.backends.cuda.matmul.allow_tf32 = False
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "command": "python bench/gpu_summarize.py"}
    bw = copy_bandwidth()
    info["copy_bandwidth_TBps"] = round(bw / 1e12, 3)
    print(json.dumps(info))
    cases = []
    for every in (None, SAMPLE_EVERY):
        for batch in BATCHES:
            r = run_case(batch, every)
            r["sampling"] = "all rows" if every is None else f"1 in {every}"
            r["floor_us"] = r["bytes_read"] / bw * 1e6
            cases.append(r)
            print(json.dumps(r), flush=True)
    # Where the time goes (batch 64, default sampling): hidden statistics alone, and block widths.
    extra = [dict(run_case(64, SAMPLE_EVERY, with_logits=False, naive=False), variant="hidden stats only")]
    for block in (128, 160, 512, 1024):
        extra.append(dict(run_case(64, SAMPLE_EVERY, block=block, naive=False, check=False),
                          variant=f"block {block}"))
    for e in extra:
        print(json.dumps(e), flush=True)

    print("\n| batch | rows | sampling | summarise (graph) | naive (graph) | floor | eager host launch |")
    print("|---|---|---|---|---|---|---|")
    for r in cases:
        print(f"| {r['batch']} | {r['rows']} | {r['sampling']} | {r['summarize_us']:.1f} | {r['naive_us']:.1f} "
              f"| {r['floor_us']:.1f} | {r['eager_host_us']:.0f} |")
    for e in extra:
        print(f"batch 64, 1 in 16, {e['variant']}: {e['summarize_us']:.1f} us")
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_summarize.json").write_text(json.dumps({"info": info, "cases": cases, "variants": extra},
                                                              indent=1))


if __name__ == "__main__":
    main()
