"""Bit rot: a flipped bit in a sealed segment whose `.verified` sidecar still matches is
not re-read at startup. The background scrub and `conveyor journal verify` on the live
journal find it, the server keeps serving, and the next start refuses the journal."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading

from conveyor import Client
from conveyor.config import load_file
from conveyor.journal.scrub import Scrubber
from conveyor.journal.verified import VERIFIED_SUFFIX
from conveyor.protocol import encode_frame
from conveyor.protocol import messages as m
from conveyor.server.server import Server
from tests.integration.test_bad_input import Raw
from tests.serverproc import ServerProcess, write_config

SCRUB = "<JournalSize>1M</JournalSize><Scrub><Rate>64M</Rate><Interval>1s</Interval></Scrub>"


def conveyor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conveyor", *args], capture_output=True, text=True, timeout=60)


def rot(path, offset: int) -> None:
    """Flip a bit in place, keeping size, inode and modification time: what bit rot does."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x04]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_bit_rot_in_a_trusted_sealed_segment_is_found_by_the_scrub(tmp_path):
    config = write_config(tmp_path, recorded="t", txlog_extra=SCRUB)
    server = ServerProcess(config).start()
    with Client("p").connect(server.uri) as client:
        for n in range(3000):
            client.publish("t", {"n": n, "pad": "x" * 1000})
        client.flush()
    assert server.stop() == 0
    server.start()  # this open checks the sealed segments and writes their .verified sidecars
    assert server.stop() == 0
    journal = tmp_path / "journal"
    sealed = sorted(journal.glob("*.log"))[1]
    assert os.path.exists(str(sealed) + VERIFIED_SUFFIX)
    rot(sealed, os.path.getsize(sealed) // 2)

    server.start()  # the sidecar still matches: the open trusts it
    server.wait_log(f"journal scrub: journal segment {sealed}: CRC mismatch at offset", timeout=60)
    assert not os.path.exists(str(sealed) + VERIFIED_SUFFIX)  # no longer trusted
    with Client("p2").connect(server.uri) as client:  # the server keeps serving
        client.publish("t", {"n": "after"})
        client.flush()
    live = conveyor("journal", "verify", str(journal))  # beside the running server
    assert live.returncode == 3 and str(sealed) in live.stdout and "CRC mismatch" in live.stdout
    server.kill()

    refused = conveyor("serve", "--config", str(config), "--port", "0")
    assert refused.returncode == 3, refused.stderr
    assert str(sealed) in refused.stderr and "conveyor journal repair" in refused.stderr


def test_verify_on_a_live_journal_under_load_reports_no_problem(tmp_path):
    server = ServerProcess(write_config(tmp_path, recorded="t", txlog_extra="<JournalSize>1M</JournalSize>")).start()
    try:
        with Client("p").connect(server.uri) as client:
            for n in range(1500):
                client.publish("t", {"n": n, "pad": "x" * 1000})
                if n == 1000:
                    live = conveyor("journal", "verify", str(tmp_path / "journal"))  # while publishing
            client.flush()
    finally:
        server.kill()
    assert live.returncode == 0, live.stdout + live.stderr


QUEUE = """
<Queue><Name>Jobs</Name><MessageType>json</MessageType><UnderlyingTopic>t</UnderlyingTopic><MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog></Queue>
<Queue><Name>Once</Name><MessageType>json</MessageType><UnderlyingTopic>t</UnderlyingTopic>
       <Semantics>at-most-once</Semantics><MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog></Queue>
"""


def drain(client: Client, queue: str, idle: float = 2.0) -> list[int]:
    sub = client.subscribe(queue, max_backlog=100)
    got = []
    while (msg := sub.get(timeout=idle)) is not None:
        got.append(msg.json()["n"])
        msg.ack()
    client.flush()
    return got


def replay_until_failure(port: int) -> tuple[list[int], m.Ack]:
    """Replay topic t from the start over a raw connection until the server ends it."""
    raw = Raw(port)
    raw.send(encode_frame([m.Logon(client_name="replayer"), m.Subscribe(topic="t", sub_id="r", bookmark="0", cid="r")]))
    got = []
    while True:
        for item in raw.read():
            if isinstance(item, m.Message):
                got.append(json.loads(item.data)["n"])
            elif isinstance(item, m.Ack) and item.status == "failure":
                return got, item


def test_a_damaged_record_found_at_read_time_fails_only_its_own_delivery(tmp_path):
    """The issue's trial: bit rot in a trusted sealed segment, found only when queue
    consumers and a replay read it after a restart. It used to disconnect every queue
    consumer (0 of 30,000 delivered) and stall the replay with a traceback each second."""
    total = 3000
    config = write_config(tmp_path, recorded="t", queues=QUEUE,
                          txlog_extra="<JournalSize>1M</JournalSize><Scrub><Rate>0</Rate></Scrub>")
    server = ServerProcess(config).start()
    with Client("p").connect(server.uri) as client:
        for n in range(total):
            client.publish("t", {"n": n, "pad": "x" * 1000})
        client.flush()
    assert server.stop() == 0
    server.start()  # recovery reads the journal once; the message cache starts cold
    sealed = sorted((tmp_path / "journal").glob("*.log"))[1]
    rot(sealed, os.path.getsize(sealed) // 2)  # while it runs: found when the bodies are read
    with Client("worker").connect(server.uri) as client:
        jobs = drain(client, "Jobs")
        once = drain(client, "Once")
        replayed, end = replay_until_failure(server.port)
        client.publish("t", {"n": total})  # the connection and the server are fine
        client.flush()
    server.kill()
    [damaged] = set(range(total)) - set(jobs)
    assert sorted(jobs) == [n for n in range(total) if n != damaged]
    assert sorted(once) == sorted(jobs)  # at-most-once: the damaged one counts as delivered
    assert replayed == list(range(damaged))  # everything before the damage, in order
    assert end.code == "journal_corrupt" and str(sealed) in end.reason and "offset" in end.reason
    assert f"journal segment {sealed}" in server.log and "not delivered, its journal record is damaged" in server.log
    assert "Traceback" not in server.log


def test_a_scrub_step_running_at_shutdown_is_closed_after_it_on_the_io_thread(tmp_path, monkeypatch):
    """A graceful stop cancels the scrub while its step runs on the I/O thread. Closing
    the scrubber from the loop then raced the step (EBADF failed a graceful stop, found
    by the queue checker); the close now runs on the I/O thread after the step."""
    config_path = write_config(tmp_path, recorded="t", txlog_extra=SCRUB)
    server = ServerProcess(config_path).start()
    with Client("pub").connect(server.uri) as client:
        for i in range(50):
            client.publish("t", {"i": i})
        client.flush()
    server.stop()

    events: list[str] = []
    in_step, release = threading.Event(), threading.Event()
    step, close = Scrubber.step, Scrubber.close
    stepping = threading.local()  # a step's own close (at the end of a segment) is not the race

    def held_step(self, *args):
        events.append("step")
        in_step.set()
        release.wait(30)  # until the loop has had its chance to close the scrubber
        stepping.on = True
        try:
            return step(self, *args)
        finally:
            stepping.on = False
            events.append("step returned")

    def recorded_close(self):
        if not getattr(stepping, "on", False):
            events.append("close")
        close(self)

    monkeypatch.setattr(Scrubber, "step", held_step)
    monkeypatch.setattr(Scrubber, "close", recorded_close)

    async def scenario() -> None:
        live = Server(load_file(config_path))
        await live.start()
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, in_step.wait, 30)
        stopping = asyncio.create_task(live.stop())
        for _ in range(20):  # the scrub task sees its cancellation and runs its finally
            await asyncio.sleep(0.01)
        assert "close" not in events  # not from the loop while the step holds the file
        release.set()
        await asyncio.wait_for(stopping, 30)
        assert live.failure is None

    asyncio.run(scenario())
    assert events[:2] == ["step", "step returned"] and "close" in events[2:]
