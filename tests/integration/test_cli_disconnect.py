"""An administrator's disconnect (``conveyor disconnect``, the admin interface's
``clients/ID/disconnect``) is final: the server tells the client why before it closes,
the client does not reconnect, and ``conveyor subscribe`` ends with one line and exit
code 4 (issue 34, item 6). An ordinary loss still reconnects (tests/client/test_failover.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request

import pytest

from conveyor import AsyncClient, Client, errors
from tests.serverproc import REPO

QUEUE = ("<Queue><Name>WorkToDo</Name><MessageType>json</MessageType><UnderlyingTopic>Work</UnderlyingTopic>"
         "</Queue>")
EXIT_DISCONNECTED = 4  # docs/cli.md, exit codes
CLI_TIMEOUT_S = 8.0  # below the old 10 s hangs: a test that hangs fails, it does not wait


def conveyor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conveyor", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=60)


def clients(server) -> dict:
    with urllib.request.urlopen(server.admin_url + "/api/clients", timeout=10) as resp:
        return json.loads(resp.read())


def wait_for(predicate, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)
    return value


def subscribed(server, name: str):
    """The admin interface's entry for client ``name`` once it holds a subscription."""
    return next((c for c in clients(server).values() if c["name"] == name and c["subscriptions"]), None)


def admin_disconnect(server, ident: str) -> dict:
    url = f"{server.admin_url}/amps/administrator/clients/{ident}/disconnect"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_cli_subscriber_ends_with_one_line_and_exit_code_4_after_conveyor_disconnect(server_factory):
    server = server_factory(recorded="Work", queues=QUEUE, admin=True)
    proc = subprocess.Popen([sys.executable, "-m", "conveyor", "subscribe", "WorkToDo", "--server", server.uri,
                             "--name", "worker-7"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        entry = wait_for(lambda: subscribed(server, "worker-7"))
        done = conveyor("disconnect", str(entry["id"]), "--admin", server.admin_url)
        assert done.returncode == 0, done.stderr
        out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_DISCONNECTED, err
    assert err.splitlines() == ["conveyor: disconnected by an administrator"]
    assert out == ""
    server.wait_log("disconnected by an administrator")
    assert server.log.count("logon: client 'worker-7'") == 1  # it did not come back under a new id


def test_the_library_client_raises_the_typed_error_and_does_not_reconnect(server_factory):
    server = server_factory(recorded="Work", queues=QUEUE, admin=True)
    client = Client("lib-worker").connect(server.uri)
    states = []
    client.on_state(lambda change: states.append((str(change.state), change.reason)))
    try:
        sub = client.subscribe("WorkToDo")
        wait_for(lambda: subscribed(server, "lib-worker"))
        assert admin_disconnect(server, "lib-worker")["client"] == "lib-worker"
        assert sub.get(timeout=CLI_TIMEOUT_S) is None  # the subscription ends...
        assert isinstance(sub.error, errors.DisconnectedByAdmin)  # ...saying why
        assert str(sub.error) == "disconnected by an administrator"
        # What it says is final: no reconnection (the state never went to reconnecting).
        assert states == [("disconnected", "disconnected by an administrator")]
        assert client.state == "disconnected" and client.statistics().reconnects == 0
        with pytest.raises(errors.DisconnectedByAdmin):
            client.publish("Work", {"n": 1})
        with pytest.raises(errors.DisconnectedByAdmin):
            client.flush(timeout=CLI_TIMEOUT_S)
        # Still a ConnectionLost, for code that handles every lost connection alike.
        with pytest.raises(errors.ConnectionLost):
            client.subscribe("WorkToDo")
    finally:
        client.disconnect()
    assert server.log.count("logon: client 'lib-worker'") == 1


def test_the_asyncio_client_ends_its_subscriptions_with_the_typed_error(server_factory):
    server = server_factory(recorded="Work", queues=QUEUE, admin=True)

    async def main() -> None:
        async with AsyncClient("async-worker") as client:
            await client.connect(server.uri)
            sub = await client.subscribe("WorkToDo")
            await asyncio.to_thread(wait_for, lambda: subscribed(server, "async-worker"))
            await asyncio.to_thread(admin_disconnect, server, "async-worker")
            assert await sub.get(timeout=CLI_TIMEOUT_S) is None
            assert isinstance(sub.error, errors.DisconnectedByAdmin)
            assert isinstance(client.error, errors.DisconnectedByAdmin)
            with pytest.raises(errors.DisconnectedByAdmin):
                await client.sow("WorkToDo")

    asyncio.run(main())


def test_the_server_says_why_before_it_closes(server_factory):
    """On the wire (docs/protocol.md, "Connection notices"): one ack without a command
    id, status failure, code disconnected_by_admin, then the end of the stream."""
    import socket

    from conveyor.protocol import messages as m
    from conveyor.protocol.codec import MessageDecoder, encode_frame

    server = server_factory(recorded="Work", queues=QUEUE, admin=True)
    with socket.create_connection(("127.0.0.1", server.port), timeout=CLI_TIMEOUT_S) as sock:
        sock.sendall(encode_frame([m.Logon(client_name="raw-worker", cid="1", ack_type="processed")]))
        decoder = MessageDecoder()
        items: list = []
        while not items:
            decoder.receive_data(sock.recv(65536))
            items += decoder.next_items()
        assert admin_disconnect(server, "raw-worker")["client"] == "raw-worker"
        while (data := sock.recv(65536)):
            decoder.receive_data(data)
            items += decoder.next_items()
    notices = [i for i in items if isinstance(i, m.Ack) and i.cid is None]
    assert [(n.status, n.code, n.reason) for n in notices] == [
        ("failure", "disconnected_by_admin", "disconnected by an administrator")]
