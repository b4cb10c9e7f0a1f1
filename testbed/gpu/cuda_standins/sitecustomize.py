"""GPU test bed only: patches applied right after SGLang imports a few of its modules, in every Python
process started with this folder first on ``PYTHONPATH`` (SGLang spawns its schedulers, which run it too),
by ``testbed/standin_loader.py`` (the kit's source is on the servers' path).

- ``sglang.srt.layers.dual_gemm``: the dual-GEMM mode selector imports CuTe DSL kernels
  (nvidia-cutlass-dsl, not on the device); here it picks "no dual GEMM", what the real selector ends
  in for unquantised float32 weights without those kernels.
- ``SGLANG_GPU_TESTBED_NO_JIT=1`` keeps SGLang off its nvcc JIT kernels: ``load_jit`` raises naming
  the module, except for the modules of ``JIT_STANDINS``, which get a pure-PyTorch stand-in (logged
  once: ``JIT module 'NAME' -> pure-PyTorch stand-in``); the EAGLE tree build and greedy tree verify
  run SGLang's own Triton versions; the KV store takes SGLang's plain-indexing fallback.
- ``SGLANG_GPU_TESTBED_COUNT_REPLAYS=1`` counts ``torch.cuda.CUDAGraph.replay`` calls and logs the total
  at powers of two (``[gpu-testbed] graph replays: N``): proof that requests ran through CUDA graphs.
"""

import os
import sys

from testbed.standin_loader import count_graph_replays, patch_after_import


def _log(msg: str) -> None:
    sys.stderr.write(f"[gpu-testbed] {msg} (pid {os.getpid()})\n")


def _no_dual_gemm(mod):
    mod.DualGemm._select_mode = lambda self, gate_up_proj, hidden_size: None


class _Dsv3FusedAGemm:
    """``dsv3_fused_a_gemm``: DeepSeek-V3's fused q_a/kv_a projection for 1-16 tokens (SM90, bf16), called
    in every decode and verify pass of the Kimi-shaped target. ``mat_b`` is the weight's column-major
    transpose: ``output[M, N] = mat_a[M, K] @ mat_b[K, N]``."""

    @staticmethod
    def dsv3_fused_a_gemm(mat_a, mat_b, output):
        import torch

        torch.mm(mat_a, mat_b, out=output)


JIT_STANDINS = {"dsv3_fused_a_gemm": _Dsv3FusedAGemm}


def _refuse_jit(mod):
    served = set()

    def load_jit(*args, **kwargs):
        name = args[0] if args else kwargs.get("name", "?")
        if name in JIT_STANDINS:
            if name not in served:
                served.add(name)
                _log(f"JIT module {name!r} -> pure-PyTorch stand-in")
            return JIT_STANDINS[name]()
        _log(f"refused JIT module {name!r}")
        raise RuntimeError(f"SGLang JIT kernels are off on the GPU test bed (SGLANG_GPU_TESTBED_NO_JIT=1): {name}")

    mod.load_jit = load_jit


def _triton_tree_ops(mod):
    def build_tree_kernel_efficient(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                    retrive_index, retrive_next_token, retrive_next_sibling, topk, depth,
                                    draft_token_num, tree_mask_mode):
        from sglang.kernels.ops.speculative import spec_tree

        spec_tree.sgl_build_tree_kernel_triton(
            parent_list, selected_index, verified_seq_len, tree_mask, positions, retrive_index,
            retrive_next_token, retrive_next_sibling, topk, depth, draft_token_num,
            spec_tree.TreeMaskMode(int(tree_mask_mode)))

    def verify_tree_greedy(predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict):
        from sglang.kernels.ops.speculative import spec_tree

        spec_tree.verify_tree_greedy_triton(
            predicts=predicts, accept_index=accept_index, accept_token_num=accept_token_num,
            candidates=candidates, retrieve_index=retrive_index, retrieve_next_token=retrive_next_token,
            retrieve_next_sibling=retrive_next_sibling, target_predict=target_predict)

    mod.build_tree_kernel_efficient = build_tree_kernel_efficient
    mod.verify_tree_greedy = verify_tree_greedy


def _spec_tree_builder(mod):
    from sglang.kernels.ops.speculative import tree

    mod.sgl_build_tree_kernel_efficient = tree.build_tree_kernel_efficient


def _no_store_cache(mod):
    mod.can_use_store_cache = lambda *args, **kwargs: False


PATCHES = {"sglang.srt.layers.dual_gemm": _no_dual_gemm}
if os.environ.get("SGLANG_GPU_TESTBED_NO_JIT") == "1":
    PATCHES.update({
        "sglang.kernels.jit.utils.compile": _refuse_jit,
        "sglang.kernels.ops.speculative.tree": _triton_tree_ops,
        "sglang.kernels.ops.speculative.spec_tree": _spec_tree_builder,
        "sglang.srt.mem_cache.memory_pool": _no_store_cache,
    })


patch_after_import(PATCHES)

if os.environ.get("SGLANG_GPU_TESTBED_COUNT_REPLAYS") == "1":
    count_graph_replays(_log)
