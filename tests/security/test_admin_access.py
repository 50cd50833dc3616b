"""Who may use the admin interface of a real server with Authentication on
(docs/security.md, "The admin interface"): the probes are open; everything else needs a
user from the users file (HTTP Basic), then the Admin grant, `read` for statistics,
metrics and the dashboard, `full` for the actions. The matrix is generated from one
table of routes and one of users."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.security.helpers import fetch, secure_config
from tests.serverproc import ServerProcess

USERS = {"ops": "ops-pw", "root": "root-pw", "app": "app-pw"}
GRANTS = """
<Grant><User>ops</User><Admin>read</Admin></Grant>
<Grant><User>root</User><Admin>full</Admin></Grant>
<Grant><User>app</User><Publish>.*</Publish></Grant>
"""
#: route -> the Admin grant it needs (None: open)
ROUTES = {
    "/healthz": None,
    "/readyz": None,
    "/amps/instance": "read",
    "/api/queues": "read",
    "/metrics": "read",
    "/": "read",
    "/amps/administrator/diagnostics/dump": "full",
}
#: user -> its Admin grant (None: no grant); "" is no credentials, "bad" a wrong password
WHO = {"": None, "bad": None, "app": None, "ops": "read", "root": "full"}
RANK = {None: 0, "read": 1, "full": 2}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("admin-access")
    config = secure_config(directory, users=USERS, grants=GRANTS,
                           limits="<MaxFailedLogonsPerAddress>1000</MaxFailedLogonsPerAddress>")
    text = config.read_text().replace("</AMPSConfig>", "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin></AMPSConfig>")
    config.write_text(text)
    proc = ServerProcess(config).start()
    assert proc.admin_url, proc.log
    yield proc
    proc.stop()




@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("who", sorted(WHO))
def test_matrix(server, route, who):
    password = "wrong" if who == "bad" else USERS.get(who, "")
    user = "ops" if who == "bad" else who
    status, headers, body = fetch(server.admin_url + route, user, password)
    need = ROUTES[route]
    if need is None:
        assert status in (200, 503), body
    elif who in ("", "bad"):
        assert status == 401, body
        assert headers.get("WWW-Authenticate", "").startswith('Basic realm="conveyor admin"')
        assert json.loads(body)["error"] == "not_authenticated"
    elif RANK[WHO[who]] >= RANK[need]:
        assert status == 200, body
    else:
        assert status == 403, body
        answer = json.loads(body)
        assert answer["error"] == "not_entitled" and f"Admin grant {need!r}" in answer["message"]


def test_refusals_are_logged_without_the_password(server):
    fetch(server.admin_url + "/amps/instance", "ops", "a-wrong-secret")
    server.wait_log("admin request refused from 127.0.0.1 (user 'ops')")
    assert "a-wrong-secret" not in server.log


def test_the_operator_cli_takes_credentials_and_says_why_it_is_refused(server):
    def cli(*args, env=None):
        return subprocess.run([sys.executable, "-m", "conveyor", *args], capture_output=True, text=True,
                              timeout=60, env=env)

    host = server.admin_url.split("//", 1)[1]
    refused = cli("stats", "--admin", server.admin_url)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "401" in refused.stderr or "credentials" in refused.stderr, refused.stderr
    ok = cli("stats", "--json", "--admin", f"http://ops:ops-pw@{host}")
    assert ok.returncode == 0, ok.stderr
    assert "uptime" in ok.stdout or "instance" in ok.stdout
    assert "ops-pw" not in ok.stderr + ok.stdout
    denied = cli("stats", "--admin", f"http://app:app-pw@{host}")
    assert denied.returncode != 0 and "HTTP 403" in denied.stderr and "app-pw" not in denied.stderr, denied.stderr
    env = dict(os.environ, CONVEYOR_USER="root", CONVEYOR_PASSWORD="root-pw")
    acted = cli("disconnect", "nobody-by-that-name", "--admin", server.admin_url, env=env)
    assert "HTTP 404" in acted.stderr and "no client" in acted.stderr, acted.stderr  # past the gate: full
    reader = cli("disconnect", "nobody-by-that-name", "--user", "ops", "--admin", server.admin_url,
                 env=dict(os.environ, CONVEYOR_PASSWORD="ops-pw"))
    assert "HTTP 403" in reader.stderr and "'full'" in reader.stderr, reader.stderr
