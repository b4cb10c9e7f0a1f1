"""Where the pages' templates and static assets are: inside the installed package (a wheel), else
the source tree's top-level folders (an editable install; pyproject.toml maps them into the wheel)."""

from __future__ import annotations

from pathlib import Path


def _data_dir(name: str) -> Path:
    here = Path(__file__).resolve().parent
    return here / name if (here / name).is_dir() else here.parent / name


TEMPLATES_DIR = _data_dir("templates")
STATIC_DIR = _data_dir("static")
