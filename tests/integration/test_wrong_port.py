"""The wrong port fails at once, both ways (issue 34, item 7): HTTP sent to a client
port is answered 400 with what the port is and where the admin interface is; a client
given the admin (HTTP) port says so instead of waiting 10 s. Every wait here is bounded
below the old 10 s hang (``WAIT_S``), so the old behaviour fails rather than passes late."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from conveyor import Client, errors
from tests.serverproc import REPO, ServerProcess, write_config

WAIT_S = 8.0


def conveyor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conveyor", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=WAIT_S)


def exchange(port: int, *chunks: bytes) -> bytes:
    """Send ``chunks`` (one send each) and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        for chunk in chunks:
            sock.sendall(chunk)
        out = b""
        while (data := sock.recv(65536)):
            out += data
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module: the tests only probe it (and publish one message)."""
    proc = ServerProcess(write_config(tmp_path_factory.mktemp("wrong-port"), recorded="Work", admin=True)).start()
    yield proc
    proc.kill()


def test_an_http_request_on_the_client_port_gets_a_400_naming_the_port_and_the_admin_interface(server):
    out = exchange(server.port, b"GET /amps/instance HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 400 Bad Request"
    assert "Connection: close" in lines and "Content-Type: text/plain; charset=utf-8" in lines
    assert f"Content-Length: {len(body)}" in lines
    first = body.decode().splitlines()[0]
    assert first == (f"this is conveyor's client port ({server.port}), which speaks conveyor's binary protocol, "
                     f"not HTTP: the admin interface is at {server.admin_url}")
    server.wait_log("an HTTP request on the client port ('GET /amps/instance HTTP/1.1'): answered 400")


def test_a_request_line_split_across_sends_and_a_head_request_are_told_apart_too(server):
    out = exchange(server.port, b"P", b"OS", b"T /x HTTP/1.1\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"conveyor's client port" in out
    head = exchange(server.port, b"HEAD / HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n") and head.endswith(b"\r\n\r\n")  # no body
    # and the port still serves conveyor's clients
    with Client("after-http").connect(server.uri) as client:
        client.publish("Work", {"n": 1})
        client.flush(timeout=WAIT_S)


def test_without_an_admin_interface_the_answer_says_so(server_factory):
    server = server_factory(recorded="Work")
    out = exchange(server.port, b"GET / HTTP/1.0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400") and b"this server has no admin interface" in out


def test_the_cli_given_the_client_port_as_the_admin_address_fails_at_once_with_one_line(server):
    proc = conveyor("stats", "--admin", f"http://127.0.0.1:{server.port}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"conveyor: http://127.0.0.1:{server.port}/amps/instance: this is conveyor's client port ({server.port}), "
        f"which speaks conveyor's binary protocol, not HTTP: the admin interface is at {server.admin_url} (HTTP 400)"]


@pytest.mark.parametrize("which", ["client", "admin"])
def test_the_cli_given_an_https_address_of_a_port_without_tls_fails_at_once_saying_so(server, which):
    """https:// to the client port or to a plain-HTTP admin port: one line that says the
    port does not speak TLS (not the SSL library's "wrong version number")."""
    port = server.port if which == "client" else int(server.admin_url.rsplit(":", 1)[1])
    proc = conveyor("stats", "--admin", f"https://127.0.0.1:{port}")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [
        f"conveyor: cannot reach the admin interface at https://127.0.0.1:{port}: that port does not speak TLS (an "
        "admin interface without <Certificate> is http://, and conveyor's client port is not the admin port: set "
        "CONVEYOR_ADMIN or --admin to the admin interface's address)"]


def test_the_cli_given_the_admin_port_as_the_server_fails_at_once_with_one_line(server):
    admin_port = server.admin_url.rsplit(":", 1)[1]
    proc = conveyor("publish", "Work", "x", "--server", f"tcp://127.0.0.1:{admin_port}")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.splitlines() == [
        f"conveyor: tcp://127.0.0.1:{admin_port} answered in HTTP: that is an HTTP port (the admin interface?), "
        "not conveyor's client port"]


def test_the_clients_given_the_admin_port_raise_connection_lost_saying_so(server):
    from conveyor.client.rpc import RpcClient

    admin = "tcp://" + server.admin_url.removeprefix("http://")
    with pytest.raises(errors.ConnectionLost, match="answered in HTTP: that is an HTTP port"):
        Client("wrong-port", timeout=WAIT_S).connect(admin)
    # with a list, the next server is tried, as for any server that does not answer
    with Client("wrong-port-first", timeout=WAIT_S).connect([admin, server.uri]) as client:
        assert client.state == "connected"
    with RpcClient(admin, timeout=WAIT_S) as rpc, pytest.raises(errors.ConnectionLost, match="answered in HTTP"):
        rpc.head("Work")


def test_the_admin_port_answers_a_request_that_is_not_http_at_once(server):
    admin_port = int(server.admin_url.rsplit(":", 1)[1])
    out = exchange(admin_port, b"\x00\x00\x00\x10 not a request line")
    assert out.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"not an HTTP request" in out
