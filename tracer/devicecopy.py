"""One non-blocking copy of a device tensor into host memory, completed by an event (no host sync).

On the CPU the same code runs: the copy is a plain copy and there is no event to wait on.
"""

from __future__ import annotations

import torch


class HostCopy:
    """``tensor`` copied into a (pinned, on CUDA) host buffer in stream order; ``wait()`` returns it."""

    def __init__(self, tensor: torch.Tensor):
        self.host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=tensor.is_cuda)
        self.host.copy_(tensor.detach(), non_blocking=True)
        self.event = None
        if tensor.is_cuda:
            self.event = torch.cuda.Event()
            self.event.record()

    def wait(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.host
