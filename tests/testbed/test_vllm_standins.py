"""The vLLM GPU kit's pure-PyTorch stand-ins for vLLM 0.32's compiled ops, called the way vLLM calls them
(``torch.ops._C.<name>`` after the kit's ``install``), against float64 references.

The references are written from the semantics of vLLM's CUDA kernels (their docstrings in
``vllm/_custom_ops.py`` and the PyTorch-native twins in ``vllm/ir/ops/`` and
``rotary_embedding/base.py``) as plain loops over Python floats, independently of the stand-ins' code.
"""

import math

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from testbed.gpu.vllm_standins import vllm_c_standin
from testbed.gpu.vllm_standins.vllm_c_standin import kernels

INSTALLED = vllm_c_standin.install()
ops = torch.ops._C
gen = torch.Generator().manual_seed(0)


def randn(*shape, dtype=torch.float64):
    return torch.randn(*shape, generator=gen, dtype=dtype)


def rows(t):
    return t.reshape(-1, t.shape[-1]).tolist()


def ref_rms(row, weight, eps):
    scale = 1.0 / math.sqrt(sum(v * v for v in row) / len(row) + eps)
    return [v * scale * (1.0 if weight is None else w) for v, w in zip(row, weight or [None] * len(row))]


# ---------------------------------------------------------------- registration


def test_every_schema_of_the_release_is_defined_in_its_namespace():
    schemas = vllm_c_standin.read_schemas()
    assert len(schemas) == len(INSTALLED["defined"]) >= 140 and not INSTALLED["refused"]
    for ns, schema in schemas:
        name = vllm_c_standin.op_name(schema)
        packet = getattr(getattr(torch.ops, ns), name.split(".")[0])
        overload = getattr(packet, name.split(".")[1] if "." in name else "default")
        assert str(overload._schema).startswith(f"{ns}::{name}(")
    assert torch.ops._C_cache_ops.reshape_and_cache_flash.default is not None  # vLLM's own namespace for it


def test_a_stub_raises_naming_the_op_and_what_it_needs():
    with pytest.raises(vllm_c_standin.StandinNotImplemented, match=r"_C::gelu_fast .*vLLM's compiled kernels"):
        ops.gelu_fast(torch.empty(2), torch.empty(2))
    assert "STUB _C::gelu_fast" in vllm_c_standin.ran()


def test_install_twice_defines_nothing_twice():
    assert vllm_c_standin.install() is INSTALLED and len(set(INSTALLED["defined"])) == len(INSTALLED["defined"])


def test_the_cutlass_capability_queries_say_no():
    """vLLM asks at import (``cutlass_scaled_mm_supports_block_fp8``) and then takes its Triton paths."""
    for query in ("cutlass_scaled_mm_supports_fp8", "cutlass_scaled_mm_supports_block_fp8",
                  "cutlass_scaled_mm_supports_fp4", "cutlass_group_gemm_supported", "mxfp4_experts_quant_supported"):
        assert getattr(ops, query)(90) is False


def test_an_implemented_op_runs_on_meta_tensors():
    """vLLM's compile passes trace ops with fake tensors: the stand-in bodies run on meta tensors too."""
    x = torch.empty(3, 8, device="meta")
    out = torch.empty(3, 8, device="meta")
    ops.rms_norm(out, x, torch.empty(8, device="meta"), 1e-6)
    ops.silu_and_mul(torch.empty(3, 4, device="meta"), x)


# ---------------------------------------------------------------- norms and activations


@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm(with_weight):
    x, w = randn(5, 16), randn(16)
    out = torch.empty_like(x)
    ops.rms_norm(out, x, w if with_weight else None, 1e-5)
    expected = [ref_rms(r, w.tolist() if with_weight else None, 1e-5) for r in rows(x)]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_fused_add_rms_norm_updates_both_in_place():
    x, r, w = randn(4, 2, 16), randn(4, 2, 16), randn(16)
    total = [[a + b for a, b in zip(ra, rb)] for ra, rb in zip(rows(x), rows(r))]
    ops.fused_add_rms_norm(x, r, w, 1e-6)
    torch.testing.assert_close(r, torch.tensor(total, dtype=torch.float64).view(4, 2, 16), rtol=0, atol=1e-15)
    expected = [ref_rms(t, w.tolist(), 1e-6) for t in total]
    torch.testing.assert_close(x, torch.tensor(expected, dtype=torch.float64).view(4, 2, 16), rtol=1e-12, atol=1e-12)


def test_rms_norm_in_float32_stays_within_float32_rounding():
    x, w = randn(6, 64, dtype=torch.float32), randn(64, dtype=torch.float32)
    out = torch.empty_like(x)
    ops.rms_norm(out, x, w, 1e-6)
    expected = [ref_rms(r, w.double().tolist(), 1e-6) for r in rows(x.double())]
    torch.testing.assert_close(out.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-6)


def test_silu_and_mul():
    x = randn(3, 2, 10)
    out = torch.empty(3, 2, 5, dtype=torch.float64)
    ops.silu_and_mul(out, x)
    expected = [[a / (1 + math.exp(-a)) * b for a, b in zip(r[:5], r[5:])] for r in rows(x)]
    torch.testing.assert_close(out, torch.tensor(expected, dtype=torch.float64).view(3, 2, 5), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- rotary embedding


def cos_sin_cache(max_pos, rot_dim, base=10000.0, dtype=torch.float64):
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)
    angles = torch.outer(torch.arange(max_pos, dtype=torch.float64), inv_freq)
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype)


def ref_rope(vec, pos, rot_dim, offset, neox, inverse, base=10000.0):
    """One head's vector rotated pair by pair by the angle ``pos * base ** (-2i / rot_dim)``."""
    out = list(vec)
    half = rot_dim // 2
    for i in range(half):
        theta = pos * base ** (-2 * i / rot_dim) * (-1 if inverse else 1)
        a, b = (offset + i, offset + half + i) if neox else (offset + 2 * i, offset + 2 * i + 1)
        out[a] = vec[a] * math.cos(theta) - vec[b] * math.sin(theta)
        out[b] = vec[b] * math.cos(theta) + vec[a] * math.sin(theta)
    return out


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("offset,rot_dim,inverse", [(0, 16, False), (0, 8, False), (8, 8, False), (0, 16, True)])
def test_rotary_embedding(neox, offset, rot_dim, inverse):
    tokens, heads, kv_heads, head_size = 5, 3, 1, 16
    positions = torch.tensor([0, 7, 3, 40, 12])
    q, k = randn(tokens, heads * head_size), randn(tokens, kv_heads, head_size)  # vLLM passes both layouts
    q0, k0 = q.clone(), k.clone()
    ops.rotary_embedding(positions, q, k, head_size, cos_sin_cache(64, rot_dim), neox, offset, inverse)
    for t, pos in enumerate(positions.tolist()):
        for h in range(heads):
            got = q[t, h * head_size:(h + 1) * head_size].tolist()
            want = ref_rope(q0[t, h * head_size:(h + 1) * head_size].tolist(), pos, rot_dim, offset, neox, inverse)
            assert got == pytest.approx(want, abs=1e-12)
        assert k[t, 0].tolist() == pytest.approx(ref_rope(k0[t, 0].tolist(), pos, rot_dim, offset, neox, inverse),
                                                 abs=1e-12)


def test_rotary_embedding_without_key_and_its_inverse_restores_the_query():
    positions = torch.tensor([[1, 2], [5, 9]])  # vLLM flattens batched positions
    q = randn(2, 2, 2, 8)
    q0 = q.clone()
    cache = cos_sin_cache(16, 8)
    ops.rotary_embedding(positions, q, None, 8, cache, True)
    assert not torch.allclose(q, q0)
    ops.rotary_embedding(positions, q, None, 8, cache, True, 0, True)
    torch.testing.assert_close(q, q0, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- sampling


def test_apply_repetition_penalties():
    logits = randn(3, 6)
    prompt = torch.tensor([[1, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 1]], dtype=torch.bool)
    output = torch.tensor([[0, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 1, 0]], dtype=torch.bool)
    penalties = torch.tensor([1.5, 2.0, 1.0], dtype=torch.float64)
    expected = []
    for row, p_row, o_row, pen in zip(logits.tolist(), prompt.tolist(), output.tolist(), penalties.tolist()):
        expected.append([(v / pen if v > 0 else v * pen) if (p or o) else v for v, p, o in zip(row, p_row, o_row)])
    ops.apply_repetition_penalties_(logits, prompt, output, penalties)
    torch.testing.assert_close(logits, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-15)


def test_dsv3_fused_a_gemm_writes_the_product_with_the_transposed_weight():
    mat_a, weight = randn(5, 7), randn(6, 7)
    output = torch.full((5, 6), float("nan"), dtype=torch.float64)
    ops.dsv3_fused_a_gemm(output, mat_a, weight.T)  # as deepseek_v2.py calls it: the weight's transposed view
    expected = [[sum(a * w for a, w in zip(row, col)) for col in weight.tolist()] for row in mat_a.tolist()]
    torch.testing.assert_close(output, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- KV caches


def test_reshape_and_cache_flash_writes_each_slot_and_skips_padding():
    blocks, block_size, heads, dim = 4, 3, 2, 5
    key, value = randn(6, heads, dim), randn(6, heads, dim)  # 6 rows, 5 counted: CUDA-graph padding
    slots = torch.tensor([7, 0, -1, 11, 4])
    kv = randn(blocks, 2, block_size, heads, dim)  # TRITON_ATTN's layout: the caches are strided views
    key_cache, value_cache = kv.unbind(1)
    before = kv.clone()
    torch.ops._C_cache_ops.reshape_and_cache_flash(key, value, key_cache, value_cache, slots, "auto",
                                                   torch.ones(()), torch.ones(()))
    expected = before.tolist()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected[slot // block_size][0][slot % block_size] = key[t].tolist()
            expected[slot // block_size][1][slot % block_size] = value[t].tolist()
    assert kv.tolist() == expected


def test_concat_and_cache_mla_writes_the_compressed_kv_then_the_rotary_key():
    kv_c, k_pe = randn(3, 8), randn(3, 4)
    slots = torch.tensor([5, -1, 2])
    cache = randn(2, 4, 12)
    expected = cache.clone().tolist()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected[slot // 4][slot % 4] = kv_c[t].tolist() + k_pe[t].tolist()
    torch.ops._C_cache_ops.concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", torch.ones(()))
    assert cache.tolist() == expected


def test_an_all_padding_batch_leaves_the_cache_as_it_was():
    cache = randn(2, 4, 12)
    before = cache.clone()
    torch.ops._C_cache_ops.concat_and_cache_mla(randn(2, 8), randn(2, 4), cache, torch.tensor([-1, -1]), "auto",
                                                torch.ones(()))
    assert torch.equal(cache, before)


def test_cache_writers_take_no_shape_from_the_data():
    # a CUDA-graph capture allows no host read (the first MLA server on the device stopped at `nonzero` in
    # capture): fake tensors have no data, so whatever needs it (nonzero, item) raises there
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        with pytest.raises(Exception, match="nonzero"):
            (torch.tensor([1, -1]) >= 0).nonzero()  # the check can fail
        kernels.concat_and_cache_mla(torch.randn(3, 8), torch.randn(3, 4), torch.zeros(2, 4, 12),
                                     torch.tensor([5, -1, 2]), "auto", torch.ones(()))
        key_cache, value_cache = torch.zeros(4, 2, 3, 2, 5).unbind(1)
        kernels.reshape_and_cache_flash(torch.randn(6, 2, 5), torch.randn(6, 2, 5), key_cache, value_cache,
                                        torch.tensor([7, 0, -1, 11, 4]), "auto", None, None)


def test_a_quantised_kv_cache_is_refused_by_name():
    with pytest.raises(ValueError, match="kv_cache_dtype 'fp8'"):
        torch.ops._C_cache_ops.concat_and_cache_mla(randn(1, 8), randn(1, 4), randn(1, 4, 12), torch.tensor([0]),
                                                    "fp8", torch.ones(()))


# ---------------------------------------------------------------- memory


def test_weak_ref_tensor_aliases_without_keeping_the_memory_alive():
    base = randn(4, 6)
    view = base[1:, ::2]  # offset and strides kept, as the graph wrappers' outputs need
    weak = ops.weak_ref_tensor(view)
    assert (weak.shape, weak.stride(), weak.storage_offset(), weak.data_ptr()) == (
        view.shape, view.stride(), view.storage_offset(), view.data_ptr())
    weak[0, 0] = 123.0
    assert base[1, 0].item() == 123.0
    ref = StorageWeakRef(base.untyped_storage())
    del base, view
    assert ref.expired()  # the weak alias alone does not hold the storage


def test_get_cuda_view_refuses_memory_that_is_not_pinned():
    with pytest.raises(ValueError, match="pinned host memory"):
        kernels.get_cuda_view_from_cpu_tensor(torch.zeros(4))
