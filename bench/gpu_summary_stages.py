"""Where the summary kernel's time goes at each shape (issue 33 item 1): every program's stages, timed inside it.

``bench/gpu_summarize.py`` times whole launches: 13-15 µs at 4 rows where the memory floor is under 1 µs, and
ablations could not split that further. Here the kernel's profile switch (``triton_tuning["stamps"]``: the
``STAMPS`` variant of ``summary_triton._summary_kernel``) has each program write the SM's cycle counter after
each of its stages and the device's nanosecond timer at its start and end. Per case (Kimi-K2.5 widths as in
``gpu_summarize.py``: batch 1, 8 and 64 x 4 draft tokens, every row and 1 request in 16), over ``--launches``
eager launches, each alone on an idle GPU (inputs in L2 after the first, as the repeated launches there):

- **span**: the first program's start to the last program's end (the timer), and when the programs start
  (median and last, after the first: how long the launch takes to fill the GPU);
- **per stage**, median and 90th percentile over programs and launches (cycles at the SM's clock, given in µs
  at the clock the run measured: cycles over timer nanoseconds, summed over programs): a logits chunk's read
  with its softmax partials, its groups' ranking, its columns' ranking; a hidden slice's read; the ticket (the
  atomic that tells the row's last program); the merge (that last program only); and when the row's merge ends
  after the launch's first start (the timer): the launch's critical path;
- the launch without stamps and with them, GPU µs queued as ``gpu_summarize.py``'s eager column, so the
  stamps' own cost shows.

    python bench/gpu_summary_stages.py [--launches 50]    # JSON to $OUT/gpu_summary_stages.json if OUT is set
    python bench/gpu_summary_stages.py --tuning "" --tuning block=2048,warps=1    # each case under each tuning

``--tuning`` (repeatable) runs every case under a kernel tuning: ``block`` (the logits chunk of one program) and
the keys of ``triton_tuning`` (``warps``, ``group``, ``hidden_slice``), comma-separated; ``""`` is the
default. Each case's summary is first checked against float64 statistics and ``torch.topk``.

Needs a CUDA GPU, torch, Triton and the tracer importable as ``draftscope_tracer``, as ``gpu_summarize.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CASES = ((1, None), (8, None), (64, None), (1, 16), (8, 16), (64, 16))
# a program's slots (summary_triton._summary_kernel): timer at start, cycles at start, after the part's three stages
# (a hidden slice writes the same cycle count three times), after the ticket, after the merge (the row's merger
# only; 0 elsewhere), timer at the end, cycles at the end
T0, C0, C_READ, C_GROUPS, C_COLUMNS, C_TICKET, C_MERGE, T1, C1 = range(9)


def percentiles(x: np.ndarray) -> dict:
    return {"p50": float(np.median(x)), "p90": float(np.percentile(x, 90))} if x.size else {"p50": None, "p90": None}


def stages(launches: list, rows: int, hidden_programs: int) -> dict:
    """Stage times (µs) from the stamps of each launch (``[max_rows, programs, 9]`` int64; rows past ``rows`` and
    programs of padding rows hold 0), the first ``hidden_programs`` of each row being hidden slices."""
    s = np.stack([np.asarray(x, dtype=np.int64)[:rows] for x in launches])  # [launch, row, program, slot]
    cycles_per_ns = (s[..., C1] - s[..., C0]).sum() / max(1, (s[..., T1] - s[..., T0]).sum())
    us = lambda c: c / cycles_per_ns / 1000  # noqa: E731
    first = s[..., T0].reshape(len(s), -1).min(axis=1)[:, None, None]  # each launch's first start
    starts = (s[..., T0] - first) / 1000
    logits, hidden = s[:, :, hidden_programs:], s[:, :, :hidden_programs]
    merger = s[..., C_MERGE] > 0
    merge_ends = (s[..., T1] - first)[merger] / 1000  # the merger's end: the row's summary is written
    return {
        "span_us": percentiles((s[..., T1].reshape(len(s), -1).max(axis=1) - first[:, 0, 0]) / 1000),
        "program_start_us": {"p50": float(np.median(starts)), "last": float(starts.max())},
        "logits_read_us": percentiles(us(logits[..., C_READ] - logits[..., C0]).ravel()),
        "logits_groups_ranked_us": percentiles(us(logits[..., C_GROUPS] - logits[..., C_READ]).ravel()),
        "logits_columns_ranked_us": percentiles(us(logits[..., C_COLUMNS] - logits[..., C_GROUPS]).ravel()),
        "hidden_slice_us": percentiles(us(hidden[..., C_READ] - hidden[..., C0]).ravel()),
        "ticket_us": percentiles(us(s[..., C_TICKET] - s[..., C_COLUMNS]).ravel()),
        "merge_us": percentiles(us(s[..., C_MERGE] - s[..., C_TICKET])[merger]),
        "merge_ends_us": percentiles(merge_ends),
        "cycles_per_ns": float(cycles_per_ns),
    }


def parse_tuning(text: str) -> dict:
    """``"block=2048,warps=1"`` -> ``{"block": 2048, "warps": 1}`` (``""``: the defaults)."""
    out = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in ("block", "warps", "group", "hidden_slice") or not value.isdigit():
            raise SystemExit(f"--tuning {text!r}: {item!r} is not block/warps/group/hidden_slice=<int>")
        out[name] = int(value)
    return out


def run_case(batch: int, every: int | None, launches: int, tuning: dict) -> dict:
    import torch
    import gpu_summarize as gs

    hidden, logits = gs.inputs(batch)
    picked = gs.sampled_rows(batch, every)
    rows = torch.tensor(picked, dtype=torch.int64, device="cuda")
    summ = gs.make(len(picked), "auto", ring_size=17, block=tuning.get("block"))
    summ.triton_tuning.update({k: v for k, v in tuning.items() if k != "block"})
    summ.compute(hidden, rows, logits)  # compiles; the path taken must be Triton's, and right
    assert summ.backend == "triton" and summ.fallbacks == 0, f"Triton path not used: {summ.fallback_error}"
    gs.check_against_reference(summ.publish().result(), hidden, logits, picked)
    plain_us = gs.queued_us(lambda: summ.summarize(hidden, rows, logits))
    stamps = torch.zeros(summ.triton_stamp_shape, dtype=torch.int64, device="cuda")
    summ.triton_tuning["stamps"] = stamps
    want = summ.publish().result().rows
    summ.compute(hidden, rows, logits)
    assert summ.publish().result().rows == want, "the stamped kernel's summary differs"
    stamped_us = gs.queued_us(lambda: summ.summarize(hidden, rows, logits))
    gs.clocks_up()
    taken = []
    for _ in range(launches):
        stamps.zero_()
        summ.compute(hidden, rows, logits)
        taken.append(stamps.cpu().numpy())
    hidden_programs = summ.triton_stamp_shape[1] - -(-logits.shape[1] // summ.triton_block)
    return {"tuning": tuning, "block": summ.triton_block, "batch": batch, "rows": len(picked),
            "sampling": "all rows" if every is None else f"1 in {every}", "launches": launches,
            "programs_per_row": summ.triton_stamp_shape[1], "hidden_programs": hidden_programs,
            "eager_us": plain_us, "eager_stamped_us": stamped_us, **stages(taken, len(picked), hidden_programs)}


def table(cases: list) -> str:
    cell = lambda d: "-" if d["p50"] is None else f"{d['p50']:.2f} / {d['p90']:.2f}"  # noqa: E731
    lines = ["| tuning | batch | rows | sampling | eager µs, plain / stamped | span p50 | "
             "programs start, p50 / last | logits read | groups ranked | columns ranked | hidden slice | ticket | merge | merge ends |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        tuning = ", ".join(f"{k} {v}" for k, v in c["tuning"].items()) or "default"
        lines.append(f"| {tuning} | {c['batch']} | {c['rows']} | {c['sampling']} | {c['eager_us']:.1f} / "
                     f"{c['eager_stamped_us']:.1f} | {c['span_us']['p50']:.2f} | "
                     f"{c['program_start_us']['p50']:.2f} / {c['program_start_us']['last']:.2f} | "
                     f"{cell(c['logits_read_us'])} | {cell(c['logits_groups_ranked_us'])} | "
                     f"{cell(c['logits_columns_ranked_us'])} | {cell(c['hidden_slice_us'])} | {cell(c['ticket_us'])} | "
                     f"{cell(c['merge_us'])} | {cell(c['merge_ends_us'])} |")
    return "\n".join(lines) + "\n(stages: µs, median / 90th percentile over programs and launches)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=50, help="stamped launches per case (default %(default)s)")
    ap.add_argument("--tuning", action="append", default=None, metavar="K=V,...",
                    help="run every case under this kernel tuning (repeatable; \"\" is the default tuning)")
    args = ap.parse_args()
    tunings = [parse_tuning(t) for t in (args.tuning or [""])]
    sys.path.insert(0, str(HERE))
    import torch
    import triton

    cases = []
    for tuning in tunings:
        for batch, every in CASES:
            cases.append(run_case(batch, every, args.launches, tuning))
            print(json.dumps({k: cases[-1][k] for k in ("tuning", "batch", "sampling", "eager_us", "span_us")}),
                  flush=True)
    print(table(cases))
    command = " ".join(["python bench/gpu_summary_stages.py", f"--launches {args.launches}",
                        *(f"--tuning '{t}'" for t in args.tuning or [])])
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "command": command, "cases": cases}
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / "gpu_summary_stages.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
