"""Paged attention for `IntelAMXAttnBackend`: `decode_attention_cpu`, `extend_attention_cpu`.

K/V live in per-layer buffers `[pool_size, kv_heads, head_dim]`; `req_to_token[req, pos]` is the pool
slot of token `pos` of request `req`. Heads are grouped (GQA): query head h reads KV head
`h // (heads // kv_heads)`. Supported: causal self-attention, logit soft-capping, the QLEN_ONLY tree masks
of a speculative verify with topk > 1. Not supported (they raise): sliding windows, attention sinks,
cross-attention, fp8 caches.
"""

from typing import Optional

import torch

_NS = "sgl_kernel"


def _reject_unsupported(op, k_buffer, is_cross_attention, window_plus_one, sinks):
    reasons = []
    if is_cross_attention:
        reasons.append("cross-attention")
    if window_plus_one > 0:
        reasons.append(f"sliding window {window_plus_one - 1}")
    if sinks is not None:
        reasons.append("attention sinks")
    if k_buffer.dtype.is_floating_point and k_buffer.dtype.itemsize == 1:
        reasons.append(f"{k_buffer.dtype} KV cache")
    if reasons:
        raise NotImplementedError(
            f"sgl_kernel.{op} stand-in (testbed/cpu_standins) does not support " + ", ".join(reasons)
        )


def attend(q, keys, values, sm_scale, logit_cap, causal_offset, visible=None):
    """q `[n, H, D]`, keys/values `[L, Hkv, D]` -> `[n, H, Dv]` (float32).

    With `causal_offset` c, query i sees keys `0 .. c + i`; None means every key, or the keys
    `visible[i]` marks (a bool `[n, L]`) when given.
    """
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1)
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if causal_offset is not None:
        n, length = q.shape[0], keys.shape[0]
        visible = torch.arange(length)[None, :] <= causal_offset + torch.arange(n)[:, None]
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)


@torch.library.custom_op(f"{_NS}::decode_attention_cpu", mutates_args=("k_buffer", "v_buffer", "o"))
def decode_attention_cpu(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    o: torch.Tensor,
    k: Optional[torch.Tensor],
    v: Optional[torch.Tensor],
    cache_loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_plus_one: int,
    encoder_lens: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
) -> None:
    """One new query token per sequence; writes the new K/V (when given) at `cache_loc` first."""
    _reject_unsupported("decode_attention_cpu", k_buffer, is_cross_attention, sliding_window_plus_one, sinks)
    if k is not None and v is not None:
        k_buffer[cache_loc] = k.to(k_buffer.dtype)
        v_buffer[cache_loc] = v.to(v_buffer.dtype)
    for i in range(seq_lens.shape[0]):
        slots = req_to_token[req_pool_indices[i], : seq_lens[i]].long()
        out = attend(q[i : i + 1], k_buffer[slots] * key_scale, v_buffer[slots] * value_scale,
                     sm_scale, logit_cap, None)
        o[i] = out[0].to(o.dtype)


@torch.library.custom_op(f"{_NS}::extend_attention_cpu", mutates_args=("o_extend",))
def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: Optional[torch.Tensor],
    v_extend: Optional[torch.Tensor],
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_extend_len: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_plus_one: int,
    encoder_lens: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
    tree_mask: Optional[torch.Tensor],
    is_causal: bool,
) -> None:
    """Each sequence's new tokens attend to its cached prefix plus (causally) to each other; with a
    `tree_mask` (a verify's draft tree, QLEN_ONLY: `n x n` per sequence, node i sees node j where set),
    to the prefix plus their ancestors."""
    _reject_unsupported("extend_attention_cpu", k_buffer, is_cross_attention, sliding_window_plus_one, sinks)
    mask_at = 0
    for i in range(seq_lens.shape[0]):
        n, start, total = int(extend_seq_lens[i]), int(extend_start_loc[i]), int(seq_lens[i])
        prefix = total - n
        row = req_to_token[req_pool_indices[i]].long()
        if k_extend is not None and v_extend is not None:
            keys = torch.cat([k_buffer[row[:prefix]], k_extend[start : start + n].to(k_buffer.dtype)])
            values = torch.cat([v_buffer[row[:prefix]], v_extend[start : start + n].to(v_buffer.dtype)])
        else:
            keys, values = k_buffer[row[:total]], v_buffer[row[:total]]
        visible = None
        if tree_mask is not None:
            tree = tree_mask[mask_at : mask_at + n * n].view(n, n).bool()
            visible = torch.cat([torch.ones(n, prefix, dtype=torch.bool), tree], dim=1)
            mask_at += n * n
        out = attend(q_extend[start : start + n], keys * key_scale, values * value_scale, sm_scale,
                     logit_cap, prefix if is_causal and visible is None else None, visible)
        o_extend[start : start + n] = out.to(o_extend.dtype)
