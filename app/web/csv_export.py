"""CSV downloads a spreadsheet opens as data: no cell runs as a formula, no name breaks the header.

A writer controls many stored strings (run ids, paths, finding messages, request ids). A spreadsheet
runs a cell that begins with ``=``, ``+``, ``-`` or ``@`` (or a tab or carriage return before one) as a
formula, so such a text cell gets a leading ``'`` (OWASP, "CSV Injection"). Numbers stay numbers: an
int or float is written as it is, as is text that is only a decimal number (``-1.5``, ``+3``, ``2e-3``):
a negative number is a number, not a formula. Lists and objects are written as JSON.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable
from typing import Any

from starlette.responses import Response

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def cell(value: Any) -> Any:
    """``value`` as a CSV cell: numbers as they are, None empty, lists and objects as JSON, text that
    would start a formula behind a ``'``."""
    if value is None:
        return ""
    if isinstance(value, (int, float)):  # bool too: True/False
        return value
    text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    if text.startswith(FORMULA_START) and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


def attachment_name(name: str) -> str:
    """``name`` fit for a ``Content-Disposition`` header: letters, digits, ``.``, ``_`` and ``-``."""
    return _UNSAFE_NAME.sub("_", name) or "download.csv"


def csv_response(rows: Iterable[dict[str, Any]], columns: Iterable[str], filename: str) -> Response:
    """``rows`` (the ``columns`` of each) as a CSV download named ``filename``."""
    out = io.StringIO()
    writer = csv.writer(out)
    columns = list(columns)
    writer.writerow(columns)
    for row in rows:
        writer.writerow([cell(row.get(c)) for c in columns])
    return Response(out.getvalue(), media_type="text/csv; charset=utf-8",
                    headers={"content-disposition": f'attachment; filename="{attachment_name(filename)}"'})
