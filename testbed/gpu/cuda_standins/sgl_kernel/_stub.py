"""What every stand-in module shares: the named error, the first-use log line, import-only stubs."""

import functools
import os
import sys


class StandinNotImplemented(NotImplementedError):
    """A kernel the GPU test bed's ``sgl_kernel`` stand-in does not implement was called."""


_logged = set()


def _note(what: str) -> None:
    if what not in _logged:
        _logged.add(what)
        sys.stderr.write(f"[sgl_kernel stand-in] {what} (pid {os.getpid()})\n")


def used(fn, name=None):
    """``fn`` that logs its first call."""
    label = f"called sgl_kernel.{name or fn.__name__}"

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        _note(label)
        return fn(*args, **kwargs)

    return wrapper


def module_getattr(module: str):
    """A PEP 562 ``__getattr__``: any other public name is a stub that raises when called."""
    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        full = f"{module}.{attr}"

        def stub(*args, **kwargs):
            _note(f"STUB CALLED {full}")
            raise StandinNotImplemented(f"{full} is not implemented by the GPU test bed's sgl_kernel stand-in "
                                        "(testbed/gpu/cuda_standins); this code path needs the real sgl-kernel wheel")

        stub.__name__ = stub.__qualname__ = attr
        return stub

    return __getattr__
