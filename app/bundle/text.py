"""``--include-text``: the text of what the server generated, decoded from the recorded token ids.

The tracer records token ids, never text, and never the prompt. A verify step's accepted drafts
plus its bonus token are the tokens it emitted, so a request whose every step was sampled yields
its generated tokens, less the first (which the prefill emits); the last step may add up to a
step's worth of tokens that SGLang cut off at ``max_new_tokens`` or a stop. Decoding needs the target's
``tokenizer.json`` at the recorded path and the ``tokenizers`` package (both in an SGLang
environment).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any


class TextUnavailable(Exception):
    """The target's tokenizer cannot be read here; the message says what to do."""


def load_tokenizer(target_path: str | None) -> Any:
    """The ``tokenizers.Tokenizer`` of the target at ``target_path``."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TextUnavailable("--include-text decodes the recorded token ids, which needs the "
                              "'tokenizers' package: pip install tokenizers (an SGLang environment "
                              "has it), or export without --include-text.") from None
    path = Path(target_path or "") / "tokenizer.json"
    if not target_path or not path.is_file():
        raise TextUnavailable(f"--include-text decodes the recorded token ids with the target's "
                              f"tokenizer, but {path} is not readable here. Export on the machine "
                              "that holds the target model, or without --include-text.")
    return Tokenizer.from_file(str(path))


def emitted_tokens(steps: Iterable[dict[str, Any]]) -> list[int]:
    """The tokens a request's verify steps emitted, in order: accepted drafts, then the bonus."""
    out: list[int] = []
    for step in steps:
        out += [t for t, ok in zip(step["drafted_tokens"], step["accept_flags"]) if ok]
        if step.get("bonus_token") is not None:
            out.append(step["bonus_token"])
    return out


def text_line(tokenizer: Any, rid: str, steps: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``text.jsonl`` record: the request's emitted token ids and their text."""
    ids = emitted_tokens(steps)
    return {"rid": rid, "steps": len(steps), "token_ids": ids,
            "text": tokenizer.decode(ids, skip_special_tokens=True)}  # as SGLang's default
