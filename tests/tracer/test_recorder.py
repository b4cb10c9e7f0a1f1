"""The recorder process and the relay that feeds it, without a server: records built from summaries
crossing the pipe, a killed recorder replaced, a scheduler that vanishes, a frame that does not load."""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import psutil
import torch

from draftscope_tracer.transport import records
from draftscope_tracer.transport import relay as relay_mod
from draftscope_tracer.config import TracerConfig
from draftscope_tracer.device.devicecopy import HostInts
from draftscope_tracer.health import Health
from draftscope_tracer.device.host_reduce import host_rows
from draftscope_tracer.transport.recorder import frame, read_frame
from draftscope_tracer.shared import Shared
from draftscope_tracer.transport.relay import Relay
from tests.fixtures.wait import until

RUN = {"engine": "sglang", "engine_version": "0.5.23", "source": "tracer", "status": "running", "started_at": 1.0}
N = 4  # draft tokens per verify step


def _batches(path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _verify_call(step: int, hot: Shared) -> records.Call:
    """One sampled request's verify step: drafts 10, 11, 12 after token 9; the target accepts two."""
    hidden = torch.arange(N * 12, dtype=torch.float32).reshape(N, 12)
    logits = torch.zeros(N, 50)
    logits[torch.arange(N), torch.tensor([10, 11, 30, 31])] = 5.0
    target = host_rows(hidden, range(N), chunk_width=4, logits=logits, topk=2)
    draft_logits = torch.zeros(1, 40)
    draft_logits[0, 0] = 5.0  # draft id 0 -> target id 10, the draft's first token
    draft = host_rows(draft_logits, [0], chunk_width=40, logits=draft_logits, topk=2, stats=False)
    ints = HostInts([(torch.tensor([9, 10, 11, 12]), list(range(N))), (torch.tensor([10, 11, 30, 31]), list(range(N))),
                     (torch.tensor([7]), [0]), (torch.tensor([3]), [0])])
    drafts = {"a": ((draft, 0, True), None)}
    return records.Call("verify", records.verify,
                        (ints, target, [(0, "a", step)], records.VerifyShape(N, 3, 4, "float32"), time.time(), drafts,
                         hot), (target,))


def _relay(tmp_path, **config) -> tuple:
    path = tmp_path / "trace.jsonl"
    cfg = TracerConfig(file=str(path), flush_interval_s=0.05, **config)
    health = Health(cfg.probe_failure_limit)
    return Relay(cfg, health, dict(RUN), "r1"), health, path


def _kinds(data: bytes) -> list:
    """What each frame of one write to the recorder carries: "jobs", or the tuple's tag."""
    stream, kinds = io.BytesIO(data), []
    while stream.tell() < len(data):
        message = read_frame(stream)
        kinds.append(message[0] if isinstance(message, tuple) else "jobs")
    return kinds


def test_records_are_built_in_the_recorder_from_what_crossed_the_pipe(tmp_path):
    relay, health, path = _relay(tmp_path)
    hot = Shared("hot_token_id", lambda: list(range(10, 50)))
    health.beat("verify")
    for step in range(3):
        assert relay.submit(_verify_call(step, hot))
    relay.submit(records.Call("finish", records.finished, ([{"rid": "a", "sampled": True}],)))
    relay.close(10)
    batches = _batches(path)
    steps = [s for b in batches for s in b["steps"]]
    assert [s["step_index"] for s in steps] == [0, 1, 2]
    assert steps[0]["drafted_tokens"] == [10, 11, 12] and steps[0]["accept_len"] == 3
    assert steps[0]["accept_flags"] == [True, True, False] and steps[0]["bonus_token"] == 30
    assert [pos[0][0] for pos in steps[0]["draft_topk"]] == [10]  # position 1, mapped through hot_token_id
    assert [pos[0][0] for pos in steps[0]["target_topk"]] == [10, 11, 30]
    aux = [s for b in batches for s in b["samples"] if s["step_index"] == 0]
    assert [s["point"] for s in aux] == ["target.aux[0]", "target.aux[1]", "target.aux[2]"]
    assert aux[0]["mean"] == torch.tensor([[12 * r + c for c in range(4)] for r in range(N)]).float().mean().item()
    assert [r["rid"] for b in batches for r in b["requests"]] == ["a"]
    assert batches[-1]["run"]["status"] == "ended"
    final = batches[-1]["health"][-1]
    assert final["heartbeats"] == {"verify": 1} and final["drops"] == {} and final["errors"] == {}


def test_the_counters_cross_ahead_of_the_jobs_they_count(tmp_path, monkeypatch):
    """The recorder's writer may take a health record while it builds a frame's steps: the scheduler's
    counters must already include the hook calls that made them, so the relay sends them first (sent
    after, a loaded machine stored steps beside a record of attach-time counters: ``hooks-starved`` on a
    healthy run)."""
    relay, health, path = _relay(tmp_path)
    sent, write = [], relay._write
    monkeypatch.setattr(relay, "_write", lambda data, jobs: (sent.append(data), write(data, jobs))[1])
    hot = Shared("hot_token_id", lambda: list(range(10, 50)))
    health.beat("verify")
    assert relay.submit(_verify_call(0, hot))
    relay.close(10)
    kinds = [kind for data in sent for kind in _kinds(data)]
    assert "jobs" in kinds, kinds
    first = kinds.index("jobs")
    assert first > 0 and kinds[first - 1] == "health", kinds
    assert _batches(path)[-1]["health"][-1]["heartbeats"] == {"verify": 1}


def test_an_idle_relay_sleeps_until_the_counters_are_due(tmp_path, monkeypatch):
    """Idle, the relay thread wakes once per health frame (the scheduler's counters, every
    ``health_interval_s``) and for nothing else: a thread that polled would pass several times between
    two of them."""
    relay, _, path = _relay(tmp_path, health_interval_s=0.25)
    writes, write = [], relay._write
    monkeypatch.setattr(relay, "_write", lambda data, jobs: (writes.append((relay.wakeups, _kinds(data))),
                                                             write(data, jobs))[1])
    relay.submit(records.Call("finish", records.finished, ([{"rid": "a", "sampled": True}],)))

    def after_the_job() -> list:
        first = next((i for i, (_, kinds) in enumerate(writes) if "jobs" in kinds), None)
        return [] if first is None else writes[first + 1:]

    after = until(lambda: len(after_the_job()) >= 4 and after_the_job(), "four writes after the job's")
    assert all(kinds == ["health"] for _, kinds in after), after
    counts = [n for n, _ in after]
    assert [b - a for a, b in zip(counts, counts[1:])] == [1] * (len(counts) - 1), counts
    relay.close(10)
    assert [r["rid"] for b in _batches(path) for r in b["requests"]] == ["a"]


def test_a_job_wakes_the_sleeping_relay_and_recorder(tmp_path):
    """No health record is due for an hour: the job's record reaches the sink because queueing it woke
    the relay thread, and the recorder's writer in turn."""
    relay, _, path = _relay(tmp_path, health_interval_s=3600)
    until(lambda: path.exists() and b'"run":{' in path.read_bytes(), "the recorder sent the run")
    relay.submit(records.Call("finish", records.finished, ([{"rid": "a", "sampled": True}],)))
    until(lambda: b'"rid":"a"' in path.read_bytes(), "the finish record is stored")
    relay.close(10)
    assert [r["rid"] for b in _batches(path) for r in b["requests"]] == ["a"]


def test_close_sends_the_last_round_itself_while_the_relay_thread_is_held(tmp_path, monkeypatch):
    """On SIGTERM to SGLang's process group the scheduler is SIGKILLed within a second, and a loaded
    machine took longer to wake the relay thread: ``close`` relays what is queued and the final status on
    its own thread. Here the relay thread never wakes again, and the run still ends with every step."""
    held = threading.Event()
    monkeypatch.setattr(Relay, "_sleep", lambda self, until: held.wait())  # from its first pass on
    relay, health, path = _relay(tmp_path)
    hot = Shared("hot_token_id", lambda: list(range(10, 50)))
    health.beat("verify")
    for step in range(3):
        assert relay.submit(_verify_call(step, hot))
    relay.close(30)
    assert relay._thread.is_alive()  # still held: none of the above was its doing
    batches = _batches(path)
    assert [s["step_index"] for b in batches for s in b["steps"]] == [0, 1, 2]
    assert batches[-1]["run"]["status"] == "ended"
    held.set()
    relay._thread.join(10)
    assert not relay._thread.is_alive()  # it wakes to the stop and ends, writing nothing more
    assert _batches(path) == batches


def test_a_stalled_recorder_does_not_hold_up_the_final_round(tmp_path):
    """A loaded machine's recorder reads slowly; the scheduler may be killed a moment after its SIGTERM. The
    pipe has room for a request's rounds (``PIPE_BYTES``), so ``close`` writes the last of them and the
    final status without waiting for the recorder, and the recorder, outside the scheduler's tree, reads
    them all once it runs again. With the default 64 KiB pipe this close waits for the recorder."""
    jobs = 600  # ~560 bytes each pickled: ~330 KB, five times the default pipe
    relay, health, path = _relay(tmp_path)
    recorder = relay.pid
    os.kill(recorder, signal.SIGSTOP)
    try:
        hot = Shared("hot_token_id", lambda: list(range(10, 50)))
        for step in range(jobs):
            assert relay.submit(_verify_call(step, hot))
        closing = threading.Thread(target=relay.close, args=(1.0,))
        closing.start()
        closing.join(60)
        assert not closing.is_alive(), "close waited for the stopped recorder to read"
    finally:
        os.kill(recorder, signal.SIGCONT)
    until(lambda: _dead(recorder), "the recorder read everything and exited", 120)
    batches = _batches(path)
    assert [s["step_index"] for b in batches for s in b["steps"]] == list(range(jobs))
    assert batches[-1]["run"]["status"] == "ended"


def test_a_final_round_on_a_thread_inside_the_counters_lock_does_not_wait_on_itself(tmp_path):
    """The SIGTERM handler runs the final round on the thread the signal interrupted, which may be inside
    ``Health.drop`` (a drop counted, the counters' lock held): the round re-enters that lock."""
    relay, health, path = _relay(tmp_path)
    assert relay.submit(_verify_call(0, Shared("hot_token_id", lambda: list(range(10, 50)))))

    def interrupted() -> None:
        with health._lock:  # where the signal came
            relay.close(10)

    closing = threading.Thread(target=interrupted, daemon=True)
    closing.start()
    closing.join(60)
    assert not closing.is_alive(), "the final round waits on a lock its own thread holds"
    batches = _batches(path)
    assert [s["step_index"] for b in batches for s in b["steps"]] == [0]
    assert batches[-1]["run"]["status"] == "ended"


def test_the_recorder_imports_no_torch():
    code = ("import sys, draftscope_tracer.transport.recorder, draftscope_tracer.transport.records; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_killed_recorder_is_replaced_and_its_losses_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(relay_mod, "RESTART_S", 1.0)
    relay, health, path = _relay(tmp_path)
    hot = Shared("hot_token_id", lambda: list(range(10, 50)))
    relay.submit(_verify_call(0, hot))
    deadline = time.monotonic() + 30  # the recorder has stored step 0 before it is killed
    while b'"step_index":0' not in (path.read_bytes() if path.exists() else b""):
        assert time.monotonic() < deadline, "the recorder never wrote step 0"
        time.sleep(0.05)
    first = relay.pid
    os.kill(first, signal.SIGKILL)
    until(lambda: _dead(first), "the killed recorder is dead (its pipe closed)", 10)
    relay.submit(_verify_call(1, hot))  # the relay finds the recorder dead: dropped, counted
    deadline = time.monotonic() + 10
    while relay.pid in (None, first) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert relay.pid not in (None, first)
    relay.submit(_verify_call(2, hot))  # the new recorder is sent hot_token_id again
    relay.close(10)
    batches = _batches(path)
    assert [s["step_index"] for b in batches for s in b["steps"]] == [0, 2]
    assert health.drops["recorder_down"] == 1 and health.errors["recorder"] >= 1
    assert batches[-1]["health"][-1]["drops"] == {"recorder_down": 1}
    assert batches[-1]["run"]["status"] == "ended"


def test_a_vanished_scheduler_ends_the_run_as_crashed_and_a_bad_frame_costs_one_job(tmp_path):
    """End of input without ``close``: the recorder flushes and marks the run crashed."""
    path = tmp_path / "trace.jsonl"
    cfg = TracerConfig(file=str(path), flush_interval_s=30)
    rec = subprocess.Popen([sys.executable, "-m", "draftscope_tracer.transport.recorder"], stdin=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    job = lambda step: frame(pickle.dumps([_verify_call(step, Shared("k", lambda: list(range(40))))]))  # noqa: E731
    frames = frame(pickle.dumps(("start", cfg, dict(RUN), "r1"))) + job(0) + frame(b"not a pickle") + job(1)
    stderr = rec.communicate(frames, timeout=30)[1].decode()  # then end of input
    assert rec.returncode == 0
    batches = _batches(path)
    assert [s["step_index"] for b in batches for s in b["steps"]] == [0, 1]
    assert batches[-1]["run"]["status"] == "crashed"
    assert "the scheduler's pipe closed without its final flush" in stderr, stderr  # the server's log says why
    assert batches[-1]["health"][-1]["drops"] == {"bad_frame": 1}


def test_a_recorder_that_keeps_dying_turns_tracing_off(tmp_path, monkeypatch, caplog):
    """Its sink cannot open (the scheduler checked it at attach; here the folder is gone): after the
    probe failure limit of losses the relay stops starting recorders, and says so once."""
    monkeypatch.setattr(relay_mod, "RESTART_S", 0.05)
    relay, health, _ = _relay(tmp_path / "gone", probe_failure_limit=2)
    deadline = time.monotonic() + 20
    while not health.is_disabled("recorder") and time.monotonic() < deadline:
        relay.submit(records.Call("finish", records.finished, ([{"rid": "a"}],)))
        time.sleep(0.1)
    assert health.is_disabled("recorder") and health.errors["recorder"] == 2
    assert health.drops["recorder_down"] >= 1 and relay.pid is None
    relay.close(5)
    assert sum("tracing stops" in r.getMessage() for r in caplog.records) == 1


def test_the_recorder_outlives_a_kill_of_its_starters_process_tree(tmp_path):
    """SGLang's shutdown SIGKILLs every descendant of the scheduler at once (``kill_process_tree``, with no
    pause where ``SGLANG_PYSPY_DUMP_BEFORE_CRASH=0``): the recorder has left that tree, keeps what it was
    sent and ends the run as crashed."""
    code = ("import sys, time; from pathlib import Path; from draftscope_tracer.shared import Shared; "
            "from tests.tracer.test_recorder import _relay, _verify_call; "
            f"relay, _, _ = _relay(Path({str(tmp_path)!r})); "
            "relay.submit(_verify_call(0, Shared('hot', lambda: list(range(40))))); "
            "print(relay.pid, flush=True); time.sleep(600)")
    scheduler = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                 cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        recorder = int(scheduler.stdout.readline())
        path = tmp_path / "trace.jsonl"
        until(lambda: path.exists() and b'"step_index":0' in path.read_bytes(), "the recorder stored step 0", 30)
        tree = psutil.Process(scheduler.pid).children(recursive=True)  # as SGLang's kill_process_tree
        assert recorder not in [p.pid for p in tree]
        for p in [*tree, psutil.Process(scheduler.pid)]:
            p.kill()
    finally:
        scheduler.kill()
        scheduler.wait()
    until(lambda: _batches(path)[-1]["run"] is not None and _batches(path)[-1]["run"]["status"] == "crashed",
          "the recorder ended the run as crashed", 30)
    assert [s["step_index"] for b in _batches(path) for s in b["steps"]] == [0]
