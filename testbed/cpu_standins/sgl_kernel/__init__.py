"""Pure-PyTorch stand-in for SGLang's CPU kernel build (CPU test bed only; see ../README.md).

Importing this package registers the ops SGLang 0.5.23 uses under `SGLANG_USE_CPU_ENGINE=1` for a
dense Llama-style model with an EAGLE-3 chain draft on `torch.ops.sgl_kernel`, and exposes them as
module attributes for SGLang's `from sgl_kernel import ...` lines. On a GPU, SGLang's own kernels run.
"""

import torch

from . import attention, kv_cache, speculative  # noqa: F401  (registers the ops)
from .unsupported import rotate_input_ids_cpu  # noqa: F401

_ops = torch.ops.sgl_kernel

decode_attention_cpu = _ops.decode_attention_cpu
extend_attention_cpu = _ops.extend_attention_cpu
copy_all_layer_kv_cache_cpu = _ops.copy_all_layer_kv_cache_cpu
assign_req_to_token_pool_cpu = _ops.assign_req_to_token_pool_cpu
assign_extend_cache_locs_cpu = _ops.assign_extend_cache_locs_cpu
assign_draft_cache_locs_contiguous_cpu = _ops.assign_draft_cache_locs_contiguous_cpu
build_draft_decode_metadata_cpu = _ops.build_draft_decode_metadata_cpu
build_tree_kernel_efficient_cpu = _ops.build_tree_kernel_efficient_cpu
verify_tree_greedy_cpu = _ops.verify_tree_greedy_cpu
fill_bonus_tokens_cpu = _ops.fill_bonus_tokens_cpu
fill_accept_out_cache_loc_cpu = _ops.fill_accept_out_cache_loc_cpu

STANDIN = True
"""Marks this package as the CPU test bed's stand-in, not SGLang's kernel build."""
