"""The failed-logon limit on real servers (docs/security.md, "Failed logons"): it counts
wrong credentials only, per client address and per user name, answers them late once
over the limit, and never refuses a correct credential: not a client's logon, not an
admin request's Basic credentials, not a replication link's, whatever an address that
hammers wrong passwords (and requests without credentials) does meanwhile.

Every address here is loopback: on Linux a socket may connect from any 127.x.y.z, which
stands for distinct clients. Over the limit a wrong answer comes after a backoff of
0.5 s doubling to 8 s, so the hammering runs on a few threads at once."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import pytest

from conveyor import Client
from conveyor.config.model import FAILED_LOGONS_PER_USER_MAX_DEFAULT
from conveyor.protocol import replication as p_repl
from conveyor.protocol.codec import encode_frame
from tests.integration.instances import free_port
from tests.security.helpers import fetch, instance_config, make_users, secure_config, start
from tests.security.raw import Raw
from tests.serverproc import ServerProcess

USERS = {"alice": "alice-pw", "bob": "bob-pw", "ops": "ops-pw"}
GRANTS = """
<Grant><User>alice</User><User>bob</User><Publish>jobs</Publish></Grant>
<Grant><User>ops</User><Admin>read</Admin></Grant>
"""
#: The old options only (MaxFailedLogonsPerUser keeps its default): three wrong
#: credentials from an address within the hour put it over the limit.
LIMITS = "<MaxFailedLogonsPerAddress>3</MaxFailedLogonsPerAddress><FailedLogonWindow>1h</FailedLogonWindow>"
BAD = "logon refused: bad user name or password"
TOO_MANY = "too many failed logons"


@pytest.fixture
def server(tmp_path):
    config = secure_config(tmp_path, users=USERS, grants=GRANTS, limits=LIMITS)
    config.write_text(config.read_text().replace(
        "</AMPSConfig>", "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin></AMPSConfig>"))
    s = start(config)
    assert s.admin_url, s.log
    yield s
    s.stop()




def logon(port: int, user: str | None, password: str | None, *, source: str | None = None,
          name: str = "guess") -> tuple[str, str | None]:
    raw = Raw(port, source=source)
    try:
        ack = raw.logon(name, user, password)
        return ack.status, ack.reason
    finally:
        raw.close()


class Hammer:
    """Threads that repeat ``attempts`` (wrong or missing credentials) until the block ends."""

    def __init__(self, attempts: list[Callable[[], object]], threads: int = 6) -> None:
        self.attempts = attempts
        self.stop = threading.Event()
        self.made = 0
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(threads)]

    def _run(self, k: int) -> None:
        """Thread ``k`` starts at the k-th attempt, so that every kind is under way at once."""
        while not self.stop.is_set():
            attempt = self.attempts[k % len(self.attempts)]
            k += 1
            try:
                attempt()
            except Exception as exc:  # noqa: BLE001 (reported at the end)
                self.errors.append(exc)
            with self._lock:
                self.made += 1

    def __enter__(self) -> Hammer:
        for t in self._threads:
            t.start()
        return self

    def until(self, made: int) -> None:
        """Wait until at least ``made`` attempts were answered (the hammering is on)."""
        while self.made < made:
            assert not self.stop.wait(0.05)

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=60)
        assert not self.errors, self.errors[:3]


# --- (a) a correct user is never locked out -------------------------------------------------------


def test_missing_credentials_are_answered_but_never_counted(server):
    """A logon without a password, a logon without a user, an admin request without an
    Authorization header (a browser's first request): refused, 401 with the challenge,
    and none of them counted; before, ten of them locked the address out."""
    for _ in range(10):
        assert logon(server.port, None, None) == ("failure", BAD)
        assert logon(server.port, "alice", None) == ("failure", BAD)
        status, headers, _ = fetch(server.admin_url + "/amps/instance")
        assert status == 401 and headers.get("WWW-Authenticate", "").startswith("Basic realm=")
    # Nothing was counted: the address is not over the limit of 3, and a wrong password
    # is answered at once and plainly.
    assert logon(server.port, "alice", "wrong") == ("failure", BAD)
    assert logon(server.port, "alice", "alice-pw", name="alice-1")[0] == "success"
    assert fetch(server.admin_url + "/amps/instance", "ops", "ops-pw")[0] == 200
    assert "over MaxFailedLogons" not in server.log


def test_a_correct_user_logs_on_while_its_address_hammers_wrong_passwords(server):
    """The address (loopback, as behind a NAT or a proxy) and the user alice are both
    over the limit, and the hammering goes on: alice's logon (raw and with the client)
    and ops's admin Basic credentials still get through, at once."""
    answers = [logon(server.port, "alice", f"guess-{i}")[1] for i in range(4)]
    assert answers[:3] == [BAD] * 3 and TOO_MANY in answers[3]
    admin = server.admin_url + "/amps/instance"
    attempts = [
        lambda: logon(server.port, "alice", "wrong"),
        lambda: logon(server.port, "ops", "wrong"),
        lambda: logon(server.port, "nobody", "x"),
        lambda: logon(server.port, None, None),
        lambda: fetch(admin),
        lambda: fetch(admin, "ops", "wrong"),
    ]
    with Hammer(attempts) as hammer:
        hammer.until(len(attempts))
        assert logon(server.port, "alice", "alice-pw", name="alice-raw") == ("success", None)
        with Client("alice-client", user_id="alice", password="alice-pw", reconnect=False).connect(server.uri) as c:
            c.publish("jobs", b'{"through": "the hammering"}')
            c.flush()
        status, _, body = fetch(admin, "ops", "ops-pw")
        assert status == 200, body
        assert fetch(server.admin_url + "/", "ops", "ops-pw")[0] == 200  # the dashboard
    log = server.wait_log("address 127.0.0.1 is over MaxFailedLogonsPerAddress")
    assert "authenticated as 'alice'" in log and "answered after" in log


# --- (c) wrong passwords are still limited --------------------------------------------------------


def test_wrong_credentials_are_answered_late_per_address_and_per_user(server):
    # Per address: the fourth wrong password from 127.0.0.2 within the window is
    # answered late, saying why; the right one from there still logs on.
    answers = [logon(server.port, "alice", f"guess-{i}", source="127.0.0.2")[1] for i in range(4)]
    assert answers[:3] == [BAD] * 3 and TOO_MANY in answers[3]
    assert logon(server.port, "alice", "alice-pw", source="127.0.0.2", name="alice-ok")[0] == "success"
    assert answers[3] == f"{BAD}; {TOO_MANY} for this user or from this address: answered after 0.5 s"
    server.wait_log("wrong password; address 127.0.0.2 is over MaxFailedLogonsPerAddress: answered after 0.5 s")
    # Unknown users count too.
    answers = [logon(server.port, f"nobody-{i}", "x", source="127.0.0.3")[1] for i in range(4)]
    assert answers[:3] == [BAD] * 3 and TOO_MANY in answers[3]
    server.wait_log("unknown user; address 127.0.0.3 is over MaxFailedLogonsPerAddress")
    # Per user: one wrong password for bob from each of many addresses puts bob over
    # MaxFailedLogonsPerUser (its default here); bob's own logon still gets through.
    for i in range(FAILED_LOGONS_PER_USER_MAX_DEFAULT):
        assert logon(server.port, "bob", "wrong", source=f"127.0.1.{i + 1}")[1] == BAD
    assert TOO_MANY in logon(server.port, "bob", "wrong", source="127.0.2.1")[1]
    server.wait_log("wrong password; user 'bob' is over MaxFailedLogonsPerUser: answered after 0.5 s")
    assert logon(server.port, "bob", "bob-pw", source="127.0.2.2", name="bob-ok")[0] == "success"
    # Wrong admin Basic credentials count like wrong logons (and the right ones pass).
    admin = server.admin_url + "/amps/instance"
    for _ in range(3):
        status, _, body = fetch(admin, "ops", "wrong")
        assert status == 401 and TOO_MANY not in body
    status, headers, body = fetch(admin, "ops", "wrong")
    assert status == 401 and TOO_MANY in body and headers.get("WWW-Authenticate", "").startswith("Basic realm=")
    assert fetch(admin, "ops", "ops-pw")[0] == 200


# --- (b) a sync replication link is never locked out -----------------------------------------------




def link_hello(port: int, password: str) -> p_repl.Refused | p_repl.Welcome:
    """A replication handshake as user ``repl`` (an impostor when the password is wrong)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        profile = p_repl.Profile(instance="M", group="M", journal_id="impostor")
        sock.sendall(encode_frame([p_repl.Hello(profile=profile, user="repl", password=password)]))
        decoder = p_repl.LinkDecoder()
        while True:
            data = sock.recv(1 << 16)
            assert data, "closed without an answer"
            decoder.receive_data(data)
            if items := decoder.next_items():
                return items[0]


def test_a_sync_link_keeps_persisting_while_an_address_hammers_wrong_passwords(tmp_path):
    """B requires authentication; its client port and its replication port are
    hammered from 127.0.0.1 with wrong passwords, the link's own user among them, so
    that both limits hold that address and that user. A's sync link to B (user repl,
    from 127.0.0.1 too) still authenticates, at start and again after A restarts, and
    every publish on A is acknowledged as persisted (that is, stored on B)."""
    port = free_port()
    users = make_users(tmp_path / "users", {"repl": "repl-pw", "reader": "r"})
    dest = ServerProcess(instance_config(
        tmp_path / "B", "B",
        incoming=f"<Transport><Name>repl</Name><Type>amps-replication</Type><InetAddr>127.0.0.1:{port}</InetAddr>"
                 "</Transport>",
        auth=f"<Authentication><UsersFile>{users}</UsersFile></Authentication><Entitlement>"
             "<Grant><User>repl</User><Replicate>true</Replicate></Grant>"
             f"<Grant><User>reader</User><Replay>orders</Replay></Grant></Entitlement><Limits>{LIMITS}</Limits>",
    )).start()
    source = ServerProcess(instance_config(
        tmp_path / "A", "A",
        destination=f"<Destination><Name>B</Name><SyncType>sync</SyncType><Transport>"
                    f"<Type>amps-replication</Type><InetAddr>127.0.0.1:{port}</InetAddr>"
                    "<User>repl</User><Password>${REPL_PASSWORD}</Password></Transport>"
                    "<Topic><Name>orders</Name><MessageType>json</MessageType></Topic></Destination>",
    ), env={"REPL_PASSWORD": "repl-pw"})
    attempts = [
        lambda: logon(dest.port, "repl", "wrong"),
        lambda: logon(dest.port, "reader", "wrong"),
        lambda: logon(dest.port, None, None),
        lambda: link_hello(port, "wrong"),
    ]
    try:
        # Both of B's limits hold 127.0.0.1 and the user repl before A dials.
        answers = [logon(dest.port, "repl", f"guess-{i}")[1] for i in range(4)]
        assert answers[:3] == [BAD] * 3 and TOO_MANY in answers[3]
        refusals = [link_hello(port, f"guess-{i}") for i in range(4)]
        assert all(isinstance(r, p_repl.Refused) for r in refusals) and TOO_MANY in refusals[3].reason
        published = 0
        with Hammer(attempts) as hammer:
            hammer.until(len(attempts))
            source.start()
            for _ in range(2):  # then once more over a new link, A restarted
                with Client(f"pub-{published}", reconnect=False).connect(source.uri) as c:
                    for i in range(published, published + 20):
                        c.publish("orders", f'{{"i": {i}}}'.encode())
                    c.flush(timeout=60)  # sync: persisted on B too
                published += 20
                source.stop()
                if published < 40:
                    hammer.until(hammer.made + len(attempts))
                    source.restart()
        log = dest.log
        assert log.count("replication from A (127.0.0.1:") >= 2 and "authenticated as 'repl'" in log
        assert "address 127.0.0.1 is over MaxFailedLogonsPerAddress" in log
        with Client("reader", user_id="reader", password="r").connect(dest.uri) as c:
            sub = c.subscribe("orders", bookmark="0")
            got = [sub.get(timeout=10) for _ in range(published)]
        assert sorted(g.json()["i"] for g in got) == list(range(published))
        assert "repl-pw" not in source.log + dest.log
    finally:
        source.stop()
        dest.stop()


def test_the_limit_elements_are_read():
    from conveyor.config import load_text

    limits = load_text("<AMPSConfig><Limits><MaxFailedLogonsPerAddress>5</MaxFailedLogonsPerAddress>"
                       "<MaxFailedLogonsPerUser>2</MaxFailedLogonsPerUser><FailedLogonWindow>5m</FailedLogonWindow>"
                       "</Limits></AMPSConfig>").limits
    assert (limits.failed_logons_per_address_max, limits.failed_logons_per_user_max,
            limits.failed_logon_window_s) == (5, 2, 300.0)
