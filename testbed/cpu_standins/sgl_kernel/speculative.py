"""EAGLE helpers: draft-decode metadata, tree build, greedy verify, bonus tokens, accepted slots.

Tree build and greedy verify are line-by-line ports of `build_tree_efficient` and
`VerifyTreeGreedy` in `sglang/kernels/jit/include/sgl_kernel/speculative/eagle.cuh`; the bonus-token
and accepted-slot helpers port the triton kernels in `sglang/kernels/ops/speculative/eagle.py`.
"""

import torch

_NS = "sgl_kernel"
FULL_MASK, QLEN_ONLY, QLEN_ONLY_BITPACKING = 0, 1, 2


@torch.library.custom_op(f"{_NS}::build_draft_decode_metadata_cpu", mutates_args=())
def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """The `req_to_token` rows the draft decode steps read, one per (request, branch): row
    ``b * topk + k`` is request ``b``'s committed prefix followed by branch ``k``'s draft slots, which
    `assign_draft_cache_locs_contiguous` lays out in the request's own row at ``seq_len + k * num_steps``
    (a chain's, topk 1, follow the prefix). Only the first ``seq_len + num_steps`` entries of a row are
    defined, as in the kernel."""
    rows = req_to_token[req_pool_indices.long()]
    if topk == 1:
        return rows.clone()
    out = torch.zeros((rows.shape[0] * topk, pool_len), dtype=req_to_token.dtype)
    for b, sl in enumerate(seq_lens.tolist()):
        for k in range(topk):
            out[b * topk + k, :sl] = rows[b, :sl]
            start = sl + k * num_steps
            out[b * topk + k, sl:sl + num_steps] = rows[b, start:start + num_steps]
    return out


@torch.library.custom_op(
    f"{_NS}::build_tree_kernel_efficient_cpu",
    mutates_args=("tree_mask", "positions", "retrive_index", "retrive_next_token", "retrive_next_sibling"),
)
def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Port of `build_tree_efficient` (FULL_MASK and QLEN_ONLY; bit-packed masks raise)."""
    if tree_mask_mode not in (FULL_MASK, QLEN_ONLY):
        raise NotImplementedError(
            f"sgl_kernel.build_tree_kernel_efficient_cpu stand-in: tree_mask_mode {tree_mask_mode} "
            "(bit-packed) is not supported"
        )
    parents = parent_list.reshape(-1).tolist()
    selected = selected_index.reshape(-1).tolist()
    seq_lens = verified_seq_len.tolist()
    mask = tree_mask.reshape(-1)
    n = draft_token_num
    parent_stride, sel_stride = topk * (depth - 1) + 1, n - 1
    next_token = retrive_next_token.reshape(-1)
    next_sibling = retrive_next_sibling.reshape(-1)
    index = retrive_index.reshape(-1)
    seq_tree_idx = 0
    for bid, seq_len in enumerate(seq_lens):
        sel = selected[bid * sel_stride : (bid + 1) * sel_stride]
        par = parents[bid * parent_stride : (bid + 1) * parent_stride]
        for tid in range(n):
            if tree_mask_mode == FULL_MASK:
                token_tree_idx = seq_tree_idx + (seq_len + n) * tid + seq_len + 1
            else:
                token_tree_idx = n * n * bid + n * tid + 1
            mask[token_tree_idx - 1] = True
            mask[token_tree_idx : token_tree_idx + n - 1] = False
            if tid == 0:
                positions[bid * n] = seq_len
                for i in range(n - 1, 0, -1):
                    index[bid * n + i] = bid * n + i
                    parent_tb_idx = sel[i - 1] // topk
                    parent_position = 0
                    if parent_tb_idx > 0:
                        parent_token_idx = par[parent_tb_idx]
                        while parent_position < n:
                            if parent_position < n - 1 and sel[parent_position] == parent_token_idx:
                                parent_position += 1
                                break
                            parent_position += 1
                    if parent_position == n:
                        continue  # invalid tree: the CUDA kernel warns and skips the token
                    origin = int(next_token[bid * n + parent_position])
                    next_token[bid * n + parent_position] = i
                    if origin != -1:
                        next_sibling[bid * n + i] = origin
                index[bid * n] = bid * n
            else:
                position, cur = 0, tid - 1
                while True:
                    position += 1
                    mask[token_tree_idx + cur] = True
                    parent_tb_idx = sel[cur] // topk
                    if parent_tb_idx == 0:
                        break
                    token_idx = par[parent_tb_idx]
                    cur = next((j for j in range(n - 1) if sel[j] == token_idx), None)
                    if cur is None:
                        break  # invalid tree (no selected parent): the CUDA kernel reads past the row
                positions[bid * n + tid] = position + seq_len
        seq_tree_idx += n * n + seq_len * n


@torch.library.custom_op(
    f"{_NS}::verify_tree_greedy_cpu", mutates_args=("predicts", "accept_index", "accept_token_num")
)
def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Port of `VerifyTreeGreedy`: walk the tree, accepting a child whose token equals the target's
    prediction at the last accepted node; `accept_token_num` counts accepted drafts (no bonus)."""
    bs, num_draft = candidates.shape[0], candidates.shape[1]
    num_spec = accept_index.shape[1]
    cand = candidates.reshape(-1).tolist()
    r_index = retrive_index.reshape(-1).tolist()
    r_next = retrive_next_token.reshape(-1).tolist()
    r_sibling = retrive_next_sibling.reshape(-1).tolist()
    target = target_predict.reshape(-1).tolist()
    for bx in range(bs):
        last = r_index[bx * num_draft]
        accept_index[bx, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, num_spec):
            cur = r_next[bx * num_draft + cur]
            while cur != -1:
                draft_index = r_index[bx * num_draft + cur]
                if cand[bx * num_draft + cur] == target[last]:
                    predicts[last] = target[last]
                    accepted += 1
                    accept_index[bx, accepted] = draft_index
                    last = draft_index
                    break
                cur = r_sibling[bx * num_draft + cur]
            if cur == -1:
                break
        accept_token_num[bx] = accepted
        predicts[last] = target[last]


@torch.library.custom_op(f"{_NS}::fill_bonus_tokens_cpu", mutates_args=("bonus_tokens",))
def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """`bonus_tokens[i] = accept_tokens.flat[accept_stride*i + accept_lens[i] - 1]` (last accepted)."""
    flat = accept_tokens.reshape(-1)
    for i in range(accept_lens.shape[0]):
        bonus_tokens[i] = flat[accept_stride * i + int(accept_lens[i]) - 1]


@torch.library.custom_op(f"{_NS}::fill_accept_out_cache_loc_cpu", mutates_args=("accept_out_cache_loc",))
def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """Pack `out_cache_loc[accept_index[j]]` for every `accept_index[j] != -1`, in order (SGLang calls the
    CPU op with these three arguments: tree drafting's accepted-path move)."""
    dst = 0
    for src in accept_index.reshape(-1).tolist():
        if src > -1:
            accept_out_cache_loc[dst] = out_cache_loc[src]
            dst += 1
