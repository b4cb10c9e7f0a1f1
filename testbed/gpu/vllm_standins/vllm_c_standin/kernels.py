"""Pure-PyTorch bodies for the vLLM 0.32 compiled ops that the GPU test bed's path can reach.

Each function has the argument list of the op's schema in ``schemas.txt`` (the release's own, read from
its ``_C_stable_libtorch`` binary) and the semantics of vLLM's CUDA kernel: in-place ops write their
outputs and return ``None``. Half-precision inputs are computed in float32 and cast back, as the
kernels accumulate; float64 stays float64 (the tests compare with float64 references).
"""

import torch


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rms(x: torch.Tensor, weight, epsilon: float) -> torch.Tensor:
    xf = x.to(_acc(x.dtype))
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)
    return y.to(x.dtype) if weight is None else y.to(weight.dtype) * weight


def rms_norm(result, input, weight, epsilon):
    """``result = input / rms(input) * weight`` over the last dimension."""
    result.copy_(_rms(input, weight, epsilon))


def fused_add_rms_norm(input, residual, weight, epsilon):
    """``residual += input``; then ``input = rms_norm(residual) * weight``, both in place."""
    total = input.to(_acc(input.dtype)) + residual.to(_acc(input.dtype))
    residual.copy_(total)
    input.copy_(_rms(total, weight, epsilon).to(input.dtype))


def silu_and_mul(result, input):
    """``result = silu(input[..., :d]) * input[..., d:]`` with ``d = input.shape[-1] // 2``."""
    d = input.shape[-1] // 2
    x = input.to(_acc(input.dtype))
    result.copy_(torch.nn.functional.silu(x[..., :d]) * x[..., d:])


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0,
                     inverse=False):
    """Rotate ``query`` (and ``key`` unless None) in place by the angles at ``positions``.

    ``cos_sin_cache[pos]`` holds ``rot_dim / 2`` cosines then as many sines; each head's dimensions
    ``[rope_dim_offset, rope_dim_offset + rot_dim)`` are rotated, NeoX style (first half against second
    half) or GPT-J style (even against odd); ``inverse`` rotates by the opposite angle.
    """
    rot_dim = cos_sin_cache.shape[-1]
    half = rot_dim // 2
    pos = positions.flatten()
    cos_sin = cos_sin_cache.index_select(0, pos).to(_acc(query.dtype))
    cos = cos_sin[:, :half].unsqueeze(1)
    sin = cos_sin[:, half:].unsqueeze(1)
    if inverse:
        sin = -sin
    for x in (query, key):
        if x is None:
            continue
        heads = x.view(pos.shape[0], -1, head_size)
        part = heads[..., rope_dim_offset:rope_dim_offset + rot_dim]
        xf = part.to(cos.dtype)
        if is_neox:
            x1, x2 = xf[..., :half], xf[..., half:]
            rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = xf[..., 0::2], xf[..., 1::2]
            rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        part.copy_(rotated)


def apply_repetition_penalties_(logits, prompt_mask, output_mask, repetition_penalties):
    """Where a token was in the prompt or the output: positive logits divided by the row's penalty,
    the others multiplied by it; in place."""
    seen = prompt_mask | output_mask
    penalty = repetition_penalties.to(logits.dtype).unsqueeze(1).expand_as(logits)
    scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
    logits.copy_(torch.where(seen, scaled, logits))


def dsv3_fused_a_gemm(output, mat_a, mat_b, enable_pdl=False):
    """``output = mat_a @ mat_b``: DeepSeek-V3's fused q_a/kv_a projection for 1-16 tokens (vLLM calls it with
    ``mat_b`` the transposed weight, ``[7168, 2112]``, on Hopper in bf16); ``enable_pdl`` is a launch hint."""
    output.copy_(torch.mm(mat_a, mat_b))


def _slots(slot_mapping, block_size: int, kv_cache_dtype: str):
    """Per counted row: the row whose data it writes and that row's (block, offset), and whether it writes at all,
    with no shape that depends on the data (a CUDA-graph capture allows no host read: no ``nonzero``). A padding
    row (slot ``-1``, which vLLM's kernel skips) repeats the first real row's write, the same value to the same
    place; with no real row, every row rewrites slot 0 with what it holds (``writes`` all false)."""
    if kv_cache_dtype != "auto":
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r}: the GPU test bed's stand-in writes unquantised "
                         "caches only (kv_cache_dtype 'auto')")
    real = slot_mapping >= 0
    rows = torch.where(real, torch.arange(len(slot_mapping), device=slot_mapping.device), real.int().argmax())
    slots = slot_mapping[rows].long()
    writes = slots >= 0
    slots = slots.clamp(min=0)
    return slots // block_size, slots % block_size, rows, writes


def _write(cache, block, offset, rows, writes, data) -> None:
    """``cache[block, offset] = data[rows]`` where ``writes``; elsewhere the cache keeps what it holds."""
    keep = writes.view(-1, *[1] * (data.dim() - 1))
    cache[block, offset] = torch.where(keep, data[rows].to(cache.dtype), cache[block, offset])


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """``key[t]`` and ``value[t]`` ``[heads, head_size]`` into ``*_cache[slot // block_size, slot % block_size]``
    (caches ``[blocks, block_size, heads, head_size]``, any strides). Only the first ``len(slot_mapping)`` rows
    count: vLLM pads the inputs for CUDA graphs."""
    where = _slots(slot_mapping, key_cache.shape[1], kv_cache_dtype)
    _write(key_cache, *where, key)
    _write(value_cache, *where, value)


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """MLA's cache row: the compressed KV ``kv_c[t]`` then the rotary key ``k_pe[t]``, at
    ``kv_cache[slot // block_size, slot % block_size]`` (cache ``[blocks, block_size, kv_lora_rank + rope_dim]``)."""
    where = _slots(slot_mapping, kv_cache.shape[1], kv_cache_dtype)
    _write(kv_cache, *where, torch.cat((kv_c[:len(slot_mapping)], k_pe[:len(slot_mapping)]), dim=-1))


def _alias(tensor: torch.Tensor, data_ptr: int, nbytes: int, device: torch.device) -> torch.Tensor:
    """A tensor over ``nbytes`` at ``data_ptr`` on ``device`` with ``tensor``'s shape and strides, whose
    storage does not own (or keep alive) that memory."""
    storage = torch._C._construct_storage_from_data_pointer(data_ptr, device, nbytes)
    return torch.empty(0, dtype=tensor.dtype, device=device).set_(
        storage, tensor.storage_offset(), tensor.size(), tensor.stride())


def weak_ref_tensor(input):
    """The same memory, shape and strides as ``input``, without keeping it alive (vLLM's CUDA-graph
    wrappers hold captured outputs this way, so the graph pool can be reused)."""
    storage = input.untyped_storage()
    return _alias(input, storage.data_ptr(), storage.nbytes(), input.device)


def get_cuda_view_from_cpu_tensor(cpu_tensor):
    """A CUDA tensor over pinned host memory (Unified Virtual Addressing: a pinned host pointer is valid
    on the device as it is). The caller keeps ``cpu_tensor`` alive, as Model Runner V2's UVA buffers do."""
    if not cpu_tensor.is_pinned():
        raise ValueError("get_cuda_view_from_cpu_tensor needs pinned host memory (pin_memory=True)")
    storage = cpu_tensor.untyped_storage()
    return _alias(cpu_tensor, storage.data_ptr(), storage.nbytes(), torch.device("cuda", torch.cuda.current_device()))


def no_cutlass_kernel(cuda_device_capability):
    """The ``cutlass_*_supported`` / ``*_supports_*`` queries: this build has none of those kernels (vLLM asks
    at import and then picks its Triton or PyTorch paths)."""
    return False


IMPLEMENTED = {
    "_C::rms_norm": rms_norm,
    "_C::fused_add_rms_norm": fused_add_rms_norm,
    "_C::silu_and_mul": silu_and_mul,
    "_C::rotary_embedding": rotary_embedding,
    "_C::apply_repetition_penalties_": apply_repetition_penalties_,
    "_C::dsv3_fused_a_gemm": dsv3_fused_a_gemm,
    "_C::weak_ref_tensor": weak_ref_tensor,
    "_C::get_cuda_view_from_cpu_tensor": get_cuda_view_from_cpu_tensor,
    "_C_cache_ops::reshape_and_cache_flash": reshape_and_cache_flash,
    "_C_cache_ops::concat_and_cache_mla": concat_and_cache_mla,
    **{f"_C::{query}": no_cutlass_kernel for query in (
        "cutlass_group_gemm_supported", "cutlass_scaled_mm_supports_block_fp8", "cutlass_scaled_mm_supports_fp4",
        "cutlass_scaled_mm_supports_fp8", "mxfp4_experts_quant_supported")},
}
