"""CSV downloads open in a spreadsheet as data: a text cell that would start a formula gets a leading
``'`` (OWASP), numbers (negative ones included) stay numbers, and a download's file name is safe."""

from __future__ import annotations

import csv
import io
import uuid

import pytest

from draftscope.web.csv_export import attachment_name, cell
from tests.fixtures.store import make_batch, run_record


@pytest.mark.parametrize("value,expected", [
    ("=HYPERLINK(\"http://evil\")", "'=HYPERLINK(\"http://evil\")"), ("+1+2", "'+1+2"), ("-x", "'-x"),
    ("@SUM(A1)", "'@SUM(A1)"), ("\t=1", "'\t=1"), ("\r=1", "'\r=1"), ("-1+1", "'-1+1"), ("-", "'-"),
    ("-1.5", "-1.5"), ("+3", "+3"), ("2e-3", "2e-3"), (-1.5, -1.5), (-7, -7), (0, 0), (True, True),
    (None, ""), ("a=b", "a=b"), ("/models/x", "/models/x"), ([1, -2], "[1, -2]"), ({"a": "=1"}, '{"a": "=1"}'),
])
def test_cells(value, expected):
    assert cell(value) == expected


def test_file_names_keep_only_safe_characters():
    assert attachment_name('run"\r\nX-Evil: 1-spec.csv') == "run_X-Evil_1-spec.csv"
    assert attachment_name("0123abcd-requests.csv") == "0123abcd-requests.csv"


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_downloads_neutralise_formulas_and_keep_numbers(client):
    run_id = uuid.uuid4().hex
    batch = make_batch(run_id, run=run_record(target_path="=cmd|' /C calc'!A0", algorithm="@EAGLE3"),
                       requests=[{"rid": "-r1", "prompt_len": 12, "output_len": 30, "spec_verify_ct": 10}],
                       findings=[{"rule_id": "aux-width-mismatch", "severity": "warning", "message": "+1+2",
                                  "fix": "-x", "evidence": {"width": -1}}])
    assert client.post("/api/v1/batches", json=batch).status_code == 200
    runs = client.get("/runs.csv")
    assert runs.headers["content-disposition"] == 'attachment; filename="runs.csv"'
    run = next(r for r in _rows(runs.text) if r["id"] == run_id)
    assert run["target_path"] == "'=cmd|' /C calc'!A0" and run["algorithm"] == "'@EAGLE3"
    finding, = _rows(client.get(f"/runs/{run_id}/findings.csv").text)
    assert (finding["message"], finding["fix"], finding["evidence"]) == ("'+1+2", "'-x", '{"width": -1}')
    request, = _rows(client.get(f"/runs/{run_id}/requests.csv").text)
    assert request["rid"] == "'-r1" and request["prompt_len"] == "12" and request["spec_accept_length"] == "3.0"
