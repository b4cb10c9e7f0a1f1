"""The CPU test bed's pure-PyTorch `sgl_kernel` stand-ins against plain references.

The references are written from the semantics of SGLang's own kernels (the CUDA header
`sglang/kernels/jit/include/sgl_kernel/speculative/eagle.cuh`, the triton versions in
`sglang/kernels/ops/`) as straightforward loops, independently of the stand-ins' code.
"""

import math

import pytest
import torch

from testbed.cpu_standins import sgl_kernel

ops = torch.ops.sgl_kernel
gen = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=gen)


def randint(high, *shape):
    return torch.randint(0, high, shape, generator=gen)


# ---------------------------------------------------------------- attention


def ref_attention(q_vec, keys, values, scale, cap):
    """One query head over a list of keys/values, by the textbook formula."""
    scores = [float(q_vec @ k) * scale for k in keys]
    if cap > 0:
        scores = [cap * math.tanh(s / cap) for s in scores]
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return sum(w / total * v for w, v in zip(weights, values))


def kv_pool(pool, kv_heads, dim, bs, max_len):
    k_buffer, v_buffer = randn(pool, kv_heads, dim), randn(pool, kv_heads, dim)
    req_to_token = torch.randperm(pool, generator=gen)[: bs * max_len].view(bs, max_len).int()
    return k_buffer, v_buffer, req_to_token


@pytest.mark.parametrize("logit_cap", [0.0, 2.0])
def test_decode_attention_writes_new_kv_and_attends_over_the_sequence(logit_cap):
    heads, kv_heads, dim, bs, pool = 4, 2, 8, 3, 64
    k_buffer, v_buffer, req_to_token = kv_pool(pool, kv_heads, dim, bs, 10)
    req_pool_indices = torch.tensor([2, 0, 1])
    seq_lens = torch.tensor([5, 9, 1])
    cache_loc = torch.stack([req_to_token[r, n - 1] for r, n in zip(req_pool_indices, seq_lens)]).long()
    q, k_new, v_new = randn(bs, heads, dim), randn(bs, kv_heads, dim), randn(bs, kv_heads, dim)
    o = torch.empty(bs, heads, dim)
    expected_k, expected_v = k_buffer.clone(), v_buffer.clone()
    expected_k[cache_loc], expected_v[cache_loc] = k_new, v_new

    ops.decode_attention_cpu(q, k_buffer, v_buffer, 1.0, 1.0, o, k_new, v_new, cache_loc,
                             torch.zeros(bs, heads, 8, dim + 1), req_to_token, req_pool_indices,
                             seq_lens, 0.3, logit_cap, False, 0, None, None)

    assert torch.equal(k_buffer, expected_k) and torch.equal(v_buffer, expected_v)
    for i in range(bs):
        slots = req_to_token[req_pool_indices[i], : seq_lens[i]].tolist()
        for h in range(heads):
            kh = h // (heads // kv_heads)
            want = ref_attention(q[i, h], [expected_k[s, kh] for s in slots],
                                 [expected_v[s, kh] for s in slots], 0.3, logit_cap)
            torch.testing.assert_close(o[i, h], want)


@pytest.mark.parametrize("pass_extend_kv", [True, False])
def test_extend_attention_is_causal_over_prefix_and_new_tokens(pass_extend_kv):
    heads, kv_heads, dim, pool = 4, 2, 8, 64
    k_buffer, v_buffer, req_to_token = kv_pool(pool, kv_heads, dim, 2, 12)
    req_pool_indices = torch.tensor([1, 0])
    extend_lens, prefix_lens = torch.tensor([3, 4]), torch.tensor([5, 0])
    seq_lens = prefix_lens + extend_lens
    starts = torch.tensor([0, 3])
    total = int(extend_lens.sum())
    q, k_ext, v_ext = randn(total, heads, dim), randn(total, kv_heads, dim), randn(total, kv_heads, dim)
    for i in range(2):  # SGLang stores the new K/V before calling the kernel
        slots = req_to_token[req_pool_indices[i], prefix_lens[i] : seq_lens[i]].long()
        k_buffer[slots] = k_ext[starts[i] : starts[i] + extend_lens[i]]
        v_buffer[slots] = v_ext[starts[i] : starts[i] + extend_lens[i]]
    o = torch.empty(total, heads, dim)

    ops.extend_attention_cpu(q, k_ext if pass_extend_kv else None, v_ext if pass_extend_kv else None,
                             o, k_buffer, v_buffer, 1.0, 1.0, req_to_token, req_pool_indices,
                             seq_lens, extend_lens, starts, 4, 0.25, 0.0, False, 0, None, None, None,
                             True)

    for i in range(2):
        row = req_to_token[req_pool_indices[i]].tolist()
        for j in range(int(extend_lens[i])):
            visible = row[: int(prefix_lens[i]) + j + 1]
            for h in range(heads):
                kh = h // (heads // kv_heads)
                want = ref_attention(q[starts[i] + j, h], [k_buffer[s, kh] for s in visible],
                                     [v_buffer[s, kh] for s in visible], 0.25, 0.0)
                torch.testing.assert_close(o[starts[i] + j, h], want)


def test_extend_attention_with_a_tree_mask_sees_the_prefix_and_each_nodes_ancestors():
    """A verify of a draft tree (topk > 1): node i of each sequence sees the whole prefix and the nodes its
    QLEN_ONLY mask row marks (its ancestors and itself), nothing else."""
    heads, kv_heads, dim, pool, n = 2, 1, 8, 64, 4
    k_buffer, v_buffer, req_to_token = kv_pool(pool, kv_heads, dim, 2, 12)
    req_pool_indices, prefix_lens = torch.tensor([0, 1]), torch.tensor([3, 5])
    seq_lens, starts = prefix_lens + n, torch.tensor([0, n])
    parents = [{1: 0, 2: 0, 3: 1}, {1: 0, 2: 1, 3: 2}]  # a branching tree, then a chain
    masks = []
    for tree in parents:
        m = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            node = i
            m[i, 0] = True
            while node:
                m[i, node], node = True, tree[node]
        masks.append(m)
    q, k_ext, v_ext = randn(2 * n, heads, dim), randn(2 * n, kv_heads, dim), randn(2 * n, kv_heads, dim)
    for i in range(2):
        slots = req_to_token[req_pool_indices[i], prefix_lens[i]: seq_lens[i]].long()
        k_buffer[slots], v_buffer[slots] = k_ext[starts[i]: starts[i] + n], v_ext[starts[i]: starts[i] + n]
    o = torch.empty(2 * n, heads, dim)

    ops.extend_attention_cpu(q, k_ext, v_ext, o, k_buffer, v_buffer, 1.0, 1.0, req_to_token, req_pool_indices,
                             seq_lens, torch.tensor([n, n]), starts, n, 0.25, 0.0, False, 0, None, None,
                             torch.cat([m.flatten() for m in masks]), True)

    for i in range(2):
        row, prefix = req_to_token[req_pool_indices[i]].tolist(), int(prefix_lens[i])
        for j in range(n):
            visible = row[:prefix] + [row[prefix + a] for a in range(n) if masks[i][j, a]]
            for h in range(heads):
                want = ref_attention(q[starts[i] + j, h], [k_buffer[s, 0] for s in visible],
                                     [v_buffer[s, 0] for s in visible], 0.25, 0.0)
                torch.testing.assert_close(o[starts[i] + j, h], want)


def test_attention_rejects_what_it_does_not_implement():
    k_buffer, v_buffer, req_to_token = kv_pool(16, 1, 4, 1, 4)
    args = (randn(1, 1, 4), k_buffer, v_buffer, 1.0, 1.0, torch.empty(1, 1, 4), None, None,
            torch.tensor([0]), torch.zeros(1, 1, 8, 5), req_to_token, torch.tensor([0]),
            torch.tensor([2]), 1.0, 0.0, False)
    with pytest.raises(NotImplementedError, match="decode_attention_cpu.*sliding window"):
        ops.decode_attention_cpu(*args, 5, None, None)
    with pytest.raises(NotImplementedError, match="decode_attention_cpu.*attention sinks"):
        ops.decode_attention_cpu(*args, 0, None, torch.zeros(1))


# ---------------------------------------------------------------- KV-pool bookkeeping


def test_copy_all_layer_kv_cache_copies_rows_in_every_buffer_by_raw_pointer():
    buffers = [randn(10, 2, 4), randn(10, 3)]
    expected = [b.clone() for b in buffers]
    tgt, src = torch.tensor([1, 7, 4]), torch.tensor([4, 2, 1])  # row 4 is read and written
    for e in expected:
        e[tgt] = e[src].clone()
    data_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in buffers])

    ops.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)

    for b, e in zip(buffers, expected):
        assert torch.equal(b, e)


def segments(starts, ends):
    out = 0
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
        yield i, s, e, out
        out += e - s


def test_assign_req_to_token_pool_writes_packed_locations_into_rows():
    req_to_token = torch.zeros(4, 16, dtype=torch.int32)
    req_pool_indices, starts, ends = torch.tensor([3, 1]), torch.tensor([2, 0]), torch.tensor([5, 4])
    out_cache_loc = torch.arange(100, 107)
    expected = req_to_token.clone()
    for i, s, e, out in segments(starts, ends):
        for j in range(e - s):
            expected[req_pool_indices[i], s + j] = out_cache_loc[out + j]

    ops.assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, starts, ends, out_cache_loc, 16)

    assert torch.equal(req_to_token, expected)


def test_assign_extend_cache_locs_reads_rows_into_packed_locations():
    req_to_token = randint(1000, 4, 16).int()
    req_pool_indices, starts, ends = torch.tensor([0, 2]), torch.tensor([3, 5]), torch.tensor([7, 6])
    out = torch.full((5,), -1, dtype=torch.int64)

    ops.assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, starts, ends, out, 16)

    expected = [int(req_to_token[req_pool_indices[i], s + j]) for i, s, e, _ in segments(starts, ends)
                for j in range(e - s)]
    assert out.tolist() == expected


def test_assign_draft_cache_locs_contiguous_copies_slots_after_each_prefix():
    req_to_token = randint(1000, 3, 20).int()
    req_pool_indices, seq_lens = torch.tensor([2, 0]), torch.tensor([4, 9])
    out = torch.full((2 * 3,), -1, dtype=torch.int64)

    ops.assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out, 20, 1, 3)

    expected = [int(req_to_token[r, n + j]) for r, n in zip(req_pool_indices, seq_lens) for j in range(3)]
    assert out.tolist() == expected


def test_build_draft_decode_metadata_gives_each_request_its_row_for_chains():
    req_to_token = randint(1000, 4, 8).int()
    rows = ops.build_draft_decode_metadata_cpu(req_to_token, torch.tensor([3, 1]), torch.tensor([2, 5]),
                                               1, 3, 8)
    assert torch.equal(rows, req_to_token[[3, 1]])


def test_build_draft_decode_metadata_gives_each_branch_the_prefix_then_its_own_slots():
    """Tree drafting: row b*topk+k is request b's prefix, then the slots assign_draft_cache_locs_contiguous
    gave branch k (at seq_len + k*num_steps of the request's row); what follows is undefined."""
    req_to_token = torch.randperm(4 * 32).int().view(4, 32)  # distinct slots: a misplaced copy shows
    topk, steps, pools, seq_lens = 4, 3, [2, 0], [5, 9]
    rows = ops.build_draft_decode_metadata_cpu(req_to_token, torch.tensor(pools), torch.tensor(seq_lens), topk, steps, 32)
    assert rows.shape == (2 * topk, 32)
    for b, (pool, sl) in enumerate(zip(pools, seq_lens)):
        for k in range(topk):
            src = req_to_token[pool]
            expected = torch.cat([src[:sl], src[sl + k * steps: sl + (k + 1) * steps]])
            assert torch.equal(rows[b * topk + k, :sl + steps], expected), (b, k)


# ---------------------------------------------------------------- speculative helpers

FULL_MASK, QLEN_ONLY = 0, 1


def tree_nodes(parent_list, selected_index, topk):
    """Parent node of each draft node 1..n-1 (node 0 is the verified token), per the tree semantics:
    node i is token `selected[i-1]`; its parent is the root when `selected[i-1] // topk == 0`, else
    the node holding token `parent_list[selected[i-1] // topk]`."""
    sel = selected_index.tolist()
    parents = {}
    for i in range(1, len(sel) + 1):
        group = sel[i - 1] // topk
        parents[i] = 0 if group == 0 else 1 + sel.index(int(parent_list[group]))
    return parents


def ref_tree(parents, n, seq_len):
    """Ancestor mask (n x n), positions, first-child / next-sibling lists (children in index order)."""
    mask = torch.zeros(n, n, dtype=torch.bool)
    depth = [0] * n
    for i in range(n):
        node = i
        mask[i, 0] = True
        while node != 0:
            mask[i, node] = True
            depth[i] += 1
            node = parents[node]
    next_token, next_sibling = [-1] * n, [-1] * n
    for i in range(n - 1, 0, -1):
        p = parents[i]
        if next_token[p] != -1:
            next_sibling[i] = next_token[p]
        next_token[p] = i
    return mask, [seq_len + d for d in depth], next_token, next_sibling


# (topk, depth, parent_list row, selected_index row): a chain and a branching tree
TREES = [
    (1, 3, [-1, 0, 1], [0, 1, 2]),
    (2, 2, [-1, 0, 1], [0, 1, 2]),  # nodes 1, 2 under the root; node 3 under node 1
]


@pytest.mark.parametrize("topk, depth, parent_row, selected_row", TREES)
@pytest.mark.parametrize("mode", [FULL_MASK, QLEN_ONLY])
def test_build_tree_kernel_efficient(topk, depth, parent_row, selected_row, mode):
    n, seq_lens = len(selected_row) + 1, torch.tensor([5, 2])
    bs = len(seq_lens)
    parent_list = torch.tensor([parent_row] * bs)
    selected = torch.tensor([selected_row] * bs)
    size = int(seq_lens.sum()) * n + bs * n * n if mode == FULL_MASK else bs * n * n
    tree_mask = torch.full((size,), True)
    positions = torch.empty(bs * n, dtype=torch.long)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.long)

    ops.build_tree_kernel_efficient_cpu(parent_list, selected, seq_lens, tree_mask, positions,
                                        retrieve[0], retrieve[1], retrieve[2], topk, depth, n, mode)

    offset = 0
    for b, seq_len in enumerate(seq_lens.tolist()):
        mask, pos, next_token, next_sibling = ref_tree(tree_nodes(parent_list[b], selected[b], topk), n,
                                                       seq_len)
        width = seq_len + n if mode == FULL_MASK else n
        got = tree_mask[offset : offset + n * width].view(n, width)
        assert torch.equal(got[:, width - n :], mask)
        assert got[:, : width - n].all()  # the committed prefix stays visible
        offset += n * width
        assert positions[b * n : (b + 1) * n].tolist() == pos
        assert retrieve[0, b].tolist() == [b * n + i for i in range(n)]
        assert retrieve[1, b].tolist() == next_token
        assert retrieve[2, b].tolist() == next_sibling


def ref_verify_greedy(candidates, next_token, next_sibling, target, num_spec):
    """Walk from the root; at each node accept the first child (in sibling order) whose token is the
    target's prediction there. Returns accepted node indices (root first) and predicts per node."""
    accepted, predicts, node = [0], {}, 0
    while len(accepted) < num_spec:
        child = next_token[node]
        while child != -1 and candidates[child] != target[node]:
            child = next_sibling[child]
        if child == -1:
            break
        predicts[node] = target[node]
        accepted.append(child)
        node = child
    predicts[node] = target[node]
    return accepted, predicts


@pytest.mark.parametrize("topk, depth, parent_row, selected_row", TREES)
def test_verify_tree_greedy_on_random_predictions(topk, depth, parent_row, selected_row):
    n, bs, num_spec = len(selected_row) + 1, 64, depth + 1
    _, _, next_token, next_sibling = ref_tree(tree_nodes(torch.tensor(parent_row),
                                                         torch.tensor(selected_row), topk), n, 0)
    candidates, target = randint(2, bs, n), randint(2, bs, n)  # 2 tokens: many acceptances
    retrieve_index = torch.arange(bs * n).view(bs, n)
    predicts = torch.zeros(bs * n, dtype=torch.int32)
    accept_index = torch.full((bs, num_spec), -1, dtype=torch.int32)
    accept_num = torch.empty(bs, dtype=torch.int32)

    ops.verify_tree_greedy_cpu(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
        candidates=candidates, retrive_index=retrieve_index,
        retrive_next_token=torch.tensor([next_token] * bs),
        retrive_next_sibling=torch.tensor([next_sibling] * bs), target_predict=target.flatten())

    assert {int(x) for x in accept_num} == set(range(num_spec)), "inputs should cover every length"
    for b in range(bs):
        accepted, want = ref_verify_greedy(candidates[b].tolist(), next_token, next_sibling,
                                           target[b].tolist(), num_spec)
        assert accept_num[b] == len(accepted) - 1
        assert accept_index[b].tolist() == [b * n + i for i in accepted] + [-1] * (num_spec - len(accepted))
        for node in range(n):
            assert predicts[b * n + node] == want.get(node, 0)


def test_fill_bonus_tokens_takes_the_last_accepted_token():
    accept_tokens = randint(1000, 5, 4).int()
    accept_lens = torch.tensor([1, 4, 2, 3, 1], dtype=torch.int32)
    bonus = torch.empty(5, dtype=torch.int32)

    ops.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, 4)

    assert bonus.tolist() == [int(accept_tokens[i, accept_lens[i] - 1]) for i in range(5)]


def test_fill_accept_out_cache_loc_packs_accepted_slots_in_order():
    accept_index = torch.tensor([[0, 1, -1, -1], [4, -1, -1, -1], [8, 9, 10, 11]], dtype=torch.int32)
    out_cache_loc = randint(1000, 12)
    packed = torch.zeros(12, dtype=torch.int64)

    ops.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, packed)

    kept = [int(out_cache_loc[i]) for i in accept_index.flatten().tolist() if i != -1]
    assert packed.tolist() == kept + [0] * (12 - len(kept))


# ---------------------------------------------------------------- what the stand-in leaves out


def test_unimplemented_ops_raise_naming_themselves():
    with pytest.raises(NotImplementedError, match="rotate_input_ids_cpu"):
        sgl_kernel.rotate_input_ids_cpu(torch.zeros(1))
    with pytest.raises(NotImplementedError, match="build_tree_kernel_efficient_cpu.*bit-packed"):
        ops.build_tree_kernel_efficient_cpu(*[torch.zeros(1, dtype=torch.long)] * 8, 1, 3, 4, 2)


def test_amx_probe_stays_false_so_layers_use_native_torch():
    # SGLang's cpu_has_amx_support() checks for this op; the stand-in must not provide it.
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
