"""`conveyor users add|remove|list`: the users file, clear errors, no traceback, the
password never echoed; a user added while the server runs can log on at once."""

from __future__ import annotations

import os
import subprocess
import sys

import argon2

from conveyor.security.users import UsersFile, verify_password
from tests.security.helpers import secure_config, start
from tests.security.raw import Raw
from tests.serverproc import REPO


def conveyor(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conveyor", *args], input=stdin, capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_add_list_remove(tmp_path):
    path = tmp_path / "users"
    out = conveyor("users", "add", "alice", "--file", str(path), "--password-stdin", stdin="s3cret-pass\n")
    assert out.returncode == 0, out.stderr
    assert "s3cret-pass" not in out.stdout + out.stderr
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    stored = UsersFile(path).read()["alice"]
    assert stored.startswith("$argon2id$") and "s3cret-pass" not in path.read_text()
    assert argon2.extract_parameters(stored).memory_cost == argon2.PasswordHasher().memory_cost  # the strong defaults
    assert verify_password(stored, "s3cret-pass") and not verify_password(stored, "other")
    assert conveyor("users", "add", "bob", "-f", str(path), "--password-stdin", stdin="b\n").returncode == 0
    assert conveyor("users", "list", "-f", str(path)).stdout.split() == ["alice", "bob"]
    assert conveyor("users", "remove", "bob", "-f", str(path)).returncode == 0
    assert conveyor("users", "list", "-f", str(path)).stdout.split() == ["alice"]


def test_errors_are_clear_and_have_no_traceback(tmp_path):
    path = tmp_path / "users"
    conveyor("users", "add", "alice", "-f", str(path), "--password-stdin", stdin="a\n")
    cases = [
        (("users", "add", "alice", "-f", str(path), "--password-stdin"), "a\n", "already exists"),
        (("users", "add", "carol", "-f", str(path), "--password-stdin"), "\n", "cannot be empty"),
        (("users", "add", "bad name", "-f", str(path), "--password-stdin"), "x\n", "not a valid user name"),
        (("users", "add", "carol", "-f", str(path)), "", "use --password-stdin"),  # no terminal to ask on
        (("users", "remove", "nobody", "-f", str(path)), "", "there is no user 'nobody'"),
        (("users", "list", "--config", str(tmp_path / "missing.xml")), "", "cannot read configuration file"),
    ]
    for args, stdin, message in cases:
        out = conveyor(*args, stdin=stdin)
        assert out.returncode != 0, args
        assert message in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr
    path.write_text("alice:not-a-hash\n")
    out = conveyor("users", "list", "-f", str(path))
    assert "line 1: not NAME:ARGON2-HASH" in out.stderr and "Traceback" not in out.stderr


def test_a_user_added_while_the_server_runs_can_log_on(tmp_path):
    config = secure_config(tmp_path, users={"alice": "a"},
                           grants="<Grant><User>alice</User><User>dave</User><Publish>x</Publish></Grant>")
    s = start(config)
    try:
        assert Raw(s.port).logon("d", "dave", "dave-pw").code == "not_authenticated"
        out = conveyor("users", "add", "dave", "--config", str(config), "--password-stdin", stdin="dave-pw\n")
        assert out.returncode == 0, out.stderr
        s.wait_log("reloaded: 2 user(s)", timeout=15)  # the server's periodic check notices the change
        assert Raw(s.port).logon("d2", "dave", "dave-pw").status == "success"
    finally:
        s.stop()
    assert os.environ.get("CONVEYOR_PASSWORD") is None
