"""GPU test bed only: a pure-PyTorch stand-in for SGLang's CUDA kernel wheel (``sgl_kernel``).

It implements the symbols that a dense Llama target, its ``LlamaForCausalLMEagle3`` draft and
``EAGLEWorkerV2`` call on CUDA with the kit's settings (``SGLANG_FORCE_FUSED_OP_BACKEND=torch``):
RMS norms, gated activations, top-k / top-p renormalisation and ``weak_ref_tensor``. Any other name
imports as a stub that raises :class:`StandinNotImplemented` naming itself if it is ever called, and
``torch.ops.sgl_kernel`` stays empty, so SGLang's ``hasattr(torch.ops.sgl_kernel, ...)`` probes say
no. Each symbol logs one ``[sgl_kernel stand-in] called NAME`` line the first time it runs, so a run's
log lists what was used.
"""

import torch
import torch.nn.functional as F

from ._stub import StandinNotImplemented, module_getattr, used

__version__ = "0.0.0+draftscope-gpu-testbed"
__all__ = ["StandinNotImplemented"]


def _rms(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


@used
def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    y = _rms(input, weight, eps)
    return y if out is None else out.copy_(y)


@used
def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps))


def _gated(act):
    def op(input, out=None, enable_pdl=None):
        d = input.shape[-1] // 2
        y = (act(input[..., :d].float()) * input[..., d:].float()).to(input.dtype)
        return y if out is None else out.copy_(y)
    return op


silu_and_mul = used(_gated(F.silu), "silu_and_mul")
gelu_and_mul = used(_gated(F.gelu), "gelu_and_mul")
gelu_tanh_and_mul = used(_gated(lambda x: F.gelu(x, approximate="tanh")), "gelu_tanh_and_mul")


def _per_row(value, probs, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(device=probs.device, dtype=dtype).view(-1, 1)
    return torch.full((probs.shape[0], 1), value, device=probs.device, dtype=dtype)


@used
def top_k_renorm_prob(probs, top_k, *args, **kwargs):
    k = _per_row(top_k, probs, torch.long).clamp(1, probs.shape[-1])
    kth = probs.sort(dim=-1, descending=True).values.gather(-1, k - 1)
    kept = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


@used
def top_p_renorm_prob(probs, top_p, *args, **kwargs):
    sorted_p, order = probs.sort(dim=-1, descending=True)
    keep_sorted = (sorted_p.cumsum(-1) - sorted_p) < _per_row(top_p, probs, probs.dtype)
    keep_sorted[..., 0] = True
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


@used
def weak_ref_tensor(tensor):
    """The real op returns a non-owning alias; an owning alias is a safe superset (the graph runners
    only read through it)."""
    return tensor


__getattr__ = module_getattr(__name__)
