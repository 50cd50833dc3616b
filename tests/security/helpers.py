"""Configurations, users files and certificates for the security tests."""

from __future__ import annotations

import base64
import datetime
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import argon2
import pytest
import trustme

from conveyor.security.users import UsersFile
from tests.serverproc import ServerProcess, write_config

#: Cheap argon2 parameters for tests: the hash carries them, so the server verifies with
#: them (real users files get argon2-cffi's defaults from `conveyor users add`).
CHEAP = argon2.PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)

QUEUES = """
<Queue><Name>Jobs</Name><MessageType>json</MessageType><UnderlyingTopic>jobs</UnderlyingTopic>
  <LeasePeriod>60s</LeasePeriod></Queue>
<Queue><Name>Secret</Name><MessageType>json</MessageType><UnderlyingTopic>secret</UnderlyingTopic>
  <LeasePeriod>60s</LeasePeriod></Queue>
"""


def make_users(path: Path, users: dict[str, str]) -> Path:
    f = UsersFile(path)
    f.write({name: CHEAP.hash(password) for name, password in users.items()})
    return path


def secure_config(directory: Path, *, users: dict[str, str], grants: str = "", limits: str = "",
                  authentication: str = "", transport_extra: str = "", queues: str = QUEUES,
                  users_file: bool = True) -> Path:
    path = make_users(directory / "users", users)
    auth = f"<UsersFile>{path}</UsersFile>" if users_file else ""
    root = f"<Authentication>{auth}{authentication}</Authentication>"
    root += f"<Entitlement>{textwrap.dedent(grants)}</Entitlement>"
    if limits:
        root += f"<Limits>{limits}</Limits>"
    return write_config(directory, queues=queues, root_extra=root, transport_extra=transport_extra)


def start(config: Path, **kw) -> ServerProcess:
    return ServerProcess(config, **kw).start()


PAST = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)


class Pki:
    """A CA, a server certificate, client certificates, and the PEM files of each."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = trustme.CA()
        self.other_ca = trustme.CA()
        self.ca_file = self._write("ca.pem", self.ca.cert_pem.bytes())
        self.other_ca_file = self._write("other-ca.pem", self.other_ca.cert_pem.bytes())
        self.server = self.leaf("server", self.ca.issue_cert("127.0.0.1", "localhost"))
        self.expired_server = self.leaf("expired-server", self.ca.issue_cert("127.0.0.1", not_before=PAST,
                                                                             not_after=PAST + datetime.timedelta(days=1)))
        self.alice = self.leaf("alice", self.ca.issue_cert("alice@clients", common_name="alice"))
        self.expired_alice = self.leaf("expired-alice", self.ca.issue_cert(
            "alice@clients", common_name="alice", not_before=PAST, not_after=PAST + datetime.timedelta(days=1)))
        self.stranger = self.leaf("stranger", self.other_ca.issue_cert("alice@clients", common_name="alice"))

    def _write(self, name: str, data: bytes) -> Path:
        path = self.dir / name
        path.write_bytes(data)
        return path

    def leaf(self, name: str, cert) -> tuple[Path, Path]:
        chain = b"".join(blob.bytes() for blob in cert.cert_chain_pems)
        return self._write(f"{name}.pem", chain), self._write(f"{name}.key", cert.private_key_pem.bytes())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


def tls_elements(pki: Pki, cert: tuple[Path, Path] | None = None, client_certificates: str = "optional") -> str:
    cert = cert or pki.server
    return (f"<Certificate>{cert[0]}</Certificate><PrivateKey>{cert[1]}</PrivateKey>"
            f"<CAFile>{pki.ca_file}</CAFile><ClientCertificates>{client_certificates}</ClientCertificates>")


def fetch(url: str, user: str | None = None, password: str = "") -> tuple[int, dict, str]:
    """GET ``url`` (with HTTP Basic credentials when ``user`` is given, an empty one
    included): (status, headers, body), an HTTP error status included."""
    headers = {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def instance_config(directory: Path, name: str, *, incoming: str = "", auth: str = "", destination: str = "") -> Path:
    """A replication test instance's configuration: clients on a free port, ``orders``
    recorded, and the given incoming transport, Authentication and Destination."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.xml"
    path.write_text(f"""<AMPSConfig><Name>{name}</Name><Transports>
      <Transport><Name>clients</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr></Transport>{incoming}
      </Transports>
      <TransactionLog><JournalDirectory>{directory / 'journal'}</JournalDirectory>
        <Topic><Name>orders</Name><MessageType>json</MessageType></Topic></TransactionLog>
      {auth}{f'<Replication>{destination}</Replication>' if destination else ''}</AMPSConfig>""")
    return path
