"""CPU test bed only: keep SGLang's `intel_amx` attention backend on a CPU without AMX.

SGLang rewrites `--attention-backend intel_amx` to `torch_native` when the platform fact `has_amx`
is False, and `torch_native` has no EAGLE support. Python imports this module at start-up in every
process that has this folder on `PYTHONPATH` (SGLang's schedulers are spawned), and the hook below
overrides the fact right after `sglang.srt.runtime_context` is imported. The model layers still use
native torch: `cpu_has_amx_support()` stays False because the stand-in `sgl_kernel` lacks
`convert_weight_packed`.

With `DRAFTSCOPE_TESTBED_GRAPHS=emulate`, the same mechanism replaces
`EagleDraftWorker._capture_cuda_graphs` with `testbed.graph_emulation.capture_cuda_graphs`, so that
`EAGLEWorkerV2` takes its CUDA-graph branches on the CPU (graph-mode emulation; see that module).
"""

import importlib.abc
import importlib.machinery
import os
import sys


def _amx(module):
    module._PLATFORM._install(has_amx=True)


def _emulated_graphs(module):
    from testbed.graph_emulation import capture_cuda_graphs

    module.EagleDraftWorker._capture_cuda_graphs = capture_cuda_graphs


_AFTER_EXEC = {"sglang.srt.runtime_context": _amx}
if os.environ.get("DRAFTSCOPE_TESTBED_GRAPHS") == "emulate":
    _AFTER_EXEC["sglang.srt.speculative.eagle_worker_v2"] = _emulated_graphs


class _PatchAfterExec(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)


class _PatchHook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        patch = _AFTER_EXEC.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchAfterExec(spec.loader, patch)
        return spec


sys.meta_path.insert(0, _PatchHook())
