"""GPU test bed only (added to vLLM's tree by testbed/gpu/vllm_kit.py): in place of the release's compiled
``_C_stable_libtorch`` (built for torch 2.13), defines its ops with pure-PyTorch stand-ins
(``testbed/gpu/vllm_standins/vllm_c_standin``)."""
from vllm_c_standin import install

install()
