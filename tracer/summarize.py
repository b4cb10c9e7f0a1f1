"""Device-side summaries of one verify step, read back without stalling the GPU.

A :class:`Summarizer` turns the tensors of one verify step into a few hundred numbers **on the
device** and brings them to the host with one non-blocking copy:

* ``hidden [n, K*H]`` (any float dtype; bf16 in SGLang): for every selected row and every aux chunk
  of width ``H``: L2 norm, mean, std, absmax, NaN and Inf counts, computed in fp32;
* ``logits [n, V]`` (optional, fp32 target logits): top-k token ids and their softmax probabilities
  over the full row (two-stage top-k: block maxima first, then top-k over the best blocks);
* ``draft_probs [m, kd]`` + ``draft_ids [m, kd]`` (optional, e.g. SGLang's ``topk_p`` /
  ``topk_index``): the selected rows, with ids mapped to target ids through ``hot_token_id``.

Rows are chosen by ``rows``, an int64 tensor on the tensors' device of fixed length ``max_rows``
(pad with ``-1``): its shape never depends on data, so a launch can be captured in a CUDA graph.
Nothing on the launch path synchronises with the host (no ``.item()``, ``.tolist()``, ``.cpu()``).
The results land in one device buffer, one ``non_blocking`` copy moves it into a pinned host buffer
taken from a ring, and a CUDA event marks completion. :class:`Pending` is the handle: a background
thread calls :meth:`Pending.result` (waits on the event, decodes plain Python numbers, frees the
ring slot). When every slot is still unread, a launch is **dropped** (counted in
:attr:`Summarizer.drops`) instead of blocking. CPU tensors work the same way (no pinning, no
events), which is what the tests use.

On CUDA, when ``triton`` imports (it ships with SGLang), three Triton kernels compute everything
(per row and chunk statistics in one fp32 pass; per-block logits max / exp-sum / top-k candidates;
final top-k and softmax): about 33-40 us per verify step at batch 64 with 1 request in 16 sampled on
an H200. Otherwise, and after any Triton failure (counted in :attr:`Summarizer.fallbacks`, never
raised), a per-op torch path computes the same results. ``backend="torch"`` forces that path.

One thread launches (the scheduler's); any one other thread may read each ``Pending``. Launches
must be issued on the stream that produced the tensors (``torch.cuda.current_stream()``).

Usage::

    from draftscope_tracer.summarize import Summarizer

    summ = Summarizer(max_rows=16, width=3 * 7168, chunk_width=7168, vocab_size=163840,
                      device="cuda")                      # once, at attach time
    rows = torch.full((16,), -1, dtype=torch.int64, device="cuda")   # static, graph-safe
    rows[:8].copy_(sampled_rows_cpu, non_blocking=True)   # e.g. rows of 2 sampled requests x N=4

    pending = summ.summarize(logits_output.hidden_states, rows,
                             logits=logits_output.next_token_logits, tag=("rid-a", 17))
    if pending is not None:                               # None: ring full, counted in summ.drops
        queue.put(pending)

    # another thread (in the tracer: the relay, which pickles it for the recorder process)
    s = queue.get().result()                              # blocks only this thread
    s.tag                                                 # ("rid-a", 17)
    s.rows[0].row, s.rows[0].chunks[2].l2, s.rows[0].topk[0]   # 0, 381.2, (13, 0.91)
    s.sample(chunk=0, rows=[0, 1, 2, 3])   # -> SampleRecord statistics over those rows

For CUDA-graph taps, run one eager launch first (Triton compiles on first use), then capture
:meth:`Summarizer.compute` inside the graph and call
:meth:`Summarizer.publish` after each replay (it copies the device buffer out and records the event).
``bench/gpu_summarize.py`` does this on a GPU and measures it; ``docs/benchmarks.md`` has the figures.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Optional

import torch

from .stats import ChunkStats, DraftRow, RowSummary, Summary, Resolved

try:  # Triton ships with every SGLang GPU install; without it the pure-torch path runs.
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - any import failure only disables the fast path
    triton = None

# Per (row, chunk) sums as stored on the device (float32), in this order.
_SUMS = ("sum", "nan", "nonfinite", "sumsq")

if triton is not None:
    @triton.jit
    def _hidden_stats_kernel(hidden, stride_row, n_rows, rows, rows_out, sums, absmax,
                             R, K, H, BLOCK_H: tl.constexpr):
        """Program (r, c): chunk c of selected row r in one fp32 pass; also copies rows[r] out."""
        r = tl.program_id(0)
        c = tl.program_id(1)
        row = tl.load(rows + r)
        if c == 0:
            tl.store(rows_out + r, row)
        row = tl.minimum(tl.maximum(row, 0), n_rows - 1)
        base = hidden + row * stride_row + c * H
        acc_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc_sq = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc_nan = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc_inf = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc_max = tl.zeros([BLOCK_H], dtype=tl.float32)
        for start in range(0, H, BLOCK_H):
            offs = start + tl.arange(0, BLOCK_H)
            x = tl.load(base + offs, mask=offs < H, other=0.0).to(tl.float32)
            is_nan = x != x
            ax = tl.abs(x)
            acc_sum += x
            acc_sq += x * x
            acc_nan += is_nan.to(tl.float32)
            acc_inf += (ax == float("inf")).to(tl.float32)
            acc_max = tl.maximum(acc_max, tl.where(is_nan, 0.0, ax))
        nan = tl.sum(acc_nan, axis=0)
        out = r * K + c
        plane = R * K
        tl.store(sums + out, tl.sum(acc_sum, axis=0))
        tl.store(sums + plane + out, nan)
        tl.store(sums + 2 * plane + out, nan + tl.sum(acc_inf, axis=0))
        tl.store(sums + 3 * plane + out, tl.sum(acc_sq, axis=0))
        tl.store(absmax + out, tl.where(nan > 0, float("nan"), tl.max(acc_max, axis=0)))

    @triton.jit
    def _logits_block_kernel(logits, stride_row, n_rows, rows, bmax, bsum, cand_val, cand_id,
                             V, NB, TOPK: tl.constexpr, BLOCK_V: tl.constexpr):
        """Program (r, b): max, sum of exp(x - max) and the top-TOPK (value, id) of one block of a row."""
        r = tl.program_id(0)
        b = tl.program_id(1)
        row = tl.minimum(tl.maximum(tl.load(rows + r), 0), n_rows - 1)
        idx = tl.arange(0, BLOCK_V)
        offs = b * BLOCK_V + idx
        x = tl.load(logits + row * stride_row + offs, mask=offs < V, other=float("-inf"))
        m = tl.max(x, axis=0)
        s = tl.where(m == float("-inf"), 0.0, tl.sum(tl.exp(x - m), axis=0))
        tl.store(bmax + r * NB + b, m)
        tl.store(bsum + r * NB + b, s)
        out = (r * NB + b) * TOPK
        for j in tl.static_range(TOPK):
            v, i = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
            tl.store(cand_val + out + j, v)
            tl.store(cand_id + out + j, b * BLOCK_V + i)
            x = tl.where(idx == i, float("-inf"), x)

    @triton.jit
    def _logits_final_kernel(bmax, bsum, cand_val, cand_id, topk_p, topk_id,
                             NB, TOPK: tl.constexpr, NB_P2: tl.constexpr, NC_P2: tl.constexpr):
        """Program r: row max and softmax denominator from the blocks; final top-TOPK, best first."""
        r = tl.program_id(0)
        ob = tl.arange(0, NB_P2)
        bm = tl.load(bmax + r * NB + ob, mask=ob < NB, other=float("-inf"))
        bs = tl.load(bsum + r * NB + ob, mask=ob < NB, other=0.0)
        m = tl.max(bm, axis=0)
        denom = tl.sum(tl.where(bm > float("-inf"), bs * tl.exp(bm - m), 0.0), axis=0)
        oc = tl.arange(0, NC_P2)
        nc = NB * TOPK
        cv = tl.load(cand_val + r * nc + oc, mask=oc < nc, other=float("-inf"))
        ci = tl.load(cand_id + r * nc + oc, mask=oc < nc, other=0)
        for j in tl.static_range(TOPK):
            v, i = tl.max(cv, axis=0, return_indices=True, return_indices_tie_break_left=True)
            tok = tl.sum(tl.where(oc == i, ci, 0), axis=0)
            tl.store(topk_id + r * TOPK + j, tok.to(tl.int64))
            tl.store(topk_p + r * TOPK + j, tl.exp(v - m) / denom)
            cv = tl.where(oc == i, float("-inf"), cv)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class Pending:
    """Handle of one launch: wait for it and decode it on a background thread."""

    def __init__(self, owner: "Summarizer", slot: int, event: Optional["torch.cuda.Event"], tag: Any):
        self._owner, self._slot, self._event, self.tag = owner, slot, event, tag
        self._summary: Optional[Summary] = None
        self._lock = threading.Lock()

    def __reduce__(self):
        """Pickled (for the recorder process) as its decoded summary: waits for the copy first."""
        return Resolved, (self.result(),)

    def ready(self) -> bool:
        """True once the host buffer holds the results (never blocks)."""
        return self._summary is not None or self._event is None or self._event.query()

    def result(self) -> Summary:
        """Wait for the copy, decode it, free the ring slot. Idempotent; blocks the calling thread only."""
        with self._lock:
            if self._summary is None:
                if self._slot is None:
                    raise RuntimeError("this Pending was released without being read")
                if self._event is not None:
                    self._event.synchronize()
                self._summary = self._owner._decode(self._slot, self.tag)
                self._owner._release(self._slot)
                self._slot = None
            return self._summary

    def release(self) -> None:
        """Free the ring slot without decoding (e.g. at shutdown). Safe to call more than once."""
        with self._lock:
            if self._slot is not None and self._summary is None:
                if self._event is not None:
                    self._event.synchronize()
                self._owner._release(self._slot)
                self._slot = None


def _pick_block(vocab: int, k: int) -> int:
    """Block width for the two-stage top-k: a divisor of ``vocab`` near 2 * sqrt(vocab / k) if any.

    Both stages then run top-k over a few hundred to a few thousand values per row, where
    ``torch.topk`` is fastest (measured in bench/gpu_summarize.py).
    """
    target = 2 * math.sqrt(vocab / k)
    divisors = [d for d in range(64, min(vocab, 8192) + 1) if vocab % d == 0]
    if divisors:
        return min(divisors, key=lambda d: abs(math.log(d / target)))
    return max(1, 1 << round(math.log2(target)))


class Summarizer:
    """Preallocated device/host buffers and the fused summary kernels for one tensor layout.

    Args:
        max_rows: capacity ``R`` of ``rows`` (and of ``draft_rows`` unless ``max_draft_rows``).
        width: width of ``hidden`` (``K * chunk_width``).
        chunk_width: aux chunk width ``H`` (default: ``width``, one chunk). Must divide ``width``.
        vocab_size: width ``V`` of ``logits``; ``None`` when no logits are summarised.
        topk: entries kept per logits row (8).
        draft_k: entries per row of the draft top-k inputs; 0 when there are none.
        max_draft_rows: capacity of ``draft_rows`` (default ``max_rows``).
        ring_size: pinned host buffers in the ring (reads in flight before launches drop).
        block: block width of the two-stage top-k (default: chosen from ``vocab_size`` per path;
            the Triton path rounds it up to a power of two).
        device: device of the tensors that will be summarised.
        backend: ``"auto"`` (Triton kernels on CUDA when ``triton`` imports, else torch),
            ``"torch"`` (the per-op torch path), or ``"triton"`` (Triton kernels on any device;
            on CPU only under ``TRITON_INTERPRET=1``, which the tests use).

    The Triton path is three kernels (hidden statistics; per-block logits max / exp-sum / top-k;
    final top-k and softmax). Any failure in it is counted in :attr:`fallbacks` (reason in
    :attr:`fallback_error`) and the torch path computes that launch and every later one; it never
    raises. Run one launch eagerly before capturing a CUDA graph (Triton compiles on first use).
    """

    def __init__(self, *, max_rows: int, width: int, chunk_width: Optional[int] = None,
                 vocab_size: Optional[int] = None, topk: int = 8, draft_k: int = 0,
                 max_draft_rows: Optional[int] = None, ring_size: int = 4,
                 block: Optional[int] = None, device: torch.device | str = "cpu", backend: str = "auto"):
        chunk_width = width if chunk_width is None else chunk_width
        if max_rows < 1 or width < 1 or chunk_width < 1 or width % chunk_width:
            raise ValueError(f"need max_rows >= 1 and chunk_width dividing width; got max_rows={max_rows}, "
                             f"width={width}, chunk_width={chunk_width}")
        if vocab_size is not None and not 1 <= topk <= vocab_size:
            raise ValueError(f"topk={topk} must be between 1 and vocab_size={vocab_size}")
        if ring_size < 1 or draft_k < 0:
            raise ValueError(f"need ring_size >= 1 and draft_k >= 0; got {ring_size}, {draft_k}")
        if backend not in ("auto", "torch", "triton"):
            raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
        if backend == "triton" and triton is None:
            raise ValueError("backend='triton' needs the triton package; install it or use backend='auto'")
        self.device = torch.device(device)
        self.max_rows, self.width, self.chunk_width = max_rows, width, chunk_width
        self.num_chunks = width // chunk_width
        self.vocab_size, self.topk, self.draft_k = vocab_size, topk, draft_k
        self.max_draft_rows = max_rows if max_draft_rows is None else max_draft_rows
        self.drops = 0  # launches refused because every ring slot was still unread
        self.launches = 0
        self.fallbacks = 0  # launches the torch path computed because the Triton path could not
        self.fallback_error: Optional[str] = None
        self._block_arg = block
        R, K, dev = max_rows, self.num_chunks, self.device

        # One byte buffer; typed views onto 8-byte-aligned regions of it.
        fields: list[tuple[str, torch.dtype, tuple[int, ...]]] = [
            ("rows", torch.int64, (R,)), ("sums", torch.float32, (len(_SUMS), R, K)),
            ("absmax", torch.float32, (R, K))]
        if vocab_size is not None:
            fields += [("topk_p", torch.float32, (R, topk)), ("topk_id", torch.int64, (R, topk))]
        if draft_k:
            Rd = self.max_draft_rows
            fields += [("draft_rows", torch.int64, (Rd,)), ("draft_p", torch.float32, (Rd, draft_k)),
                       ("draft_id", torch.int64, (Rd, draft_k))]
        self._layout, offset = [], 0
        for name, dtype, shape in fields:
            nbytes = math.prod(shape) * torch.tensor([], dtype=dtype).element_size()
            self._layout.append((name, dtype, shape, offset, nbytes))
            offset += (nbytes + 7) // 8 * 8
        self.nbytes = offset
        self._dev_buf = torch.zeros(offset, dtype=torch.uint8, device=dev)
        self._dev = self._views(self._dev_buf)
        pin = dev.type == "cuda"
        self._host_bufs = [torch.zeros(offset, dtype=torch.uint8, pin_memory=pin) for _ in range(ring_size)]
        self._host = [self._views(b) for b in self._host_bufs]
        self._busy = [False] * ring_size
        # one completion event per ring slot, re-recorded by each launch that takes the slot (creating
        # an event per launch costs host time)
        self._events = [torch.cuda.Event() for _ in range(ring_size)] if self.device.type == "cuda" else None
        self._next = 0

        # Scratch, preallocated so a launch allocates nothing.
        self._triton_on = triton is not None and (backend == "triton" or (backend == "auto" and dev.type == "cuda"))
        self._torch_ready = False
        if self._triton_on:
            self._triton_scratch()
        else:
            self._torch_scratch()
        if draft_k:
            self._drows_c = torch.zeros(self.max_draft_rows, dtype=torch.int64, device=dev)
            self._did = torch.zeros(self.max_draft_rows, draft_k, dtype=torch.int64, device=dev)

    @property
    def backend(self) -> str:
        """The path launches take now: ``"triton"`` or ``"torch"``."""
        return "triton" if self._triton_on else "torch"

    def _triton_scratch(self) -> None:
        """Block width and the small per-block buffers of the Triton logits path."""
        self._hblock = min(_pow2_at_least(self.chunk_width), 8192)
        # Warps per program of the three kernels (tuned on an H200 by bench/gpu_summarize.py).
        self.triton_warps = {"hidden": max(1, min(16, self._hblock // 512)), "block": 4, "final": 4}
        if self.vocab_size is None:
            return
        V, k, R, dev = self.vocab_size, self.topk, self.max_rows, self.device
        tb = max(_pow2_at_least(self._block_arg or 2048), _pow2_at_least(k))
        tb = min(tb, max(_pow2_at_least(V), _pow2_at_least(k)))
        while _pow2_at_least(-(-V // tb) * k) > 16384:  # keep the final stage's candidates in registers
            tb *= 2
        self.triton_block = tb
        self._tnb = -(-V // tb)
        self._t_bmax = torch.zeros(R, self._tnb, dtype=torch.float32, device=dev)
        self._t_bsum = torch.zeros(R, self._tnb, dtype=torch.float32, device=dev)
        self._t_cval = torch.zeros(R, self._tnb * k, dtype=torch.float32, device=dev)
        self._t_cid = torch.zeros(R, self._tnb * k, dtype=torch.int32, device=dev)

    def _torch_scratch(self) -> None:
        """Buffers of the per-op torch path (allocated only when that path runs)."""
        if self._torch_ready:
            return
        R, K, dev, chunk_width, vocab_size, topk = (self.max_rows, self.num_chunks, self.device,
                                                    self.chunk_width, self.vocab_size, self.topk)
        self._rows_c = torch.zeros(R, dtype=torch.int64, device=dev)
        # x, NaN mask, non-finite mask, x*x of the selected rows, reduced by one matrix-vector product.
        self._work = torch.zeros(len(_SUMS), R * K, chunk_width, dtype=torch.float32, device=dev)
        self._ones = torch.ones(chunk_width, dtype=torch.float32, device=dev)
        split = max(d for d in range(1, math.isqrt(chunk_width) + 1) if chunk_width % d == 0)
        self._absmax_part = torch.zeros(R * K, split, dtype=torch.float32, device=dev)
        if vocab_size is not None:
            self.block = self._block_arg or _pick_block(vocab_size, topk)
            nb = -(-vocab_size // self.block)
            self._nb, self._kb = nb, min(topk, nb)
            self._lg = None if nb * self.block == vocab_size else torch.full(
                (R, nb * self.block), -math.inf, dtype=torch.float32, device=dev)
            self._bmax = torch.zeros(R, nb, device=dev)
            self._bval = torch.zeros(R, self._kb, device=dev)
            self._bidx = torch.zeros(R, self._kb, dtype=torch.int64, device=dev)
            self._rmax = torch.zeros(R, 1, device=dev)
            self._rsum = torch.zeros(R, 1, device=dev)
            self._arange = torch.arange(self.block, dtype=torch.int64, device=dev)
            self._cand = torch.zeros(R, self._kb, self.block, dtype=torch.int64, device=dev)
            self._cval = torch.zeros(R, self._kb * self.block, device=dev)
            self._tval = torch.zeros(R, topk, device=dev)
            self._tpos = torch.zeros(R, topk, dtype=torch.int64, device=dev)
        self._torch_ready = True

    @property
    def device_buffer(self) -> torch.Tensor:
        """The raw result bytes on the device (``nbytes`` uint8), as :meth:`compute` leaves them."""
        return self._dev_buf

    def _views(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: buf[off:off + n].view(dtype).view(shape) for name, dtype, shape, off, n in self._layout}

    # ----------------------------------------------------------------------------- launch path
    def summarize(self, hidden: torch.Tensor, rows: torch.Tensor, logits: Optional[torch.Tensor] = None,
                  *, draft_probs: Optional[torch.Tensor] = None, draft_ids: Optional[torch.Tensor] = None,
                  draft_rows: Optional[torch.Tensor] = None, hot_token_id: Optional[torch.Tensor] = None,
                  tag: Any = None) -> Optional[Pending]:
        """Launch the summary of one step; returns a :class:`Pending`, or ``None`` if dropped.

        ``hidden [n, width]``; ``rows [max_rows]`` int64 row indices into ``hidden`` (and
        ``logits [n, vocab_size]``), ``-1`` for unused slots. Draft inputs ``draft_probs`` and
        ``draft_ids [m, draft_k]`` are selected by ``draft_rows [max_draft_rows]`` (default
        ``rows``); ``hot_token_id [draft_vocab]`` maps draft ids to target ids. ``tag`` is handed
        back unchanged in the :class:`Summary`. Never synchronises with the host.
        """
        slot = self._reserve()
        if slot is None:
            return None
        try:
            self.compute(hidden, rows, logits, draft_probs=draft_probs, draft_ids=draft_ids,
                         draft_rows=draft_rows, hot_token_id=hot_token_id)
        except BaseException:
            self._release(slot)
            raise
        return self._copy_out(slot, tag)

    def publish(self, tag: Any = None) -> Optional[Pending]:
        """Copy the device buffer (as last written by :meth:`compute`) to a free ring slot."""
        slot = self._reserve()
        return None if slot is None else self._copy_out(slot, tag)

    def compute(self, hidden: torch.Tensor, rows: torch.Tensor, logits: Optional[torch.Tensor] = None,
                *, draft_probs: Optional[torch.Tensor] = None, draft_ids: Optional[torch.Tensor] = None,
                draft_rows: Optional[torch.Tensor] = None, hot_token_id: Optional[torch.Tensor] = None) -> None:
        """Write the summary into the device buffer only (capturable in a CUDA graph)."""
        self._check(hidden, rows, logits, draft_probs, draft_ids, draft_rows, hot_token_id)
        d = self._dev
        if not (self._triton_on and self._compute_triton(hidden, rows, logits)):
            self._torch_scratch()
            d["rows"].copy_(rows)
            torch.clamp(rows, 0, hidden.shape[0] - 1, out=self._rows_c)
            self._hidden_stats(hidden, d["sums"], d["absmax"])
            if self.vocab_size is not None:
                self._topk(logits, d["topk_p"], d["topk_id"])
        if self.draft_k:
            drows = rows if draft_rows is None else draft_rows
            d["draft_rows"].copy_(drows)
            torch.clamp(drows, 0, draft_probs.shape[0] - 1, out=self._drows_c)
            d["draft_p"].copy_(draft_probs.index_select(0, self._drows_c))
            self._did.copy_(draft_ids.index_select(0, self._drows_c))
            if hot_token_id is None:
                d["draft_id"].copy_(self._did)
            else:
                torch.index_select(hot_token_id, 0, self._did.view(-1), out=d["draft_id"].view(-1))

    def _compute_triton(self, hidden: torch.Tensor, rows: torch.Tensor, logits: Optional[torch.Tensor]) -> bool:
        """The three Triton kernels; False (counted in :attr:`fallbacks`) when the torch path must run."""
        if hidden.stride(1) != 1 or (logits is not None and logits.stride(1) != 1):
            self.fallbacks += 1
            self.fallback_error = "hidden/logits rows are not contiguous"
            return False
        try:
            d, R, K = self._dev, self.max_rows, self.num_chunks
            hb = self._hblock
            _hidden_stats_kernel[(R, K)](hidden, hidden.stride(0), hidden.shape[0], rows, d["rows"], d["sums"],
                                         d["absmax"], R, K, self.chunk_width, BLOCK_H=hb,
                                         num_warps=self.triton_warps["hidden"])
            if self.vocab_size is not None:
                nb, k, tb = self._tnb, self.topk, self.triton_block
                _logits_block_kernel[(R, nb)](logits, logits.stride(0), logits.shape[0], rows, self._t_bmax,
                                              self._t_bsum, self._t_cval, self._t_cid, self.vocab_size, nb,
                                              TOPK=k, BLOCK_V=tb, num_warps=self.triton_warps["block"])
                _logits_final_kernel[(R,)](self._t_bmax, self._t_bsum, self._t_cval, self._t_cid, d["topk_p"],
                                           d["topk_id"], nb, TOPK=k, NB_P2=_pow2_at_least(nb),
                                           NC_P2=_pow2_at_least(nb * k), num_warps=self.triton_warps["final"])
            return True
        except Exception as exc:  # noqa: BLE001 - never raise into the serving process
            self.fallbacks += 1
            self.fallback_error = f"{type(exc).__name__}: {exc}"
            self._triton_on = False
            return False

    def _hidden_stats(self, hidden: torch.Tensor, sums: torch.Tensor, absmax: torch.Tensor) -> None:
        """Sums, NaN/Inf counts and sums of squares in one fp32 ``mv``; absmax in two steps.

        Reductions over few long rows are slow on GPUs (few blocks); a matrix-vector product with
        a ones vector (cuBLAS gemv: fp32 FMA, never TF32) and a two-level max keep kernels wide.
        """
        R, K, H = self.max_rows, self.num_chunks, self.chunk_width
        w = self._work
        x = w[0]
        x.view(R, K * H).copy_(hidden[self._rows_c])
        torch.ne(x, x, out=w[1])
        torch.sub(x, x, out=w[2])  # 0 for finite x, NaN for +-inf and NaN
        torch.ne(w[2], 0, out=w[2])
        torch.mul(x, x, out=w[3])
        torch.mv(w.view(-1, H), self._ones, out=sums.view(-1))
        part = self._absmax_part
        torch.linalg.vector_norm(x.view(R * K, part.shape[1], -1), ord=math.inf, dim=-1, out=part)
        torch.amax(part, dim=-1, out=absmax.view(-1))

    def _topk(self, logits: torch.Tensor, probs: torch.Tensor, ids: torch.Tensor) -> None:
        """Two-stage top-k with exact softmax probabilities over the full row."""
        R, B, k = self.max_rows, self.block, self.topk
        if self._lg is None:
            lg = logits[self._rows_c]
        else:  # vocab not a multiple of the block: copy into the -inf padded buffer
            lg = self._lg
            lg[:, :self.vocab_size].copy_(logits[self._rows_c])
        torch.amax(lg.view(R, self._nb, B), dim=-1, out=self._bmax)
        torch.topk(self._bmax, self._kb, dim=-1, sorted=False, out=(self._bval, self._bidx))
        torch.amax(self._bmax, dim=-1, keepdim=True, out=self._rmax)
        # Probabilities: exp(x - rowmax) over the row, normalised by its sum. Top-k is taken on
        # these exponentials (monotone in the logits), so no second exp is needed.
        torch.sub(lg, self._rmax, out=lg)
        torch.exp(lg, out=lg)
        torch.sum(lg, dim=-1, keepdim=True, out=self._rsum)
        torch.add(self._arange, self._bidx.unsqueeze(-1), alpha=B, out=self._cand)
        cand = self._cand.view(R, -1)
        torch.gather(lg, 1, cand, out=self._cval)
        torch.topk(self._cval, k, dim=-1, sorted=False, out=(self._tval, self._tpos))  # host sorts
        torch.gather(cand, 1, self._tpos, out=ids)
        torch.div(self._tval, self._rsum, out=probs)

    def _check(self, hidden, rows, logits, draft_probs, draft_ids, draft_rows, hot_token_id) -> None:
        """Shape/dtype/device checks only: metadata, never data (no host sync)."""
        def need(ok: bool, what) -> None:  # ``what``: a callable, so the message is built only on failure
            if not ok:
                raise ValueError(f"Summarizer: {what()}")

        need(hidden.dim() == 2 and hidden.shape[1] == self.width and hidden.shape[0] > 0,
             lambda: f"hidden must be [n>0, {self.width}], got {list(hidden.shape)}")
        need(hidden.is_floating_point(), lambda: f"hidden must be a float tensor, got {hidden.dtype}")
        need(rows.shape == (self.max_rows,) and rows.dtype == torch.int64,
             lambda: f"rows must be int64 [{self.max_rows}] (pad with -1), got {rows.dtype} {list(rows.shape)}")
        for name, t in (("hidden", hidden), ("rows", rows), ("logits", logits), ("draft_probs", draft_probs),
                        ("draft_ids", draft_ids), ("draft_rows", draft_rows), ("hot_token_id", hot_token_id)):
            need(t is None or t.device.type == self.device.type,
                 lambda: f"{name} is on {t.device if t is not None else None}, the Summarizer on {self.device}")
        if self.vocab_size is None:
            need(logits is None, lambda: "logits given but the Summarizer was built without vocab_size")
        else:
            need(logits is not None and list(logits.shape) == [hidden.shape[0], self.vocab_size]
                 and logits.dtype == torch.float32,
                 lambda: f"logits must be float32 [{hidden.shape[0]}, {self.vocab_size}], got "
                 f"{None if logits is None else (logits.dtype, list(logits.shape))}")
        if not self.draft_k:
            need(draft_probs is None and draft_ids is None, lambda: "draft inputs given but draft_k=0")
            return
        need(draft_probs is not None and draft_ids is not None, lambda: "draft_probs and draft_ids are both required")
        need(draft_probs.dim() == 2 and draft_probs.shape[1] == self.draft_k and draft_probs.shape[0] > 0
             and draft_ids.shape == draft_probs.shape and not draft_ids.is_floating_point(),
             lambda: f"draft_probs/draft_ids must be [m>0, {self.draft_k}] (float / integer), got "
             f"{list(draft_probs.shape)} {draft_ids.dtype} {list(draft_ids.shape)}")
        need(draft_rows is not None or self.max_draft_rows == self.max_rows,
             lambda: "draft_rows is required when max_draft_rows differs from max_rows")
        need(draft_rows is None or (draft_rows.shape == (self.max_draft_rows,) and draft_rows.dtype == torch.int64),
             lambda: f"draft_rows must be int64 [{self.max_draft_rows}]")
        need(hot_token_id is None or (hot_token_id.dim() == 1 and hot_token_id.dtype == torch.int64),
             lambda: "hot_token_id must be a 1-D int64 tensor")

    # ----------------------------------------------------------------------------- ring
    def _reserve(self) -> Optional[int]:
        n = len(self._busy)
        for i in range(n):
            slot = (self._next + i) % n
            if not self._busy[slot]:
                self._busy[slot] = True
                self._next = (slot + 1) % n
                return slot
        self.drops += 1
        return None

    def _release(self, slot: int) -> None:
        self._busy[slot] = False

    def _copy_out(self, slot: int, tag: Any) -> Pending:
        self._host_bufs[slot].copy_(self._dev_buf, non_blocking=True)
        event = None
        if self._events is not None:
            event = self._events[slot]
            event.record()
        self.launches += 1
        return Pending(self, slot, event, tag)

    # ----------------------------------------------------------------------------- decode (host)
    def _decode(self, slot: int, tag: Any) -> Summary:
        h = self._host[slot]
        rows = h["rows"].tolist()
        sums, nan, nonfinite, sumsq = h["sums"].tolist()
        absmax = h["absmax"].tolist()
        topk = None
        if self.vocab_size is not None:  # unsorted on the device: best first here, ties by id
            topk = [sorted(zip(i, p), key=lambda e: (-e[1], e[0]))
                    for i, p in zip(h["topk_id"].tolist(), h["topk_p"].tolist())]
        out = []
        H = self.chunk_width
        for r, row in enumerate(rows):
            if row < 0:
                continue
            chunks = []
            for c in range(self.num_chunks):
                mean, ss = sums[r][c] / H, sumsq[r][c]
                var = max(ss / H - mean * mean, 0.0) if math.isfinite(ss) and math.isfinite(mean) else math.nan
                chunks.append(ChunkStats(l2=math.sqrt(ss) if ss >= 0 else math.nan, mean=mean, std=math.sqrt(var)
                                         if var == var else math.nan, absmax=absmax[r][c],
                                         nan_count=int(nan[r][c]), inf_count=int(nonfinite[r][c] - nan[r][c]),
                                         width=H))
            out.append(RowSummary(row=row, chunks=chunks, topk=None if topk is None else topk[r]))
        draft = None
        if self.draft_k:
            draft = [DraftRow(row=row, topk=list(zip(i, p)))
                     for row, i, p in zip(h["draft_rows"].tolist(), h["draft_id"].tolist(), h["draft_p"].tolist())
                     if row >= 0]
        return Summary(tag=tag, rows=out, draft=draft)
