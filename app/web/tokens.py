"""Token ids as text, when the target's tokenizer is readable from the dashboard host."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

Decode = Callable[[int], "str | None"]


def _none(_token_id: int) -> None:
    return None


@lru_cache(maxsize=8)
def decoder(target_path: str | None) -> Decode:
    """A function from token id to its text for the tokenizer next to ``target_path``
    (``tokenizer.json``), or one that returns None when there is none readable here."""
    if not target_path:
        return _none
    path = Path(target_path) / "tokenizer.json"
    try:
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_file(str(path))
    except Exception:  # absent, unreadable or not a tokenizers file: show ids alone
        return _none
    size = tokenizer.get_vocab_size(with_added_tokens=True)

    @lru_cache(maxsize=65536)
    def decode(token_id: int) -> str | None:
        token_id = int(token_id)
        if not 0 <= token_id < size:
            return None
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)

    return decode
