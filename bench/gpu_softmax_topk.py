"""GPU time of the step tap's two-stage softmax top-k (``tracer/device/softmax_topk.py``'s ``two_stage``) against
a softmax then ``torch.topk``, per CUDA-graph replay (as in SGLang's draft-decode loop: the row gather
included), at the vocabularies of Kimi-K2.5 (163,840) and Qwen (151,936) and 1, 8 and 64 rows, top-8: where
``softmax_topk`` takes which (``SOFTMAX_ROWS``). Both paths replay in turns, each timed over 200 replays, 5
rounds; the median per case.

    python bench/gpu_softmax_topk.py          # JSON also to $OUT/gpu_softmax_topk.json if OUT is set

Needs a CUDA GPU and the tracer importable as ``draftscope_tracer`` (the GPU kits put it on ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch

from gpu_summarize import capture  # bench/, beside this script: warm-up off the capture, then one graph

VOCABS = (163_840, 151_936)
ROWS = (1, 8, 64)
K = 8


def _old(x: torch.Tensor, k: int, out) -> None:
    torch.topk(torch.softmax(x.float(), dim=-1), k, dim=-1, out=out)


def per_replay_us(graph, replays: int = 200) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays * 1000


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_softmax_topk: needs a CUDA GPU", file=sys.stderr)
        return 2
    from draftscope_tracer.device.softmax_topk import two_stage

    out = {"device": torch.cuda.get_device_name(), "k": K, "cases": []}
    print(f"| vocabulary | rows | softmax then topk µs | two stages µs | ratio |  ({out['device']}, top-{K})")
    print("|---|---|---|---|---|")
    for V in VOCABS:
        for n in ROWS:
            logits = torch.randn(n, V, device="cuda", dtype=torch.float32) * 4
            rows = torch.arange(n, device="cuda")
            probs = torch.zeros(n, K, device="cuda")
            ids = torch.zeros(n, K, dtype=torch.int64, device="cuda")

            def gathered():
                return logits.index_select(0, rows.clamp(0, n - 1))

            graphs = {"old": capture(lambda: _old(gathered(), K, (probs, ids))),
                      "new": capture(lambda: two_stage(gathered(), K, (probs, ids)))}
            times = {name: [] for name in graphs}
            for _ in range(5):
                for name, graph in graphs.items():
                    for _ in range(20):
                        graph.replay()
                    times[name].append(per_replay_us(graph))
            old, new = statistics.median(times["old"]), statistics.median(times["new"])
            out["cases"].append({"vocab": V, "rows": n, "old_us": round(old, 1), "new_us": round(new, 1)})
            print(f"| {V:,} | {n} | {old:.1f} | {new:.1f} | {new / old:.2f} |", flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_softmax_topk.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
