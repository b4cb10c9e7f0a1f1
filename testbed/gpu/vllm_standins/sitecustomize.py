"""GPU test bed only: set-up for every Python process started with this folder first on ``PYTHONPATH``
(vLLM's engine core and workers run it too), by ``testbed/standin_loader.py`` (the kit's source is on the path).

- ``vllm.vllm_flash_attn``: imported thanks to the kit's empty ``_vllm_fa2_C`` module, then marked
  "FA2 unavailable" (no flash-attention binary here), so vLLM picks its Triton attention and reports why.
- ``GPU_TESTBED_COUNT_REPLAYS=1`` counts ``torch.cuda.CUDAGraph.replay`` calls and logs the total at
  powers of two (``[vllm-gpu-testbed] graph replays: N``): proof that requests ran through CUDA graphs.
"""

import os
import sys

from testbed.standin_loader import count_graph_replays, patch_after_import

NO_FA = "the GPU test bed carries no flash-attention binary (testbed/gpu/vllm_overlay)"


def _log(msg: str) -> None:
    sys.stderr.write(f"[vllm-gpu-testbed] {msg} (pid {os.getpid()})\n")


def _no_flash_attention(mod):
    from vllm.vllm_flash_attn import flash_attn_interface as fai

    fai.FA2_AVAILABLE, fai.FA2_UNAVAILABLE_REASON = False, NO_FA
    mod.FA2_AVAILABLE = False


patch_after_import({"vllm.vllm_flash_attn": _no_flash_attention})

if os.environ.get("GPU_TESTBED_COUNT_REPLAYS") == "1":
    count_graph_replays(_log)
