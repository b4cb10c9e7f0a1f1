"""GPU test bed only: vLLM 0.32's compiled CUDA ops, registered in pure PyTorch where vLLM looks them up.

vLLM's CUDA platform imports ``vllm._C_stable_libtorch`` at start (``vllm/platforms/cuda.py``), a binary
that defines its ops in the ``torch.ops._C``, ``_C_cache_ops``, ``_C_cuda_utils`` and ``_C_custom_ar``
namespaces. That binary targets torch 2.13 and the device has 2.11, so the kit replaces it with a
``vllm/_C_stable_libtorch.py`` that calls :func:`install`: every schema of the release's binary
(``schemas.txt``, read from it by ``testbed/gpu/vllm_kit.py``) is defined with ``torch.library``, so
vLLM's module-level lookups (``torch.ops._C.silu_and_mul.default`` in its compile passes) and
``hasattr`` probes see what a CUDA build shows. The ops of ``kernels.IMPLEMENTED`` run pure-PyTorch
bodies; any other op raises :class:`StandinNotImplemented` naming itself if it is ever called. Each op
logs one ``[vllm _C stand-in] called NS::NAME`` (or ``STUB CALLED``) line the first time it runs, so a
run's log lists what was used.
"""

import functools
import os
import sys
from pathlib import Path

import torch

from .kernels import IMPLEMENTED

SCHEMAS = Path(__file__).with_name("schemas.txt")
KEY = "CompositeExplicitAutograd"  # one body for CPU, CUDA and meta tensors

_libraries = {}
_logged = set()
installed = {"defined": [], "implemented": [], "refused": {}}


class StandinNotImplemented(NotImplementedError):
    """A vLLM compiled op that the GPU test bed does not stand in for was called."""


def _note(what: str) -> None:
    if what not in _logged:
        _logged.add(what)
        sys.stderr.write(f"[vllm _C stand-in] {what} (pid {os.getpid()})\n")


def ran() -> list:
    """The ops run so far in this process: ``NS::NAME``, stubs as ``STUB NS::NAME``."""
    return [w.replace("called ", "").replace("STUB CALLED ", "STUB ") for w in _logged]


def read_schemas(path: Path = SCHEMAS) -> list:
    """``[(namespace, schema)]`` from ``schemas.txt`` (tab-separated; ``#`` lines are comments)."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            ns, schema = line.split("\t", 1)
            rows.append((ns, schema))
    return rows


def op_name(schema: str) -> str:
    """``name`` or ``name.overload``: what precedes the schema's argument list."""
    return schema.split("(", 1)[0]


def _called(qualname: str, body):
    @functools.wraps(body)
    def op(*args, **kwargs):
        _note(f"called {qualname}")
        return body(*args, **kwargs)
    return op


def _stub(qualname: str):
    def op(*args, **kwargs):
        _note(f"STUB CALLED {qualname}")
        raise StandinNotImplemented(
            f"{qualname} is not implemented by the GPU test bed's vLLM stand-in (testbed/gpu/vllm_standins); "
            "this code path needs vLLM's compiled kernels")
    return op


def install(path: Path = SCHEMAS) -> dict:
    """Define every schema of ``path`` once per process, with its stand-in body or a stub."""
    if installed["defined"]:
        return installed
    for ns, schema in read_schemas(path):
        name = op_name(schema)
        qualname = f"{ns}::{name}"
        lib = _libraries.setdefault(ns, torch.library.Library(ns, "FRAGMENT"))
        try:
            lib.define(schema)
        except RuntimeError as exc:  # a type torch does not know (vLLM's ScalarType): left undefined
            installed["refused"][qualname] = str(exc).splitlines()[0]
            continue
        body = IMPLEMENTED.get(qualname)
        lib.impl(name, _called(qualname, body) if body else _stub(qualname), KEY)
        installed["defined"].append(qualname)
        if body:
            installed["implemented"].append(qualname)
    return installed
