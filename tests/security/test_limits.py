"""The limits that protect the server from one client (Limits), on real servers, and the
warning of a server that listens beyond loopback without authentication."""

from __future__ import annotations

import socket
import time

import pytest

from conveyor.protocol import messages as m
from tests.security.helpers import secure_config, start
from tests.security.raw import Raw
from tests.serverproc import ServerProcess, write_config

LIMITS = """
<MaxConnections>6</MaxConnections>
<MaxConnectionsPerUser>2</MaxConnectionsPerUser>
<MaxSubscriptionsPerConnection>2</MaxSubscriptionsPerConnection>
<MaxTopicLength>16</MaxTopicLength>
<MaxPendingLogons>2</MaxPendingLogons>
<LogonTimeout>2s</LogonTimeout>
"""
GRANTS = "<Grant><User>alice</User><User>bob</User><Publish>.*</Publish><Subscribe>.*</Subscribe></Grant>"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start(secure_config(tmp_path_factory.mktemp("limits"), users={"alice": "a", "bob": "b"}, grants=GRANTS,
                            limits=LIMITS))
    yield s
    s.stop()


def logged_on(server, name: str, user: str = "alice", password: str = "a") -> Raw:
    raw = Raw(server.port)
    ack = raw.logon(name, user, password)
    assert ack.status == "success", ack
    return raw


def test_subscriptions_per_connection(server):
    raw = logged_on(server, "subs")
    for i in range(2):
        assert raw.call(m.Subscribe(topic=f"t{i}", cid=f"s{i}", ack_type="processed")).status == "success"
    ack = raw.call(m.Subscribe(topic="t9", cid="s9", ack_type="processed"))
    assert (ack.code, ack.details["limit"]) == ("limit_exceeded", "MaxSubscriptionsPerConnection")
    raw.close()


def test_topic_name_length(server):
    raw = logged_on(server, "topics")
    ack = raw.call(m.Publish(topic="x" * 17, data=b"{}", cid="p", ack_type="processed"))
    assert (ack.code, ack.details["limit"]) == ("limit_exceeded", "MaxTopicLength")
    ack = raw.call(m.Subscribe(topic="y" * 17, cid="s", ack_type="processed"))
    assert ack.code == "limit_exceeded"
    assert raw.call(m.Publish(topic="x" * 16, data=b"{}", cid="q", ack_type="processed")).status == "success"
    raw.close()


def test_connections_per_user(server):
    first, second = logged_on(server, "per-user-1", "bob", "b"), logged_on(server, "per-user-2", "bob", "b")
    raw = Raw(server.port)
    ack = raw.logon("per-user-3", "bob", "b")
    assert (ack.code, ack.details["limit"]) == ("limit_exceeded", "MaxConnectionsPerUser")
    assert raw.closed()
    second.close()
    server.wait_log("closing connection")
    deadline = time.monotonic() + 10
    while True:  # once the server saw the close, a third logon fits again
        raw = Raw(server.port)
        if raw.logon("per-user-3", "bob", "b").status == "success" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert raw.call(m.Flush(cid="f", ack_type="processed")).status == "success"
    first.close()
    raw.close()


def test_pending_logons_and_logon_timeout(server):
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
    time.sleep(0.5)  # the server registers them (they send nothing)
    third = Raw(server.port)
    assert third.closed()  # over MaxPendingLogons: closed at once
    server.wait_log("too many connections waiting to log on")
    for sock in idle:  # and the two silent ones are closed after LogonTimeout
        sock.settimeout(20)
        assert sock.recv(10) == b""
    server.wait_log("no logon within 2 s (Limits/LogonTimeout)")
    logged_on(server, "after-timeout").close()


def test_connections_in_total(tmp_path):
    s = start(secure_config(tmp_path, users={"alice": "a"}, grants=GRANTS, limits="<MaxConnections>2</MaxConnections>"))
    try:
        a, b = logged_on(s, "c1"), logged_on(s, "c2")
        assert Raw(s.port).closed()
        s.wait_log("too many connections: the server holds 2 (Limits/MaxConnections 2)")
        a.close()
        b.close()
    finally:
        s.stop()


def test_a_non_loopback_listener_without_authentication_is_a_warning(tmp_path):
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace("<InetAddr>127.0.0.1:0</InetAddr>", "<InetAddr>0.0.0.0:0</InetAddr>"))
    s = ServerProcess(config).start()
    try:
        s.wait_log("SECURITY WARNING: transport tcp listens on 0.0.0.0")
    finally:
        s.stop()
    (tmp_path / "lo").mkdir()
    loopback = ServerProcess(write_config(tmp_path / "lo")).start()
    try:
        assert "SECURITY WARNING" not in loopback.log
    finally:
        loopback.stop()
