"""testbed/gpu/profile_summary.py on Chrome traces written here: the traced server's kernels against the untraced
one's, every kernel counted (not only the longest ones the summary lists)."""

from __future__ import annotations

import gzip
import json

from testbed.gpu import profile_summary


def trace(path, kernels):
    """A trace of one step: ``kernels`` [(name, µs)] back to back on the GPU."""
    events, t = [], 0.0
    for name, dur in kernels:
        events.append({"ph": "X", "cat": "kernel", "name": name, "ts": t, "dur": dur})
        t += dur
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def test_kernels_only_the_traced_server_ran_are_listed_even_when_short(tmp_path):
    model = [(f"model_kernel_{i}", 100.0) for i in range(30)]  # more than the summary's top 25, all longer
    base = profile_summary.summarize(trace(tmp_path / "base.json.gz", model), steps=1)
    traced = profile_summary.summarize(trace(tmp_path / "traced.json.gz", model + [
        ("_summary_kernel", 12.0), ("_summary_kernel", 3.0), ("topk_small", 5.0), ("model_kernel_3", 7.0)]), steps=1)
    assert "_summary_kernel" not in traced["kernels_us"]  # past the top 25
    d = profile_summary.compare(base, traced)
    assert d["kernels_only_traced"] == {"_summary_kernel": 15.0, "topk_small": 5.0}
    assert d["kernels_longer_traced"] == {"model_kernel_3": 7.0}
    assert d["busy_us"] == 27.0
    lines = profile_summary.table({"profiles": {}, "deltas": {"every-c1": d}}).splitlines()
    assert "    only traced: 15.0 us/step  _summary_kernel" in lines
    assert "    longer traced: +7.0 us/step  model_kernel_3" in lines


def test_a_summary_saved_before_every_kernel_was_kept_still_compares(tmp_path):
    base = profile_summary.summarize(trace(tmp_path / "b.json.gz", [("a", 10.0)]), steps=1)
    traced = profile_summary.summarize(trace(tmp_path / "t.json.gz", [("a", 10.0), ("b", 4.0)]), steps=1)
    for s in (base, traced):
        del s["all_kernels_us"]
    assert profile_summary.compare(base, traced)["kernels_only_traced"] == {"b": 4.0}
