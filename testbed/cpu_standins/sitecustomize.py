"""CPU test bed only: keep SGLang's `intel_amx` attention backend on a CPU without AMX.

SGLang rewrites `--attention-backend intel_amx` to `torch_native` when the platform fact `has_amx`
is False, and `torch_native` has no EAGLE support. Python imports this module at start-up in every
process that has this folder on `PYTHONPATH` (SGLang's schedulers are spawned), and the hook below
overrides the fact right after `sglang.srt.runtime_context` is imported. The model layers still use
native torch: `cpu_has_amx_support()` stays False because the stand-in `sgl_kernel` lacks
`convert_weight_packed`.
"""

import importlib.abc
import importlib.machinery
import sys

_TARGET = "sglang.srt.runtime_context"


class _OverrideAfterExec(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module._PLATFORM._install(has_amx=True)


class _RuntimeContextHook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _OverrideAfterExec(spec.loader)
        return spec


sys.meta_path.insert(0, _RuntimeContextHook())
