"""Disk work other than the journal's writes never holds a publish's durability
(server/server.py, module header): a checkpoint being written and a scrub step run on
the server's background I/O thread, and group commits go on meanwhile. Before, they
shared the journal writer's thread, and every publish waited for them (80 ms a
checkpoint with 1,000,000 queued, a scrub step every eighth of a second)."""

from __future__ import annotations

import asyncio
import threading

from conveyor import Client
from conveyor.config import load_file
from conveyor.journal.scrub import Scrubber
from conveyor.server import housekeeping
from conveyor.server.server import Server
from tests.serverproc import write_config

SCRUB = "<Scrub><Rate>64M</Rate><Interval>1s</Interval></Scrub>"


def publish_persisted(uri: str, name: str, n: int) -> int:
    with Client(name).connect(uri) as client:
        for i in range(n):
            client.publish("t", {"i": i})
        client.flush()  # every publish persisted: its group commit done
    return n


async def published_while(uri: str, held: threading.Event, release: threading.Event) -> None:
    """Publish and wait for persistence while the held work waits for ``release``."""
    loop = asyncio.get_running_loop()
    try:
        assert await loop.run_in_executor(None, held.wait, 30)
        done = loop.run_in_executor(None, publish_persisted, uri, "while-held", 200)
        assert await asyncio.wait_for(done, 20) == 200
    finally:
        release.set()


def run(config_path, scenario) -> None:
    async def main() -> None:
        server = Server(load_file(config_path))
        await server.start()
        try:
            await scenario(server, f"tcp://127.0.0.1:{server.ports[0]}")
        finally:
            await asyncio.wait_for(server.stop(), 30)
        assert server.failure is None

    asyncio.run(main())


def test_publishes_are_persisted_while_a_scrub_step_is_held(tmp_path, monkeypatch):
    config_path = write_config(tmp_path, recorded="t", txlog_extra=SCRUB)
    held, release = threading.Event(), threading.Event()
    step = Scrubber.step

    def held_step(self, *args):
        held.set()
        release.wait(30)
        return step(self, *args)

    monkeypatch.setattr(Scrubber, "step", held_step)

    async def scenario(server, uri):
        await asyncio.get_running_loop().run_in_executor(None, publish_persisted, uri, "first", 50)
        await published_while(uri, held, release)

    run(config_path, scenario)


def test_publishes_are_persisted_while_a_checkpoint_is_being_written(tmp_path, monkeypatch):
    config_path = write_config(tmp_path, recorded="t", txlog_extra="<CheckpointSize>4K</CheckpointSize>")
    held, release = threading.Event(), threading.Event()
    write = housekeeping.write_checkpoint

    def held_write(*args):
        if not release.is_set():
            held.set()
            release.wait(30)
        return write(*args)

    monkeypatch.setattr(housekeeping, "write_checkpoint", held_write)

    async def scenario(server, uri):
        # past CheckpointSize: a checkpoint starts, and its write is held
        await asyncio.get_running_loop().run_in_executor(None, publish_persisted, uri, "first", 300)
        await published_while(uri, held, release)

    run(config_path, scenario)
