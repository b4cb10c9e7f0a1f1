"""Import vLLM's CUDA serving path from the kit's tree and report what it needed.

    python -m testbed.gpu.vllm_imports [--dry-run] [--json OUT]

Imports the modules a CUDA server with EAGLE-3 and the Triton attention backend loads (the OpenAI server,
the engine core, the GPU worker and both model runners, the Llama target and EAGLE-3 draft, the EAGLE
proposer, ``TRITON_ATTN``, the rejection sampler, the compile passes and CUDA-graph wrapper, vLLM's own
kernel registrations) and prints, as JSON: each module's result, the platform vLLM resolved, the ops the
stand-ins defined and which of them ran, and the distributions the imports came from (what a kit must
carry where the device lacks them).

On the device it runs as is (the runner's first phase). ``--dry-run`` is for a machine without a GPU:
vLLM's CUDA platform is taken as an H200 (compute capability 9.0, one device) and Triton's NVIDIA driver
as active, so the imports go as far as they can without CUDA; nothing is launched on a device either way.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import sys
import time
import traceback

PATH_MODULES = (
    "vllm",
    "vllm.entrypoints.openai.api_server",
    "vllm.v1.engine.core",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.models.llama_eagle3",
    "vllm.v1.spec_decode.eagle",
    "vllm.v1.attention.backends.triton_attn",
    "vllm.v1.sample.sampler",
    "vllm.v1.sample.rejection_sampler",
    "vllm.compilation.passes.pass_manager",
    "vllm.compilation.backends",
    "vllm.compilation.cuda_graph",
    "vllm.kernels.vllm_c",
    "vllm._custom_ops",
)


def fake_h200() -> None:
    """Without a GPU: vLLM's platform is CUDA on one H200 and Triton's NVIDIA driver counts as active."""
    from triton.backends import backends

    backends["nvidia"].driver.is_active = staticmethod(lambda: True)
    import vllm.platforms as platforms
    from vllm.platforms.cuda import CudaPlatform
    from vllm.platforms.interface import DeviceCapability

    cls = type(CudaPlatform())
    cls.get_device_capability = classmethod(lambda c, device_id=0: DeviceCapability(9, 0))
    cls.get_device_name = classmethod(lambda c, device_id=0: "NVIDIA H200 (dry run: no GPU here)")
    cls.device_count = classmethod(lambda c: 1)
    platforms.current_platform = cls()


def distributions() -> dict:
    """``{distribution: version}`` of every imported top-level module outside the standard library."""
    owners = importlib.metadata.packages_distributions()
    found = {}
    for name in {m.split(".")[0] for m in list(sys.modules)}:
        if name in sys.stdlib_module_names or name.startswith("_"):
            continue
        for dist in owners.get(name, []):
            try:
                found[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
    return dict(sorted(found.items()))


def check(dry_run: bool) -> dict:
    started = time.monotonic()
    if dry_run:
        fake_h200()
    results = {}
    for name in PATH_MODULES:
        t0 = time.monotonic()
        try:
            importlib.import_module(name)
            results[name] = {"ok": True, "s": round(time.monotonic() - t0, 2)}
        except Exception as exc:  # noqa: BLE001 - each module's failure is the finding
            tail = traceback.extract_tb(exc.__traceback__)[-1]
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:400]}",
                             "at": f"{tail.filename}:{tail.lineno}"}
    import vllm
    import vllm_c_standin
    from vllm.platforms import current_platform

    return {"dry_run": dry_run, "vllm": vllm.__version__, "vllm_from": vllm.__file__,
            "platform": type(current_platform).__name__, "modules": results,
            "standins": {"defined": len(vllm_c_standin.installed["defined"]),
                         "implemented": vllm_c_standin.installed["implemented"],
                         "refused": vllm_c_standin.installed["refused"],
                         "ran": sorted(vllm_c_standin.ran())},
            "distributions": distributions(), "s": round(time.monotonic() - started, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="no GPU here: take the platform as one H200")
    ap.add_argument("--json", help="also write the report to this file")
    a = ap.parse_args()
    report = check(a.dry_run)
    text = json.dumps(report, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0 if all(r["ok"] for r in report["modules"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
