"""The one error the spec readers raise: a file that cannot be read as what it should be."""

from __future__ import annotations

from pathlib import Path


class SpecError(Exception):
    """A checkpoint or config file is missing, corrupt or not what draftscope expects.

    ``path`` names the file; ``problem`` says what is wrong and what to do, in one paragraph.
    """

    def __init__(self, path: str | Path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")
