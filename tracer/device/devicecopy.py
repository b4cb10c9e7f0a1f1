"""Small copies between host and device that never wait for the GPU, and never allocate pinned memory late.

Allocating pinned memory (``cudaHostAlloc``, which PyTorch's caching host allocator calls whenever none of
its blocks is free yet) can wait for the device without being a sync that ``set_sync_debug_mode`` reports:
with work queued ahead, the hooks then stall until the GPU drains. So every pinned byte the hooks use comes
from :class:`HostSlots`, carved from one allocation made when the tracer attaches (:func:`prepare`):

* :func:`device_index`: a host list as an int64 device index, staged through a slot (the tensors of recent
  lists are kept, so a batch whose sampled rows have not changed costs no copy);
* :class:`HostInts`: selected elements of a few small device tensors, copied whole into one slot;
* ``steptap.StepTopk`` and the Summarizer's ring (``summary_ring.Ring``) take their slots the same way.

A slot is handed out only when no reader holds it and the last device copy that used it has completed
(``Event.query``, which never waits); when none is, the caller drops its work and counts it. On a CPU the
same functions read through numpy views at once (there is no device to wait for).

The events a reader waits on are made with blocking sync: the reader (the relay thread) sleeps until the GPU
reaches them instead of spinning a core. With default (spinning) events the relay thread used ~2.2 ms of CPU
per engine step in ``bench/gpu_vllm_hooks.py`` (vLLM, Kimi widths, batch 64, 1 in 16, a 3 ms forward queued
ahead), where pickling a step's few launches is far less: waiting is the likely rest (not yet re-measured with
blocking events). ``Event.query`` (the hooks' only use) is the same either way.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from draftscope_tracer.stats import ArrayBytes, Resolved, indexed_ints

INDEX_CACHE_SIZE = 256  # distinct index lists kept on the device (a batch's sampled rows repeat every step)
INDEX_SLOT_INTS = 1024  # longest index list staged through a slot (longer ones are refused, counted)
INDEX_SLOTS = 1024  # index uploads in flight (the GPU may be far behind the host); 8 MiB
INT_SLOT_BYTES = 32 * 1024  # HostInts: the small tensors of one verify step whole (up to batch 1024 x 2 tokens)
# HostInts reads in flight, held until the relay thread reads them (~0.1 s of verify steps, more when the GPU
# is behind); 32 MiB. 256 ran out 50 times on the H200 with 64 concurrent requests, every one sampled.
INT_SLOTS = 1024
PROBE = 8  # slots a reservation looks at before it gives up (counted)


_STREAM: list = [None, None]  # (raw handle, Stream) of the last current stream seen


def current_stream() -> "torch.cuda.Stream":
    """``torch.cuda.current_stream()`` without its Python cost (~10 µs) when the raw stream has not changed:
    the scheduler thread runs every hook on the same stream."""
    raw = torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())
    if raw != _STREAM[0]:
        _STREAM[:] = [raw, torch.cuda.current_stream()]
    return _STREAM[1]


def record(event: "torch.cuda.Event") -> None:
    """``event.record()`` on the current stream (see :func:`current_stream`)."""
    event.record(current_stream())


_MARKS = itertools.count(1)  # work marked so far (mark_later): ``next`` is atomic, whichever thread asks
_READ: Dict[Any, tuple] = {}  # stream -> (marks it covers, event) of the last event a reader recorded on it
_READ_LOCK = threading.Lock()


def mark_later(holder) -> None:
    """Mark the work just issued on the current stream as ``holder``'s without recording an event (each recording
    costs the hooks' thread host time): its reader records one behind it (:func:`wait_later`)."""
    holder.stream, holder.mark = current_stream(), next(_MARKS)


def wait_later(holder) -> None:
    """Wait (on the reader's thread) for the work :func:`mark_later` marked: behind the last event a reader recorded
    on its stream when that came after the mark, else behind one recorded now, which covers every mark made so far
    (so the relay, reading a batch of handles, records one event for them all)."""
    with _READ_LOCK:
        covered, event = _READ.get(holder.stream, (0, None))
        if holder.mark >= covered:
            covered, event = next(_MARKS), torch.cuda.Event(blocking=True)
            event.record(holder.stream)
            _READ[holder.stream] = (covered, event)
    event.synchronize()


def host_view(t: torch.Tensor) -> Optional[np.ndarray]:
    """``t`` as a numpy array sharing its memory, when ``t`` is a CPU tensor numpy can read (else None)."""
    if t.device.type != "cpu" or t.requires_grad or t.dtype == torch.bfloat16:
        return None
    return t.numpy()


class HostSlots:
    """``count`` host buffers of ``nbytes`` each (pinned on CUDA), carved from one allocation.

    ``reserve()`` returns a slot no reader holds whose last copy (``record``) has completed, or None
    (counted in ``full``): it never waits. The hooks' thread reserves and records; a reader may release
    from another thread (a list store under the GIL)."""

    def __init__(self, nbytes: int, count: int, device: torch.device, events: bool = True):
        """``events=False``: slots only the device writes (no host write can race a copy still queued), whose
        readers wait on an event of their own choosing; a slot is free again once released."""
        self.nbytes = (nbytes + 7) // 8 * 8
        cuda = torch.device(device).type == "cuda"
        self.memory = torch.zeros(self.nbytes * count, dtype=torch.uint8, pin_memory=cuda)
        self._held = [False] * count
        self._events = [torch.cuda.Event(blocking=True) for _ in range(count)] if cuda and events else None
        self._copied = [True] * count  # the slot's last copy is known to have completed (its reader waited)
        self._next = 0
        self.full = 0
        self._ints: Optional[List[torch.Tensor]] = None

    def __len__(self) -> int:
        return len(self._held)

    def buffer(self, slot: int) -> torch.Tensor:
        return self.memory[slot * self.nbytes:(slot + 1) * self.nbytes]

    def ints(self, slot: int) -> torch.Tensor:
        """Slot ``slot`` as int64 (views made once: slicing a tensor costs host time)."""
        if self._ints is None:
            self._ints = [self.buffer(i).view(torch.int64) for i in range(len(self._held))]
        return self._ints[slot]

    def reserve(self) -> Optional[int]:
        """Slots are taken in ring order, so the oldest ones come first: only ``PROBE`` of them are looked at
        (each look at an event is a CUDA call; scanning a full ring would cost milliseconds in a hook)."""
        held, events, copied, n = self._held, self._events, self._copied, len(self._held)
        for i in range(min(n, PROBE)):
            slot = (self._next + i) % n
            if held[slot] or not (copied[slot] or events is None or events[slot].query()):
                continue
            held[slot] = True
            self._next = (slot + 1) % n
            return slot
        self.full += 1
        return None

    def record(self, slot: int) -> Optional["torch.cuda.Event"]:
        """Mark the copies just issued into or out of ``slot`` (on CUDA: its event, returned)."""
        if self._events is None:
            return None
        event = self._events[slot]
        record(event)
        self._copied[slot] = False
        return event

    def release(self, slot: int, read: bool = False) -> None:
        """Give ``slot`` back; ``read``: its reader waited for its copy (the next reservation need not ask)."""
        if read:
            self._copied[slot] = True
        self._held[slot] = False


class Transfers:
    """The pinned slots of one device: index uploads and small reads."""

    def __init__(self, device: torch.device):
        self.device = device
        self.index = HostSlots(8 * INDEX_SLOT_INTS, INDEX_SLOTS, device)
        self.ints = HostSlots(INT_SLOT_BYTES, INT_SLOTS, device)
        self.cache: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()


_TRANSFERS: Dict[torch.device, Transfers] = {}


def prepare(device: torch.device | str) -> Transfers:
    """The slots of ``device``, allocated now (at attach: a late pinned allocation may wait for the GPU)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    out = _TRANSFERS.get(device)
    if out is None:
        out = _TRANSFERS[device] = Transfers(device)
    return out


def reserved(device: torch.device | str) -> int:
    """Bytes the CUDA caching allocator has reserved from CUDA on ``device`` since the process started (0 off CUDA):
    a counter that only grows, so the difference over a stretch of code is what that stretch reserved, even where
    the cache was emptied in it (``torch.cuda.graph`` empties it before each capture: the reserved total then
    drops by the engine's cached blocks, 3.4 GB under the tracer's attach on the Kimi bed). Host-side, no sync."""
    device = torch.device(device)
    return torch.cuda.memory_stats(device).get("reserved_bytes.all.allocated", 0) if device.type == "cuda" else 0


def reserved_now(device: torch.device | str) -> int:
    """Bytes the CUDA caching allocator holds reserved on ``device`` now, for the whole process (0 off CUDA):
    PyTorch's share of what ``nvidia-smi`` shows for the process, the rest being the CUDA context, loaded kernels and
    memory other libraries take from CUDA directly. Host-side, no sync."""
    device = torch.device(device)
    return torch.cuda.memory_stats(device).get("reserved_bytes.all.current", 0) if device.type == "cuda" else 0


def device_index(values: Sequence[int], device: torch.device, pad: int = 0) -> Optional[torch.Tensor]:
    """``values`` (then ``-1`` up to ``pad`` entries) as an int64 tensor on ``device`` (callers only read it).
    On CUDA it is staged through a pinned slot and copied without blocking; recent lists are kept. None when
    no slot is free or the list is longer than a slot (the caller drops its work and counts it)."""
    if device.type != "cuda":
        return torch.tensor([*values, *[-1] * (pad - len(values))], dtype=torch.int64, device=device)
    tr = prepare(device)
    key = (tuple(values), pad)  # the padding is built on a miss only
    out = tr.cache.get(key)
    if out is not None:
        tr.cache.move_to_end(key)
        return out
    if pad > len(values):
        values = [*values, *[-1] * (pad - len(values))]
    slot = tr.index.reserve() if len(values) <= INDEX_SLOT_INTS else None
    if slot is None:
        return None
    host = tr.index.buffer(slot).view(torch.int64)[:len(values)]
    host.numpy()[:] = values
    out = torch.empty(len(values), dtype=torch.int64, device=tr.device)
    out.copy_(host, non_blocking=True)
    tr.index.record(slot)
    tr.index.release(slot)  # reusable once the copy has run (reserve checks the event)
    tr.cache[key] = out
    if len(tr.cache) > INDEX_CACHE_SIZE:
        tr.cache.popitem(last=False)
    return out


def later_list(t: torch.Tensor) -> Callable[[], list]:
    """``t.tolist`` for another thread to call, without a host sync here. For values read once, at attach:
    on CUDA it allocates its own pinned buffer."""
    if t.device.type != "cuda":
        return t.tolist
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    event = torch.cuda.Event()
    event.record()

    def load() -> list:
        event.synchronize()
        return host.tolist()

    return load


class HostInts:
    """``tensor[index]`` of each ``(tensor, index)`` pair as one flat list of Python ints.

    On CUDA the (small) tensors are copied whole into one pinned int64 slot, one after the other (a
    ``torch.cat`` of mixed int dtypes costs more host time than the copies), without blocking, with the
    slot's event; the indexing happens on the host in ``result()``, on the reader's thread. ``ok`` is False when no slot was free or the tensors do not fit
    one (the caller drops the record and counts it)."""

    def __init__(self, parts: Sequence[Tuple[torch.Tensor, List[int]]]):
        self.event, self._host, self._slots, self._slot = None, None, None, None
        self.ok = True
        views = [host_view(t) for t, _ in parts]
        if all(v is not None for v in views):
            self._values: Optional[list] = np.concatenate(
                [v[i].astype(np.int64) for v, (_, i) in zip(views, parts)]).tolist()
            return
        self._values = None
        device = next(t.device for t, _ in parts if t.device.type != "cpu")
        slots = prepare(device).ints
        self._parts, at = [], 0  # (offset of the tensor in the joined one, its index list)
        for t, index in parts:
            self._parts.append((at, index))
            at += t.numel()
        slot = slots.reserve() if at * 8 <= slots.nbytes else None
        if slot is None:
            self.ok = False
            return
        host = slots.ints(slot)
        for (t, _), (offset, _) in zip(parts, self._parts):  # int32 tensors widen on the way
            host[offset:offset + t.numel()].copy_(t.view(-1) if t.dim() == 1 else t.reshape(-1), non_blocking=True)
        self._host = host[:at]
        self._slots, self._slot = slots, slot
        self.event = slots.record(slot)

    def __reduce__(self):
        """Pickled as the joined tensor's bytes and the (offset, index list) pairs (decoded in the recorder)."""
        if self._values is not None:
            return Resolved, (self._values,)
        self._wait()
        data = self._host.numpy().tobytes()
        self.release(read=True)
        return ArrayBytes, ("ints", [(data, "int64", (len(data) // 8,))], self._parts)

    def ready(self) -> bool:
        """Whether the copy has completed (``Event.query``: never waits); :meth:`result` then reads it without
        waiting. False for a read that was dropped (``ok`` False)."""
        if self._values is not None:
            return True
        if not self.ok or self._host is None:
            return False
        if self.event is not None and not self.event.query():
            return False
        self.event = None  # seen done: result() need not ask the device again
        return True

    def result(self) -> list:
        if self._values is None:
            self._wait()
            self._values = indexed_ints([self._host.numpy()], self._parts)
            self.release(read=True)
        return self._values

    def _wait(self) -> None:
        if not self.ok or self._host is None:
            raise RuntimeError("HostInts: no pinned slot was free, or this read was released; it was dropped")
        if self.event is not None:
            self.event.synchronize()

    def release(self, read: bool = False) -> None:
        """Give the slot back (after reading: ``read``, or when the record is dropped). Safe to call twice."""
        if self._slot is not None:
            self._host = None
            self._slots.release(self._slot, read)
            self._slot = None
