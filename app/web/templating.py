"""The Jinja environment of the pages: autoescaped templates, the filters they use, asset names."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone

from jinja2_fragments.fastapi import Jinja2Blocks
from markupsafe import Markup

from draftscope.resources import TEMPLATES_DIR

HTMX_JS = "htmx-2.0.4.min.js"
PLOTLY_JS = "plotly-basic-4.1.1.min.js"  # plotly.js-basic-dist-min, the version plotly 7.1.0 embeds


def when(ts: float | None) -> str:
    """A Unix time as UTC text; a stored value that is no time (infinite, out of range) as itself."""
    if ts is None:
        return ""
    try:
        return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError, TypeError):
        return f"{ts!r} (not a time)"


def num(value: float | None, digits: int = 3) -> str:
    """A number to ``digits`` significant figures; empty for None."""
    return "" if value is None else f"{value:.{digits}g}"


_HASH = re.compile(r"[0-9a-f]{12,}", re.IGNORECASE)  # a cache folder named by a content hash
_HASH_PREFIX = re.compile(r"^[0-9a-f]{12,}[-_.]", re.IGNORECASE)
GENERIC = {"draft", "target", "model", "models", "checkpoint", "checkpoints", "final", "latest", "main",
           "hf", "weights"}  # folder names that do not tell one model from another


def model_name(path: str | None) -> str:
    """What tells a model apart in its path: its own folder's name, without the content hash a cache
    folder carries (``…/<hash>/scenarios/<hash>-aux-off-v1`` reads ``aux-off-v1``); a generic name
    (``draft``, ``target``) with its parent's (``kimi-models/target``); a Hugging Face cache folder
    (``models--org--name``) and a hub id (``org/name``) as ``org/name``."""
    if not path:
        return ""
    text = str(path).replace("\\", "/")
    parts = [p for p in text.split("/") if p and p != "."]
    for part in reversed(parts):
        if part.startswith("models--"):
            return part[len("models--"):].replace("--", "/")
    named = [_HASH_PREFIX.sub("", p) for p in parts if not _HASH.fullmatch(p)]
    if not named:
        return parts[-1] if parts else text
    if len(parts) == 2 and len(named) == 2 and not text.startswith(("/", ".", "~")):
        return "/".join(named)  # a hub id: org/name
    if named[-1].lower() in GENERIC and len(named) > 1:
        return "/".join(named[-2:])
    return named[-1]


def run_names(runs: list[dict], facts_of: Callable[[list[str]], dict[str, dict]]) -> dict[str, str]:
    """Run id -> its name in a list: the draft's ``model_name``; where several runs of the list share
    that name, what sets each apart in brackets: an algorithm other than EAGLE3 and a drafted tree
    (``draft (EAGLE)``, ``draft (tree, top-4)``). ``facts_of``: the recorded facts of the runs that
    share a name (``queries.run_facts``), asked only when some do."""
    names = {r["id"]: model_name(r.get("draft_path")) for r in runs}
    counts = Counter(names.values())
    shared = [r for r in runs if names[r["id"]] and counts[names[r["id"]]] > 1]
    facts = facts_of([r["id"] for r in shared]) if shared else {}
    for r in shared:
        topk = (facts.get(r["id"]) or {}).get("spec_topk")
        parts = [r["algorithm"]] if r.get("algorithm") and r["algorithm"] != "EAGLE3" else []
        parts += [f"tree, top-{topk}"] if isinstance(topk, int) and topk > 1 else []
        names[r["id"]] += f" ({', '.join(parts)})" if parts else ""
    return names


def middle(text: str | None, width: int = 30) -> str:
    """``text`` cut to ``width`` characters in its middle (its start and its end tell most apart)."""
    text = "" if text is None else str(text)
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def position_rates(rows: list[dict] | None) -> str:
    """A chart's numbers in words for its label: ``: position 1 40% (8 of 20), …``."""
    parts = [f"position {r.get('position')} {r['rate']:.0%} ({r.get('accepted')} of {r.get('proposed')})"
             for r in rows or [] if isinstance(r.get("rate"), (int, float))]
    return (": " + ", ".join(parts)) if parts else ""


def safe_json(text: str | None) -> Markup:
    """JSON text for a ``<script type="application/json">`` block: no ``</script>`` can end it."""
    return Markup((text or "null").replace("<", "\\u003c").replace(">", "\\u003e")
                  .replace("&", "\\u0026"))


templates = Jinja2Blocks(directory=str(TEMPLATES_DIR))  # autoescapes .html templates
templates.env.filters.update(when=when, num=num, model_name=model_name, middle=middle,
                             position_rates=position_rates, safe_json=safe_json)
templates.env.globals.update(htmx_js=HTMX_JS, plotly_js=PLOTLY_JS)


def warm_up() -> None:
    """Compile every template now (~120 ms for all of them): at start, not in a page's first view."""
    for name in templates.env.list_templates():
        templates.env.get_template(name)
