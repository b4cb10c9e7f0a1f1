"""The Jinja environment of the pages: autoescaped templates, the filters they use, asset names."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

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


def shortpath(path: str | None) -> str:
    """The last two components of a path (the full path goes in a title attribute)."""
    if not path:
        return ""
    parts = [p for p in str(path).rstrip("/").split("/") if p]
    return "/".join(parts[-2:]) if len(parts) > 2 else str(path)


def safe_json(text: str | None) -> Markup:
    """JSON text for a ``<script type="application/json">`` block: no ``</script>`` can end it."""
    return Markup((text or "null").replace("<", "\\u003c").replace(">", "\\u003e")
                  .replace("&", "\\u0026"))


templates = Jinja2Blocks(directory=str(TEMPLATES_DIR))  # autoescapes .html templates
templates.env.filters.update(when=when, num=num, shortpath=shortpath, safe_json=safe_json)
templates.env.globals.update(htmx_js=HTMX_JS, plotly_js=PLOTLY_JS)


def warm_up() -> None:
    """Compile every template now (~120 ms for all of them): at start, not in a page's first view."""
    for name in templates.env.list_templates():
        templates.env.get_template(name)
