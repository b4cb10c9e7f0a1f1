"""What both GPU kits share (``testbed/gpu/build_kit.py`` for SGLang, ``testbed/gpu/vllm_kit.py`` for vLLM):
pinned cp312 wheels, the project's wheel, this checkout's source, and the finished kit's manifest and size
check. Downloads are cached in ``~/.cache/draftscope-gpu-kit/``."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path.home() / ".cache" / "draftscope-gpu-kit"
LIMIT_MIB = 60  # the device takes 64 MiB per call, the checkout itself included
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
             "manylinux1_x86_64"]
SRC = ("bench/", "testbed/", "tests/__init__.py", "tests/gpu/", "pyproject.toml")


class KitError(RuntimeError):
    """The kit cannot be built; the message says what is missing and what to do."""


def pinned_wheels(pins: Path) -> list:
    lines = pins.read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def download(reqs: list, cache: Path) -> None:
    """``pip download`` of cp312 manylinux wheels (no dependencies) into ``cache``."""
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "-d", str(cache), *[f"--platform={p}" for p in PLATFORMS], *reqs]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise KitError(f"pip download of {' '.join(reqs)[:200]} failed:\n{done.stderr[-3000:]}")


def wheels(dest: Path, pins: Path) -> list:
    """The cp312 wheels pinned in ``pins`` (pip download, cached), copied into ``dest``."""
    cache = CACHE / "wheels"
    reqs = pinned_wheels(pins)
    download(reqs, cache)
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
    """``draftscope-*.whl`` built from this checkout (tracer plugins + dashboard package, no dependencies)."""
    with tempfile.TemporaryDirectory() as tmp:
        build = Path(tmp) / "src"
        shutil.copytree(REPO, build, ignore=shutil.ignore_patterns(".git", ".venv", ".venv-vllm", ".cache", "build",
                                                                    "dist", "*.egg-info", "__pycache__",
                                                                    "node_modules"))
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                               "-w", str(dest), str(build)], capture_output=True, text=True)
        if done.returncode:
            raise KitError(f"building the draftscope wheel failed:\n{done.stderr[-3000:]}")
    return next(dest.glob("draftscope-*.whl")).name


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


def finish(tmp: Path, out: Path, manifest: dict, tree: str, pins: str) -> dict:
    """Write ``manifest.json`` (size, hashes of the wheels and ``tree``), refuse a kit over ``LIMIT_MIB``,
    then move ``tmp`` to ``out``."""
    manifest["size_mib"] = round(size_mib(tmp), 1)
    manifest["sha256"] = {str(f.relative_to(tmp)): hashlib.sha256(f.read_bytes()).hexdigest()[:16]
                          for f in sorted(tmp.glob("*.whl")) + sorted((tmp / "wheels").glob("*.whl")) + [tmp / tree]}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    if manifest["size_mib"] > LIMIT_MIB:
        raise KitError(f"the kit is {manifest['size_mib']} MiB, over {LIMIT_MIB} MiB (the device takes 64 MiB a "
                       f"call, checkout included): drop wheels from {pins}")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return manifest


def models(dest: Path, scenarios: tuple) -> dict:
    """The tiny target and its trained EAGLE-3 draft, and the edited drafts of ``scenarios``
    (``testbed/scenarios.py``; one whose edit is a server flag has no draft of its own)."""
    from testbed.models import ensure_models
    from testbed.scenarios import SCENARIOS, prepare

    paths = ensure_models()
    shutil.copytree(paths.target, dest / "target")
    shutil.copytree(paths.draft, dest / "draft")
    for name in scenarios:
        if SCENARIOS[name].edit is not None:
            shutil.copytree(prepare(name).draft_dir, dest / "scenarios" / name)
    return {"build": json.loads((paths.target.parent / "build.json").read_text()).get("hash")}
