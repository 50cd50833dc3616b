"""Issue 2: bad input gets a clear error and the server keeps serving other clients."""

import socket
import subprocess
import sys

import msgspec
import pytest

from conveyor import Client, errors
from conveyor.protocol import MessageDecoder, encode_frame
from conveyor.protocol import messages as m


class Raw:
    """A hand-driven connection for sending arbitrary bytes."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.decoder = MessageDecoder()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frame(self, obj) -> None:
        body = msgspec.msgpack.encode(obj)
        self.send(len(body).to_bytes(4, "big") + body)

    def read(self, count: int = 1) -> list:
        out = []
        while len(out) < count:
            data = self.sock.recv(65536)
            assert data, "server closed the connection"
            self.decoder.receive_data(data)
            out.extend(self.decoder.next_items())
        return out


@pytest.fixture
def server(server_factory):
    return server_factory(recorded="t")


def assert_still_serving(server):
    with Client("healthy").connect(server.uri) as client:
        client.publish("t", {"ok": 1})
        client.flush()


def test_malformed_frame_gets_protocol_error_and_connection_stays(server):
    raw = Raw(server.port)
    raw.send(b"\x00\x00\x00\x04\xc1\xc1\xc1\xc1")
    (ack,) = raw.read()
    assert ack.status == "failure" and ack.code == "protocol_error"
    raw.frame([{"c": "flush", "cid": "f1", "a": "processed"}])
    (ack,) = raw.read()
    assert ack.cid == "f1" and ack.status == "success"
    assert_still_serving(server)


def test_deeply_nested_frame_gets_protocol_error_and_connection_stays(server):
    raw = Raw(server.port)
    body = b"\x91" * 1000 + b"\xc0"
    raw.send(len(body).to_bytes(4, "big") + body)
    (ack,) = raw.read()
    assert ack.status == "failure" and ack.code == "protocol_error" and "nested" in ack.reason
    raw.frame([{"c": "flush", "cid": "f1", "a": "processed"}])
    (ack,) = raw.read()
    assert ack.cid == "f1" and ack.status == "success"
    assert "Traceback" not in server.log
    assert_still_serving(server)


def test_unknown_command_names_it(server):
    raw = Raw(server.port)
    raw.frame([{"c": "launch_missiles", "cid": "7"}])
    (ack,) = raw.read()
    assert ack.code == "unknown_command" and "launch_missiles" in ack.reason and ack.cid == "7"


def test_missing_required_field(server):
    raw = Raw(server.port)
    raw.frame([{"c": "publish", "cid": "1"}])
    (ack,) = raw.read()
    assert ack.code == "protocol_error" and "`t`" in ack.reason


def test_oversized_frame_refused_before_buffering(server_factory):
    server = server_factory(recorded="t", transport_extra="<MaxFrameSize>64K</MaxFrameSize>")
    raw = Raw(server.port)
    raw.send(encode_frame([m.Logon(client_name="big")]))
    raw.read()
    raw.send(encode_frame([m.Publish(topic="t", data=b"x" * 200_000)]))
    (ack,) = raw.read()
    assert ack.code == "frame_too_large" and "65536" in ack.reason
    raw.send(encode_frame([m.Flush(cid="after", ack_type="processed")]))
    (ack,) = raw.read()
    assert ack.cid == "after" and ack.status == "success"
    assert_still_serving(server)


def test_unknown_option_is_refused_with_the_supported_list(server):
    with Client("c").connect(server.uri) as client:
        with pytest.raises(errors.UnknownOption, match="max_backlog"):
            client.subscribe("t", options="max_backlgo=3")
        with pytest.raises(errors.InvalidOption):
            client.subscribe("t", options="max_backlog=lots")
        # the connection is still usable
        client.publish("t", {"n": 1})
        client.flush()


def test_second_logon_is_refused(server):
    raw = Raw(server.port)
    raw.send(encode_frame([m.Logon(client_name="once", cid="1", ack_type="processed")]))
    assert raw.read()[0].status == "success"
    raw.send(encode_frame([m.Logon(client_name="twice", cid="2", ack_type="processed")]))
    (ack,) = raw.read()
    assert ack.code == "already_logged_on"


def test_bad_bookmark(server):
    with Client("c").connect(server.uri) as client:
        with pytest.raises(errors.BadBookmark):
            client.subscribe("t", bookmark="yesterday")


def test_name_in_use_same_user_replaces_old_connection(server):
    raw1 = Raw(server.port)
    raw1.send(encode_frame([m.Logon(client_name="dup", cid="1", ack_type="processed", user_id="alice")]))
    raw1.read()
    raw2 = Raw(server.port)
    raw2.send(encode_frame([m.Logon(client_name="dup", cid="1", ack_type="processed", user_id="alice")]))
    assert raw2.read()[0].status == "success"
    raw1.sock.settimeout(5)
    (told,) = raw1.read()  # the old one is told why (client_replaced), then closed
    assert (told.status, told.code) == ("failure", "client_replaced")
    assert raw1.sock.recv(100) == b""
    server.wait_log("name in use")


def test_name_in_use_other_user_refuses_new_connection(server):
    raw1 = Raw(server.port)
    raw1.send(encode_frame([m.Logon(client_name="dup2", cid="1", ack_type="processed", user_id="alice")]))
    raw1.read()
    raw2 = Raw(server.port)
    raw2.send(encode_frame([m.Logon(client_name="dup2", cid="1", ack_type="processed", user_id="mallory")]))
    (ack,) = raw2.read()
    assert ack.code == "name_in_use"
    raw1.send(encode_frame([m.Flush(cid="still", ack_type="processed")]))
    assert raw1.read()[0].cid == "still"


def test_slow_consumer_is_disconnected_not_buffered(server_factory):
    server = server_factory(recorded="t", transport_extra="<SlowClientDisconnectThreshold>1M</SlowClientDisconnectThreshold>")
    slow = Raw(server.port)
    slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.send(encode_frame([m.Logon(client_name="slow"), m.Subscribe(topic="t", sub_id="s")]))
    with Client("fast").connect(server.uri) as client:
        for i in range(3000):
            client.publish("t", {"pad": "x" * 2000})  # JSON: the topic is recorded as json
        client.flush()
    server.wait_log("slow consumer")
    assert_still_serving(server)


def test_bad_config_refuses_to_start_with_path(tmp_path):
    cfg = tmp_path / "bad.xml"
    cfg.write_text("<AMPSConfig><SOW><Queue><Name>Q</Name><MessageType>json</MessageType><LeasePeriod>LastThursday</LeasePeriod></Queue></SOW></AMPSConfig>")
    proc = subprocess.run([sys.executable, "-m", "conveyor", "serve", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "LeasePeriod" in proc.stderr and "configuration error" in proc.stderr


def serve_with_address(tmp_path, address: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "listen.xml"
    cfg.write_text(
        "<AMPSConfig><Transports><Transport><Name>clients</Name><Type>tcp</Type>"
        f"<InetAddr>{address}</InetAddr><Protocol>amps</Protocol></Transport></Transports>"
        f"<TransactionLog><JournalDirectory>{tmp_path / 'journal'}</JournalDirectory></TransactionLog></AMPSConfig>"
    )
    return subprocess.run([sys.executable, "-m", "conveyor", "serve", "--config", str(cfg)], capture_output=True,
                          text=True, timeout=60)


def test_port_in_use_is_a_configuration_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = serve_with_address(tmp_path, f"127.0.0.1:{port}")
    assert proc.returncode == 2, proc.stderr
    assert "configuration error" in proc.stderr and "Transport[1]/InetAddr" in proc.stderr
    assert f"127.0.0.1:{port}" in proc.stderr and "in use" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_host_that_does_not_resolve_is_a_configuration_error(tmp_path):
    proc = serve_with_address(tmp_path, "no-such-host.invalid:9007")
    assert proc.returncode == 2, proc.stderr
    assert "configuration error" in proc.stderr and "Transport[1]/InetAddr" in proc.stderr
    assert "no-such-host.invalid" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_heartbeat_silence_closes_the_connection(server):
    """reference B.8: with a heartbeat started, a client that stops answering is cut."""
    raw = Raw(server.port)
    raw.send(encode_frame([m.Logon(client_name="hb"), m.Heartbeat(options="start,1")]))
    raw.sock.settimeout(10)
    received = b""
    while True:
        chunk = raw.sock.recv(65536)
        if not chunk:
            break
        received += chunk
    raw.decoder.receive_data(received)
    kinds = [type(x).__name__ for x in raw.decoder.next_items()]
    assert "ServerHeartbeat" in kinds
    server.wait_log("no heartbeat")
    assert_still_serving(server)


def test_idle_timeout_closes_silent_connections(server_factory):
    server = server_factory(recorded="t", transport_extra="<IdleTimeout>1s</IdleTimeout>")
    raw = Raw(server.port)
    raw.send(encode_frame([m.Logon(client_name="idle")]))
    raw.sock.settimeout(10)
    while raw.sock.recv(65536):
        pass
    server.wait_log("idle for")
