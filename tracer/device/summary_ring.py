"""The Summarizer's way back to the host: the result layout, a ring of (pinned) host buffers, the
:class:`Pending` handle of each launch, and the decoding into a ``Summary``.

One launch goes launch -> ring slot -> record: it takes a free slot as its :class:`Pending` (``Ring.take``), its
results reach the slot one of two ways: a kernel writes them straight into the slot (pinned memory the device
can address: the slot's :class:`Outputs`; no copy), or they are computed into the Summarizer's device buffer and
one non-blocking copy moves them (the torch path, and CUDA-graph replays, whose kernels write one static
address); ``Pending.issue`` then marks the work on its stream, with no event (``devicecopy.mark_later``): the
reader (the relay, for the recorder's records) records one behind it when it reads, one for every handle it reads
at once, and waits on that event only."""

from __future__ import annotations

import ctypes
import math
import threading
from typing import Any, Optional

import torch

from draftscope_tracer.device.devicecopy import mark_later, wait_later
from draftscope_tracer.stats import DeviceBytes, Resolved, Summary, decode
from draftscope_tracer.device.summary_torch import SUMS


class Layout:
    """Typed views onto 8-byte-aligned regions of one byte buffer: ``rows``, ``sums``, ``absmax``, with a
    vocabulary ``topk_p``/``topk_id``, and with ``gather`` the verify's ``ints`` (4 per row)."""

    def __init__(self, max_rows: int, num_chunks: int, vocab_size: Optional[int], topk: int, gather: bool = False):
        R, K = max_rows, num_chunks
        fields: list[tuple[str, torch.dtype, tuple[int, ...]]] = [
            ("rows", torch.int64, (R,)), ("sums", torch.float32, (len(SUMS), R, K)),
            ("absmax", torch.float32, (R, K))]
        if vocab_size is not None:
            fields += [("topk_p", torch.float32, (R, topk)), ("topk_id", torch.int64, (R, topk))]
        if gather:
            fields.append(("ints", torch.int64, (R, 4)))
        self.fields, offset = [], 0
        for name, dtype, shape in fields:
            nbytes = math.prod(shape) * torch.tensor([], dtype=dtype).element_size()
            self.fields.append((name, dtype, shape, offset, nbytes))
            offset += (nbytes + 7) // 8 * 8
        self.nbytes = offset
        # the same fields for numpy, in the recorder process (``stats.DeviceBytes``)
        self.numpy_fields = [(name, str(torch.tensor([], dtype=dtype).numpy().dtype), shape, off)
                             for name, dtype, shape, off, _ in self.fields]

    def views(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: buf[off:off + n].view(dtype).view(shape) for name, dtype, shape, off, n in self.fields}

    def outputs(self, buf: torch.Tensor, address: Optional[int] = None) -> "Outputs":
        """Where a launch into ``buf`` writes: its views, and their addresses for kernels (``address``: the
        address through which kernels reach ``buf``, when it is not ``buf.data_ptr()``: mapped host memory)."""
        base = buf.data_ptr() if address is None else address
        return Outputs(self.views(buf), {name: base + off for name, _, _, off, _ in self.fields})


class Outputs:
    """A launch's destination: ``views`` (name -> typed tensor) and ``head`` (the addresses of ``rows``, ``sums``,
    ``absmax``), ``topk`` (of ``topk_p``, ``topk_id``; None without a vocabulary) and ``ints`` (None without
    gather), in the kernels' argument order, worked out once."""

    def __init__(self, views: dict, address: dict):
        self.views = views
        self.head = (address["rows"], address["sums"], address["absmax"])
        self.topk = (address["topk_p"], address["topk_id"]) if "topk_p" in address else None
        self.ints = address.get("ints")


SLOT_ALIGN = 16  # ring slots start at this alignment, so a field sits at the same alignment in every slot
# (Triton specialises its kernels on 16-byte aligned pointers)
_DEVICE_POINTER = 3  # CU_POINTER_ATTRIBUTE_DEVICE_POINTER (cuda.h)


def mapped_address(host: torch.Tensor) -> Optional[int]:
    """The address through which CUDA kernels reach pinned tensor ``host``: its own, under the unified
    addressing of every 64-bit CUDA platform. Asked of the driver; None when the driver is not reachable or
    gives any other answer (the launches then copy)."""
    try:
        query = ctypes.CDLL("libcuda.so.1").cuPointerGetAttribute
    except (OSError, AttributeError):
        return None
    out, ptr = ctypes.c_uint64(), host.data_ptr()
    ok = query(ctypes.byref(out), ctypes.c_int(_DEVICE_POINTER), ctypes.c_uint64(ptr)) == 0
    return ptr if ok and out.value == ptr else None


class Ring:
    """``size`` host buffers (pinned on CUDA, one allocation); a launch takes a free one (``take``) or is dropped
    (``drops``). ``outputs(slot)``: where a kernel writes that slot directly, or None when kernels cannot reach
    the ring (a launch then computes into the device buffer and copies)."""

    def __init__(self, layout: Layout, size: int, device: torch.device, chunk_width: int, direct: bool = True):
        pin = device.type == "cuda"
        self.chunk_width = chunk_width
        # one allocation for every slot: a pinned allocation per slot would cost a ``cudaHostAlloc`` each
        stride = -(-layout.nbytes // SLOT_ALIGN) * SLOT_ALIGN
        memory = torch.zeros(size, stride, dtype=torch.uint8, pin_memory=pin)
        self._bufs = list(memory[:, :layout.nbytes].unbind(0))
        self._outputs: Optional[list] = None
        base = (mapped_address(memory) if pin else memory.data_ptr()) if direct else None
        if base is not None:  # on a CPU the "kernel" (Triton's interpreter) writes the slot as any host code would
            self._outputs = [layout.outputs(b, base + i * stride) for i, b in enumerate(self._bufs)]
        self._views = [o.views for o in self._outputs] if self._outputs else [layout.views(b) for b in self._bufs]
        self.numpy_fields = layout.numpy_fields
        self._busy = [False] * size
        self.cuda = device.type == "cuda"  # launches are marked for their reader (Pending.issue)
        self._next = 0
        self.drops = 0  # launches refused because every slot was still unread
        self.launches = 0  # launches issued (bench/gpu_hooks.py counts launches per iteration)

    def take(self, tag: Any) -> Optional["Pending"]:
        """A free slot, as the handle of the launch about to write it (:attr:`Pending.outputs`: where a kernel
        writes it directly); None when every slot is still unread (counted in ``drops``)."""
        busy, n = self._busy, len(self._busy)
        for i in range(n):
            slot = (self._next + i) % n
            if not busy[slot]:
                busy[slot] = True
                self._next = (slot + 1) % n
                return Pending(self, slot, tag)
        self.drops += 1
        return None

    def release(self, slot: int) -> None:
        self._busy[slot] = False

    def views(self, slot: int) -> dict:
        return self._views[slot]

    def outputs(self, slot: int) -> Optional[Outputs]:
        return None if self._outputs is None else self._outputs[slot]

    def buffer(self, slot: int) -> torch.Tensor:
        return self._bufs[slot]

    def bytes(self, slot: int) -> bytes:
        return self._bufs[slot].numpy().tobytes()


class Pending:
    """Handle of one launch, from its ring slot to its reader: the launch writes the slot (:attr:`outputs`, or
    its device buffer then :meth:`issue` copies), :meth:`issue` marks the work issued; a background thread reads
    it here (:meth:`result`) or, pickled, in the recorder process (:class:`~draftscope_tracer.stats.DeviceBytes`:
    only the bytes are copied here)."""

    def __init__(self, ring: Ring, slot: int, tag: Any):
        self._ring, self._slot, self.tag = ring, slot, tag
        self.outputs: Optional[Outputs] = ring.outputs(slot)  # None: kernels cannot reach the ring (copy instead)
        self.stream: Optional["torch.cuda.Stream"] = None  # set by issue on CUDA (mark_later), with ``mark``
        self._held = True
        self._summary: Optional[Summary] = None
        self._bytes: Optional[bytes] = None
        self._lock = threading.Lock()

    def issue(self, copy_from: Optional[torch.Tensor] = None) -> "Pending":
        """The launch's work is issued: ``copy_from`` (its device buffer) first copied into the slot without
        blocking, when the launch did not write the slot itself; on CUDA the work is marked on its stream for the
        reader, who records the event that marks completion (``devicecopy.mark_later``: none recorded here)."""
        ring = self._ring
        if copy_from is not None:
            ring.buffer(self._slot).copy_(copy_from, non_blocking=True)
        if ring.cuda:
            mark_later(self)
        ring.launches += 1
        return self

    def __reduce__(self):
        """Pickled (for the recorder process) as the launch's bytes: waits for the copy first."""
        with self._lock:
            if self._bytes is None:
                if self._summary is not None:
                    return Resolved, (self._summary,)
                self._wait()
                self._bytes = self._ring.bytes(self._slot)
                self._free()
        return DeviceBytes, (self._ring.numpy_fields, self._bytes, self._ring.chunk_width, self.tag)

    def result(self) -> Summary:
        """Wait for the copy, decode it, free the ring slot. Idempotent; blocks the calling thread only."""
        with self._lock:
            if self._summary is None:
                if self._bytes is not None:
                    self._summary = DeviceBytes(self._ring.numpy_fields, self._bytes, self._ring.chunk_width,
                                                self.tag).result()
                else:
                    self._wait()
                    self._summary = decode(self._ring.views(self._slot), self._ring.chunk_width, self.tag)
                    self._free()
            return self._summary

    def release(self) -> None:
        """Free the ring slot without decoding (e.g. a dropped record); never waits: the next copy into the
        slot is ordered after this one on the stream, and its reader waits for it. Safe to call twice."""
        with self._lock:
            if self._held and self._summary is None and self._bytes is None:
                self._free()

    def _wait(self) -> None:
        if not self._held:
            raise RuntimeError("this Pending was released without being read")
        if self.stream is not None:
            wait_later(self)

    def _free(self) -> None:
        self._ring.release(self._slot)
        self._held = False
