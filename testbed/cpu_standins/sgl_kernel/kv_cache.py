"""KV-pool bookkeeping: moving rows across every layer buffer and filling `req_to_token`.

Written from the triton kernels in `sglang/kernels/ops/kvcache/cache_move.py`,
`sglang/srt/mem_cache/allocation.py` and `sglang/kernels/ops/speculative/cache_locs.py`.
"""

import ctypes

import torch

_NS = "sgl_kernel"


def _segments(start_offset, end_offset):
    """(i, start, end, out_offset) per request; out_offset packs the segments back to back."""
    out = 0
    for i in range(start_offset.shape[0]):
        start, end = int(start_offset[i]), int(end_offset[i])
        yield i, start, end, out
        out += end - start


@torch.library.custom_op(f"{_NS}::copy_all_layer_kv_cache_cpu", mutates_args=())
def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """In every buffer (raw address `data_ptrs[b]`, row size `strides[b]` bytes) copy row `src_loc[j]`
    onto row `tgt_loc[j]`. All sources are read before any target is written (safe in place)."""
    if tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.long(), src_loc.long()
    rows = int(max(tgt.max(), src.max())) + 1
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        raw = (ctypes.c_uint8 * (rows * row_bytes)).from_address(address)
        buffer = torch.frombuffer(raw, dtype=torch.uint8).view(rows, row_bytes)
        buffer[tgt] = buffer[src]


@torch.library.custom_op(f"{_NS}::assign_req_to_token_pool_cpu", mutates_args=("req_to_token",))
def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """`req_to_token[req_i, start_i:end_i] = out_cache_loc[packed segment i]`."""
    for i, start, end, out in _segments(start_offset, end_offset):
        req_to_token[req_pool_indices[i], start:end] = out_cache_loc[out : out + end - start].to(
            req_to_token.dtype
        )


@torch.library.custom_op(f"{_NS}::assign_extend_cache_locs_cpu", mutates_args=("out_cache_loc",))
def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """`out_cache_loc[packed segment i] = req_to_token[req_i, start_i:end_i]`."""
    for i, start, end, out in _segments(start_offset, end_offset):
        out_cache_loc[out : out + end - start] = req_to_token[req_pool_indices[i], start:end].to(
            out_cache_loc.dtype
        )


@torch.library.custom_op(
    f"{_NS}::assign_draft_cache_locs_contiguous_cpu", mutates_args=("out_cache_loc",)
)
def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """`out_cache_loc[i*n:(i+1)*n] = req_to_token[req_i, seq_len_i : seq_len_i + n]`, n = topk*steps."""
    n = topk * num_steps
    for i in range(seq_lens.shape[0]):
        start = int(seq_lens[i])
        out_cache_loc[i * n : (i + 1) * n] = req_to_token[req_pool_indices[i], start : start + n].to(
            out_cache_loc.dtype
        )
