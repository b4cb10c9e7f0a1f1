"""Device-side reductions and one non-blocking copy to host, completed by an event (no host sync).

On the CPU the same code runs: the copy is a plain copy and there is no event to wait on.
"""

from __future__ import annotations

from typing import Dict

import torch

STAT_FIELDS = ("rows", "l2_mean", "l2_max", "mean", "std", "absmax", "nan_count", "inf_count")


def row_stats(x: torch.Tensor) -> torch.Tensor:
    """``STAT_FIELDS`` of ``x [rows, width]`` as one float32 tensor on x's device (no sync)."""
    x = x.detach().float()
    nan = torch.isnan(x)
    inf = torch.isinf(x)
    finite = torch.where(nan | inf, torch.zeros((), device=x.device), x)
    l2 = finite.norm(dim=-1)
    n = torch.tensor(float(x.shape[0]), device=x.device)
    return torch.stack([n, l2.mean(), l2.amax(), finite.mean(), finite.std(unbiased=False),
                        finite.abs().amax(), nan.sum().float(), inf.sum().float()])


def probs_topk(logits: torch.Tensor, k: int):
    """(probs, ids) of the top ``k`` of ``softmax(logits)`` per row, on device."""
    probs = torch.softmax(logits.detach().float(), dim=-1)
    return torch.topk(probs, min(k, probs.shape[-1]), dim=-1)


class HostCopy:
    """Tensors copied into (pinned, on CUDA) host buffers in stream order; ``wait()`` returns them."""

    def __init__(self, tensors: Dict[str, torch.Tensor]):
        self.host: Dict[str, torch.Tensor] = {}
        on_cuda = False
        for key, t in tensors.items():
            on_cuda = on_cuda or t.is_cuda
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
            buf.copy_(t.detach(), non_blocking=True)
            self.host[key] = buf
        self.event = None
        if on_cuda:
            self.event = torch.cuda.Event()
            self.event.record()

    def wait(self) -> Dict[str, torch.Tensor]:
        if self.event is not None:
            self.event.synchronize()
        return self.host
