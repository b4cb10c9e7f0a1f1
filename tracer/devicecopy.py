"""Index tensors to the device and selected elements back, without a host sync.

On CUDA a host list becomes a device index tensor through pinned memory and a ``non_blocking`` copy
(``device_index``, which keeps recent ones): a pageable copy or ``torch.tensor(list, device=cuda)``
waits for the stream, i.e. for all GPU work queued ahead. PyTorch's pinned allocator keeps the host
block until the copy is done.
``HostInts`` copies a few small device tensors into pinned memory without blocking, with an event
that ``result()`` synchronises before indexing them (on the relay thread, when the call is pickled for
the recorder). On a CPU the elements are read through numpy views
at once (a few microseconds; there is no device to wait for).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .stats import Resolved


def host_view(t: torch.Tensor) -> Optional[np.ndarray]:
    """``t`` as a numpy array sharing its memory, when ``t`` is a CPU tensor numpy can read (else None)."""
    if t.device.type != "cpu" or t.requires_grad or t.dtype == torch.bfloat16:
        return None
    return t.numpy()


_INDEX_CACHE: "OrderedDict[tuple, torch.Tensor]" = OrderedDict()
INDEX_CACHE_SIZE = 256  # distinct index lists kept on the device (a batch's sampled rows repeat every step)


def device_index(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device`` (never written to: callers only read it). On CUDA the
    tensors of recent lists are kept, so a batch whose sampled rows have not changed costs no copy; a new
    list is copied from pinned memory without blocking."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=torch.int64, device=device)
    key = (device, *values)
    out = _INDEX_CACHE.get(key)
    if out is not None:
        _INDEX_CACHE.move_to_end(key)
        return out
    host = torch.empty(len(values), dtype=torch.int64, pin_memory=True)
    host.numpy()[:] = values
    out = _INDEX_CACHE[key] = host.to(device, non_blocking=True)
    if len(_INDEX_CACHE) > INDEX_CACHE_SIZE:
        _INDEX_CACHE.popitem(last=False)
    return out


def later_list(t: torch.Tensor) -> Callable[[], list]:
    """``t.tolist`` for another thread to call, without a host sync here: on CUDA a non-blocking copy
    into pinned memory now and an event that the returned function waits on."""
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

    On CUDA each (small) tensor is copied whole into pinned memory without blocking, one copy per
    tensor and one event; the indexing happens on the host in ``result()``."""

    def __init__(self, parts: Sequence[Tuple[torch.Tensor, List[int]]]):
        self.event, self._parts = None, None
        views = [host_view(t) for t, _ in parts]
        if all(v is not None for v in views):
            self._values: Optional[list] = np.concatenate(
                [v[i].astype(np.int64) for v, (_, i) in zip(views, parts)]).tolist()
            return
        self._values = None
        self._parts = []
        for t, index in parts:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
            host.copy_(t, non_blocking=True)
            self._parts.append((host, index))
        if any(t.is_cuda for t, _ in parts):
            self.event = torch.cuda.Event()
            self.event.record()

    def __reduce__(self):
        return Resolved, (self.result(),)

    def result(self) -> list:
        if self._values is None:
            if self.event is not None:
                self.event.synchronize()
            self._values = np.concatenate([host.numpy()[index].astype(np.int64)
                                           for host, index in self._parts]).tolist()
            self._parts = None
        return self._values
