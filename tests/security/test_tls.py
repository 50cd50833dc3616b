"""TLS on real servers, with certificates made in the test (trustme): tcps clients (the
blocking, asyncio and RPC clients), mutual TLS as authentication, a wrong CA, expired
certificates, a plaintext client on a TLS port, reloaded certificates, and replication
over TLS with and without credentials."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import time
from pathlib import Path

import pytest

from conveyor import errors
from conveyor.client import AsyncClient, Client
from conveyor.client.rpc import RpcClient
from conveyor.protocol import messages as m
from tests.security.helpers import CHEAP, Pki, instance_config, make_users, pki, tls_elements  # noqa: F401 (pki: a fixture)
from tests.security.raw import Closed, Raw
from tests.serverproc import ServerProcess

def server_config(directory: Path, pki: Pki) -> Path:
    users = make_users(directory / "users", {"alice": "alice-pw", "bob": "bob-pw"})
    # The live certificate files the server reloads: copies the tests may replace.
    cert, key = directory / "live.pem", directory / "live.key"
    cert.write_bytes(pki.server[0].read_bytes())
    key.write_bytes(pki.server[1].read_bytes())
    path = directory / "config.xml"
    path.write_text(f"""<AMPSConfig><Name>tls-test</Name>
      <Transports>
        <Transport><Name>secure</Name><Type>tcps</Type><InetAddr>127.0.0.1:0</InetAddr>
          {tls_elements(pki, (cert, key))}</Transport>
        <Transport><Name>plain</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr></Transport>
      </Transports>
      <TransactionLog><JournalDirectory>{directory / 'journal'}</JournalDirectory>
        <Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
      <Authentication><UsersFile>{users}</UsersFile><ClientCertificates>true</ClientCertificates></Authentication>
      <Entitlement><Grant><User>alice</User><User>bob</User><Publish>orders</Publish><Replay>orders</Replay>
        <Transactions>true</Transactions></Grant></Entitlement>
    </AMPSConfig>""")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, pki):
    directory = tmp_path_factory.mktemp("tls")
    s = ServerProcess(server_config(directory, pki)).start()
    s.directory = directory
    s.tls_port, s.plain_port = s.ports
    yield s
    s.stop()


def tcps(server, user: str = "", password: str = "", **query) -> str:
    auth = f"{user}:{password}@" if user else ""
    q = "&".join(f"{k}={v}" for k, v in query.items())
    return f"tcps://{auth}127.0.0.1:{server.tls_port}" + (f"?{q}" if q else "")


def recorded(server) -> list[bytes]:
    with Client("reader", user_id="bob", password="bob-pw").connect(f"tcp://127.0.0.1:{server.plain_port}") as c:
        sub = c.subscribe("orders", bookmark="0")
        out = []
        while (msg := sub.get(timeout=2)) is not None:
            out.append(msg.data)
        return out


def test_a_tcps_client_with_a_password(server, pki):
    with Client("tls-1").connect(tcps(server, "alice", "alice-pw", ca_file=pki.ca_file)) as c:
        c.publish("orders", b'{"over": "tls"}')
        c.flush()
    assert b'{"over": "tls"}' in recorded(server)


def test_the_asyncio_client_over_tls(server, pki):
    async def run():
        client = AsyncClient("tls-async", user_id="alice", password="alice-pw", ca_file=str(pki.ca_file))
        await client.connect(tcps(server))
        await client.publish("orders", b'{"over": "asyncio tls"}')
        await client.flush()
        await client.disconnect()

    asyncio.run(run())
    assert b'{"over": "asyncio tls"}' in recorded(server)


def test_the_rpc_client_over_tls(server, pki):
    rpc = RpcClient(tcps(server), client_name="tls-rpc", user_id="alice", password="alice-pw", ca_file=str(pki.ca_file))
    rpc.stage("t", "orders", [b'{"over": "rpc tls"}'])
    assert rpc.commit_txn("sink/q", 1, ["t"])[0] == "published"
    rpc.close()


def test_a_client_certificate_authenticates_without_a_password(server, pki):
    uri = tcps(server, ca_file=pki.ca_file, cert_file=pki.alice[0], key_file=pki.alice[1])
    with Client("by-cert").connect(uri) as c:
        c.publish("orders", b'{"by": "certificate"}')
        c.flush()
    server.wait_log("authenticated as 'alice'")
    # a logon that names another user than its certificate is refused
    ctx = ssl.create_default_context(cafile=pki.ca_file)
    ctx.load_cert_chain(*pki.alice)
    raw = Raw(server.tls_port, tls=ctx)
    assert raw.logon("cert-bob", "bob", None).code == "not_authenticated"


def test_a_wrong_ca_is_refused_on_both_sides(server, pki):
    with pytest.raises(errors.ConnectionLost, match="certificate was refused"):
        Client("wrong-ca", reconnect=False).connect(tcps(server, "alice", "alice-pw", ca_file=pki.other_ca_file))
    _refused_with(server, pki, pki.stranger)  # a client certificate from another CA


def test_an_expired_client_certificate_is_refused(server, pki):
    _refused_with(server, pki, pki.expired_alice)


def _refused_with(server, pki, cert: tuple[Path, Path]) -> None:
    """The handshake fails with this client certificate (on TLS 1.3 the client learns it
    when it reads)."""
    ctx = ssl.create_default_context(cafile=pki.ca_file)
    ctx.load_cert_chain(*cert)
    with pytest.raises(Closed):
        Raw(server.tls_port, tls=ctx).logon("refused", None, None)


def test_a_plaintext_client_on_the_tls_port(server, pki):
    with pytest.raises((errors.ConnectionLost, errors.TimedOut)):
        Client("plain-on-tls", reconnect=False, user_id="alice", password="alice-pw", timeout=5).connect(
            f"tcp://127.0.0.1:{server.tls_port}")
    with socket.create_connection(("127.0.0.1", server.tls_port), timeout=10) as sock:
        sock.sendall(m_frame := b"\x00\x00\x00\x05hello")
        assert not sock.recv(100).startswith(m_frame[:4])  # no conveyor frame comes back
    # and the server goes on serving TLS clients
    raw = Raw(server.tls_port, tls=ssl.create_default_context(cafile=pki.ca_file))
    assert raw.logon("after", "alice", "alice-pw").status == "success"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tls_below_1_2_is_refused(server, pki):
    ctx = ssl.create_default_context(cafile=pki.ca_file)
    ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    try:
        ctx.set_ciphers("ALL:@SECLEVEL=0")
    except ssl.SSLError:
        pass
    with pytest.raises((ssl.SSLError, OSError)):
        with socket.create_connection(("127.0.0.1", server.tls_port), timeout=10) as sock:
            ctx.wrap_socket(sock, server_hostname="127.0.0.1")


def test_certificates_reload_on_sighup_and_an_expired_one_is_refused(server, pki):
    live_cert, live_key = server.directory / "live.pem", server.directory / "live.key"
    try:
        live_cert.write_bytes(pki.expired_server[0].read_bytes())
        live_key.write_bytes(pki.expired_server[1].read_bytes())
        os.kill(server.proc.pid, signal.SIGHUP)
        server.wait_log("TLS certificates of AMPSConfig/Transports/Transport[1] reloaded")
        with pytest.raises(errors.ConnectionLost, match="certificate has expired"):
            Client("sees-expired", reconnect=False).connect(tcps(server, "alice", "alice-pw", ca_file=pki.ca_file))
    finally:
        live_cert.write_bytes(pki.server[0].read_bytes())
        live_key.write_bytes(pki.server[1].read_bytes())
        os.kill(server.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + 20
    while True:  # the good certificate is back (the reload is asynchronous to this test)
        try:
            Client("sees-fresh", reconnect=False).connect(tcps(server, "alice", "alice-pw", ca_file=pki.ca_file)).disconnect()
            break
        except errors.ConnectionLost:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# --- replication over TLS ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




@pytest.mark.parametrize("credentials", [True, False], ids=["with credentials", "without credentials"])
def test_replication_over_tls(tmp_path, pki, credentials):
    port = _free_port()
    users = make_users(tmp_path / "users", {"repl": "repl-pw", "reader": "r"})
    dest = ServerProcess(instance_config(
        tmp_path / "B", "B",
        incoming=f"<Transport><Name>repl</Name><Type>amps-replication-secure</Type>"
                 f"<InetAddr>127.0.0.1:{port}</InetAddr>{tls_elements(pki, client_certificates='none')}</Transport>",
        auth=f"<Authentication><UsersFile>{users}</UsersFile></Authentication><Entitlement>"
             "<Grant><User>repl</User><Replicate>true</Replicate></Grant>"
             "<Grant><User>reader</User><Replay>orders</Replay></Grant></Entitlement>",
    )).start()
    creds = "<User>repl</User><Password>${REPL_PASSWORD}</Password>" if credentials else ""
    source = ServerProcess(instance_config(
        tmp_path / "A", "A",
        destination=f"<Destination><Name>B</Name><SyncType>sync</SyncType><Transport>"
                    f"<Type>amps-replication-secure</Type><InetAddr>127.0.0.1:{port}</InetAddr>"
                    f"<CAFile>{pki.ca_file}</CAFile>{creds}</Transport>"
                    "<Topic><Name>orders</Name><MessageType>json</MessageType></Topic></Destination>",
    ), env={"REPL_PASSWORD": "repl-pw"}).start()
    try:
        if credentials:
            with Client("pub") .connect(source.uri) as c:
                for i in range(3):
                    c.publish("orders", f'{{"i": {i}}}'.encode())
                c.flush()  # sync: persisted on B too
            with Client("reader", user_id="reader", password="r").connect(dest.uri) as c:
                sub = c.subscribe("orders", bookmark="0")
                got = [sub.get(timeout=10) for _ in range(3)]
            assert [g.data for g in got] == [f'{{"i": {i}}}'.encode() for i in range(3)]
            dest.wait_log("replication from A (127.0.0.1:")
            assert "repl-pw" not in source.log + dest.log
        else:
            dest.wait_log("replication from A", timeout=30)
            source.wait_log("REFUSED by the destination: logon refused: bad user name or password", timeout=30)
    finally:
        source.stop()
        dest.stop()
