"""A request's prompt key: a keyed hash (BLAKE2b, 8 bytes) of its prompt's token ids, so that the
store can tell the same prompt sent twice within one run without holding anything that identifies
the prompt. The key is random per tracer process and never leaves it: a guessed prompt cannot be
confirmed from the store, and keys of two processes (two runs, two data-parallel schedulers) do
not compare."""

from __future__ import annotations

import hashlib
import secrets
from array import array
from typing import Iterable

_KEY = secrets.token_bytes(16)


def prompt_key(token_ids: Iterable[int]) -> str:
    """16 hex digits, equal for equal token id sequences within this process."""
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=8, key=_KEY).hexdigest()
