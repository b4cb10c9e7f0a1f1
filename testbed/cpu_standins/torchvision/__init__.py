"""Inert stand-in for `torchvision` (CPU test bed only; see ../README.md).

SGLang imports `torchvision.transforms` and friends from its multimodal helpers at import time. The
PyPI wheels are CUDA-linked and crash next to torch+cpu, and text-only models never call them. Every
`torchvision.*` submodule imports as an inert module whose attributes are placeholders; calling a
placeholder raises, so accidental use is loud.
"""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+cpu.standin"


class _Placeholder:
    """Stands for any torchvision name: attribute access and subclassing work, calls raise."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{self._name}: torchvision is an inert stand-in in the CPU test bed "
            "(testbed/cpu_standins); only text-only models are supported"
        )

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self):
        return f"<torchvision stand-in {self._name}>"


class _InertModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self.__name__}.{attr}")


class _InertLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _InertModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


class _SubmoduleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith(__name__ + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, _InertLoader(), is_package=True)


sys.meta_path.insert(0, _SubmoduleFinder())


def __getattr__(attr):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Placeholder(f"{__name__}.{attr}")
