"""The journal's I/O thread: one thread that runs the calls handed to it, in the order
they were handed over.

The group commit hands it one call per group (write and fsync), so what the hand-off
costs is paid per group, and at a low rate a group is a handful of messages.
``loop.run_in_executor`` over a ``ThreadPoolExecutor`` paid about 46 µs of CPU for a
round trip here (the executor's work item and locks, a ``concurrent.futures.Future`` with
its condition variable, and asyncio's chaining of the two futures, all in Python on both
threads); :meth:`IoThread.call` pays about 18: a ``queue.SimpleQueue`` (C) carries the
call over, and the loop's ``call_soon_threadsafe`` carries the result back to an asyncio
future that nothing else wraps (docs/benchmarks.md, "Group commit: a leaner hand-off").

It is also a ``concurrent.futures.Executor`` (``submit``), for callers that want one. The
thread is a daemon: after a failure the server does not wait for a thread stuck on a
dead disk, and a process that exits is not held by it (a ``ThreadPoolExecutor``'s
thread is joined at interpreter exit).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# A call: (loop, future, function, arguments); loop None: a concurrent.futures.Future.
_Call = tuple[asyncio.AbstractEventLoop | None, "asyncio.Future[Any] | concurrent.futures.Future[Any]",
              Callable[..., Any], tuple[Any, ...]]


def _settle(fut: asyncio.Future[Any], result: object, exc: BaseException | None) -> None:
    """On the loop: the call's outcome, unless its waiter gave up (cancelled)."""
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


class IoThread(concurrent.futures.Executor):
    """One thread, started at the first call, that runs each call in turn."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._lock = threading.Lock()  # start and shutdown, against each other
        self._closed = False

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run ``fn(*args)`` on the thread; its result (or exception) on the running loop."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._put((loop, fut, fn, args))
        return fut

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._put((None, fut, functools.partial(fn, **kwargs) if kwargs else fn, args))
        return fut

    def _put(self, call: _Call) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            if self._thread.ident is None:
                self._thread.start()
            self._calls.put(call)

    def _work(self) -> None:
        calls = self._calls
        while (call := calls.get()) is not None:
            loop, fut, fn, args = call
            if loop is None:
                assert isinstance(fut, concurrent.futures.Future)
                if fut.set_running_or_notify_cancel():
                    try:
                        fut.set_result(fn(*args))
                    except BaseException as exc:  # noqa: BLE001 - the caller's to see, as an executor's
                        fut.set_exception(exc)
                continue
            try:
                result, exc = fn(*args), None
            except BaseException as e:  # noqa: BLE001 - the caller's to see, on its loop
                result, exc = None, e
            try:
                loop.call_soon_threadsafe(_settle, fut, result, exc)
            except RuntimeError:
                pass  # the loop is closed: nobody waits any more

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._thread.ident is not None
            if cancel_futures:
                self._cancel_queued()
            self._calls.put(None)
        if wait and started:
            self._thread.join()

    def _cancel_queued(self) -> None:
        """The calls not started yet: cancelled (their waiters see CancelledError)."""
        while True:
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                return
            if call is None:
                continue
            loop, fut, _, _ = call
            if loop is None:
                fut.cancel()
                continue
            try:
                loop.call_soon_threadsafe(fut.cancel)
            except RuntimeError:
                pass  # the loop is closed
