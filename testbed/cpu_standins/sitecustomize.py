"""CPU test bed only: keep SGLang's `intel_amx` attention backend on a CPU without AMX.

SGLang rewrites `--attention-backend intel_amx` to `torch_native` when the platform fact `has_amx`
is False, and `torch_native` has no EAGLE support. Python imports this module at start-up in every
process that has this folder on `PYTHONPATH` (SGLang's schedulers are spawned), and the hook below
(`testbed/standin_loader.py`: the checkout is on the servers' path) overrides the fact right after
`sglang.srt.runtime_context` is imported. The model layers still use native torch:
`cpu_has_amx_support()` stays False because the stand-in `sgl_kernel` lacks `convert_weight_packed`.

With `DRAFTSCOPE_TESTBED_GRAPHS=emulate`, the same mechanism replaces
`EagleDraftWorker._capture_cuda_graphs` with `testbed.graph_emulation.capture_cuda_graphs`, so that
`EAGLEWorkerV2` takes its CUDA-graph branches on the CPU (graph-mode emulation; see that module).
"""

import os

from testbed.standin_loader import patch_after_import


def _amx(module):
    module._PLATFORM._install(has_amx=True)


def _emulated_graphs(module):
    from testbed.graph_emulation import capture_cuda_graphs

    module.EagleDraftWorker._capture_cuda_graphs = capture_cuda_graphs


_AFTER_EXEC = {"sglang.srt.runtime_context": _amx}
if os.environ.get("DRAFTSCOPE_TESTBED_GRAPHS") == "emulate":
    _AFTER_EXEC["sglang.srt.speculative.eagle_worker_v2"] = _emulated_graphs
patch_after_import(_AFTER_EXEC)
