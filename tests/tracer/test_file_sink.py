"""The file sink (DRAFTSCOPE_FILE) and the host side of the summaries, without a server."""

from __future__ import annotations

import json
import logging
import math

import torch

from draftscope_tracer.transport.file_sink import FileSink
from draftscope_tracer.health import Health
from draftscope_tracer.transport.records import topk_list
from draftscope_tracer.stats import merged_stats
from draftscope_tracer.device.summaries import Summaries
from draftscope_tracer.transport.writer import Writer

RUN = {"engine": "sglang", "engine_version": "0.5.23", "source": "tracer", "status": "running", "started_at": 1.0}


def test_file_sink_appends_one_json_line_per_batch(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"earlier": 1}\n')
    health = Health()
    w = Writer(FileSink(str(path), health.drop), health, lambda: dict(RUN), run_id="r1", max_batch_items=2,
               flush_interval_s=0.05, health_interval_s=60)
    for i in range(5):
        w.submit(lambda i=i: {"steps": [{"rid": "a", "step_index": i}]})
    w.close(status="ended")
    lines = path.read_text().splitlines()
    batches = [json.loads(x) for x in lines[1:]]
    assert json.loads(lines[0]) == {"earlier": 1}
    assert [s["step_index"] for b in batches for s in b["steps"]] == list(range(5))
    assert batches[0]["run"]["status"] == "running" and batches[-1]["run"]["status"] == "ended"
    assert not health.drops


def test_file_sink_full_disk_counts_drops_and_logs_once(caplog):
    drops = Health()
    sink = FileSink("/dev/full", drops.drop)  # every write fails with ENOSPC
    batch = {"run": None, "steps": [{"rid": "a"}, {"rid": "b"}], "samples": []}
    with caplog.at_level(logging.WARNING, logger="draftscope.tracer"):
        sink.send(batch)
        sink.send(batch)
    sink.close()
    assert drops.drops["sink_error"] == 4
    assert sum("the file sink (/dev/full) failed: OSError: [Errno 28] No space left" in r.getMessage()
               for r in caplog.records) == 1


def test_summaries_match_direct_statistics():
    torch.manual_seed(0)
    h = torch.randn(10, 12) * 3
    h[4, 7] = float("nan")
    logits = torch.randn(10, 50)
    s = Summaries(Health(), topk=3)
    out = s.launch(h, [2, 3, 4], chunk_width=4, logits=logits).result()
    whole = merged_stats(out, [0, 1])
    x = h[[2, 3]]
    assert whole["rows"] == 2 and whole["width"] == 12
    assert math.isclose(whole["mean"], x.mean().item(), rel_tol=1e-5)
    assert math.isclose(whole["std"], x.std(unbiased=False).item(), rel_tol=1e-5)
    assert math.isclose(whole["l2_max"], x.norm(dim=-1).max().item(), rel_tol=1e-5)
    chunk = merged_stats(out, [0], [1])
    assert chunk["width"] == 4 and math.isclose(chunk["l2_mean"], h[2, 4:8].norm().item(), rel_tol=1e-5)
    assert merged_stats(out, [2])["nan_count"] == 1
    probs, ids = torch.softmax(logits[3], -1).topk(3)
    top = topk_list(out.rows[1].topk)
    assert [t[0] for t in top] == ids.tolist() and math.isclose(top[0][1], probs[0].item(), rel_tol=1e-4)
    assert topk_list([(1, 0.5)], id_map=[7, 9]) == [[9, 0.5]]
    # more rows than the first Summarizer holds: a larger one replaces it
    assert len(s.launch(h, list(range(10))).result().rows) == 10
