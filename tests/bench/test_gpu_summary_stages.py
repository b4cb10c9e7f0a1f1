"""The stage profile's arithmetic (``bench/gpu_summary_stages.py``; its kernel runs only on a GPU): stamps laid out
as the summary kernel writes them give back the stage times they were made from."""

import importlib.util

import numpy as np
import pytest

from testbed.server import REPO_ROOT

spec = importlib.util.spec_from_file_location("gpu_summary_stages", REPO_ROOT / "bench" / "gpu_summary_stages.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

CYCLES_PER_NS = 2  # a 2 GHz SM clock


def program(start_ns: int, read: int, groups: int, columns: int, ticket: int, merge: int = 0) -> list:
    """One program's 9 slots from its start (timer ns) and its stages' ns (0 ``groups``/``columns``: a hidden
    slice, which writes its one stage three times)."""
    c0 = 1_000_000 + 7 * start_ns  # each SM's counter has an offset of its own
    at = [c0, c0 + read * CYCLES_PER_NS]
    at += [at[-1] + groups * CYCLES_PER_NS, at[-1] + (groups + columns) * CYCLES_PER_NS]
    at.append(at[-1] + ticket * CYCLES_PER_NS)
    end = at[-1] + merge * CYCLES_PER_NS
    ns = (end - c0) // CYCLES_PER_NS
    return [start_ns, c0, at[1], at[2], at[3], at[4], end if merge else 0, start_ns + ns, end]


def launch(shift: int) -> np.ndarray:
    """Two selected rows of one hidden slice and two logits chunks each, and a padding row (all 0)."""
    rows = []
    for r in range(2):
        rows.append([program(shift + 100 * r, 400, 0, 0, 50),
                     program(shift + 100 * r + 20, 1000, 300, 200, 60),
                     program(shift + 100 * r + 40, 1200, 300, 200, 40, merge=2000)])
    rows.append([[0] * 9] * 3)
    return np.array(rows, dtype=np.int64)


def test_stages_give_back_the_times_the_stamps_were_made_from():
    got = bench.stages([launch(5_000), launch(90_000)], rows=2, hidden_programs=1)
    assert got["cycles_per_ns"] == pytest.approx(CYCLES_PER_NS)
    assert got["logits_read_us"] == {"p50": pytest.approx(1.1), "p90": pytest.approx(1.2)}
    assert got["logits_groups_ranked_us"]["p50"] == pytest.approx(0.3)
    assert got["logits_columns_ranked_us"]["p50"] == pytest.approx(0.2)
    assert got["hidden_slice_us"] == {"p50": pytest.approx(0.4), "p90": pytest.approx(0.4)}
    assert got["ticket_us"]["p50"] == pytest.approx(0.05)
    assert got["merge_us"] == {"p50": pytest.approx(2.0), "p90": pytest.approx(2.0)}  # the merger only
    # row 1's merger starts 140 ns after the launch's first program and runs 1.2 + 0.3 + 0.2 + 0.04 + 2 µs
    assert got["merge_ends_us"]["p90"] == pytest.approx(0.14 + 3.74, rel=1e-3)
    assert got["span_us"]["p50"] == pytest.approx(0.14 + 3.74, rel=1e-3)
    assert got["program_start_us"] == {"p50": pytest.approx(0.07), "last": pytest.approx(0.14)}


def test_a_tuning_is_read_from_its_text_and_a_wrong_key_or_value_is_named():
    assert bench.parse_tuning("") == {}
    assert bench.parse_tuning("block=2048,warps=1") == {"block": 2048, "warps": 1}
    for bad, named in (("chunk=2048", "'chunk=2048'"), ("warps=one", "'warps=one'"), ("warps", "'warps'")):
        with pytest.raises(SystemExit, match=named):
            bench.parse_tuning(bad)


def test_the_table_names_each_case_by_its_tuning():
    stage = {"p50": 1.0, "p90": 2.0}
    case = {"batch": 1, "rows": 4, "sampling": "all rows", "eager_us": 13.4, "eager_stamped_us": 13.5,
            "span_us": stage, "program_start_us": {"p50": 0.1, "last": 0.2}, "logits_read_us": stage,
            "logits_groups_ranked_us": stage, "logits_columns_ranked_us": stage, "hidden_slice_us": stage,
            "ticket_us": stage, "merge_us": {"p50": None, "p90": None}, "merge_ends_us": stage}
    lines = bench.table([{**case, "tuning": {}}, {**case, "tuning": {"block": 2048, "warps": 1}}]).splitlines()
    assert lines[2].startswith("| default | 1 | 4 | all rows | 13.4 / 13.5 |")
    assert lines[3].startswith("| block 2048, warps 1 | 1 | 4 |")
    assert "| - |" in lines[3]  # a stage no program ran
    assert all(line.count("|") == lines[0].count("|") for line in lines[:4])
