"""Host time of the tracer hooks' own Python per decode iteration, on a CPU (no GPU needed).

1. SGLang: ``testbed.gpu.hooks_path.HooksPath`` (one decode iteration through the plugin's own hooks with the real
   ``Tracer``) on CPU tensors of small widths, with the device layer stood in for by stubs (each summary launch, the
   step tap's writes, the verify's id copy return at once, as a launch returns to the host on a GPU) and the draft
   extend's logits handed back as its CUDA graph does: what is left is the hooks' Python (the plugin, the probes, the
   sampled rows' bookkeeping, the records queued), the part that does not depend on the device. Batch 8 and 64, with
   1 request in 16 sampled, every request, and none; each iteration followed by the same one without the tracer.
2. vLLM: ``testbed.gpu.vllm_hooks_path.VllmStepPath`` on CPU tensors; the time of reading each step's ids into the
   tracer's totals and verify records (``step_ids.Ledger.drain``: ``resolve`` and ``VerifySteps._resolved``).

Microseconds of the thread's CPU time (``time.thread_time_ns``: another process on the host does not count),
median and 90th percentile. A CPU's figure is the Python's share only: on a GPU each launch, copy and event adds its
own host time (``bench/gpu_hooks.py`` measures the whole path there).

    PYTHONPATH=. python bench/hooks_host_cpu.py                 # the tracer as draftscope_tracer
    PYTHONPATH=. python bench/hooks_host_cpu.py --iterations 500 --batches 64
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftscope_tracer.engine.sglang import probes  # noqa: E402
from draftscope_tracer.engine.vllm import plugin as vllm_plugin  # noqa: E402
from testbed.gpu import hooks_path  # noqa: E402  (the checkout, by path)
from testbed.gpu.vllm_hooks_path import VllmStepPath  # noqa: E402

hooks_path.H, hooks_path.K, hooks_path.V, hooks_path.V_DRAFT = 64, 3, 512, 256  # small: the tensors cost little
CLOCK = time.thread_time_ns


class Launched:
    """A stub launch's handle (a summary, the step tap's read, the verify's ids): returned at once, released when its
    call is dropped."""

    ok = True
    out_dtype = torch.float32

    def __init__(self, *args, **kwargs):
        pass

    def release(self, *args) -> None:
        pass

    def takes(self, *args) -> bool:
        return True

    def launch(self, *args, **kwargs) -> "Launched":
        return self


class Calls:
    """The relay's place: keeps the queued calls until :meth:`flush` releases them (between iterations)."""

    def __init__(self):
        self.calls: list = []

    def submit(self, call) -> bool:
        self.calls.append(call)
        return True

    def flush(self) -> None:
        for call in self.calls:
            call.release()
        self.calls.clear()


def stats(ns: list) -> tuple:
    ns = sorted(ns)
    return ns[len(ns) // 2] / 1e3, ns[int(0.9 * len(ns))] / 1e3


def sglang_path(batch: int, every: int) -> hooks_path.HooksPath:
    """``HooksPath`` on CPU tensors with the device layer stubbed (see the module's docstring); ``every`` 0: no
    request sampled."""
    path = hooks_path.HooksPath(batch, sample_every=every or 1, device="cpu", graphs=False)
    path.relay.drain()
    t = path.tracer
    t.transport.writer = Calls()
    if not every:
        t.sampled.live.clear()
    launched = Launched()
    t.capture.summaries.launch = lambda *args, **kwargs: launched
    t.capture.step_tap._write = lambda *args: None
    t.capture.step_tap.read = lambda n: launched
    t.capture.fc = launched
    probes.HostInts = Launched  # the verify's id copy (on a GPU the summary gathers them)
    path.worker.cuda_graph_runner_for_draft_extend = hooks_path._ExtendGraph(torch.zeros(batch, hooks_path.V_DRAFT))
    t.capture.watch_draft_extend(path.worker)  # its logits handed back, as the graph's are
    return path


def sglang(batch: int, every: int, iterations: int) -> dict:
    path, own, bare = sglang_path(batch, every), [], []
    calls = path.tracer.transport.writer
    for i in range(iterations + 50):
        for traced, into in ((True, own), (False, bare)):
            t0 = CLOCK()
            path.iteration(traced=traced)
            if i >= 50:
                into.append(CLOCK() - t0)
        calls.flush()
    h = path.tracer.health
    if h.errors or h.drops:
        raise SystemExit(f"batch {batch}: the hooks failed: {dict(h.errors)} {dict(h.last_error)} {dict(h.drops)}")
    (m, p90), (b, _) = stats(own), stats(bare)
    return {"median": m, "p90": p90, "without": b}


def vllm(batch: int, every: int, iterations: int) -> dict:
    path = VllmStepPath(batch, sample_every=every, device="cpu")
    path.relay.drain()
    calls = path.tracer.core.transport.writer = Calls()
    ledger, spent, times = path.tracer.steps.cuda.verify_steps.ledger, [0], []
    drain = ledger.drain

    def timed(*args, **kwargs):
        t0 = CLOCK()
        try:
            return drain(*args, **kwargs)
        finally:
            spent[0] += CLOCK() - t0

    ledger.drain = timed
    for i in range(iterations + 20):
        spent[0] = 0
        vllm_plugin.PLUGIN.tracer = path.tracer
        path.step()
        calls.flush()
        if i >= 20:
            times.append(spent[0])
    h = path.tracer.health
    if h.errors or h.drops:
        raise SystemExit(f"vLLM batch {batch}: {dict(h.errors)} {dict(h.last_error)} {dict(h.drops)}")
    m, p90 = stats(times)
    return {"median": m, "p90": p90}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--batches", default="8,64")
    a = ap.parse_args()
    torch.set_num_threads(1)
    gc.disable()  # a collection lands in whichever iteration it likes
    batches = [int(b) for b in a.batches.split(",")]
    print("SGLang hooks, µs of Python per decode iteration (the tracer's own: with it minus without it)")
    print("| batch | sampled | with the tracer, median | p90 | without | the tracer's own |")
    print("|---|---|---|---|---|---|")
    for batch in batches:
        for every, name in ((16, "1 in 16"), (1, "every request"), (0, "none")):
            r = sglang(batch, every, a.iterations)
            print(f"| {batch} | {name} | {r['median']:.1f} | {r['p90']:.1f} | {r['without']:.1f} | "
                  f"{r['median'] - r['without']:.1f} |", flush=True)
    print("\nvLLM, µs per engine step reading its ids into the totals and verify records (Ledger.drain)")
    print("| batch | sampled | median | p90 |")
    print("|---|---|---|---|")
    for batch in batches:
        for every, name in ((16, "1 in 16"), (1, "every request")):
            r = vllm(batch, every, a.iterations // 2)
            print(f"| {batch} | {name} | {r['median']:.1f} | {r['p90']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
