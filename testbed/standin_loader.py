"""Patch a module right after it is imported: the loader both stand-in folders' ``sitecustomize`` use (and
their CUDA-graph replay counter).

Python imports ``sitecustomize`` at start-up in every process that has a stand-in folder first on
``PYTHONPATH`` (SGLang's spawned schedulers too), before SGLang imports anything. There
``patch_after_import({module name: patch})`` puts a finder first on ``sys.meta_path``: each named module
is found and executed as usual, then its patch is called with the module. The beds keep this module
importable beside their stand-ins: the CPU servers have the checkout on their path
(``testbed/server.py``), the GPU servers the kit's copy of it (``testbed/gpu/run_device.sh``).
Standard library only (``count_graph_replays`` imports torch when called).
"""

import importlib.abc
import importlib.machinery
import sys
from typing import Callable, Dict


class _PatchAfterExec(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, patches: Dict[str, Callable]):
        self.patches = patches

    def find_spec(self, fullname, path, target=None):
        patch = self.patches.get(fullname)
        spec = None if patch is None else importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchAfterExec(spec.loader, patch)
        return spec


def patch_after_import(patches: Dict[str, Callable]) -> None:
    """Call ``patches[name](module)`` right after each named module is first imported."""
    sys.meta_path.insert(0, _Finder(patches))


def count_graph_replays(log: Callable[[str], None]) -> None:
    """Count ``torch.cuda.CUDAGraph.replay`` calls and ``log`` the total at powers of two ("graph replays:
    N"): the GPU test beds' proof that requests ran through CUDA graphs."""
    import torch.cuda.graphs as graphs

    original, count = graphs.CUDAGraph.replay, [0]

    def replay(self, *args, **kwargs):
        count[0] += 1
        if count[0] & (count[0] - 1) == 0:
            log(f"graph replays: {count[0]}")
        return original(self, *args, **kwargs)

    graphs.CUDAGraph.replay = replay
