"""Build the GPU test bed's kit: one ignored folder holding everything the device needs, pinned.

    python -m testbed.gpu.build_kit [--out DIR]     # default: .cache/gpu-kit in this checkout

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
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CACHE = Path.home() / ".cache" / "draftscope-gpu-kit"
LIMIT_MIB = 60  # the device takes 64 MiB per call, the checkout itself included
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "manylinux1_x86_64"]
SGLANG_DROP = ("multimodal_gen", "test", "benchmark")
SRC = ("bench/", "testbed/", "tests/__init__.py", "tests/gpu/", "pyproject.toml")


class KitError(RuntimeError):
    """The kit cannot be built; the message says what is missing and what to do."""


def pinned_wheels() -> list:
    lines = (HERE / "wheels.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def wheels(dest: Path) -> list:
    """The pinned cp312 wheels (pip download, cached), copied into ``dest``."""
    cache = CACHE / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    reqs = pinned_wheels()
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "-d", str(cache), *[f"--platform={p}" for p in PLATFORMS], *reqs]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise KitError(f"pip download of the pinned wheels failed (testbed/gpu/wheels.txt):\n{done.stderr[-3000:]}")
    canon = lambda s: re.sub(r"[-_.]+", "_", s).lower()  # noqa: E731
    by_key = {(canon(w.name.split("-")[0]), w.name.split("-")[1]): w for w in cache.glob("*.whl")}
    names = []
    for req in reqs:
        name, version = req.split("==")
        found = by_key.get((canon(name), version))
        if found is None:
            raise KitError(f"no wheel for {req} in {cache} after pip download")
        shutil.copy2(found, dest / found.name)
        names.append(found.name)
    return names


def project_wheel(dest: Path) -> str:
    """``draftscope-*.whl`` built from this checkout (tracer plugin + dashboard package, no dependencies)."""
    with tempfile.TemporaryDirectory() as tmp:
        build = Path(tmp) / "src"
        shutil.copytree(REPO, build, ignore=shutil.ignore_patterns(".git", ".venv", ".cache", "build", "dist",
                                                                    "*.egg-info", "__pycache__", "node_modules"))
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                               "-w", str(dest), str(build)], capture_output=True, text=True)
        if done.returncode:
            raise KitError(f"building the draftscope wheel failed:\n{done.stderr[-3000:]}")
    return next(dest.glob("draftscope-*.whl")).name


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


def models(dest: Path) -> dict:
    """The tiny target and draft, and the edited drafts of the scenarios the runner checks."""
    from testbed.gpu.runner import CHECKED_SCENARIOS
    from testbed.models import ensure_models
    from testbed.scenarios import SCENARIOS, prepare

    paths = ensure_models()
    shutil.copytree(paths.target, dest / "target")
    shutil.copytree(paths.draft, dest / "draft")
    for name in CHECKED_SCENARIOS:
        if SCENARIOS[name].edit is not None:
            shutil.copytree(prepare(name).draft_dir, dest / "scenarios" / name)
    return {"build": json.loads((paths.target.parent / "build.json").read_text()).get("hash")}


def source(dest: Path) -> dict:
    """This checkout's files under ``SRC`` (tracked and untracked-not-ignored), and its commit."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    chosen = [f for f in files if f.startswith(SRC) and (REPO / f).is_file()]
    for f in chosen:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)
    git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()  # noqa: E731
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "files": len(chosen)}


def size_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def build(out: Path) -> dict:
    started = time.monotonic()
    tmp = out.with_name(out.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "wheels").mkdir(parents=True)
    manifest = {"built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "wheels": wheels(tmp / "wheels"), "draftscope_wheel": project_wheel(tmp),
                "sglang": sglang_tree(tmp), "models": models(tmp / "models"), "source": source(tmp / "src")}
    shutil.copytree(HERE / "cuda_standins", tmp / "standins", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(HERE / "run_device.sh", tmp / "run.sh")
    manifest["size_mib"] = round(size_mib(tmp), 1)
    manifest["sha256"] = {str(f.relative_to(tmp)): hashlib.sha256(f.read_bytes()).hexdigest()[:16]
                          for f in sorted(tmp.glob("*.whl")) + sorted((tmp / "wheels").glob("*.whl"))
                          + [tmp / "sglang.tar.xz"]}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if manifest["size_mib"] > LIMIT_MIB:
        raise KitError(f"the kit is {manifest['size_mib']} MiB, over {LIMIT_MIB} MiB (the device takes 64 MiB a "
                       f"call, checkout included): drop wheels from testbed/gpu/wheels.txt or scenarios")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    manifest["build_s"] = round(time.monotonic() - started, 1)
    return manifest


def main() -> int:
    ap = argparse.ArgumentParser(description="Build the GPU test bed's kit (docs/testbed.md).")
    ap.add_argument("--out", type=Path, default=REPO / ".cache" / "gpu-kit",
                    help="kit folder, ignored by git, inside the checkout the device tool sends (default: %(default)s)")
    a = ap.parse_args()
    try:
        m = build(a.out.resolve())
    except KitError as exc:
        print(f"build_kit: {exc}", file=sys.stderr)
        return 1
    print(f"kit: {a.out} ({m['size_mib']} MiB, {len(m['wheels'])} wheels + {m['draftscope_wheel']}, SGLang "
          f"{m['sglang']['version']}, source {m['source']['commit'][:10]}{' + changes' if m['source']['dirty'] else ''}, "
          f"{m['build_s']} s)")
    print(f"run on the device: bash {a.out.name if a.out.parent.name != '.cache' else '.cache/' + a.out.name}/run.sh "
          "(carry that folder)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
