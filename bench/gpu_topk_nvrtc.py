"""Issue 33 item 1, option (a): the summary kernel's work in CUDA C++ (``bench/topk_softmax.cu``: warp shuffles,
one launch, each row split over blocks and merged by its last block), compiled at run time by NVRTC
(``torch.cuda._compile_kernel``: torch's CUDA wheels carry NVRTC, so a tracer could build it at attach). A prototype:
the logits' softmax top-k, and the hidden chunks' statistics in the same launch; not the verify's token ids.

Run on a CUDA machine, the tracer importable as ``draftscope_tracer`` (``bash bench/bench_kit.sh nvrtc``)::

    python bench/gpu_topk_nvrtc.py           # results also go to $OUT/gpu_topk_nvrtc.json if OUT is set

1. Checks, each case and tuning: the kernel's ids equal a float64 reference's best K (value descending, ties by the
   lower id: ``torch.sort(stable=True)``), its probabilities the float64 softmax's to 1e-5 relative, the hidden
   statistics float64's (counts exactly, the rest to 1e-4); unused row slots (-1) left untouched; a CUDA graph's
   replays (twice: the row tickets reset themselves) equal the eager launch; adversarial rows (every winner in one
   chunk, ties, -inf, NaN, a short last chunk). Any failure raises; the last line says "ALL CHECKS PASSED".
2. GPU µs per launch (graph replays queued behind a GPU sleep, CUDA events, median of rounds; clocks at boost):
   - the logits alone (float32 and bf16, vocabulary 163,840, top-8; 1 to 256 rows; and 64 slots with 1 or no row
     used, as the step tap's replays have) at each chunk width, against the Triton kernel on the same rows as the
     step tap runs it, the torch path (``softmax_topk``) and the floor;
   - ``bench/gpu_summarize.py``'s verify steps (hidden 3 x 7168 bf16 and float32 logits; batch 1, 8, 64, every row
     and 1 in 16) against the tracer's Triton summary (``compute``, no copy out on either side) and the floor
     (bytes of the used rows / measured copy bandwidth), with item 1's target: within 3x of the floor, or 8 µs where
     the floor is below the launch cost.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_summarize import (BATCHES, H, K, LAUNCH_FLOOR_US, SAMPLE_EVERY, capture, clocks_up,  # noqa: E402
                           copy_bandwidth, inputs, make, sampled_rows)

from draftscope_tracer.device.softmax_topk import softmax_topk  # noqa: E402
from draftscope_tracer.device.summarize import Summarizer  # noqa: E402

SOURCE = Path(__file__).with_name("topk_softmax.cu")
V, TOPK, THREADS = 163_840, 8, 256  # TOPK and THREADS as the kernel's K and THREADS
CHUNKS = (1024, 2048, 4096, 8192)  # columns per block
# (logits dtype, row slots, rows used): the verify's and the tap's row counts; the tap's 64 slots with one row or none
CASES = [(torch.float32, n, n) for n in (1, 4, 16, 32, 256)] + [(torch.bfloat16, n, n) for n in (4, 16, 256)] \
    + [(torch.float32, 64, 1), (torch.float32, 64, 0)]


class NvrtcTopk:
    """The kernel for ``slots`` row slots of ``dtype`` logits ``[n, vocab]``, ``chunk`` columns a block; with ``kc``
    > 0 also the statistics of bf16 hidden rows of ``kc`` chunks of ``hwidth``, each read in ``slices`` blocks."""

    def __init__(self, kernels: dict, dtype: torch.dtype, slots: int, vocab: int, chunk: int, kc: int = 0,
                 hwidth: int = 0, slices: int = 1):
        self.kernel, self.vocab, self.chunk = kernels[dtype], vocab, chunk
        self.chunks = -(-vocab // chunk)
        self.kc, self.hwidth, self.slices = kc, hwidth, slices
        dev = torch.device("cuda")
        parts = slots * self.chunks
        self.part_v = torch.empty(parts * TOPK, dtype=torch.float32, device=dev)
        self.part_i = torch.empty(parts * TOPK, dtype=torch.int32, device=dev)
        self.part_m = torch.empty(parts, dtype=torch.float32, device=dev)
        self.part_s = torch.empty(parts, dtype=torch.float32, device=dev)
        self.hpart = torch.empty(max(1, slots * kc * slices * 5), dtype=torch.float32, device=dev)
        self.tickets = torch.zeros(slots, dtype=torch.int32, device=dev)
        self.probs = torch.full((slots, TOPK), -2.0, device=dev)
        self.ids = torch.full((slots, TOPK), -2, dtype=torch.int64, device=dev)
        self.hstats = torch.full((slots, kc, 5), -2.0, device=dev)

    def __call__(self, logits: torch.Tensor, rows: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        vec = 16 // logits.element_size()
        assert logits.stride(1) == 1 and logits.stride(0) % vec == 0 and logits.data_ptr() % 16 == 0
        assert self.chunk % vec == 0
        if self.kc:
            assert hidden.dtype == torch.bfloat16 and hidden.stride(1) == 1 and hidden.stride(0) % 8 == 0
            assert self.hwidth % 8 == 0 and hidden.shape[1] == self.kc * self.hwidth and hidden.data_ptr() % 16 == 0
        self.kernel(grid=(self.kc * self.slices + self.chunks, rows.numel(), 1), block=(THREADS, 1, 1),
                    args=[logits, logits.stride(0), rows, self.vocab, self.chunk, self.chunks, self.part_v,
                          self.part_i, self.part_m, self.part_s, self.tickets, self.probs, self.ids,
                          self.hpart if hidden is None else hidden, 0 if hidden is None else hidden.stride(0),
                          self.hwidth, self.kc, self.slices, self.hpart, self.hstats])


class TritonTopk:
    """The tracer's summary kernel on logits rows only, as the step tap runs it (``tap_topk.TapTopk``)."""

    def __init__(self, slots: int, vocab: int):
        self.summary = Summarizer(max_rows=slots, width=8, vocab_size=vocab, topk=TOPK, ring_size=1, device="cuda")
        self.hidden = torch.zeros(1, 8, device="cuda")

    def __call__(self, logits: torch.Tensor, rows: torch.Tensor) -> None:
        self.summary.compute(self.hidden, rows, logits, logit_rows=rows)


class TorchTopk:
    """The torch path (``softmax_topk``) over the rows the slots name (-1 read as row 0, as the step tap clamps)."""

    def __init__(self, slots: int):
        self.probs = torch.empty(slots, TOPK, device="cuda")
        self.ids = torch.empty(slots, TOPK, dtype=torch.int64, device="cuda")

    def __call__(self, logits: torch.Tensor, rows: torch.Tensor) -> None:
        softmax_topk(logits.index_select(0, rows.clamp(min=0)), TOPK, out=(self.probs, self.ids))


def compile_kernels() -> dict:
    """Both kernels of ``SOURCE``, built by NVRTC for this GPU (``torch.cuda._compile_kernel``, torch 2.8 and later)."""
    if not hasattr(torch.cuda, "_compile_kernel"):
        raise SystemExit(f"torch {torch.__version__} has no torch.cuda._compile_kernel (NVRTC): torch 2.8 or later")
    src = SOURCE.read_text()
    return {dtype: torch.cuda._compile_kernel(src, name)
            for dtype, name in ((torch.float32, "topk_softmax_f32"), (torch.bfloat16, "topk_softmax_bf16"))}


def queued_us(graph: torch.cuda.CUDAGraph, launches: int = 20, rounds: int = 9) -> float:
    """GPU µs of one replay: ``launches`` replays queued behind a GPU sleep, CUDA events around them; median."""
    clocks_up()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(rounds):
        torch.cuda._sleep(int(2e6))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(launches):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / launches)
    return statistics.median(times)


def reference(logits: torch.Tensor, row: int) -> tuple:
    """Float64 best ``TOPK`` of one row (value descending, ties by the lower id) and their softmax probabilities."""
    x = logits[row].double()
    ids = torch.sort(-x, stable=True).indices[:TOPK]
    return ids.tolist(), torch.softmax(x, -1)[ids].tolist()


def check(kernel: NvrtcTopk, logits: torch.Tensor, rows: list, label: str, expected: torch.Tensor | None = None,
          run=None) -> None:
    """The kernel's results at each used slot against ``reference`` (of ``expected``, default ``logits``); unused
    slots untouched; a graph's two replays equal the eager launch. ``run``: the launch (default: the logits alone)."""
    slots = torch.tensor(rows, dtype=torch.int64, device="cuda")
    run = run or (lambda: kernel(logits, slots))
    run()
    torch.cuda.synchronize()
    probs, ids = kernel.probs.cpu(), kernel.ids.cpu()
    for y, row in enumerate(rows):
        if row < 0:
            assert (ids[y] == -2).all() and (probs[y] == -2.0).all(), f"{label}: unused slot {y} written"
            continue
        want_ids, want_p = reference(logits if expected is None else expected, row)
        assert ids[y].tolist() == want_ids, f"{label}: slot {y} (row {row}): ids {ids[y].tolist()} != {want_ids}"
        for a, b in zip(probs[y].tolist(), want_p):
            assert abs(a - b) <= 1e-5 * abs(b) + 1e-12, f"{label}: slot {y}: probability {a} != {b}"
    graph = capture(run)
    for _ in range(2):
        kernel.probs.fill_(-3.0)
        graph.replay()
        torch.cuda.synchronize()
        used = [y for y, r in enumerate(rows) if r >= 0]
        assert torch.equal(kernel.ids.cpu()[used], ids[used]), f"{label}: graph replay ids differ from eager"
        assert torch.equal(kernel.probs.cpu()[used], probs[used]), f"{label}: graph replay probabilities differ"


def adversarial(kernels: dict) -> list:
    """Rows built to break a split top-k: every winner in one chunk, ties across chunks (the lower ids win), -inf
    and NaN elements (left out), a vocabulary no chunk divides."""
    out = []
    for vocab, chunk in ((V, 4096), (V - 40, 1024), (5000, 2048)):
        lg = torch.randn(6, vocab, device="cuda") * 4
        lg[0, 100:108] = 50.0 + torch.arange(8, device="cuda")  # all in one chunk
        lg[1, :] = 1.0  # one value everywhere: ids 0..7
        lg[2, ::997] = 9.0  # ties spread over chunks
        lg[3, : vocab // 2] = float("-inf")
        lg[4, 7::13] = float("nan")
        lg[5, -3:] = 70.0  # winners in the last, short chunk
        kernel = NvrtcTopk(kernels, torch.float32, 8, vocab, chunk)
        check(kernel, lg, [0, 1, 2, 3, -1, 5, -1, -1], f"adversarial vocab {vocab} chunk {chunk}")
        without = lg.clone()
        without[without.isnan()] = float("-inf")  # the kernel leaves NaN out: its reference is the row without them
        check(NvrtcTopk(kernels, torch.float32, 1, vocab, chunk), lg, [4], f"NaN left out, vocab {vocab}", without)
        out.append(f"adversarial rows at vocabulary {vocab}, chunk {chunk}")
    return out


def run_case(kernels: dict, bw: float, dtype: torch.dtype, slots: int, used: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(slots * 31 + used)
    logits = (torch.randn(max(slots, 1) * 4, V, device="cuda", generator=g) * 4).to(dtype)
    rows = [4 * y + 1 if y < used else -1 for y in range(slots)]
    slot_t = torch.tensor(rows, dtype=torch.int64, device="cuda")
    label = f"{str(dtype).removeprefix('torch.')} logits, {slots} slots, {used} used"
    r = {"dtype": str(dtype).removeprefix("torch."), "slots": slots, "rows": used, "nvrtc_us": {}}
    for chunk in CHUNKS:
        kernel = NvrtcTopk(kernels, dtype, slots, V, chunk)
        check(kernel, logits, rows, f"{label}, chunk {chunk}")
        r["nvrtc_us"][chunk] = queued_us(capture(lambda k=kernel: k(logits, slot_t)))
    triton = TritonTopk(slots, V)
    r["triton_us"] = queued_us(capture(lambda: triton(logits, slot_t)))
    if used:
        torch_path = TorchTopk(slots)
        r["torch_us"] = queued_us(capture(lambda: torch_path(logits, slot_t)))
    r["best_chunk"] = min(r["nvrtc_us"], key=r["nvrtc_us"].get)
    r["best_us"] = r["nvrtc_us"][r["best_chunk"]]
    r["floor_us"] = used * V * logits.element_size() / bw * 1e6
    r["target_us"] = max(3 * r["floor_us"], LAUNCH_FLOOR_US)
    r["meets"] = r["best_us"] <= r["target_us"]
    return r


def check_hidden(kernel: NvrtcTopk, hidden: torch.Tensor, rows: list, label: str) -> None:
    """Each used slot's hidden chunk statistics against float64: NaN and non-finite counts exactly, sum, sum of
    squares and absmax (NaN left out) to 1e-4."""
    got = kernel.hstats.cpu()
    for y, row in enumerate(rows):
        x = hidden[row].double().view(kernel.kc, kernel.hwidth)
        want = torch.stack([x.sum(-1), x.isnan().sum(-1), (~x.isfinite()).sum(-1), (x * x).sum(-1),
                            torch.where(x.isnan(), 0.0, x.abs()).amax(-1)], -1).cpu()
        assert torch.equal(got[y, :, 1:3].double(), want[:, 1:3]), f"{label}: slot {y}: NaN / non-finite counts"
        assert torch.allclose(got[y][:, [0, 3, 4]].double(), want[:, [0, 3, 4]], rtol=1e-4, atol=1e-2, equal_nan=True), \
            f"{label}: slot {y}: statistics {got[y].tolist()} != {want.tolist()}"


def run_summary_case(kernels: dict, bw: float, batch: int, every: int | None) -> dict:
    """bench/gpu_summarize.py's verify step (hidden 3 x 7168 bf16, float32 logits of 163,840, top-8): the kernel with
    the hidden statistics in the same launch, against the tracer's Triton summary (``compute`` only, no copy out,
    on both sides), at each chunk width and 1 or 2 blocks per hidden chunk."""
    hidden, logits = inputs(batch)
    picked = sampled_rows(batch, every)
    slot_t = torch.tensor(picked, dtype=torch.int64, device="cuda")
    label = f"summary, batch {batch}, {'every row' if every is None else f'1 in {every}'}"
    r = {"batch": batch, "sampling": "every row" if every is None else f"1 in {every}", "rows": len(picked),
         "nvrtc_us": {}}
    for chunk in CHUNKS:
        for slices in (1, 2):
            kernel = NvrtcTopk(kernels, torch.float32, len(picked), V, chunk, kc=K, hwidth=H, slices=slices)
            check(kernel, logits, picked, f"{label}, chunk {chunk}, {slices} slices",
                  run=lambda k=kernel: k(logits, slot_t, hidden))
            check_hidden(kernel, hidden, picked, f"{label}, chunk {chunk}, {slices} slices")
            r["nvrtc_us"][f"{chunk}/{slices}"] = queued_us(capture(lambda k=kernel: k(logits, slot_t, hidden)))
    summ = make(len(picked), "triton")
    r["triton_us"] = queued_us(capture(lambda: summ.compute(hidden, slot_t, logits)))
    r["best"] = min(r["nvrtc_us"], key=r["nvrtc_us"].get)
    r["best_us"] = r["nvrtc_us"][r["best"]]
    r["floor_us"] = len(picked) * (K * H * hidden.element_size() + V * logits.element_size()) / bw * 1e6
    r["target_us"] = max(3 * r["floor_us"], LAUNCH_FLOOR_US)
    r["meets"] = r["best_us"] <= r["target_us"]
    return r


def main() -> None:
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "command": "python bench/gpu_topk_nvrtc.py"}
    kernels = compile_kernels()
    bw = copy_bandwidth()
    info["copy_bandwidth_TBps"] = round(bw / 1e12, 3)
    print(json.dumps(info), flush=True)
    checks = adversarial(kernels)
    for c in checks:
        print("check passed:", c, flush=True)
    cases = []
    for dtype, slots, used in CASES:
        r = run_case(kernels, bw, dtype, slots, used)
        cases.append(r)
        print(json.dumps(r), flush=True)
    checks.append("every case and chunk: ids == float64 reference (ties by id), probabilities to 1e-5, unused slots "
                  "untouched, two graph replays == eager")
    summaries = []
    for every in (None, SAMPLE_EVERY):
        for batch in BATCHES:
            r = run_summary_case(kernels, bw, batch, every)
            summaries.append(r)
            print(json.dumps(r), flush=True)
    checks.append("every summary case: the same, and the hidden statistics == float64 (counts exactly, the rest 1e-4)")
    print("\n| logits | row slots | rows used | NVRTC kernel, best chunk | its chunks: µs | Triton summary kernel "
          "| torch path | floor | target (3x floor, >= 8 µs) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in cases:
        per = ", ".join(f"{c}: {us:.1f}" for c, us in r["nvrtc_us"].items())
        torch_us = f"{r['torch_us']:.1f}" if "torch_us" in r else ""
        print(f"| {r['dtype']} | {r['slots']} | {r['rows']} | {r['best_us']:.1f} ({r['best_chunk']}) | {per} "
              f"| {r['triton_us']:.1f} | {torch_us} | {r['floor_us']:.1f} "
              f"| {r['target_us']:.1f}: {'met' if r['meets'] else 'MISSED'} |")
    print("\n| batch | rows | sampling | NVRTC summary, best (chunk/slices) | Triton summary kernel | floor "
          "| NVRTC / floor | target (3x floor, >= 8 µs) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in summaries:
        print(f"| {r['batch']} | {r['rows']} | {r['sampling']} | {r['best_us']:.1f} ({r['best']}) | {r['triton_us']:.1f} "
              f"| {r['floor_us']:.1f} | {r['best_us'] / r['floor_us']:.1f}x "
              f"| {r['target_us']:.1f}: {'met' if r['meets'] else 'MISSED'} |")
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_topk_nvrtc.json").write_text(json.dumps(
            {"info": info, "cases": cases, "summaries": summaries, "checks": checks}, indent=1))
    print("ALL CHECKS PASSED")


if __name__ == "__main__":
    main()
