"""What a bundle leaves out: secrets (whatever the store holds) and, by default, home paths.

Server args and the tracer's config go through the tracer's allow-lists (``queries.safe_run``);
facts and the draft's config through a deny pass on secret-looking names; credentials in any value
(URL userinfo, credential query parameters, bearer tokens) are scrubbed (``draftscope.redact``);
paths under the exporting user's home become ``~/...`` unless kept.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from draftscope.store.queries import safe_run

# A name is secret when one of its words (split on _ - . and case changes) is one of SECRET_WORDS,
# or its last word is one of SECRET_LAST (``api_key``, ``hf_token``; not ``num_key_value_heads``,
# ``eos_token_id``).
SECRET_WORDS = {"secret", "secrets", "password", "passwd", "credential", "credentials", "apikey",
                "auth", "cookie", "bearer", "launch"}
SECRET_LAST = {"key", "token", "keyfile"}


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[_\-.\s]+", spaced.lower()) if w]


def is_secret_name(name: str) -> bool:
    words = _words(name)
    return bool(words) and (words[-1] in SECRET_LAST or any(w in SECRET_WORDS for w in words))


def drop_secrets(value: Any) -> Any:
    """``value`` with every mapping entry whose key looks secret removed, at any depth."""
    if isinstance(value, dict):
        return {k: drop_secrets(v) for k, v in value.items() if not is_secret_name(str(k))}
    if isinstance(value, list):
        return [drop_secrets(v) for v in value]
    return value


def shorten_paths(value: Any, home: str | None = None) -> Any:
    """Every string in ``value`` with the user's home directory written as ``~``."""
    home = (home or str(Path.home())).rstrip("/")
    if home in ("", "/"):
        return value
    return _shorten(value, home)


def _shorten(value: Any, home: str) -> Any:
    if isinstance(value, str):
        if value == home:
            return "~"
        return value.replace(home + "/", "~/") if home in value else value
    if isinstance(value, dict):
        return {_shorten(k, home): _shorten(v, home) for k, v in value.items()}
    if isinstance(value, list):
        return [_shorten(v, home) for v in value]
    return value


def private_run(run: dict[str, Any]) -> dict[str, Any]:
    """The run record as a bundle carries it: server args and tracer config allow-listed and every
    value scrubbed (as the pages and the API show them, ``queries.safe_run``), secret names dropped."""
    out = safe_run(run)
    out["server_args"] = out.get("server_args") or {}
    out["facts"] = drop_secrets(out.get("facts")) if out.get("facts") is not None else None
    out["tracer_config"] = (drop_secrets(out["tracer_config"])
                            if out.get("tracer_config") is not None else None)
    return out
