"""Values that cross from the scheduler process to the recorder once per recorder (``hot_token_id``, read
from the device once): :class:`Shared` pickles as the value the first time and as its key after (the relay's
pickler decides, ``transport.relay``). Plain data: the device and transport layers both use it."""

from __future__ import annotations

from typing import Any, Dict

SHARED: Dict[str, Any] = {}  # values the relay sent once (``Shared``), by key, in the recorder process


class Shared:
    """A value every job may refer to but that crosses the pipe once per recorder (e.g. ``hot_token_id``
    as a list): ``load`` runs on the relay thread the first time; later jobs carry only ``key``."""

    def __init__(self, key: str, load):
        self.key, self.load = key, load

    def __reduce__(self):
        return _remember, (self.key, self.load())


def _remember(key: str, value: Any) -> Any:
    SHARED[key] = value
    return value


def recall(key: str) -> Any:
    """A value sent earlier (what a :class:`Shared` pickles as once the recorder has it)."""
    return SHARED[key]
