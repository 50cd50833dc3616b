"""A loopback TCP proxy that a checker drives: the network between two instances.

One :class:`NetProxy` per replication link: it listens on its own port and forwards
every connection to the real replication port, bytes unchanged, both ways. The source's
``Destination`` names the proxy's port, so everything the link says goes through it.
The checker, on the same event loop, changes the network at any moment:

- :meth:`NetProxy.cut` (``refuse``): every open connection is aborted (both peers see a
  reset: what was in flight is gone) and the listener closes, so a dial is refused
  (``ECONNREFUSED``) until :meth:`heal`;
- :meth:`NetProxy.cut` (``blackhole``): connections stay open but every byte is dropped,
  both ways, and new connections are accepted and dropped the same way: neither peer
  notices anything but silence (a partition shorter than TCP's own timeouts).
  :meth:`heal` aborts those connections (a stream with bytes missing cannot go on),
  and the peers dial again;
- :meth:`NetProxy.delay`: every chunk is forwarded ``seconds`` after it arrived, in
  order (latency, not loss);
- :meth:`NetProxy.heal`: forward normally again (no delay).

It runs in the caller's asyncio loop (no threads), so a state change is in force
before the call returns. Counters (connections, bytes, cuts) say what went through.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

CHUNK = 65536


class _Pipe:
    """One proxied connection: a client side and an upstream side, two pumps."""

    def __init__(self, proxy: NetProxy, down: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> None:
        self.proxy = proxy
        self.down = down
        self.up = up
        self.blackholed = False
        self.tasks: list[asyncio.Task] = []

    def start(self) -> None:
        if self.up is None:  # accepted while blackholed: swallow what comes, never forward
            self.blackholed = True
            self.tasks.append(asyncio.ensure_future(self._swallow(self.down[0])))
            return
        for src, dst in ((self.down[0], self.up[1]), (self.up[0], self.down[1])):
            queue: deque[tuple[float, bytes]] = deque()
            ready = asyncio.Event()
            self.tasks.append(asyncio.ensure_future(self._read(src, queue, ready)))
            self.tasks.append(asyncio.ensure_future(self._send(dst, queue, ready)))

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        try:
            while await reader.read(CHUNK):
                pass
        except (OSError, asyncio.IncompleteReadError):
            pass
        self.abort()

    async def _read(self, reader: asyncio.StreamReader, queue: deque, ready: asyncio.Event) -> None:
        try:
            while data := await reader.read(CHUNK):
                if self.blackholed:
                    continue
                self.proxy.bytes += len(data)
                queue.append((time.monotonic() + self.proxy.delay_s, data))
                ready.set()
        except (OSError, asyncio.IncompleteReadError):
            pass
        self.abort()  # one side ended: end the other (a half-close is not modelled)

    async def _send(self, writer: asyncio.StreamWriter, queue: deque, ready: asyncio.Event) -> None:
        try:
            while True:
                await ready.wait()
                ready.clear()
                while queue:
                    due, data = queue[0]
                    wait = due - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    queue.popleft()
                    if self.blackholed:
                        continue
                    writer.write(data)
                    await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            self.abort()

    def blackhole(self) -> None:
        self.blackholed = True

    def abort(self) -> None:
        for side in (self.down, self.up):
            if side is not None:
                side[1].transport.abort()
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        self.proxy._pipes.discard(self)


class NetProxy:
    """Listen on ``port`` (0: any free one) and forward to ``target_port``."""

    def __init__(self, target_port: int, *, port: int = 0, name: str = "", host: str = "127.0.0.1") -> None:
        self.name = name
        self.host = host
        self.target_port = target_port
        self.port = port
        self.state = "up"  # up, refuse, blackhole
        self.delay_s = 0.0
        self._server: asyncio.AbstractServer | None = None
        self._pipes: set[_Pipe] = set()
        self.connections = 0  # accepted, in all
        self.bytes = 0  # forwarded, both ways
        self.cuts = 0

    async def start(self) -> NetProxy:
        await self._listen()
        return self

    async def _listen(self) -> None:
        for attempt in range(50):
            try:
                self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
                break
            except OSError:
                if attempt == 49:
                    raise
                await asyncio.sleep(0.1)  # the port is ours; a closing socket may hold it briefly
        assert self._server is not None
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.state == "refuse":  # closed listener; a connection accepted just before the cut
            writer.transport.abort()
            return
        up = None
        if self.state != "blackhole":
            try:
                up = await asyncio.open_connection(self.host, self.target_port)
            except OSError:
                writer.transport.abort()  # the instance is down: the source sees the link end
                return
            if self.state == "refuse":  # cut while dialling
                up[1].transport.abort()
                writer.transport.abort()
                return
        pipe = _Pipe(self, (reader, writer), up)
        pipe.blackholed = self.state == "blackhole"
        self._pipes.add(pipe)
        pipe.start()

    @property
    def healthy(self) -> bool:
        return self.state == "up" and self.delay_s == 0

    def cut(self, mode: str = "refuse") -> int:
        """Cut the link (``refuse`` or ``blackhole``, see the module header); returns how
        many open connections it affected."""
        if mode not in ("refuse", "blackhole"):
            raise ValueError(f"cut mode {mode!r}")
        self.cuts += 1
        pipes = list(self._pipes)
        if mode == "refuse":
            self.state = "refuse"
            if self._server is not None:
                self._server.close()
                self._server = None
            for pipe in pipes:
                pipe.abort()
        else:
            self.state = "blackhole"
            for pipe in pipes:
                pipe.blackhole()
        return len(pipes)

    def delay(self, seconds: float) -> None:
        """Forward every chunk ``seconds`` after it arrives (0: at once)."""
        self.delay_s = max(0.0, seconds)

    async def heal(self) -> None:
        """Forward normally again: listen if the cut closed the listener, end the
        connections a blackhole swallowed bytes of, no delay."""
        if self.state == "blackhole":
            for pipe in list(self._pipes):
                if pipe.blackholed:
                    pipe.abort()
        self.delay_s = 0.0
        was = self.state
        self.state = "up"
        if was == "refuse" or self._server is None:
            await self._listen()

    async def close(self) -> None:
        self.state = "refuse"
        if self._server is not None:
            self._server.close()
            self._server = None
        for pipe in list(self._pipes):
            pipe.abort()

    def __repr__(self) -> str:
        delay = f", delay {self.delay_s:.3f} s" if self.delay_s else ""
        return f"NetProxy({self.name or self.port} -> {self.target_port}: {self.state}{delay})"
