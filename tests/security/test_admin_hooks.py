"""The hooks the admin interface authenticates with (docs/security.md, "The admin
interface"): HTTP Basic credentials against the users file, then the Admin grant. The
admin HTTP server itself is tested with them where it is built."""

from __future__ import annotations

import asyncio
import base64
import ssl

import pytest
import trustme

from conveyor import errors
from conveyor.config import load_text
from conveyor.server.server import Server
from tests.security.helpers import make_users


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def server(tmp_path):
    users = make_users(tmp_path / "users", {"ops": "o", "root": "r", "app": "a"})
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "admin.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "admin.key"))
    config = load_text(f"""<AMPSConfig>
      <Admin><InetAddr>127.0.0.1:0</InetAddr><Certificate>{tmp_path / 'admin.pem'}</Certificate>
        <PrivateKey>{tmp_path / 'admin.key'}</PrivateKey></Admin>
      <Authentication><UsersFile>{users}</UsersFile></Authentication>
      <Entitlement>
        <Grant><User>ops</User><Admin>read</Admin></Grant>
        <Grant><User>root</User><Admin>full</Admin></Grant>
        <Grant><User>app</User><Publish>x</Publish></Grant>
      </Entitlement></AMPSConfig>""")
    s = Server(config)
    yield s
    s.auth.close()
    s._io.shutdown()


def test_admin_rights(server):
    async def run():
        assert await server.admin_user(basic("ops", "o"), None, full=False) == "ops"
        with pytest.raises(errors.NotEntitled):
            await server.admin_user(basic("ops", "o"), None, full=True)
        assert await server.admin_user(basic("root", "r"), None, full=True) == "root"
        with pytest.raises(errors.NotEntitled):
            await server.admin_user(basic("app", "a"), None, full=False)
        for header in (None, basic("ops", "wrong"), "Bearer x", "Basic !!!"):
            with pytest.raises(errors.NotAuthenticated):
                await server.admin_user(header, None, full=False)

    asyncio.run(run())


def test_admin_tls_context(server):
    ctx = server.admin_tls()
    assert isinstance(ctx, ssl.SSLContext) and ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert server.admin_tls() is ctx  # one reloadable context
