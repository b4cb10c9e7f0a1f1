"""Index tensors to the device and selected elements back, without a host sync.

On CUDA a host list becomes a device index tensor through pinned memory and a ``non_blocking`` copy
(``device_index``): a pageable copy or ``torch.tensor(list, device=cuda)`` waits for the stream, i.e.
for all GPU work queued ahead. PyTorch's pinned allocator keeps the host block until the copy is done.
``HostInts`` gathers elements of a few device tensors with one such index copy, one concatenation and
one non-blocking copy into pinned memory, and an event that ``result()`` synchronises (on the relay
thread, when the call is pickled for the recorder). On a CPU the elements are read through numpy views
at once (a few microseconds; there is no device to wait for).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .stats import Resolved


def host_view(t: torch.Tensor) -> Optional[np.ndarray]:
    """``t`` as a numpy array sharing its memory, when ``t`` is a CPU tensor numpy can read (else None)."""
    if t.device.type != "cpu" or t.requires_grad or t.dtype == torch.bfloat16:
        return None
    return t.numpy()


def device_index(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``; on CUDA copied from pinned memory without blocking."""
    if device.type != "cuda":
        return torch.tensor(values, dtype=torch.int64, device=device)
    host = torch.empty(len(values), dtype=torch.int64, pin_memory=True)
    host.numpy()[:] = values
    return host.to(device, non_blocking=True)


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
    """``tensor[index]`` of each ``(tensor, index)`` pair as one flat list of Python ints."""

    def __init__(self, parts: Sequence[Tuple[torch.Tensor, List[int]]]):
        views = [host_view(t) for t, _ in parts]
        self.event = None
        if all(v is not None for v in views):
            self._values: Optional[list] = np.concatenate(
                [v[i].astype(np.int64) for v, (_, i) in zip(views, parts)]).tolist()
            return
        self._values = None
        index = device_index([k for _, i in parts for k in i], parts[0][0].device)
        pieces, at = [], 0
        for t, i in parts:
            pieces.append(t[index[at:at + len(i)]].to(torch.int64))
            at += len(i)
        flat = torch.cat(pieces)
        self.host = torch.empty(flat.shape, dtype=torch.int64, device="cpu", pin_memory=flat.is_cuda)
        self.host.copy_(flat, non_blocking=True)
        if flat.is_cuda:
            self.event = torch.cuda.Event()
            self.event.record()

    def __reduce__(self):
        return Resolved, (self.result(),)

    def result(self) -> list:
        if self._values is None:
            if self.event is not None:
                self.event.synchronize()
            self._values = self.host.tolist()
        return self._values
