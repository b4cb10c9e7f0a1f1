"""SIGTERM and the tracer's last flush: a signal that lands while SGLang answers requests waits until
the tracer has queued their records (``SigtermChain.deferred``), then closes and hands on."""

from __future__ import annotations

import os
import signal

from draftscope_tracer.engine.shutdown import SigtermChain


def test_a_sigterm_inside_result_processing_waits_for_its_end():
    events = []
    chain = SigtermChain(lambda status, deadline: events.append(("close", status)))
    original = signal.getsignal(signal.SIGTERM)
    chain.install()
    chain.previous = lambda signum, frame: events.append(("previous", signum))
    try:
        with chain.deferred():
            os.kill(os.getpid(), signal.SIGTERM)  # delivered on this (main) thread at once
            events.append(("records queued", None))
        assert events == [("records queued", None), ("close", "ended"), ("previous", signal.SIGTERM)]

        events.clear()
        os.kill(os.getpid(), signal.SIGTERM)  # outside the block: at once
        assert events == [("close", "ended"), ("previous", signal.SIGTERM)]
    finally:
        signal.signal(signal.SIGTERM, original)


def test_nested_blocks_hand_the_signal_on_once_at_the_outer_end():
    events = []
    chain = SigtermChain(lambda status, deadline: events.append(status))
    chain.previous = signal.SIG_IGN
    with chain.deferred():
        with chain.deferred():
            chain(signal.SIGTERM, None)
        assert events == []
    assert events == ["ended"]


def test_a_block_on_another_thread_does_not_hold_the_signal():
    """The signal interrupts the main thread only: a block entered elsewhere leaves it to close at once."""
    import threading

    events = []
    chain = SigtermChain(lambda status, deadline: events.append(status))
    chain.previous = signal.SIG_IGN
    inside, leave = threading.Event(), threading.Event()

    def result_processing():
        with chain.deferred():
            inside.set()
            leave.wait(5)

    worker = threading.Thread(target=result_processing)
    worker.start()
    inside.wait(5)
    chain(signal.SIGTERM, None)
    assert events == ["ended"]
    leave.set()
    worker.join(5)
    assert events == ["ended"]
