"""The journal's I/O thread (server/io_thread.py): calls run one at a time, in the order
they were handed over, on one thread that is not the loop's; results and exceptions come
back to the caller's loop; shutdown waits for what was handed over, or cancels it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import uvloop

from conveyor.server.io_thread import IoThread


def test_calls_run_in_order_on_one_other_thread_and_their_results_come_back():
    io = IoThread("test-io")
    ran: list[tuple[int, int]] = []

    def work(i: int) -> int:
        time.sleep(0.001 * (i % 3))  # a slow call does not let a later one overtake it
        ran.append((i, threading.get_ident()))
        return i * i

    async def main() -> list[int]:
        loop_thread = threading.get_ident()
        results = await asyncio.gather(*(io.call(work, i) for i in range(50)))
        assert {t for _, t in ran} != {loop_thread}
        return list(results)

    assert uvloop.run(main()) == [i * i for i in range(50)]
    assert [i for i, _ in ran] == list(range(50))
    assert len({t for _, t in ran}) == 1
    io.shutdown()


def test_an_exception_reaches_the_caller_and_the_thread_goes_on():
    io = IoThread("test-io")

    def fail() -> None:
        raise OSError(28, "No space left on device")

    async def main() -> int:
        with pytest.raises(OSError, match="No space left"):
            await io.call(fail)
        return await io.call(lambda: 7)

    assert uvloop.run(main()) == 7
    io.shutdown()


def test_submit_is_an_executor_and_run_in_executor_works_through_it():
    io = IoThread("test-io")
    assert io.submit(lambda a, b=0: a + b, 2, b=3).result(timeout=5) == 5

    async def main() -> int:
        return await asyncio.get_running_loop().run_in_executor(io, max, 4, 9)

    assert uvloop.run(main()) == 9
    io.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        io.submit(print)


def test_shutdown_waits_for_what_was_handed_over_or_cancels_it():
    io = IoThread("test-io")
    started = threading.Event()
    release = threading.Event()
    done: list[int] = []

    def slow(i: int) -> None:
        started.set()
        release.wait(5)
        done.append(i)

    first = io.submit(slow, 1)
    started.wait(5)
    queued = io.submit(slow, 2)
    release.set()
    io.shutdown(wait=True)
    assert first.result(timeout=0) is None and queued.result(timeout=0) is None and done == [1, 2]

    io = IoThread("test-io")
    started.clear()
    release.clear()
    running = io.submit(slow, 3)
    started.wait(5)
    waiting = io.submit(slow, 4)
    io.shutdown(wait=False, cancel_futures=True)
    assert waiting.cancelled()
    release.set()
    assert running.result(timeout=5) is None


def test_a_caller_that_gave_up_is_not_answered():
    """The call still runs (a journal write is not undone); its waiter was cancelled."""
    io = IoThread("test-io")
    release = threading.Event()
    ran: list[str] = []

    def write() -> str:
        release.wait(5)
        ran.append("written")
        return "end"

    async def main() -> str:
        fut = io.call(write)
        fut.cancel()
        release.set()
        return await io.call(lambda: "after")

    assert uvloop.run(main()) == "after"
    assert ran == ["written"]
    io.shutdown()


def test_an_unused_thread_is_never_started():
    io = IoThread("test-io")
    io.shutdown(wait=True)
    assert io._thread.ident is None


def test_the_hand_off_benchmark_runs():
    """bench/bench_handoff.py still runs (a few calls: a smoke test, not a measurement)."""
    from bench.bench_handoff import WAYS, round_trip

    for way in WAYS:
        cpu, wall = round_trip(way, 50)
        assert cpu >= 0 and wall > 0
