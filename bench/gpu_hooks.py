"""The hooks' summary path on a GPU: host time per sampled verify step, and the same records as on a CPU.

Runs what the tracer's forward hooks run per sampled scheduler iteration (``summaries.Summaries.launch``
for the verify step's aux hidden states with the target logits, the draft extend's fc output, the seed
and two step draft logits) on CUDA tensors at Kimi-K2.5 widths, with 1 request in 16 sampled:

1. Records: the recorder-side results (``merged_stats``, ``topk_list``) of every launch, pickled as the
   relay pickles it for the recorder process, equal those of the CPU path (``host_reduce.host_rows``)
   on the same rows copied to the host (1e-4).
2. Host time: wall-clock microseconds the hook thread spends issuing the launches of one iteration
   (median of 200 iterations, GPU idle-synchronised between them so that queueing is not counted).

    python bench/gpu_hooks.py        # JSON also to $OUT/gpu_hooks.json if OUT is set
"""

from __future__ import annotations

import json
import os
import pickle
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracer.health import Health  # noqa: E402  (the tracer package, by path: only torch is installed)
from tracer.records import topk_list  # noqa: E402
from tracer.stats import merged_stats  # noqa: E402
from tracer.summaries import Summaries  # noqa: E402

H, K, V, V_DRAFT, N = 7168, 3, 163_840, 32_000, 4


def close(a, b) -> bool:
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-4 * max(1.0, abs(a), abs(b))
    return a == b


def records(pending, groups, chunks) -> list:
    """What the recorder makes of one launch (after crossing the pipe): statistics per (row group, chunk
    selection), then top-k."""
    s = pickle.loads(pickle.dumps(pending)).result()
    out = [merged_stats(s, g, c) for g in groups for c in chunks]
    return out + [topk_list(r.topk) for r in s.rows if r.topk is not None]


def main() -> None:
    torch.manual_seed(0)
    dev = torch.device("cuda")
    gpu, cpu = Summaries(Health(), topk=8), Summaries(Health(), topk=8)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for batch in (8, 64):
        sampled = list(range(0, batch, 16))  # 1 request in 16
        nodes = [i * N + p for i in sampled for p in range(N)]
        aux = torch.randn(batch * N, K * H, device=dev, dtype=torch.bfloat16)
        logits = torch.randn(batch * N, V, device=dev) * 4
        fc_out = torch.randn(len(nodes), H, device=dev, dtype=torch.bfloat16)
        draft_logits = torch.randn(batch, V_DRAFT, device=dev) * 4

        per_request = [range(j * N, (j + 1) * N) for j in range(len(sampled))]
        # (launch, row groups, chunk selections) as the hooks issue them and the recorder reads them
        launches = [
            (lambda S, t: S.launch(t[0], nodes, chunk_width=H, logits=t[1]), per_request, [[0], [1], [2], None]),
            (lambda S, t: S.launch(t[2], range(len(nodes))), per_request, [None]),
            (lambda S, t: S.launch(t[3], sampled, logits=t[3]), [[j] for j in range(len(sampled))], [None]),
            (lambda S, t: S.launch(t[3], sampled, logits=t[3], stats=False), [], []),
            (lambda S, t: S.launch(t[3], sampled, logits=t[3], stats=False), [], []),
        ]
        on_gpu = (aux, logits, fc_out, draft_logits)
        on_cpu = tuple(t.cpu() for t in on_gpu)

        def iteration(summ, tensors):
            return [launch(summ, tensors) for launch, _, _ in launches]

        # 1. the same records as the CPU path
        for g, c, (_, groups, chunks) in zip(iteration(gpu, on_gpu), iteration(cpu, on_cpu), launches):
            if not close(records(g, groups, chunks), records(c, groups, chunks)):
                raise SystemExit(f"batch {batch}: GPU records differ from the CPU path's")
        # 2. host time of one iteration's launches
        times = []
        for _ in range(220):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            pending = iteration(gpu, on_gpu)
            times.append(time.perf_counter() - t0)
            for p in pending:
                p.result()
        us = 1e6 * statistics.median(times[20:])
        results[f"batch {batch}"] = {"sampled rows": len(nodes), "host us per iteration (5 launches)": round(us, 1)}
        print(f"batch {batch}: records equal the CPU path's; host time {us:.1f} us per sampled iteration "
              f"(5 launches)", flush=True)
    print("ALL CHECKS PASSED")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_hooks.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
