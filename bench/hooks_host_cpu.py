"""Host time of the tracer hooks' own Python per decode iteration, on a CPU (no GPU needed).

1. SGLang: ``testbed.gpu.hooks_path.HooksPath`` (one decode iteration through the plugin's own hooks with the real
   ``Tracer``) on CPU tensors of small widths, with the device layer stood in for by stubs (each summary launch, the
   step tap's writes, the verify's id copy return at once, as a launch returns to the host on a GPU) and the draft
   extend's logits handed back as its CUDA graph does: what is left is the hooks' Python (the plugin, the probes, the
   sampled rows' bookkeeping, the records queued), the part that does not depend on the device. Batch 8 and 64, with
   1 request in 16 sampled, every request, and none; each iteration followed by the same one without the tracer.
2. vLLM: ``testbed.gpu.vllm_hooks_path.VllmStepPath`` (one engine step through the plugin's hooks, the CUDA branch
   ``cuda_step.CudaStep``) on CPU tensors, its device layer stubbed as SGLang's (each summary launch returns at once,
   index lists are kept as on a GPU, the step's id copy is read on the host as a GPU's is): the whole step with the
   tracer and without it, and in it the time of reading earlier steps' ids into the tracer's totals and verify
   records (``step_ids.Ledger.drain``). Batch 8 and 64, 1 request in 16 sampled and every request.

Microseconds of the thread's CPU time (``time.thread_time_ns``: another process on the host does not count),
median and 90th percentile. A CPU's figure is the Python's share only: on a GPU each launch, copy and event adds its
own host time (``bench/gpu_hooks.py`` measures the whole path there). So the bench also counts, per iteration, the
CUDA calls the hooks would issue on a GPU: each stub counts the kernels and copies it stands for, a summary launch's
ring slot is taken and issued by the real ``summary_ring`` code (its events counted by stand-ins), and the aten ops
the hooks run on the CPU tensors are counted by a ``TorchDispatchMode``.

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
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftscope_tracer.device import devicecopy  # noqa: E402
from draftscope_tracer.device.summary_ring import Layout, Ring  # noqa: E402
from draftscope_tracer.engine.sglang import probes  # noqa: E402
from draftscope_tracer.engine.vllm import cuda_summaries as vllm_summaries  # noqa: E402
from draftscope_tracer.engine.vllm import plugin as vllm_plugin  # noqa: E402
from draftscope_tracer.engine.vllm import step_ids  # noqa: E402
from draftscope_tracer.stats import indexed_ints  # noqa: E402
from testbed.gpu import hooks_path  # noqa: E402  (the checkout, by path)
from testbed.gpu.vllm_hooks_path import VllmStepPath  # noqa: E402

hooks_path.H, hooks_path.K, hooks_path.V, hooks_path.V_DRAFT = 64, 3, 512, 256  # small: the tensors cost little
CLOCK = time.thread_time_ns
CALLS = {"kernels": 0, "copies": 0, "events": 0}  # CUDA calls the stubs stand for (see ``Launched``, ``Event``)


class Event:
    """A CUDA event's stand-in: counts its recordings."""

    def record(self, stream=None) -> None:
        CALLS["events"] += 1


class Launched:
    """The device layer's stubs: a summary launch (``launch``: one kernel, then its ring slot taken and issued by
    the real ``Pending``), a graphed recompute (``graph_launch``: its input gathered, the graph replayed, its summary
    copied out: three kernels), the step tap's read (``read``: one copy), the verify's ids (``HostInts``: a GPU
    gathers them in the verify's summary, no call). Each returns at once, as a launch returns to the host on a GPU."""

    def __init__(self):
        self.ring = Ring(Layout(8, 1, None, 1), 256, torch.device("cpu"), 1)
        self.ring.cuda = True  # its launches marked for their reader, as on a GPU
        self.ring.events = [Event() for _ in range(256)]  # a tracer up to c24db47 recorded one per launch

    def takes(self, *args) -> bool:
        return True

    def launch(self, *args, kernels: int = 1, **kwargs):
        CALLS["kernels"] += kernels
        pending = self.ring.take(kwargs.get("tag"))
        return None if pending is None else pending.issue()

    def graph_launch(self, h, index, tag=None):
        return self.launch(kernels=3, tag=tag)

    def read(self, n: int) -> "Read":
        CALLS["copies"] += 1
        return Read()


class Read:
    """The handle of a stub read (the step tap's, the verify's ids): ready at once."""

    ok = True

    def __init__(self, *args):
        pass

    def release(self, *args) -> None:
        pass


class AtenOps(TorchDispatchMode):
    """Counts the aten ops run under it."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


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
    t.capture.summaries.launch = launched.launch
    t.capture.step_tap._write = lambda *args: None
    t.capture.step_tap.read = launched.read
    t.capture.fc = SimpleNamespace(takes=launched.takes, launch=launched.graph_launch, out_dtype=torch.float32)
    probes.HostInts = Read  # the verify's id copy (on a GPU the summary gathers them)
    devicecopy.current_stream = lambda: None  # the stream launches are marked on (no CUDA here)
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


def cuda_calls(batch: int, every: int, iterations: int = 64) -> dict:
    """CUDA calls a GPU would issue for the tracer per decode iteration: kernels, copies and events the stubs count,
    and the aten ops the hooks run on the CPU tensors (with the tracer minus without it). Each at the median
    iteration (a step that records no periodic point: 7 in 8), and their sum's mean over ``iterations``."""
    path = sglang_path(batch, every)
    calls = path.tracer.transport.writer
    for _ in range(8):
        path.iteration()
        calls.flush()
    per = []
    for _ in range(iterations):
        CALLS.update(dict.fromkeys(CALLS, 0))
        aten = []
        for traced in (True, False):
            with AtenOps() as ops:
                path.iteration(traced=traced)
            aten.append(ops.n)
        calls.flush()
        per.append({**CALLS, "aten": aten[0] - aten[1]})
    out = {k: sorted(p[k] for p in per)[iterations // 2] for k in per[0]}
    out["mean"] = sum(sum(p.values()) for p in per) / iterations
    return out


class Ints:
    """The step's id copy (``devicecopy.HostInts``) as on a GPU: each part copied whole into a host slot of a ring
    (the copies aten ops, counted as such), the slot's event recorded (counted); read as the GPU's is, on the host
    (``stats.indexed_ints``)."""

    ok = True
    slots = [torch.zeros(4096, dtype=torch.int64) for _ in range(64)]  # read a step later, at most
    next_slot = 0

    def __init__(self, parts):
        self._host = Ints.slots[Ints.next_slot]
        Ints.next_slot = (Ints.next_slot + 1) % len(Ints.slots)
        self._parts, at = [], 0
        for t, index in parts:
            self._parts.append((at, index))
            at += t.numel()
        for (t, _), (offset, _) in zip(parts, self._parts):
            self._host[offset:offset + t.numel()].copy_(t.reshape(-1))
        self._host = self._host[:at]
        CALLS["events"] += 1

    def ready(self) -> bool:
        return True

    def result(self) -> list:
        return indexed_ints([self._host.numpy()], self._parts)

    def release(self, *args) -> None:
        pass


class Indices:
    """``devicecopy.device_index`` as on a GPU: a list seen before is kept on the device (a dict look-up), a new
    one copied there (counted)."""

    def __init__(self):
        self.cache: dict = {}

    def __call__(self, values, device, pad: int = 0) -> torch.Tensor:
        key = (tuple(values), pad)
        out = self.cache.get(key)
        if out is None:
            CALLS["copies"] += 1
            out = self.cache[key] = torch.tensor([*values, *[-1] * (pad - len(values))], dtype=torch.int64)
        return out


def vllm_path(batch: int, every: int) -> VllmStepPath:
    """``VllmStepPath`` on CPU tensors, its CUDA branch's device layer stubbed: each summary launch returns at once
    (its ring slot taken and issued by the real ``Pending``), the index lists are kept as on a GPU
    (:class:`Indices`), the step's id copy is :class:`Ints`."""
    path = VllmStepPath(batch, sample_every=every, device="cpu")
    path.relay.drain()
    path.tracer.core.transport.writer = Calls()
    summaries = path.tracer.steps.cuda.summaries.summaries
    summaries.launch = Launched().launch
    vllm_summaries.device_index = step_ids.device_index = Indices()
    step_ids.HostInts = Ints
    devicecopy.current_stream = lambda: None  # the stream launches are marked on (no CUDA here)
    return path


def vllm_step(path: VllmStepPath, traced: bool) -> None:
    """One engine step; the plugin sees ``path``'s tracer, or none (vLLM's methods only)."""
    vllm_plugin.PLUGIN.tracer = path.tracer if traced else None
    path.step()


def warmed_vllm_path(batch: int, every: int) -> tuple:
    """(:func:`vllm_path` after 8 traced steps, its writer of queued calls)."""
    path = vllm_path(batch, every)
    calls = path.tracer.core.transport.writer
    for _ in range(8):
        vllm_step(path, True)
        calls.flush()
    return path, calls


def vllm(batch: int, every: int, iterations: int) -> dict:
    """The whole engine step with the tracer and without it (in turns), and its ``Ledger.drain``."""
    path, own, bare, drains = vllm_path(batch, every), [], [], []
    calls = path.tracer.core.transport.writer
    ledger, spent = path.tracer.steps.cuda.verify_steps.ledger, [0]
    drain = ledger.drain

    def timed(*args, **kwargs):
        t0 = CLOCK()
        try:
            return drain(*args, **kwargs)
        finally:
            spent[0] += CLOCK() - t0

    ledger.drain = timed
    for i in range(iterations + 50):
        spent[0] = 0
        for traced, into in ((True, own), (False, bare)):
            t0 = CLOCK()
            vllm_step(path, traced)
            if i >= 50:
                into.append(CLOCK() - t0)
        calls.flush()
        if i >= 50:
            drains.append(spent[0])
    h = path.tracer.health
    if h.errors or h.drops:
        raise SystemExit(f"vLLM batch {batch}: {dict(h.errors)} {dict(h.last_error)} {dict(h.drops)}")
    (m, p90), (b, _), (d, _) = stats(own), stats(bare), stats(drains)
    return {"median": m, "p90": p90, "without": b, "drain": d}


def python_calls(step, flush, iterations: int = 64) -> float:
    """Python function calls the tracer makes per ``step(traced)`` (``sys.setprofile``'s ``call`` events with it
    minus without it, the mean over ``iterations``; ``flush`` after each pair): a count that does not depend on the
    host's noise."""
    n = [0, 0]

    def count(frame, event, arg):
        if event == "call":
            n[0] += 1

    for _ in range(iterations):
        for traced, sign in ((True, 1), (False, -1)):
            n[0] = 0
            sys.setprofile(count)
            step(traced)
            sys.setprofile(None)
            n[1] += sign * n[0]
        flush()
    return n[1] / iterations


def sglang_python_calls(batch: int, every: int) -> float:
    """:func:`python_calls` per decode iteration, after 8 traced ones."""
    path = sglang_path(batch, every)
    calls = path.tracer.transport.writer
    for _ in range(8):
        path.iteration()
        calls.flush()
    return python_calls(lambda traced: path.iteration(traced=traced), calls.flush)


def vllm_python_calls(batch: int, every: int) -> float:
    """:func:`python_calls` per engine step."""
    path, calls = warmed_vllm_path(batch, every)
    return python_calls(lambda traced: vllm_step(path, traced), calls.flush)


def vllm_calls(batch: int, every: int, iterations: int = 64) -> dict:
    """Per engine step (the mean over ``iterations``): the summary launches' kernels, the index copies and events
    the stubs count, and the aten ops the tracer runs on the CPU tensors (with it minus without it)."""
    path, calls = warmed_vllm_path(batch, every)
    CALLS.update(dict.fromkeys(CALLS, 0))
    aten = [0, 0]
    for _ in range(iterations):
        for traced in (True, False):
            with AtenOps() as ops:
                vllm_step(path, traced)
            aten[not traced] += ops.n
        calls.flush()
    out = {k: v / iterations for k, v in CALLS.items()}
    out["aten"] = (aten[0] - aten[1]) / iterations
    return out


SAMPLED = ((16, "1 in 16"), (1, "every request"))  # sample every n-th request, its name in the tables


def heading(title: str, *columns: str) -> None:
    """A table's title, then its header (batch and sampling first)."""
    print(f"\n{title}")
    print("| batch | sampled | " + " | ".join(columns) + " |")
    print("|" + "---|" * (len(columns) + 2))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--batches", default="8,64")
    a = ap.parse_args()
    torch.set_num_threads(1)
    gc.disable()  # a collection lands in whichever iteration it likes
    batches = [int(b) for b in a.batches.split(",")]
    heading("SGLang hooks, µs of Python per decode iteration (the tracer's own: with it minus without it), and the "
            "Python calls the tracer makes per iteration (the mean of 64; with it minus without it)",
            "with the tracer, median", "p90", "without", "the tracer's own", "Python calls")
    for batch in batches:
        for every, name in (*SAMPLED, (0, "none")):
            r = sglang(batch, every, a.iterations)
            print(f"| {batch} | {name} | {r['median']:.1f} | {r['p90']:.1f} | {r['without']:.1f} | "
                  f"{r['median'] - r['without']:.1f} | {sglang_python_calls(batch, every):.1f} |", flush=True)
    heading("SGLang hooks, CUDA calls per decode iteration on a GPU, the tracer's: kernels, copies and events of the "
            "device layer, and the aten ops the hooks run on the CPU tensors, at the median iteration; then the mean "
            "of 64 iterations (periodic steps among them) in all",
            "kernels", "copies", "events", "aten ops", "in all", "in all, mean")
    for batch in batches:
        for every, name in SAMPLED:
            c = cuda_calls(batch, every)
            print(f"| {batch} | {name} | {c['kernels']} | {c['copies']} | {c['events']} | {c['aten']} | "
                  f"{c['kernels'] + c['copies'] + c['events'] + c['aten']} | {c['mean']:.2f} |", flush=True)
    heading("vLLM, µs of Python per engine step (the CUDA branch on CPU tensors, its device layer stubbed; the "
            "tracer's own: with it minus without it), of it reading the ids of earlier steps (Ledger.drain), and the "
            "Python calls the tracer makes per step (the mean of 64; with it minus without it)",
            "with the tracer, median", "p90", "without", "the tracer's own", "Ledger.drain", "Python calls")
    for batch in batches:
        for every, name in SAMPLED:
            r = vllm(batch, every, a.iterations // 2)
            print(f"| {batch} | {name} | {r['median']:.1f} | {r['p90']:.1f} | {r['without']:.1f} | "
                  f"{r['median'] - r['without']:.1f} | {r['drain']:.1f} | {vllm_python_calls(batch, every):.1f} |",
                  flush=True)
    heading("vLLM, CUDA calls per engine step on a GPU (the mean of 64): summary kernels, index copies and events of "
            "the device layer, then the aten ops the tracer runs on the CPU tensors (the id copies among them)",
            "kernels", "copies", "events", "aten ops", "in all")
    for batch in batches:
        for every, name in SAMPLED:
            c = vllm_calls(batch, every)
            print(f"| {batch} | {name} | {c['kernels']:.2f} | {c['copies']:.2f} | {c['events']:.2f} | {c['aten']:.2f} | "
                  f"{sum(c.values()):.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
