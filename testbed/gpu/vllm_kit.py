"""Build the vLLM GPU kit: vLLM 0.32's CUDA release as Python, with PyTorch stand-ins for its binaries.

    python -m testbed.gpu.build_kit --engine vllm [--out DIR]   # default: .cache/vllm-gpu-kit
    python -m testbed.gpu.vllm_kit --schemas                     # rewrite the stand-ins' schemas.txt

The device (Python 3.12, torch 2.11, Triton 3.6, no vLLM, no registry) gets, under 64 MiB a call:

- ``vllm.tar.xz``: the Python tree of the ``vllm==0.32.0`` CUDA wheel (``pip download``, cached in
  ``~/.cache/draftscope-gpu-kit/vllm-cuda``) with its dist-info, without its binaries (``*.so``, the
  ``vllm-rs`` executable), the C/CUDA sources it ships for JIT builds, ``third_party/deep_gemm``,
  ``third_party/fmha_sm100`` and ``vllm_flash_attn/cute`` (CUDA-only kernels whose imports fail
  without their binaries or the CuTe DSL either way); plus ``vllm/_C_stable_libtorch.py``, which
  installs the stand-ins (``testbed/gpu/vllm_standins``) where the binary would have registered its ops;
- ``wheels/``: the cp312 wheels of ``testbed/gpu/vllm_wheels.txt``, vLLM's pure-Python and small
  compiled dependencies that the device lacks, and ``draftscope-*.whl`` (the tracer, its vLLM plugin);
- ``models/``: the test bed's tiny target and EAGLE-3 draft; ``standins/``; ``src/`` (this checkout's
  runner and checks); ``run.sh`` (``testbed/gpu/vllm_run_device.sh``); ``manifest.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import re
import shutil
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from testbed.gpu import kit_files

HERE = Path(__file__).resolve().parent
STANDINS = HERE / "vllm_standins"
SCHEMAS = STANDINS / "vllm_c_standin" / "schemas.txt"
VLLM = "vllm==0.32.0"
RELEASE_CACHE = kit_files.CACHE / "vllm-cuda"
BINARY = "vllm/_C_stable_libtorch.abi3.so"  # the ops vLLM's CUDA platform imports unconditionally
DROP_DIRS = ("vllm/third_party/deep_gemm/", "vllm/third_party/fmha_sm100/", "vllm/vllm_flash_attn/cute/")
DROP_SUFFIXES = (".so", ".h", ".hpp", ".cuh", ".inl", ".cu", ".cpp", ".c")
OVERLAY = HERE / "vllm_overlay"  # files the kit adds to the tree: the stand-ins' entry points
_SCHEMA = re.compile(r"[A-Za-z_]\w*(\.\w+)?\(.*\) -> .+")
_USE = re.compile(rb"torch\.ops\.(_C\w*)\.(\w+)")


def release_wheel() -> Path:
    """vLLM's CUDA wheel for cp312 manylinux (downloaded once, no dependencies)."""
    found = sorted(RELEASE_CACHE.glob("vllm-0.32.0-*.whl"))
    if not found:
        kit_files.download([VLLM], RELEASE_CACHE)
        found = sorted(RELEASE_CACHE.glob("vllm-0.32.0-*.whl"))
    if not found:
        raise kit_files.KitError(f"pip download {VLLM} left no wheel in {RELEASE_CACHE}")
    return found[-1]


def extract_schemas(wheel: Path) -> list:
    """``[(namespace, schema)]`` for every op the release's ``_C_stable_libtorch`` binary defines.

    The schemas are the binary's own strings; an op's namespace is the one vLLM's Python calls it under
    (``torch.ops._C_cache_ops.reshape_and_cache_flash``), else ``_C``."""
    with zipfile.ZipFile(wheel) as zf:
        binary = zf.read(BINARY)
        namespace = {}
        for name in zf.namelist():
            if name.startswith("vllm/") and name.endswith(".py"):
                for ns, op in _USE.findall(zf.read(name)):
                    if ns != b"_C":
                        namespace[op.decode()] = ns.decode()
    rows = []
    for chunk in binary.split(b"\x00"):
        text = chunk.decode("ascii", errors="replace")
        if "\n" not in text and _SCHEMA.fullmatch(text):
            schema = " ".join(text.split()).replace("( ", "(")
            rows.append((namespace.get(schema.split("(", 1)[0].split(".")[0], "_C"), schema))
    if not rows:
        raise kit_files.KitError(f"no op schema found in {BINARY} of {wheel.name}")
    return sorted(set(rows))


def write_schemas(wheel: Path, path: Path = SCHEMAS) -> int:
    rows = extract_schemas(wheel)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]
    head = (f"# {len(rows)} op schemas of {wheel.name} ({BINARY}, sha256 {digest}),\n"
            "# written by `python -m testbed.gpu.vllm_kit --schemas`: namespace<TAB>schema\n")
    path.write_text(head + "".join(f"{ns}\t{schema}\n" for ns, schema in rows))
    return len(rows)


def keep_in_tree(name: str) -> bool:
    """Whether a file of the wheel goes into the device's vLLM tree."""
    if name.endswith("/RECORD") or name == "vllm/vllm-rs" or name.startswith(DROP_DIRS):
        return False
    return not name.endswith(DROP_SUFFIXES)


def vllm_tree(wheel: Path, dest: Path) -> dict:
    """``vllm.tar.xz``: the wheel's Python tree and dist-info (``keep_in_tree``) and the files of
    ``vllm_overlay/`` (cached by wheel and overlay)."""
    overlay = hashlib.sha256(b"".join(f.read_bytes() for f in sorted(OVERLAY.rglob("*.py")))).hexdigest()[:8]
    cached = RELEASE_CACHE / f"{wheel.name[:-4]}-py-{overlay}.tar.xz"
    kept = 0
    if not cached.exists():
        tmp = cached.with_suffix(".tmp")
        with zipfile.ZipFile(wheel) as zf, tarfile.open(tmp, "w:xz", preset=6) as tar:
            for info in zf.infolist():
                if info.is_dir() or not keep_in_tree(info.filename):
                    continue
                data = zf.read(info)
                _add(tar, info.filename, data, 0o755 if info.external_attr >> 16 & 0o111 else 0o644)
                kept += 1
            for extra in sorted(OVERLAY.rglob("*.py")):
                _add(tar, extra.relative_to(OVERLAY).as_posix(), extra.read_bytes(), 0o644)
        tmp.rename(cached)
    shutil.copy2(cached, dest / "vllm.tar.xz")
    return {"release": wheel.name, "files": kept or None, "size_mib": round(cached.stat().st_size / 2**20, 1)}


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def build(out: Path) -> dict:
    from testbed.gpu.vllm_serve import SCENARIOS

    started = time.monotonic()
    tmp = out.with_name(out.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "wheels").mkdir(parents=True)
    wheel = release_wheel()
    manifest = {"built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "engine": "vllm",
                "wheels": kit_files.wheels(tmp / "wheels", HERE / "vllm_wheels.txt"),
                "draftscope_wheel": kit_files.project_wheel(tmp), "vllm": vllm_tree(wheel, tmp),
                "models": kit_files.models(tmp / "models", SCENARIOS), "source": kit_files.source(tmp / "src")}
    shutil.copytree(STANDINS, tmp / "standins", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(HERE / "vllm_run_device.sh", tmp / "run.sh")
    manifest = kit_files.finish(tmp, out, manifest, "vllm.tar.xz", "testbed/gpu/vllm_wheels.txt")
    manifest["build_s"] = round(time.monotonic() - started, 1)
    return manifest


def main() -> int:
    ap = argparse.ArgumentParser(description="vLLM GPU kit helpers (build it with testbed.gpu.build_kit --engine vllm).")
    ap.add_argument("--schemas", action="store_true", help=f"rewrite {SCHEMAS.relative_to(kit_files.REPO)} from the "
                                                          f"{VLLM} CUDA wheel")
    a = ap.parse_args()
    if not a.schemas:
        ap.error("nothing to do: pass --schemas, or build the kit with python -m testbed.gpu.build_kit --engine vllm")
    try:
        n = write_schemas(release_wheel())
    except kit_files.KitError as exc:
        print(f"vllm_kit: {exc}", file=sys.stderr)
        return 1
    print(f"{SCHEMAS}: {n} op schemas")
    return 0


if __name__ == "__main__":
    sys.exit(main())
