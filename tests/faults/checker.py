"""A Jepsen-style queue checker: real server processes, random faults, a history, a verdict.

What runs: one ``conveyor serve`` process (through launcher.py, so that a kill can be
turned into a power cut), publishers and queue consumers speaking the wire protocol
directly over sockets (so the history records exactly what the server said, with no
client library in between), and a nemesis that, again and again, at a random moment:

- ``kill``: SIGKILLs the server while publishes, deliveries and ack batches are in
  flight, and restarts it;
- ``powercut``: the same, then keeps only what was fsynced (powercut.py);
- ``recovery``: SIGKILLs the server again while it recovers, then restarts it;
- ``torn``: after a kill, appends a torn frame to the last segment (what a crash in the
  middle of a write leaves): the server must trim it and lose nothing acknowledged;
- ``damage``: after a kill, flips a byte of an acknowledged record: the server must
  refuse to start (exit 3) and ``conveyor journal verify`` must report it; the byte is
  put back and the server restarted;

and, between kills, resets a consumer connection in the middle of a batch.

With ``replicated=True`` the server replicates the topic, ``sync``, to a second real
instance (the replica), and each fault strikes one of the two at random: a persisted
ack then means the publish is on both disks, so the replica's copy of the topic must
hold every acknowledged publish, once, whichever of them was killed, cut or damaged.

The **partition mode** (partitions.py, ``soak --partitions``) builds on this module's
server, faults and links: three instances sharing a replicated queue, every
replication link through a proxy (netproxy.py) that its nemesis cuts, blackholes,
delays and heals, publishers that fail over and workers that move between instances.

The history, and the verdict at the end (after a last graceful restart and a drain):

- a publish is **acknowledged** when the server sent a ``persisted`` ack covering it
  (acks are conflated: one for the highest sequence of a publisher);
- ``lost``: acknowledged publishes missing from the journal (a replay of the topic from
  the beginning) or never acknowledged by a consumer of the at-least-once queue;
- ``duplicated``: at-most-once deliveries of a message beyond the first, plus
  at-least-once deliveries of a message after the server confirmed its ack, plus a
  message that appears twice in the topic replay;
- ``unexpected``: a delivery or replayed record that no publisher sent, or whose body
  differs from what was sent;
  (and, replicated, acknowledged publishes missing from the replica's topic replay);
- ``recovered``: publishes never acknowledged (in flight at a kill) that are in the
  journal after all: allowed, and counted.

Every run is driven by one seed; a failure prints it (``CONVEYOR_CHECKER_SEED=...``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from conveyor.journal import FILE_HEADER_LEN, FRAME_HEADER_LEN
from conveyor.journal.verified import read_prefix
from conveyor.protocol import MessageDecoder, encode_frame
from conveyor.protocol import messages as m
from tests.faults import powercut
from tests.integration.instances import free_port

REPO = Path(__file__).resolve().parents[2]
TOPIC = "jobs"
AT_LEAST_ONCE = "Work"
AT_MOST_ONCE = "Once"
CONFIG = """\
<AMPSConfig>
    <Name>{name}</Name>
    <Transports>
        <Transport><Name>tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:{port}</InetAddr><Protocol>amps</Protocol></Transport>
        {replication_transport}
    </Transports>
    <TransactionLog>
        <JournalDirectory>{journal}</JournalDirectory>
        <JournalSize>1M</JournalSize>
        <Topic><Name>{topic}</Name><MessageType>json</MessageType></Topic>
    </TransactionLog>
    <SOW>{sow}</SOW>
    {replication}
</AMPSConfig>
"""
QUEUES = f"""
        <Queue><Name>{AT_LEAST_ONCE}</Name><MessageType>json</MessageType><UnderlyingTopic>{TOPIC}</UnderlyingTopic>
               <MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog><LeasePeriod>60s</LeasePeriod></Queue>
        <Queue><Name>{AT_MOST_ONCE}</Name><MessageType>json</MessageType><UnderlyingTopic>{TOPIC}</UnderlyingTopic>
               <Semantics>at-most-once</Semantics><MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog></Queue>
"""
REPLICA = "replica"
#: The server under test replicates the topic to the replica, sync: a persisted ack then
#: means the replica has the publish on its disk too.
REPLICATION = f"""<Replication><Destination><Name>{REPLICA}</Name><SyncType>sync</SyncType>
        <Transport><Type>amps-replication</Type><InetAddr>127.0.0.1:{{port}}</InetAddr></Transport>
        <Topic><Name>{TOPIC}</Name><MessageType>json</MessageType></Topic></Destination></Replication>"""
REPLICATION_TRANSPORT = ("<Transport><Name>replication</Name><Type>amps-replication</Type>"
                         "<InetAddr>127.0.0.1:{port}</InetAddr></Transport>")

FAULTS = ("kill", "powercut", "recovery", "torn", "damage")
WINDOW_MAX = 300  # unacknowledged publishes a publisher keeps in flight
STARTUP_S_MAX = 120.0  # a server start, under a loaded CI machine
DRAIN_S_MAX = 120.0  # the final drain
STOP_S_MAX = 60.0  # a graceful stop: the writer finishes its group, checkpoint, close
QUIET_S = 1.5  # no delivery for this long: the at-most-once queue is drained
RECONNECT_S = 0.05


def body(publisher: str, seq: int) -> bytes:
    """What publisher ``publisher`` sends as ``seq``: it names itself, so every delivery
    can be checked against what was sent."""
    return json.dumps({"p": publisher, "s": seq, "pad": "x" * (seq * 7919 % 200)}).encode()


@dataclass
class History:
    """What the clients saw. Keys are (publisher, seq)."""

    acked_through: dict[str, int] = field(default_factory=dict)  # persisted acks, conflated
    sent_through: dict[str, int] = field(default_factory=dict)  # highest seq ever sent
    work_deliveries: Counter = field(default_factory=Counter)
    work_confirmed: set = field(default_factory=set)  # acks the server confirmed (persisted)
    work_ack_unknown: set = field(default_factory=set)  # acks sent, fate unknown (connection lost)
    redelivered_after_ack: list = field(default_factory=list)
    once_deliveries: Counter = field(default_factory=Counter)
    unexpected: list = field(default_factory=list)
    consumer_resets: int = 0
    recovered: int = 0  # publishes unacknowledged at a kill that the restarted server had

    def acknowledged(self) -> set[tuple[str, int]]:
        return {(p, s) for p, top in self.acked_through.items() for s in range(1, top + 1)}

    def check_body(self, data: bytes, where: str) -> tuple[str, int] | None:
        try:
            d = json.loads(data)
            key = (d["p"], d["s"])
        except (ValueError, KeyError, TypeError):
            self.unexpected.append(f"{where}: undecodable body {data[:60]!r}")
            return None
        if key[1] > self.sent_through.get(key[0], 0) or body(*key) != data:
            self.unexpected.append(f"{where}: {key} was never sent like this")
            return None
        return key


@dataclass
class Verdict:
    kills: int
    faults: Counter
    acknowledged: int
    lost: int
    duplicated: int
    unexpected: int
    recovered: int
    redelivered: int  # at-least-once redeliveries before an ack (allowed)
    consumer_resets: int
    seconds: float
    details: list[str]

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.unexpected == 0

    def table(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        rows = [
            ("server kills", f"{self.kills} ({faults})"),
            ("consumer resets mid-batch", self.consumer_resets),
            ("publishes acknowledged as persisted", self.acknowledged),
            ("lost", self.lost),
            ("duplicated", self.duplicated),
            ("unexpected", self.unexpected),
            ("recovered (in flight at a kill, kept)", self.recovered),
            ("redelivered before an ack (at-least-once, allowed)", self.redelivered),
            ("seconds", f"{self.seconds:.0f}"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"| {k.ljust(width)} | {v} |" for k, v in rows)


class Link:
    """One protocol connection: frames out, decoded messages in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = MessageDecoder()
        self.items: list = []

    @classmethod
    async def open(cls, port: int, name: str) -> Link:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        link = cls(reader, writer)
        link.send(m.Logon(client_name=name, cid="logon", ack_type="processed"))
        return link

    def send(self, *commands) -> None:
        self.writer.write(encode_frame(commands))

    async def next(self):
        while not self.items:
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionResetError("closed by the server")
            self.decoder.receive_data(data)
            self.items.extend(self.decoder.next_items())
        return self.items.pop(0)

    def abort(self) -> None:
        self.writer.transport.abort()


async def reconnecting(server: ServerUnderTest, name: str, session) -> None:
    """Run ``session(link)`` over and over: the server goes away at every kill."""
    while True:
        try:
            await session(await Link.open(server.port, name))
        except (OSError, asyncio.IncompleteReadError):
            await asyncio.sleep(RECONNECT_S)


class Publisher:
    def __init__(self, name: str, history: History, rng: random.Random) -> None:
        self.name, self.history, self.rng = name, history, rng
        self.next_seq = 1
        self.paused = asyncio.Event()  # set: do not send new publishes
        self.done = False  # stop sending new publishes for good

    @property
    def acked(self) -> int:
        return self.history.acked_through.get(self.name, 0)

    async def run(self, server: ServerUnderTest) -> None:
        await reconnecting(server, self.name, self._session)

    async def _session(self, link: Link) -> None:
        logon = await link.next()
        highest = logon.seq or 0
        # Sent but not acknowledged when the last session ended (at a kill), and yet
        # the server has them: recovered.
        self.history.recovered += max(0, min(highest, self.next_seq - 1) - self.acked)
        unacked = range(self.acked + 1, self.next_seq)
        # Resend what the server does not have; what it has but never confirmed is
        # confirmed by a persisted flush.
        resend = [s for s in unacked if s > highest]
        if resend:
            self._publish(link, resend)
        if any(s <= highest for s in unacked):
            link.send(m.Flush(cid=f"flush-{highest}", ack_type="persisted"))
        reading = asyncio.ensure_future(self._read(link, highest))
        try:
            while not reading.done():
                wait = 0.02
                if not self.done and not self.paused.is_set() and self.next_seq - self.acked <= WINDOW_MAX:
                    n = self.rng.randint(1, 25)
                    seqs = list(range(self.next_seq, self.next_seq + n))
                    self.next_seq += n
                    self.history.sent_through[self.name] = self.next_seq - 1
                    self._publish(link, seqs)
                    await link.writer.drain()
                    wait = self.rng.choice([0.001, 0.002, 0.005])
                await asyncio.wait([reading], timeout=wait)
            reading.result()
        finally:
            reading.cancel()
            link.abort()

    def _publish(self, link: Link, seqs) -> None:
        link.send(*(m.Publish(topic=TOPIC, data=body(self.name, s), seq=s, ack_type="persisted") for s in seqs))

    async def _read(self, link: Link, flushed_through: int) -> None:
        while True:
            item = await link.next()
            if not isinstance(item, m.Ack) or item.ack_type != "persisted":
                continue
            if item.status == "failure":
                raise AssertionError(f"{self.name}: publish refused: {item.reason}")
            top = item.seq if item.seq is not None else flushed_through  # a flush: all it had
            if top > self.acked:
                self.history.acked_through[self.name] = min(top, self.next_seq - 1)


class Consumer:
    """A queue subscriber that acknowledges in batches, and sometimes drops its
    connection in the middle of one."""

    def __init__(self, name: str, queue: str, history: History, rng: random.Random) -> None:
        self.name, self.queue, self.history, self.rng = name, queue, history, rng
        self.reset_now = False
        self.last_delivery = time.monotonic()

    async def run(self, server: ServerUnderTest) -> None:
        await reconnecting(server, self.name, self._session)

    async def _session(self, link: Link) -> None:
        backlog = self.rng.randint(1, 40)
        link.send(m.Subscribe(topic=self.queue, sub_id="s", options=f"max_backlog={backlog}"))
        pending_acks: dict[str, list] = {}  # cid -> keys, sent, not yet confirmed
        batch: list[tuple[str, tuple]] = []
        cids = 0
        try:
            while True:
                try:
                    item = await asyncio.wait_for(link.next(), timeout=0.05 if batch else 1.0)
                except asyncio.TimeoutError:
                    item = None
                if isinstance(item, m.Message):
                    self.last_delivery = time.monotonic()
                    key = self.history.check_body(item.data, f"{self.queue} delivery")
                    if key is not None:
                        self._delivered(key)
                        batch.append((item.bookmark, key))
                elif isinstance(item, m.Ack) and item.cid in pending_acks:
                    keys = pending_acks.pop(item.cid)
                    if item.status == "success" and self.queue == AT_LEAST_ONCE:
                        self.history.work_confirmed.update(keys)
                    elif self.queue == AT_LEAST_ONCE:
                        self.history.work_ack_unknown.update(keys)
                if self.reset_now and batch:
                    self.reset_now = False
                    self.history.consumer_resets += 1
                    raise ConnectionResetError("reset mid-batch")
                if batch and (item is None or len(batch) >= self.rng.randint(1, backlog)):
                    cids += 1
                    cid = f"ack-{cids}"
                    pending_acks[cid] = [k for _, k in batch]
                    link.send(m.SowDelete(topic=self.queue, bookmark=",".join(b for b, _ in batch), cid=cid,
                                          ack_type="persisted"))
                    batch = []
        finally:
            for keys in pending_acks.values():
                if self.queue == AT_LEAST_ONCE:
                    self.history.work_ack_unknown.update(keys)
            link.abort()

    def _delivered(self, key: tuple) -> None:
        h = self.history
        if self.queue == AT_MOST_ONCE:
            h.once_deliveries[key] += 1
        else:
            if key in h.work_confirmed:
                h.redelivered_after_ack.append(key)
            h.work_deliveries[key] += 1


class ServerUnderTest:
    """The ``conveyor serve`` process (through the fault launcher, with a ledger)."""

    def __init__(self, directory: Path, rng: random.Random, *, name: str = "checker", queues: bool = True,
                 replication_port: int | None = None, replicate_to: int | None = None) -> None:
        """``replication_port``: this instance listens for replication there (a fixed
        port, so that its source finds it again after a restart); ``replicate_to``: this
        instance replicates the topic, sync, to the replica listening on that port."""
        self.name = name
        self.queues = queues
        self.replication_port = replication_port
        self.replicate_to = replicate_to
        self.directory = directory
        self.journal = directory / "journal"
        self.ledger = directory / "fsync.ledger"
        self.config = directory / "config.xml"
        self.rng = rng
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self.kills = 0  # SIGKILLs sent to a running server
        self.log_lines: list[str] = []

    def _write_config(self, port: int) -> None:
        self.config.write_text(CONFIG.format(
            name=self.name, port=port, journal=self.journal, topic=TOPIC, sow=QUEUES if self.queues else "",
            replication_transport="" if self.replication_port is None
            else REPLICATION_TRANSPORT.format(port=self.replication_port),
            replication="" if self.replicate_to is None else REPLICATION.format(port=self.replicate_to),
        ))

    async def spawn(self) -> None:
        self.journal.mkdir(parents=True, exist_ok=True)
        self._write_config(self.port)
        powercut.baseline(self.journal, self.ledger)
        env = dict(os.environ, PYTHONUNBUFFERED="1", CONVEYOR_TEST_FAULTS=f"ledger={self.ledger}")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.faults.launcher", "serve", "--config", str(self.config),
            cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        asyncio.ensure_future(self._drain(self.proc.stderr))

    async def _drain(self, stream) -> None:
        while line := await stream.readline():
            self.log_lines.append(line.decode(errors="replace"))
            del self.log_lines[:-400]

    async def wait_ready(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + STARTUP_S_MAX
        while time.monotonic() < deadline:
            try:
                line = await asyncio.wait_for(self.proc.stdout.readline(), deadline - time.monotonic())
            except asyncio.TimeoutError:
                break
            if not line:
                code = await self.proc.wait()
                raise CheckerError(f"server exited with {code} while starting:\n{self.tail()}")
            if line.startswith(b"conveyor listening on port "):
                self.port = int(line.split()[-1])
                asyncio.ensure_future(self._drain(self.proc.stdout))
                return
        raise CheckerError(f"server did not start in {STARTUP_S_MAX} s:\n{self.tail()}")

    async def start(self) -> None:
        await self.spawn()
        await self.wait_ready()

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()
            self.kills += 1

    async def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(asyncio.shield(self.proc.wait()), STOP_S_MAX)
        except asyncio.TimeoutError:
            stacks = await _stacks(self.proc.pid)
            raise CheckerError(f"{self.name} did not stop within {STOP_S_MAX} s of SIGTERM:\n"
                               f"{self.tail()}\n{stacks}") from None

    async def exit_code(self) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), STARTUP_S_MAX)

    def tail(self) -> str:
        return "".join(self.log_lines[-40:])

    def segments(self) -> list[Path]:
        return sorted(self.journal.glob("*.log"))


class CheckerError(AssertionError):
    pass


async def _stacks(pid: int) -> str:
    """The Python stacks of a process that hangs (py-spy, when installed)."""
    beside = Path(sys.executable).parent / "py-spy"  # in the virtualenv, maybe not on PATH
    try:
        proc = await asyncio.create_subprocess_exec(
            str(beside) if beside.exists() else "py-spy", "dump", "--pid", str(pid), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    except FileNotFoundError:
        return "(install py-spy to see where it hangs)"
    out, _ = await proc.communicate()
    return out.decode(errors="replace")


async def _verify_journal(journal: Path) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conveyor", "journal", "verify", str(journal), cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode, out.decode()


def _damage_target(server: ServerUnderTest, rng: random.Random) -> tuple[Path, int] | None:
    """A byte inside an acknowledged record: in a sealed segment, or before the durable
    point recorded for the last one. None when there is none yet."""
    segments = server.segments()
    choices = [(p, p.stat().st_size) for p in segments[:-1] if p.stat().st_size > FILE_HEADER_LEN + FRAME_HEADER_LEN]
    if segments:
        last = segments[-1]
        claim = read_prefix(str(last), int(last.name[:20]))
        if claim is not None and claim.valid_bytes > FILE_HEADER_LEN + FRAME_HEADER_LEN:
            choices.append((last, claim.valid_bytes))
    if not choices:
        return None
    path, limit = rng.choice(choices)
    return path, rng.randrange(FILE_HEADER_LEN, limit)


async def _nemesis_step(server: ServerUnderTest, fault: str, rng: random.Random, details: list[str]) -> None:
    await server.kill()
    if fault == "powercut":
        for change in powercut.cut(server.journal, server.ledger, rng):
            details.append(f"  powercut: {change}")
    elif fault == "torn":
        last = server.segments()[-1]
        torn = os.urandom(rng.randrange(1, 64))
        frame = len(torn).to_bytes(4, "little") + os.urandom(4) + torn[: rng.randrange(len(torn))]
        with open(last, "ab") as f:
            f.write(frame[: rng.randrange(1, len(frame) + 1)])
    elif fault == "damage":
        target = _damage_target(server, rng)
        if target is not None:
            path, offset = target
            data = bytearray(path.read_bytes())
            original = data[offset]
            data[offset] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(data))
            await server.spawn()
            code = await server.exit_code()
            if code != 3:
                raise CheckerError(f"damage at {path.name} offset {offset}: serve exited {code}, not 3:\n{server.tail()}")
            code, out = await _verify_journal(server.journal)
            if code != 3 or path.name not in out:
                raise CheckerError(f"damage at {path.name} offset {offset}: verify exited {code}:\n{out}")
            data[offset] = original
            path.write_bytes(bytes(data))
            details.append(f"  damage at {path.name}:{offset} refused (exit 3), then put back")
    if fault == "recovery":
        await server.spawn()
        await asyncio.sleep(rng.uniform(0.0, 0.6))  # somewhere in start-up and recovery
        await server.kill()
    await server.start()


async def run(directory: Path, *, seed: int, kills: int, publishers: int = 2, consumers: int = 2,
              faults: tuple[str, ...] = FAULTS, replicated: bool = False) -> Verdict:
    """Drive one server through ``kills`` faults (a ``recovery`` fault kills twice);
    return the verdict. ``replicated``: the server replicates the topic, sync, to a
    second instance (the replica), and each fault strikes either of the two."""
    rng = random.Random(seed)
    started = time.monotonic()
    history = History()
    replica = None
    if replicated:
        port = free_port()
        replica = ServerUnderTest(directory / REPLICA, random.Random(rng.random()), name=REPLICA, queues=False,
                                  replication_port=port)
        await replica.start()
        server = ServerUnderTest(directory, random.Random(rng.random()), replicate_to=port)
    else:
        server = ServerUnderTest(directory, random.Random(rng.random()))
    await server.start()
    pubs = [Publisher(f"pub-{i}", history, random.Random(rng.random())) for i in range(publishers)]
    cons = [Consumer(f"{q.lower()}-{i}", q, history, random.Random(rng.random()))
            for q in (AT_LEAST_ONCE, AT_MOST_ONCE) for i in range(consumers)]
    tasks = [asyncio.ensure_future(c.run(server)) for c in [*pubs, *cons]]
    done: Counter = Counter()
    details: list[str] = []
    try:
        for k in range(kills):
            phase = rng.choice(["publishing", "publishing", "acking"])
            for p in pubs:
                (p.paused.set if phase == "acking" else p.paused.clear)()
            for _ in range(rng.randint(1, 4)):
                await asyncio.sleep(rng.uniform(0.02, 0.25))
                _raise_if_failed(tasks)
                if rng.random() < 0.3:
                    rng.choice(cons).reset_now = True
            fault = rng.choice(faults)
            victim = server if replica is None or rng.random() < 0.5 else replica
            if victim is replica:
                fault = f"{REPLICA} {fault}"
            details.append(f"kill {k + 1}: {fault} while {phase}")
            await _nemesis_step(victim, fault.split()[-1], rng, details)
            done[fault] += 1
        return await _finish(server, history, pubs, cons, tasks, done, details, started, replica)
    finally:
        for t in tasks:
            t.cancel()
        await server.kill()
        if replica is not None:
            await replica.kill()


def _raise_if_failed(tasks: list[asyncio.Future]) -> None:
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            raise t.exception()


async def _finish(server, history, pubs, cons, tasks, done, details, started, replica=None) -> Verdict:
    # Publishers stop sending new publishes and wait until everything is acknowledged.
    for p in pubs:
        p.done = True
        p.paused.clear()
    deadline = time.monotonic() + DRAIN_S_MAX
    while any(p.acked < p.next_seq - 1 for p in pubs):
        _raise_if_failed(tasks)
        if time.monotonic() > deadline:
            raise CheckerError("publishers were not all acknowledged:\n" + server.tail())
        await asyncio.sleep(0.05)
    # A graceful stop and restart (of both instances): what is left must come back exactly.
    for s in (server, replica):
        if s is not None and (code := await s.stop()) != 0:
            raise CheckerError(f"graceful stop of {s.name} exited {code}:\n{s.tail()}")
    for s in (replica, server):
        if s is not None:
            await s.start()
    acknowledged = history.acknowledged()
    # Consumers drain both queues.
    while True:
        _raise_if_failed(tasks)
        settled = history.work_confirmed | history.work_ack_unknown
        quiet = time.monotonic() - max(c.last_delivery for c in cons) > QUIET_S
        if acknowledged <= settled and quiet:
            break
        if time.monotonic() > deadline + DRAIN_S_MAX:
            break
        await asyncio.sleep(0.1)
    for t in tasks:
        t.cancel()
    replayed = await _replay_topic(server.port, history)
    code, out = await _verify_journal(server.journal)
    if code != 0:
        details.append(f"verify after the run: exit {code}\n{out}")
    lost_journal = acknowledged - set(replayed)
    lost_replica: set = set()
    replica_twice = 0
    if replica is not None:
        # Sync replication: every publish acknowledged as persisted is on the replica's
        # disk, however often either instance died.
        on_replica = await _replay_topic(replica.port, history)
        lost_replica = acknowledged - set(on_replica)
        replica_twice = sum(n - 1 for n in Counter(on_replica).values() if n > 1)
        for key in sorted(lost_replica)[:20]:
            details.append(f"lost on the {REPLICA}: {key}")
        if replica_twice:
            details.append(f"{replica_twice} publishes recorded twice on the {REPLICA}")
        rcode, rout = await _verify_journal(replica.journal)
        if rcode != 0:
            details.append(f"verify of the {REPLICA} after the run: exit {rcode}\n{rout}")
            code = code or rcode
    lost_queue = acknowledged - history.work_confirmed - history.work_ack_unknown
    duplicated = (
        sum(n - 1 for n in history.once_deliveries.values() if n > 1)
        + len(history.redelivered_after_ack)
        + sum(n - 1 for n in Counter(replayed).values() if n > 1)
        + replica_twice
    )
    for key in sorted(lost_journal)[:20]:
        details.append(f"lost from the journal: {key}")
    for key in sorted(lost_queue - lost_journal)[:20]:
        details.append(f"never acknowledged by a {AT_LEAST_ONCE} consumer: {key}")
    for key, n in sorted(history.once_deliveries.items()):
        if n > 1:
            details.append(f"{AT_MOST_ONCE} delivered {key} {n} times")
    for key in history.redelivered_after_ack[:20]:
        details.append(f"{AT_LEAST_ONCE} delivered {key} again after its ack was confirmed")
    details.extend(history.unexpected[:20])
    return Verdict(
        kills=server.kills + (replica.kills if replica is not None else 0),
        faults=done,
        acknowledged=len(acknowledged),
        lost=len(lost_journal | lost_queue | lost_replica),
        duplicated=duplicated,
        unexpected=len(history.unexpected) + (code != 0),
        recovered=history.recovered,
        redelivered=sum(n - 1 for n in history.work_deliveries.values() if n > 1),
        consumer_resets=history.consumer_resets,
        seconds=time.monotonic() - started,
        details=details,
    )


async def _replay_topic(port: int, history: History) -> list[tuple[str, int]]:
    """Every record of the topic, from the beginning of the journal."""
    link = await Link.open(port, "replay")
    link.send(m.Subscribe(topic=TOPIC, sub_id="r", bookmark="0"))
    out = []
    try:
        while True:
            try:
                item = await asyncio.wait_for(link.next(), QUIET_S)
            except asyncio.TimeoutError:
                return out
            if isinstance(item, m.Message):
                key = history.check_body(item.data, "topic replay")
                if key is not None:
                    out.append(key)
    finally:
        link.abort()


def run_sync(directory: Path, *, seed: int, kills: int, **kw) -> Verdict:
    return asyncio.run(run(directory, seed=seed, kills=kills, **kw))
