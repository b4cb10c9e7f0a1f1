"""Device-side summaries of one verify step, read back without stalling the GPU.

A :class:`Summarizer` turns the tensors of one verify step into a few hundred numbers **on the
device** and brings them to the host without blocking (written straight into pinned memory, or one copy):

* ``hidden [n, K*H]`` (any float dtype; bf16 in SGLang): for every selected row and every aux chunk
  of width ``H``: L2 norm, mean, std, absmax, NaN and Inf counts, computed in fp32;
* ``logits [n, V]`` (optional, fp32 logits): top-k token ids and their softmax probabilities
  over the full row (two-stage top-k: per block of the row first, then over the blocks' candidates).

Rows are chosen by ``rows``, an int64 tensor on the tensors' device of fixed length ``max_rows``
(pad with ``-1``): its shape never depends on data, so a launch can be captured in a CUDA graph.
Nothing on the launch path synchronises with the host (no ``.item()``, ``.tolist()``, ``.cpu()``).
The Triton kernel writes the results straight into a pinned host buffer taken from a ring (the device
addresses pinned memory directly); the torch path and graph replays write one device buffer, which one
``non_blocking`` copy moves into the ring slot. A CUDA event marks completion. :class:`Pending` is the handle: a background
thread calls :meth:`Pending.result` (waits on the event, decodes plain Python numbers, frees the
ring slot). When every slot is still unread, a launch is **dropped** (counted in
:attr:`Summarizer.drops`) instead of blocking. CPU tensors work the same way (no pinning, no
events), which is what the tests use.

On CUDA, when ``triton`` imports (it ships with SGLang), one Triton launch computes everything
(``summary_triton.py``). Otherwise, and after any Triton failure (counted in
:attr:`Summarizer.fallbacks`, never raised), a per-op torch path computes the same results
(``summary_torch.py``); ``backend="torch"`` forces it. ``summary_ring.py`` holds the host ring, the
:class:`Pending` handles and the decoding.

One thread launches (the scheduler's); any one other thread may read each ``Pending``. Launches
must be issued on the stream that produced the tensors (``torch.cuda.current_stream()``).

Usage::

    from draftscope_tracer.device.summarize import Summarizer

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

from typing import Any, Callable, Optional

import torch

from draftscope_tracer.device.summary_ring import Layout, Outputs, Pending, Ring
from draftscope_tracer.device.summary_torch import TorchPath
from draftscope_tracer.device.summary_triton import TritonPath, triton

__all__ = ["Pending", "Summarizer"]


class Summarizer:
    """Preallocated device/host buffers and the summary kernels for one tensor layout.

    Args:
        max_rows: capacity ``R`` of ``rows``.
        width: width of ``hidden`` (``K * chunk_width``).
        chunk_width: aux chunk width ``H`` (default: ``width``, one chunk). Must divide ``width``.
        vocab_size: width ``V`` of ``logits``; ``None`` when no logits are summarised.
        topk: entries kept per logits row (8).
        ring_size: pinned host buffers in the ring (reads in flight before launches drop).
        block: block width of the two-stage top-k (default: chosen from ``vocab_size`` per path;
            the Triton path rounds it up to a power of two: the logits columns one program reads).
        device: device of the tensors that will be summarised.
        backend: ``"auto"`` (Triton kernels on CUDA when ``triton`` imports, else torch),
            ``"torch"`` (the per-op torch path), or ``"triton"`` (Triton kernels on any device;
            on CPU only under ``TRITON_INTERPRET=1``, which the tests use).
        direct: let the Triton kernel write each launch into its ring slot (no copy) where the device can
            address the pinned ring; ``False`` always computes into the device buffer and copies.

    Any failure in the Triton path is counted in :attr:`fallbacks` (reason in
    :attr:`fallback_error`) and the torch path computes that launch and every later one; it never
    raises. Run one launch eagerly before capturing a CUDA graph (Triton compiles on first use).
    """

    def __init__(self, *, max_rows: int, width: int, chunk_width: Optional[int] = None,
                 vocab_size: Optional[int] = None, topk: int = 8, ring_size: int = 4,
                 block: Optional[int] = None, device: torch.device | str = "cpu", backend: str = "auto",
                 gather: bool = False, direct: bool = True):
        chunk_width = width if chunk_width is None else chunk_width
        if max_rows < 1 or width < 1 or chunk_width < 1 or width % chunk_width:
            raise ValueError(f"need max_rows >= 1 and chunk_width dividing width; got max_rows={max_rows}, "
                             f"width={width}, chunk_width={chunk_width}")
        if vocab_size is not None and not 1 <= topk <= vocab_size:
            raise ValueError(f"topk={topk} must be between 1 and vocab_size={vocab_size}")
        if ring_size < 1:
            raise ValueError(f"need ring_size >= 1; got {ring_size}")
        if backend not in ("auto", "torch", "triton"):
            raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
        if backend == "triton" and triton is None:
            raise ValueError("backend='triton' needs the triton package; install it or use backend='auto'")
        self.device = torch.device(device)
        self.max_rows, self.width, self.chunk_width = max_rows, width, chunk_width
        self.num_chunks = width // chunk_width
        self.vocab_size, self.topk = vocab_size, topk
        self.fallbacks = 0  # launches the torch path computed because the Triton path could not
        self.fallback_error: Optional[str] = None
        if gather and vocab_size is None:
            raise ValueError("gather needs a vocabulary: it rides on a verify's summary (hidden states and logits)")
        self.gather = gather
        layout = Layout(max_rows, self.num_chunks, vocab_size, topk, gather)
        self.nbytes = layout.nbytes
        self._dev_buf = torch.zeros(layout.nbytes, dtype=torch.uint8, device=self.device)
        self._dev = layout.outputs(self._dev_buf)
        self._ring = Ring(layout, ring_size, self.device, chunk_width, direct)
        self._shape = dict(max_rows=max_rows, num_chunks=self.num_chunks, chunk_width=chunk_width,
                           vocab_size=vocab_size, topk=topk, block=block, device=self.device, gather=gather)
        use_triton = triton is not None and (backend == "triton" or (backend == "auto" and self.device.type == "cuda"))
        self._triton: Optional[TritonPath] = TritonPath(**self._shape) if use_triton else None
        self._torch: Optional[TorchPath] = None if use_triton else TorchPath(**self._shape)
        self._copy_kernel = self.device.type == "cuda"  # publish() copies out by a Triton kernel

    @property
    def backend(self) -> str:
        """The path launches take now: ``"triton"`` or ``"torch"``."""
        return "triton" if self._triton is not None else "torch"

    @property
    def drops(self) -> int:
        """Launches refused because every ring slot was still unread."""
        return self._ring.drops

    @property
    def launches(self) -> int:
        """Launches copied out so far."""
        return self._ring.launches

    @property
    def triton_tuning(self) -> dict:
        """Warps per program, group width and hidden slice of the Triton kernels (a dict the GPU bench tunes in
        place before the first launch; ``summary_triton.TritonPath``)."""
        return self._triton.tuning

    @property
    def triton_block(self) -> Optional[int]:
        return self._triton.block

    @property
    def device_buffer(self) -> torch.Tensor:
        """The raw result bytes on the device (``nbytes`` uint8), as :meth:`compute` leaves them."""
        return self._dev_buf

    def summarize(self, hidden: torch.Tensor, rows: torch.Tensor, logits: Optional[torch.Tensor] = None,
                  tag: Any = None, ints: Optional[tuple] = None) -> Optional[Pending]:
        """Launch the summary of one step; returns a :class:`Pending`, or ``None`` if dropped.

        ``hidden [n, width]``; ``rows [max_rows]`` int64 row indices into ``hidden`` (and
        ``logits [n, vocab_size]``), ``-1`` for unused slots. ``tag`` is handed back unchanged in
        the ``Summary``. With ``gather``: ``ints = (draft tokens, target tokens, sequence lengths, accept
        lengths, N)`` of a verify step (tokens per node, the others per request, node ``i`` belonging to
        request ``i // N``), read at each selected row into ``Summary.ints``. Never synchronises with the host.
        """
        slot = self._ring.reserve()
        if slot is None:
            return None
        try:
            into_slot = self._run(hidden, rows, logits, ints, self._ring.outputs(slot))
        except BaseException:
            self._ring.release(slot)
            raise
        return self._ring.written(slot, tag) if into_slot else self._ring.copy_out(slot, self._dev_buf, tag)

    def last_plan(self) -> Optional[Callable[[Outputs], None]]:
        """The last launch as a plan for :meth:`launch_plan`, when it went straight to its compiled Triton kernel
        (else None)."""
        return None if self._triton is None else self._triton.plan

    def launch_plan(self, plan: Callable[[Outputs], None], tag: Any = None) -> Optional[Pending]:
        """:meth:`summarize` again on the inputs of the launch that left ``plan`` (:meth:`last_plan`): the caller
        vouches that its tensors are at the same addresses with the same shapes, strides and dtypes, so nothing
        is checked or worked out again. A free ring slot, one kernel launch, an event; None when dropped."""
        slot = self._ring.reserve()
        if slot is None:
            return None
        out = self._ring.outputs(slot)
        try:
            plan(self._dev if out is None else out)
        except BaseException:
            self._ring.release(slot)
            raise
        return self._ring.copy_out(slot, self._dev_buf, tag) if out is None else self._ring.written(slot, tag)

    def publish(self, tag: Any = None) -> Optional[Pending]:
        """Copy the device buffer (as last written by :meth:`compute`) to a free ring slot: on CUDA by a Triton
        kernel where the ring is mapped (a copy engine's transfer of a few KB costs several µs on the stream),
        else (or after that kernel failed once, counted in :attr:`fallbacks`) one non-blocking copy."""
        slot = self._ring.reserve()
        if slot is None:
            return None
        out = self._ring.outputs(slot)
        if out is not None and self._triton is not None and self._copy_kernel:
            try:
                self._triton.copy(self._dev_buf, out)
                return self._ring.written(slot, tag)
            except Exception as exc:  # noqa: BLE001 - never raise into the serving process
                self.fallbacks += 1
                self.fallback_error = f"{type(exc).__name__}: {exc}"
                self._copy_kernel = False
        return self._ring.copy_out(slot, self._dev_buf, tag)

    def compute(self, hidden: torch.Tensor, rows: torch.Tensor, logits: Optional[torch.Tensor] = None,
                ints: Optional[tuple] = None) -> None:
        """Write the summary into the device buffer only (capturable in a CUDA graph)."""
        self._run(hidden, rows, logits, ints, None)

    def _run(self, hidden, rows, logits, ints, slot: Optional[Outputs]) -> bool:
        """Compute one summary: into ``slot`` (a ring slot's outputs) when the Triton path takes it, True; else
        into the device buffer, False."""
        self._check(hidden, rows, logits)
        if (ints is not None) != self.gather:
            raise ValueError(f"Summarizer: ints {'missing' if self.gather else 'given'}: this layout was built "
                             f"with gather={self.gather}")
        if self._triton is not None:
            out = self._dev if slot is None else slot
            try:
                if self._triton.run(hidden, rows, logits, out, ints):
                    return out is slot
                self.fallbacks += 1
                self.fallback_error = "inputs the Triton path does not take (hidden/logits rows not contiguous, " \
                                      "or ints not 1-D int32/int64)"
            except Exception as exc:  # noqa: BLE001 - never raise into the serving process
                self.fallbacks += 1
                self.fallback_error = f"{type(exc).__name__}: {exc}"
                self._triton = None
        if self._torch is None:
            self._torch = TorchPath(**self._shape)
        self._torch.run(hidden, rows, logits, self._dev.views, ints)
        return False

    def _check(self, hidden, rows, logits) -> None:
        """Shape/dtype/device checks only: metadata, never data (no host sync). One expression on the hot path
        (each launch pays for it); the message is worked out only when it fails."""
        kind = self.device.type
        if (hidden.dim() == 2 and hidden.shape[1] == self.width and hidden.shape[0] > 0 and hidden.is_floating_point()
                and rows.shape[0] == self.max_rows and rows.dim() == 1 and rows.dtype == torch.int64
                and hidden.device.type == kind and rows.device.type == kind
                and (logits is None if self.vocab_size is None else
                     (logits is not None and logits.dim() == 2 and logits.shape[0] == hidden.shape[0]
                      and logits.shape[1] == self.vocab_size and logits.dtype == torch.float32
                      and logits.device.type == kind))):
            return
        self._explain(hidden, rows, logits)

    def _explain(self, hidden, rows, logits) -> None:
        """Raise a ValueError naming the first argument ``_check`` refused."""
        def need(ok: bool, what) -> None:  # ``what``: a callable, so the message is built only on failure
            if not ok:
                raise ValueError(f"Summarizer: {what()}")

        need(hidden.dim() == 2 and hidden.shape[1] == self.width and hidden.shape[0] > 0,
             lambda: f"hidden must be [n>0, {self.width}], got {list(hidden.shape)}")
        need(hidden.is_floating_point(), lambda: f"hidden must be a float tensor, got {hidden.dtype}")
        need(rows.shape == (self.max_rows,) and rows.dtype == torch.int64,
             lambda: f"rows must be int64 [{self.max_rows}] (pad with -1), got {rows.dtype} {list(rows.shape)}")
        for name, t in (("hidden", hidden), ("rows", rows), ("logits", logits)):
            need(t is None or t.device.type == self.device.type,
                 lambda: f"{name} is on {t.device if t is not None else None}, the Summarizer on {self.device}")
        if self.vocab_size is None:
            need(logits is None, lambda: "logits given but the Summarizer was built without vocab_size")
        else:
            need(logits is not None and list(logits.shape) == [hidden.shape[0], self.vocab_size]
                 and logits.dtype == torch.float32,
                 lambda: f"logits must be float32 [{hidden.shape[0]}, {self.vocab_size}], got "
                 f"{None if logits is None else (logits.dtype, list(logits.shape))}")
        raise ValueError(f"Summarizer: arguments refused: hidden {hidden.dtype} {list(hidden.shape)}, rows "
                         f"{rows.dtype} {list(rows.shape)}")
