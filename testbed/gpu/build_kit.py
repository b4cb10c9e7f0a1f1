"""Build the GPU test bed's kit: one ignored folder holding everything the device needs, pinned.

    python -m testbed.gpu.build_kit [--out DIR]     # default: .cache/gpu-kit in this checkout
    python -m testbed.gpu.build_kit --engine vllm   # the vLLM kit (testbed/gpu/vllm_kit.py): .cache/vllm-gpu-kit

The device (Python 3.12, torch, Triton, no registry) gets, under its 64 MiB per call:

- ``wheels/``: the cp312 wheels of ``testbed/gpu/wheels.txt`` (downloaded once with pip into
  ``~/.cache/draftscope-gpu-kit/wheels``) and ``draftscope-*.whl`` built from this checkout: the tracer
  with its ``sglang.srt.plugins`` entry point, and the store and findings the scenario checks use;
- ``sglang.tar.xz``: SGLang 0.5.23's Python tree from the test bed's venv (its wheel is cp311 with
  extension modules that do not load on 3.12; the runner uses SGLang's Python radix tree), without
  ``multimodal_gen/``, ``test/``, ``benchmark/``, ``__pycache__`` and ``.so`` files;
- ``models/``: the test bed's tiny target and draft, and the edited drafts of the checked scenarios;
- ``standins/``: ``testbed/gpu/cuda_standins`` (pure-PyTorch ``sgl_kernel`` and import stubs);
- ``src/``: this checkout's files the device runs (runner, checks, benches; the tracer is the wheel's
  ``draftscope_tracer``, its only name), so a kit runs the code it was built from, committed or not;
- ``run.sh`` (``testbed/gpu/run_device.sh``) and ``manifest.json`` (versions, sizes, source commit).

Run it on the device with the ``run`` tool from the checkout that the tool sends, naming the kit in
``carry``: ``bash .cache/gpu-kit/run.sh`` (docs/testbed.md).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tarfile
import time
from pathlib import Path

from testbed.gpu.kit_files import CACHE, REPO, KitError, finish, models, project_wheel, source, wheels

HERE = Path(__file__).resolve().parent
SGLANG_DROP = ("multimodal_gen", "test", "benchmark")


def sglang_tree(dest: Path) -> dict:
    """SGLang's Python tree from this venv as ``sglang.tar.xz`` (cached by version)."""
    import sglang

    root = Path(sglang.__file__).resolve().parent
    version = getattr(sglang, "__version__", "unknown")
    dist = next(root.parent.glob(f"sglang-{version}.dist-info"), None)
    cached = CACHE / f"sglang-{version}-py.tar.xz"
    if not cached.exists():
        def keep(info: tarfile.TarInfo):
            parts = Path(info.name).parts
            if "__pycache__" in parts or info.name.endswith(".so") or info.name.endswith("/RECORD"):
                return None
            if len(parts) > 1 and parts[0] == "sglang" and parts[1] in SGLANG_DROP:
                return None
            return info

        tmp = cached.with_suffix(".tmp")
        with tarfile.open(tmp, "w:xz", preset=6) as tar:
            tar.add(root, arcname="sglang", filter=keep)
            if dist is not None:
                tar.add(dist, arcname=dist.name, filter=keep)
        tmp.rename(cached)
    shutil.copy2(cached, dest / "sglang.tar.xz")
    return {"version": version, "from": str(root)}


def build(out: Path) -> dict:
    from testbed.gpu.runner import KIT_SCENARIOS

    started = time.monotonic()
    tmp = out.with_name(out.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "wheels").mkdir(parents=True)
    manifest = {"built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "engine": "sglang",
                "wheels": wheels(tmp / "wheels", HERE / "wheels.txt"), "draftscope_wheel": project_wheel(tmp),
                "sglang": sglang_tree(tmp), "models": models(tmp / "models", KIT_SCENARIOS), "source": source(tmp / "src")}
    shutil.copytree(HERE / "cuda_standins", tmp / "standins", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(HERE / "run_device.sh", tmp / "run.sh")
    manifest = finish(tmp, out, manifest, "sglang.tar.xz", "testbed/gpu/wheels.txt")
    manifest["build_s"] = round(time.monotonic() - started, 1)
    return manifest


def main() -> int:
    ap = argparse.ArgumentParser(description="Build a GPU test bed kit (docs/testbed.md).")
    ap.add_argument("--engine", choices=("sglang", "vllm"), default="sglang",
                    help="which engine's kit: SGLang 0.5.23 (default) or vLLM 0.32 (testbed/gpu/vllm_kit.py)")
    ap.add_argument("--out", type=Path, default=None,
                    help="kit folder, ignored by git, inside the checkout the device tool sends (default: "
                         ".cache/gpu-kit, or .cache/vllm-gpu-kit with --engine vllm)")
    a = ap.parse_args()
    out = a.out or REPO / ".cache" / ("vllm-gpu-kit" if a.engine == "vllm" else "gpu-kit")
    try:
        if a.engine == "vllm":
            from testbed.gpu import vllm_kit

            m = vllm_kit.build(out.resolve())
            what = f"vLLM {m['vllm']['release']} tree"
        else:
            m = build(out.resolve())
            what = f"SGLang {m['sglang']['version']}"
    except KitError as exc:
        print(f"build_kit: {exc}", file=sys.stderr)
        return 1
    print(f"kit: {out} ({m['size_mib']} MiB, {len(m['wheels'])} wheels + {m['draftscope_wheel']}, {what}, source "
          f"{m['source']['commit'][:10]}{' + changes' if m['source']['dirty'] else ''}, {m['build_s']} s)")
    print(f"run on the device: bash {out.name if out.parent.name != '.cache' else '.cache/' + out.name}/run.sh "
          "(carry that folder)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
