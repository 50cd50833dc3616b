"""The cost of security: TLS against plaintext, and entitlement checks with 1,000 rules.

1. **TLS**: one publisher publishes N messages of 256 bytes, pipelined, waiting until
   every one is persisted; then one subscriber replays (drains) all of them from the
   start of the log. Once over ``tcp``, once over ``tcps`` (TLS 1.3, an ECDSA P-256
   certificate made by trustme), each against a fresh server process, runs interleaved
   (plain, TLS, plain, TLS...) so the machine's load hits both alike. Target: TLS at
   least 70% of plaintext.
2. **Entitlements**: the same workload over ``tcp`` with ``Authentication`` and a user
   whose grants hold 1,000 rules (500 literal topics, 500 regexes; the one that allows
   the benchmark topic last), against the same server without authentication.
   Target: under 5% slower. Then the engine alone (no sockets, no disk): ``Engine.handle``
   of publish frames from a restricted session against an unrestricted one, which is the
   check's cost without the noise of a shared machine; the same with an entitlement
   filter among the 1,000 rules (``Filter`` on a grant: the publish path must not pay
   for it).
3. **Entitlement filters**, the engine alone: publish frames fanned out to one live
   subscriber that gets half of them: unrestricted with its own filter
   ``/region = 'EU'``, against a user whose entitlement filter is that filter (the
   subscription's filter is composed when it is made, so a message pays one filter either
   way). Target: under 5% slower.

    python -m bench.bench_security [--messages N] [--runs 5] [--write] [--engine-only]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from bench.bench_publish import PAYLOAD, free_port, wait_port
from bench.report import git_rev, machine, median, write_section

RULES = 1000
USER, PASSWORD = "bench", "bench-password"


def _config(workdir: Path, port: int, *, tls: bool, auth: bool) -> Path:
    transport = "<Type>tcp</Type>"
    if tls:
        transport = (f"<Type>tcps</Type><Certificate>{workdir.parent / 'server.pem'}</Certificate>"
                     f"<PrivateKey>{workdir.parent / 'server.key'}</PrivateKey>")
    security = ""
    if auth:
        literals = "".join(f"<Publish>other.{i}</Publish><Replay>other.{i}</Replay>" for i in range(RULES // 4))
        regexes = "".join(f"<Publish>region{i}\\..*</Publish><Replay>region{i}\\..*</Replay>" for i in range(RULES // 4 - 1))
        security = (f"<Authentication><UsersFile>{workdir.parent / 'users'}</UsersFile></Authentication>"
                    f"<Entitlement><Grant><User>{USER}</User>{literals}{regexes}"
                    "<Publish>be.ch</Publish><Replay>be.ch</Replay></Grant></Entitlement>")
    cfg = workdir / "conveyor.xml"
    cfg.write_text(f"""<AMPSConfig><Name>bench</Name>
<Transports><Transport><Name>t</Name>{transport}<InetAddr>127.0.0.1:{port}</InetAddr></Transport></Transports>
<TransactionLog><JournalDirectory>{workdir / 'journal'}</JournalDirectory>
<Topic><Name>be.ch</Name><MessageType>json</MessageType></Topic></TransactionLog>{security}
</AMPSConfig>""")
    return cfg


def _start(workdir: Path, *, tls: bool, auth: bool) -> tuple[subprocess.Popen, str]:
    workdir.mkdir()
    port = free_port()
    cfg = _config(workdir, port, tls=tls, auth=auth)
    proc = subprocess.Popen([sys.executable, "-m", "conveyor", "serve", "--config", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port)
    scheme = "tcps" if tls else "tcp"
    return proc, f"{scheme}://127.0.0.1:{port}"


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process has used: on a shared machine, what a
    message costs the server is steadier than how long it took."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _run(uri: str, n: int, ca_file: str, auth: bool, pid: int) -> tuple[float, float, float, float]:
    """(publish msg/s, drain msg/s, server CPU µs per publish, per drained message)."""
    from conveyor import AsyncClient

    creds = {"user_id": USER, "password": PASSWORD} if auth else {}
    client = AsyncClient(f"bench-{time.time_ns()}", max_inflight=20_000, ca_file=ca_file, **creds)
    await client.connect(uri)
    cpu = _cpu_s(pid)
    start = time.perf_counter()
    for _ in range(n):
        await client.publish("be.ch", PAYLOAD)
    await client.wait_persisted(timeout=600)
    publish_s = time.perf_counter() - start
    publish_cpu = _cpu_s(pid) - cpu
    done = asyncio.Event()
    count = 0

    def on_message(_msg) -> None:
        nonlocal count
        count += 1
        if count >= n:
            done.set()

    cpu = _cpu_s(pid)
    start = time.perf_counter()
    await client.subscribe("be.ch", bookmark="0", on_message=on_message)
    await asyncio.wait_for(done.wait(), 600)
    drain_s = time.perf_counter() - start
    drain_cpu = _cpu_s(pid) - cpu
    await client.disconnect()
    return n / publish_s, n / drain_s, 1e6 * publish_cpu / n, 1e6 * drain_cpu / n


def _prepare(directory: Path) -> str:
    import trustme

    from conveyor.security.users import UsersFile

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(directory / "server.pem"))
    cert.private_key_pem.write_to_path(str(directory / "server.key"))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    UsersFile(directory / "users").add(USER, PASSWORD)
    return str(directory / "ca.pem")


def engine_check_cost(frames: int = 1000, per_frame: int = 50, runs: int = 21) -> tuple[float, float]:
    """Publishes per second through ``Engine.handle``: (unrestricted, 1,000 rules)."""
    import dataclasses

    from conveyor.config import load_text
    from conveyor.config.model import Authentication, Entitlement, Grant
    from conveyor.engine.core import Engine
    from conveyor.journal import MemoryJournal
    from conveyor.protocol import messages as m

    base = load_text("<AMPSConfig><TransactionLog><JournalDirectory>./x</JournalDirectory>"
                     "<Topic><Name>be.ch</Name></Topic></TransactionLog></AMPSConfig>")
    rules = Grant(users=(USER,), publish=tuple(f"other.{i}" for i in range(RULES // 2))
                  + tuple(f"region{i}\\..*" for i in range(RULES // 2 - 1)) + ("be.ch",))
    secured = dataclasses.replace(base, authentication=Authentication(client_certificates=True),
                                  entitlement=Entitlement(grants=(rules,)))
    # The same rules and an entitlement filter on reading the topic (rule 6 of entitlements.py).
    filtered = dataclasses.replace(secured, entitlement=Entitlement(grants=(
        rules, Grant(users=(USER,), subscribe=("be.ch",), filter=EU))))
    batch = [m.Publish(topic="be.ch", data=PAYLOAD) for _ in range(per_frame)]

    def rate(config) -> float:
        journal = MemoryJournal()
        engine = Engine(config, journal)
        engine.connect(1)
        if config.authentication is not None:
            engine.authenticate(1, USER)
        engine.handle(1, [m.Logon(client_name="b", ack_type="none")], 0.0)
        # CPU time of this process: on a shared machine, wall time mostly measures the
        # other processes.
        start = time.process_time()
        for i in range(frames):
            engine.handle(1, batch, float(i))
            if i % 100 == 99:
                journal.commit()
                engine.on_durable(float(i))
        return frames * per_frame / (time.process_time() - start)

    plain, checked, with_filter = [], [], []
    for _ in range(runs):  # interleaved
        plain.append(rate(base))
        checked.append(rate(secured))
        with_filter.append(rate(filtered))
    return median(plain), median(checked), median(with_filter)


EU = "/region = 'EU'"


def engine_filter_cost(frames: int = 400, per_frame: int = 50, runs: int = 11) -> tuple[float, float]:
    """Messages per second through ``Engine.handle``, each fanned out to one live
    subscriber that gets the EU half: (unrestricted, its own filter EU; authenticated,
    no filter of its own, its entitlement filter EU)."""
    import dataclasses

    from conveyor.config import load_text
    from conveyor.config.model import Authentication, Entitlement, Grant
    from conveyor.engine.core import Engine
    from conveyor.journal import MemoryJournal
    from conveyor.protocol import messages as m

    base = load_text("<AMPSConfig><TransactionLog><JournalDirectory>./x</JournalDirectory>"
                     "<Topic><Name>be.ch</Name></Topic></TransactionLog></AMPSConfig>")
    secured = dataclasses.replace(base, authentication=Authentication(client_certificates=True),
                                  entitlement=Entitlement(grants=(
                                      Grant(users=(USER,), publish=("be.ch",)),
                                      Grant(users=(USER,), subscribe=("be.ch",), filter=EU))))
    pad = "x" * 220
    batch = [m.Publish(topic="be.ch", data=f'{{"region":"{r}","pad":"{pad}"}}'.encode())
             for r in ("EU", "US") * (per_frame // 2)]

    def rate(config, own_filter: str | None) -> float:
        journal = MemoryJournal()
        engine = Engine(config, journal)
        for conn in (1, 2):
            engine.connect(conn)
            if config.authentication is not None:
                engine.authenticate(conn, USER)
            engine.handle(conn, [m.Logon(client_name=f"b{conn}", ack_type="none")], 0.0)
        engine.handle(2, [m.Subscribe(topic="be.ch", sub_id="s", filter=own_filter, ack_type="none")], 0.0)
        engine.take_output()
        received = 0
        start = time.process_time()
        for i in range(frames):
            engine.handle(1, batch, float(i))
            if i % 10 == 9 or i == frames - 1:
                journal.commit()
                engine.on_durable(float(i))  # fan-out happens here (read-committed)
                received += len(engine.take_output().get(2, ()))
        elapsed = time.process_time() - start
        assert received == frames * per_frame // 2, received  # the EU half, either way
        return frames * per_frame / elapsed

    own, entitled = [], []
    for _ in range(runs):  # interleaved
        own.append(rate(base, EU))
        entitled.append(rate(secured, None))
    return median(own), median(entitled)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="write the section of docs/benchmarks.md")
    parser.add_argument("--engine-only", action="store_true", help="the engine rows only (no server processes)")
    args = parser.parse_args()
    if args.engine_only:
        plain, rules, filtered = engine_check_cost()
        own, entitled = engine_filter_cost()
        print(f"engine: unrestricted {plain:,.0f} publishes/s, 1,000 rules {rules:,.0f} ({100 * rules / plain:.1f}%), "
              f"1,000 rules and an entitlement filter {filtered:,.0f} ({100 * filtered / plain:.1f}%)")
        print(f"fan-out: own filter {own:,.0f} msg/s, entitlement filter {entitled:,.0f} msg/s "
              f"({100 * entitled / own:.1f}%)")
        return
    n = args.messages
    kinds = {"plain": (False, False), "tls": (True, False), "rules": (False, True)}
    results: dict[str, dict[str, list[float]]] = {k: {"pub": [], "drain": [], "pub_cpu": [], "drain_cpu": []}
                                                  for k in kinds}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        workdir = Path(tmp)
        ca_file = _prepare(workdir)
        for run in range(args.runs):
            for kind, (tls, auth) in kinds.items():
                proc, uri = _start(workdir / f"{kind}-{run}", tls=tls, auth=auth)
                try:
                    pub, drain, pub_cpu, drain_cpu = uvloop.run(_run(uri, n, ca_file, auth, proc.pid))
                finally:
                    proc.terminate()
                    proc.wait(timeout=60)
                for key, value in (("pub", pub), ("drain", drain), ("pub_cpu", pub_cpu), ("drain_cpu", drain_cpu)):
                    results[kind][key].append(value)
                print(f"run {run + 1} {kind}: publish {pub:,.0f} msg/s ({pub_cpu:.1f} µs server CPU each), "
                      f"drain {drain:,.0f} msg/s ({drain_cpu:.1f} µs)", flush=True)
            loads.append(os.getloadavg()[0])
    engine_plain, engine_rules, engine_filtered = engine_check_cost()
    print(f"engine: unrestricted {engine_plain:,.0f} publishes/s, 1,000 rules {engine_rules:,.0f} publishes/s, "
          f"with an entitlement filter {engine_filtered:,.0f}")
    fan_own, fan_entitled = engine_filter_cost()

    def med(kind: str, key: str) -> float:
        return median(results[kind][key])

    def pct(kind: str, key: str) -> str:
        return f"{100 * med(kind, key) / med('plain', key):.0f}%"

    def cpu_pct(kind: str, key: str) -> str:
        """Messages per server CPU second, against plaintext (higher is better)."""
        return f"{100 * med('plain', key) / med(kind, key):.0f}%"

    def row(kind: str, label: str) -> str:
        return (f"| {label} | {med(kind, 'pub'):,.0f} | {med(kind, 'drain'):,.0f} | {pct(kind, 'pub')} | "
                f"{pct(kind, 'drain')} | {med(kind, 'pub_cpu'):.1f} / {med(kind, 'drain_cpu'):.1f} | "
                f"{cpu_pct(kind, 'pub_cpu')} / {cpu_pct(kind, 'drain_cpu')} |")

    table = "\n".join([
        "| transport | persisted publish (msg/s) | drain (msg/s) | publish vs plaintext | drain vs plaintext | "
        "server CPU µs per message: publish / drain | messages per server CPU second vs plaintext |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        row("plain", "tcp, no authentication"),
        row("tls", "tcps (TLS 1.3)"),
        row("rules", f"tcp, authenticated, {RULES:,} rules"),
        "",
        "| engine alone (`Engine.handle`, publish frames of 50) | publishes/s | vs unrestricted |",
        "| --- | ---: | ---: |",
        f"| unrestricted (no authentication) | {engine_plain:,.0f} | 100% |",
        f"| authenticated, {RULES:,} rules | {engine_rules:,.0f} | {100 * engine_rules / engine_plain:.1f}% |",
        f"| authenticated, {RULES:,} rules and an entitlement filter | {engine_filtered:,.0f} | "
        f"{100 * engine_filtered / engine_plain:.1f}% |",
        "",
        "| engine alone, fan-out to one subscriber that gets half | messages/s | vs its own filter |",
        "| --- | ---: | ---: |",
        f"| unrestricted, its own filter `{EU}` | {fan_own:,.0f} | 100% |",
        f"| authenticated, entitlement filter `{EU}` | {fan_entitled:,.0f} | {100 * fan_entitled / fan_own:.1f}% |",
    ])
    print(table)
    if args.write:
        body = f"""Command: `.venv/bin/python -m bench.bench_security --write` (`make bench` runs every suite).

One publisher, {n:,} messages of 256 bytes, pipelined, waiting until every publish is
persisted; then one subscriber drains them all from the start of the log (a bookmark
replay). Each measurement against a fresh server process on loopback, the three kinds
interleaved in each of {args.runs} runs (medians). The authenticated user's grant holds
{RULES:,} rules ({RULES // 4} literal topics and {RULES // 4} regexes, for publish and
replay each; the one allowing the benchmark topic last); decisions are cached per user
and topic, so the hot path pays one dictionary lookup. The engine rows run
`Engine.handle` in this process (no sockets, no disk), CPU time, median of 21 interleaved
runs of 50,000 publishes.
The server CPU columns read the server process's CPU time (`/proc/PID/stat`) around
each phase: what a message costs the server, steadier than wall time on a shared
machine. Targets: TLS at least 70% of plaintext; entitlement checks under 5%.

Machine: {machine()}; commit {git_rev()}. Shared with other work: 1-minute load average
{min(loads):.1f} to {max(loads):.1f} during the runs, so single runs vary widely; compare
the medians, and the engine rows for the check alone.

{table}
"""
        write_section("Security: TLS and entitlement checks", body)


if __name__ == "__main__":
    main()
