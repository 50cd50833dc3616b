"""Logon on a real server with Authentication: without, with wrong and with right
credentials; the borrowed-identity attacks; the name-in-use rule with authenticated users;
failed logons rate-limited per address (wrong answers late, right ones never refused);
reloads of the users file and the entitlements."""

from __future__ import annotations

import os
import signal
import time

import pytest

from conveyor import errors
from conveyor.client import Client
from conveyor.client.rpc import RpcClient
from conveyor.protocol import messages as m
from tests.security.helpers import make_users, secure_config, start
from tests.security.raw import Raw

USERS = {"alice": "alice-pw", "mallory": "mallory-pw", "auditor": "auditor-pw"}
GRANTS = """
<Group><Name>apps</Name><Member>alice</Member><Member>mallory</Member></Group>
<Grant><Group>apps</Group><Publish>jobs</Publish><Consume>Jobs</Consume><Acknowledge>Jobs</Acknowledge>
  <Transactions>true</Transactions></Grant>
<Grant><User>auditor</User><Replay>.*</Replay><Sow>.*</Sow></Grant>
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("logon")
    s = start(secure_config(directory, users=USERS, grants=GRANTS))
    s.directory = directory
    yield s
    s.stop()


def client(server, name: str, user: str | None = None, password: str | None = None, **kw) -> Client:
    return Client(name, user_id=user, password=password, **kw).connect(server.uri)


def publish(c: Client, key: str, numbers: range) -> None:
    for i in numbers:
        c.publish("jobs", f'{{"{key}": {i}}}'.encode())
    c.flush()


def recorded(server, topic: str = "jobs") -> list[bytes]:
    """Every message recorded on ``topic``, replayed by the auditor."""
    with client(server, f"audit-{time.monotonic_ns()}", "auditor", USERS["auditor"]) as c:
        sub = c.subscribe(topic, bookmark="0")
        out = []
        while (msg := sub.get(timeout=2)) is not None:
            out.append(msg.data)
        return out


# --- credentials ---------------------------------------------------------------------------


def test_no_credentials_are_refused_and_logged(server):
    with pytest.raises(errors.NotAuthenticated, match="bad user name or password"):
        client(server, "anon", reconnect=False)
    server.wait_log("logon refused from 127.0.0.1:")


def test_a_wrong_password_is_refused_and_the_connection_closed(server):
    raw = Raw(server.port)
    ack = raw.logon("w", "alice", "not-her-password")
    assert (ack.status, ack.code) == ("failure", "not_authenticated")
    assert "alice-pw" not in server.log and "not-her-password" not in server.log
    assert raw.closed()
    server.wait_log("(client 'w', user 'alice'): wrong password")


def test_an_unknown_user_gets_the_same_answer(server):
    raw = Raw(server.port)
    assert raw.logon("u", "nobody-here", "x").reason == "logon refused: bad user name or password"


def test_right_credentials_from_arguments_uri_and_environment(server, monkeypatch):
    with client(server, "by-args", "alice", USERS["alice"]) as c:
        c.publish("jobs", b'{"by": "args"}')
        c.flush()
    uri = server.uri.replace("tcp://", "tcp://alice:alice-pw@")
    with Client("by-uri").connect(uri) as c:
        c.publish("jobs", b'{"by": "uri"}')
        c.flush()
        assert "alice-pw" not in repr(c.statistics()) and "alice-pw" not in str(c.core.servers)
    monkeypatch.setenv("CONVEYOR_USER", "alice")
    monkeypatch.setenv("CONVEYOR_PASSWORD", USERS["alice"])
    with client(server, "by-env") as c:
        c.publish("jobs", b'{"by": "env"}')
        c.flush()
    assert "alice-pw" not in server.log


def test_the_rpc_client_logs_on_with_credentials(server):
    uri = server.uri.replace("tcp://", "tcp://alice:alice-pw@")
    rpc = RpcClient(uri, client_name="rpc-alice")
    assert rpc.abort_txn(["nothing"]) == 0
    rpc.close()
    assert "alice-pw" not in repr(rpc.servers)
    with pytest.raises(errors.NotAuthenticated):
        RpcClient(server.uri.replace("tcp://", "tcp://alice:wrong@"), client_name="rpc-bad").abort_txn(["x"])


def test_a_publish_the_user_may_not_make_fails_the_flush_and_is_not_recorded(server):
    with client(server, "pub-secret", "alice", USERS["alice"]) as c:
        c.publish("secret", b'{"stolen": true}')
        with pytest.raises(errors.NotEntitled, match="publish on 'secret'"):
            c.flush()
        c.publish("jobs", b'{"after": "refusal"}')
        c.flush()  # the client goes on
    assert b'{"stolen": true}' not in recorded(server, "secret")


# --- identities nobody can borrow -------------------------------------------------------------


def test_a_transaction_commit_cannot_burn_another_clients_sequence_numbers(server):
    """The attack: commit_txn under the victim's publisher name with a huge sequence
    number, so that the victim's next publishes were acknowledged as duplicates and
    dropped. The commit now lands in mallory's own namespace of transaction publishers."""
    victim = client(server, "payments", "alice", USERS["alice"])
    publish(victim, "payment", range(5))
    rpc = RpcClient(server.uri.replace("tcp://", "tcp://mallory:mallory-pw@"), client_name="mallory-rpc")
    rpc.stage("t1", "jobs", [b'{"payment": "forged"}'])
    outcome, _ = rpc.commit_txn("payments", 10**12, ["t1"])
    assert outcome == "published"  # in mallory's namespace: harmless to alice
    rpc.close()
    publish(victim, "payment", range(5, 10))
    victim.disconnect()
    mine = [d for d in recorded(server) if d.startswith(b'{"payment": ') and b"forged" not in d]
    assert mine == [f'{{"payment": {i}}}'.encode() for i in range(10)]


def test_another_users_logon_cannot_take_a_client_name(server):
    victim = client(server, "orders-app", "alice", USERS["alice"])
    publish(victim, "order", range(3))
    raw = Raw(server.port)
    ack = raw.logon("orders-app", "mallory", USERS["mallory"])
    assert (ack.status, ack.code) == ("failure", "name_in_use")
    assert raw.closed()
    publish(victim, "order", range(3, 6))  # the victim was not disconnected
    victim.disconnect()
    # Offline, the name is free: mallory takes it and publishes a huge sequence number...
    raw = Raw(server.port)
    assert raw.logon("orders-app", "mallory", USERS["mallory"]).status == "success"
    assert raw.call(m.Publish(topic="jobs", data=b'{"order": "forged"}', seq=10**12, cid="f",
                              ack_type="processed")).status == "success"
    raw.close()
    # ...which burns nothing of alice's: her publisher id is hers alone.
    victim = client(server, "orders-app", "alice", USERS["alice"])
    publish(victim, "order", range(6, 9))
    victim.disconnect()
    orders = [d for d in recorded(server) if d.startswith(b'{"order": ') and b"forged" not in d]
    assert orders == [f'{{"order": {i}}}'.encode() for i in range(9)]


def test_the_same_user_replaces_its_old_connection_which_is_told_why(server):
    old = client(server, "worker-1", "alice", USERS["alice"])
    new = client(server, "worker-1", "alice", USERS["alice"])
    deadline = time.monotonic() + 20
    while old._aio.error is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert isinstance(old._aio.error, errors.ClientReplaced), old._aio.error
    assert "taken over by a newer connection" in str(old._aio.error)
    new.publish("jobs", b'{"still": "working"}')
    new.flush()  # the old one did not reconnect and take the name back
    new.disconnect()
    old.disconnect()


# --- rate limit ----------------------------------------------------------------------------------


def test_failed_logons_are_rate_limited_per_address(tmp_path):
    """Over the limit, wrong passwords are answered late; the right one is never refused
    (more in tests/security/test_failed_logons.py)."""
    s = start(secure_config(tmp_path, users={"alice": "a"}, grants="<Grant><User>alice</User><Publish>x</Publish></Grant>",
                            limits="<MaxFailedLogonsPerAddress>3</MaxFailedLogonsPerAddress>"
                                   "<FailedLogonWindow>1h</FailedLogonWindow>"))
    try:
        answers = []
        for _ in range(4):
            raw = Raw(s.port)
            answers.append(raw.logon("guess", "alice", "guess").reason)
            raw.close()
        assert answers[:3] == ["logon refused: bad user name or password"] * 3
        assert "too many failed logons for this user or from this address" in answers[3]
        # the right password gets through: the limit slows guessers, it locks nobody out
        assert Raw(s.port).logon("alice-late", "alice", "a").status == "success"
        s.wait_log("is over MaxFailedLogonsPerAddress")
    finally:
        s.stop()


# --- reloads ---------------------------------------------------------------------------------------


def test_users_removed_from_the_file_are_disconnected_and_refused(tmp_path):
    config = secure_config(tmp_path, users={"alice": "a", "bob": "b"},
                           grants="<Grant><User>alice</User><User>bob</User><Publish>jobs</Publish></Grant>")
    s = start(config)
    try:
        bob = Raw(s.port)
        assert bob.logon("bob-1", "bob", "b").status == "success"
        make_users(tmp_path / "users", {"alice": "a"})
        os.kill(s.proc.pid, signal.SIGHUP)
        assert bob.closed()
        s.wait_log("user 'bob' was removed from the users file")
        assert Raw(s.port).logon("bob-2", "bob", "b").code == "not_authenticated"
        assert Raw(s.port).logon("alice-1", "alice", "a").status == "success"
    finally:
        s.stop()


def test_entitlements_reload_without_a_restart(tmp_path):
    grants = "<Grant><User>alice</User><Publish>jobs</Publish><Consume>Jobs</Consume></Grant>"
    config = secure_config(tmp_path, users={"alice": "a"}, grants=grants)
    s = start(config)
    try:
        raw = Raw(s.port)
        assert raw.logon("a1", "alice", "a").status == "success"
        assert raw.call(m.Subscribe(topic="Jobs", cid="s1", ack_type="processed")).status == "success"
        assert raw.call(m.Publish(topic="secret", data=b"{}", cid="p1", ack_type="processed")).code == "not_entitled"
        text = config.read_text().replace("<Consume>Jobs</Consume>", "<Publish>secret</Publish>")
        config.write_text(text)
        os.kill(s.proc.pid, signal.SIGHUP)
        s.wait_log("entitlements reloaded")
        # the queue subscription it may no longer hold ended, with its connection
        assert raw.closed()
        s.wait_log("no longer entitled to consume Jobs")
        raw = Raw(s.port)
        assert raw.logon("a2", "alice", "a").status == "success"
        assert raw.call(m.Publish(topic="secret", data=b"{}", cid="p2", ack_type="processed")).status == "success"
        assert raw.call(m.Subscribe(topic="Jobs", cid="s2", ack_type="processed")).code == "not_entitled"
        config.write_text(text.replace("<Entitlement>", "<Entitlement><Bogus/>"))
        os.kill(s.proc.pid, signal.SIGHUP)
        s.wait_log("configuration NOT reloaded")
        assert raw.call(m.Publish(topic="secret", data=b"{}", cid="p3", ack_type="processed")).status == "success"
    finally:
        s.stop()
