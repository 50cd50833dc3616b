"""Slow filters against everyone else: how long does another client wait?

The trial of issue 15, item 3, against a real ``conveyor serve`` process:

- 25 connections with 4 subscriptions each (100 in all) to topic ``t`` with the filter
  ``/a LIKE '(a|b)*c'`` (accepted: each evaluation is capped; 4 per connection is what
  the per-connection cap allows), every connection reading all it is sent;
- 20 messages whose ``/a`` is ``--subject-chars`` characters of ``abab...`` without a
  ``c`` (the pattern backtracks on every start position and matches nothing), then one
  marker message that every filter matches (``c``): once each subscription has the
  marker, the fan-out of the 20 is over (each subscription gets its messages in order);
- a probe connection that, from just before the 20 publishes until the fan-out is over,
  sends a ``flush`` and waits for its ``processed`` ack, over and over.

It reports the fan-out time, the probe's round trips (how many, median and longest:
the longest is how long the slow filters held every other client) and the time of one
evaluation measured in this process.

usage: python -m bench.bench_slow_filters [--subject-chars 300] [--src DIR] [--write]

``--src DIR`` runs the server from another revision's ``src`` directory (the figures
before a change: ``git archive REV | tar -x -C DIR``), the client side stays this one.
``--write`` puts the table into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.report import git_rev, machine, serve, write_section

SLOW = "/a LIKE '(a|b)*c'"
CONNECTIONS = 25
SUBS_PER_CONNECTION = 4
MESSAGES = 20
DEADLINE_S = 1800.0
CONFIG = """\
<AMPSConfig>
    <Name>slow-filter-bench</Name>
    <Transports><Transport><Name>tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr><Protocol>amps</Protocol></Transport></Transports>
</AMPSConfig>
"""


class Reader:
    """One connection that reads everything and counts what arrives."""

    def __init__(self, port: int, name: str, commands: list) -> None:
        from conveyor.protocol import MessageDecoder, encode_frame
        from conveyor.protocol import messages as m

        self._m = m
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(encode_frame([m.Logon(client_name=name), *commands]))
        self.decoder = MessageDecoder()
        self.markers = 0
        self.messages = 0
        self.acks: dict[str, float] = {}  # cid -> when its ack arrived
        self.changed = threading.Condition()
        self.closed = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        m = self._m
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                with self.changed:
                    self.closed = True
                    self.changed.notify_all()
                return
            self.decoder.receive_data(data)
            with self.changed:
                for item in self.decoder.next_items():
                    if isinstance(item, m.Message):
                        self.messages += 1
                        self.markers += item.data == b'{"a": "c"}'
                    elif isinstance(item, m.Ack) and item.cid:
                        self.acks[item.cid] = time.perf_counter()
                self.changed.notify_all()

    def wait(self, predicate, timeout: float) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: predicate() or self.closed, timeout):
                raise TimeoutError("no answer from the server")
            if self.closed and not predicate():
                raise ConnectionError("the server closed the connection")


def evaluation_s(subject: str) -> float:
    """One evaluation of the filter on the slow subject, in this process (median of 3)."""
    from conveyor.expr import compile as compile_expr

    flt = compile_expr(SLOW)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        flt.matches({"a": subject}, None)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(subject_chars: int, src: str | None) -> dict:
    from conveyor.protocol import encode_frame
    from conveyor.protocol import messages as m

    subject = ("ab" * subject_chars)[:subject_chars]
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = str(Path(src).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.xml"
        config.write_text(CONFIG)
        proc, port, log = serve(config, env=env, cwd=tmp)
        try:
            subs = [
                Reader(port, f"sub-{i}", [m.Subscribe(topic="t", sub_id=f"s{k}", filter=SLOW, cid=f"sub{k}",
                                                      ack_type="processed") for k in range(SUBS_PER_CONNECTION)])
                for i in range(CONNECTIONS)
            ]
            for r in subs:
                r.wait(lambda r=r: len(r.acks) == SUBS_PER_CONNECTION, 60)
            probe = Reader(port, "probe", [])
            publisher = socket.create_connection(("127.0.0.1", port))
            body = b'{"a": "%s"}' % subject.encode()
            publisher.sendall(encode_frame([m.Logon(client_name="publisher")]))
            round_trips: list[float] = []
            t0 = time.perf_counter()
            publisher.sendall(encode_frame([m.Publish(topic="t", data=body) for _ in range(MESSAGES)]
                                           + [m.Publish(topic="t", data=b'{"a": "c"}')]))
            total = CONNECTIONS * SUBS_PER_CONNECTION
            n = 0
            while sum(r.markers for r in subs) < total:
                if time.perf_counter() - t0 > DEADLINE_S:
                    raise TimeoutError(f"the fan-out took more than {DEADLINE_S} s")
                n += 1
                cid = f"f{n}"
                sent = time.perf_counter()
                probe.sock.sendall(encode_frame([m.Flush(cid=cid, ack_type="processed")]))
                probe.wait(lambda cid=cid: cid in probe.acks, DEADLINE_S)
                round_trips.append(probe.acks[cid] - sent)
            fanout = time.perf_counter() - t0
            delivered = sum(r.messages for r in subs) - total
        finally:
            proc.kill()
            proc.wait()
    return {
        "fanout": fanout, "round_trips": round_trips, "delivered": delivered,
        "evaluation": evaluation_s(subject), "cut": "".join(log).count("slow consumer"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_slow_filters")
    parser.add_argument("--subject-chars", type=int, default=300, help="length of the slow subject (default 300)")
    parser.add_argument("--src", help="run the server from this src directory (another revision)")
    parser.add_argument("--write", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    r = run(args.subject_chars, args.src)
    rt = r["round_trips"]
    table = "\n".join([
        "| measure | value |",
        "| --- | --- |",
        f"| subscriptions with `{SLOW}` | {CONNECTIONS * SUBS_PER_CONNECTION} ({CONNECTIONS} connections of {SUBS_PER_CONNECTION}) |",
        f"| one evaluation on the {args.subject_chars}-character subject | {r['evaluation'] * 1000:.1f} ms |",
        f"| fan-out of {MESSAGES} messages (all 100 subscriptions done) | {r['fanout']:.1f} s |",
        f"| another client's flush round trips meanwhile | {len(rt)} |",
        f"| round trip, median | {statistics.median(rt) * 1000:.2f} ms |",
        f"| round trip, longest (how long every other client waited) | {max(rt) * 1000:.0f} ms |",
        f"| messages delivered (the filters match none) | {r['delivered']} |",
    ])
    print(table)
    if args.write:
        write_section(
            "Slow filters and everyone else (issue 15)",
            f"`python -m bench.bench_slow_filters --subject-chars {args.subject_chars}` (rev {git_rev()}; "
            f"{machine()}; load {load:.1f}). One run.\n\n" + table,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
