"""Configurations, users files and certificates for the security tests."""

from __future__ import annotations

import datetime
import textwrap
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
