"""GPU test bed only (added to vLLM's tree by testbed/gpu/vllm_kit.py): vLLM 0.32 on CUDA imports
``vllm.vllm_flash_attn`` unconditionally (``v1/attention/backends/fa_utils.py``), and that package refuses to
import without a flash-attention binary. This empty module lets it import; the stand-ins' ``sitecustomize``
then marks FA2 unavailable, so vLLM reports flash attention as unsupported and runs its Triton paths.
It registers no op: a call into flash attention fails on ``torch.ops._vllm_fa2_C``."""
