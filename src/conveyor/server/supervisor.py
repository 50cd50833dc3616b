"""Supervision of the server's background work (trio's rule: exceptions always propagate).

Everything the server runs in the background (the journal writer, the timer, the admin
interface, the replication links, the scrub) is spawned here. When any of it raises, or
returns while the server runs, the server **fails**: the error is logged with its
traceback, ``on_failure`` stops the listeners, closes every connection with the reason and
fails every wait for durability, then :attr:`Supervisor.failed` is set, which wakes whoever
runs the server (``Server.run_until`` raises :class:`~conveyor.errors.ServerFailed`). The
first failure is the one kept; a failure is never undone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from conveyor import errors

log = logging.getLogger("conveyor.server")

STOP_TASKS_S_MAX = 10.0  # how long stop() waits for its cancelled tasks to end


class Supervisor:
    """The owner of the background tasks, of the server's failure and of "stopping"."""

    def __init__(self, on_failure: Callable[[errors.ServerFailed, BaseException], None]) -> None:
        self._on_failure = on_failure  # the server's part of failing: listeners, connections, waiters
        self.tasks: list[asyncio.Task] = []
        self.failed = asyncio.Event()  # set once the server failed
        self._failure: errors.ServerFailed | None = None
        self._stopping = False

    @property
    def failure(self) -> errors.ServerFailed | None:
        """Why the server failed, or None."""
        return self._failure

    @property
    def stopping(self) -> bool:
        """stop() has begun: background work that returns now is not a failure."""
        return self._stopping

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task:
        """Run ``coro`` as supervised background work: if it raises (or returns while
        the server runs), the server fails."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(self._task_done)
        self.tasks.append(task)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            if self._stopping:
                return
            exc = RuntimeError("it returned while the server was running")
        self.fail(f"the {task.get_name()}", exc)

    def fail(self, where: str, exc: BaseException) -> None:
        """Stop serving loudly: log, let the server stop accepting, close every connection
        and fail every durability wait (``on_failure``), wake whoever runs the server."""
        if self._failure is not None:
            return
        failure = errors.ServerFailed(f"the server stopped after a failure in {where}: {exc}")
        failure.__cause__ = exc  # the cause is named, not raised from here: no traceback of this frame
        self._failure = failure
        log.critical("%s; no further publish is accepted", failure, exc_info=exc)
        self._on_failure(failure, exc)
        self.failed.set()

    def begin_stop(self) -> None:
        """stop() begins: from now on a task that returns is done, not failed."""
        self._stopping = True

    async def cancel(self, *, keep: asyncio.Task | None, also: Iterable[asyncio.Task]) -> None:
        """At shutdown: cancel every task but ``keep`` (the writer, which finishes its group),
        and ``also`` (tasks not supervised: logons being verified); wait at most
        STOP_TASKS_S_MAX for the supervised ones, so stop() never hangs on one."""
        for task in (*self.tasks, *also):
            if task is not keep:
                task.cancel()
        others = [t for t in self.tasks if t is not keep]
        if others:
            _, stuck = await asyncio.wait(others, timeout=STOP_TASKS_S_MAX)
            for task in stuck:  # a task that swallowed its cancellation: a bug, but not a hang
                log.error("shutdown: %s did not end within %.0f s of its cancellation; stopping without it",
                          task.get_name(), STOP_TASKS_S_MAX)
