"""``conveyor serve`` imports only what serving needs before its first delivery (issue 38):
the client package, urllib's HTTP stack, argon2 and the rotating log handlers are imported
where they are used (the operator commands, Authentication, a <Logging> file target)."""

import subprocess
import sys

from conveyor.cli import ops
from conveyor.client import endpoints

#: What cmd_serve and _run_server import, after main() built the parser.
_SERVE_IMPORTS = """
import sys
from conveyor.cli.main import build_parser
build_parser().parse_args(["serve"])
from conveyor.config import default_config, load_file
from conveyor.server.log_targets import install
from conveyor.server.startup import ADMIN_LISTEN_PATH, listen_path
from conveyor.server.collector import settle_after_recovery
from conveyor.server.server import Server
print(" ".join(m for m in ("conveyor.client", "urllib.request", "http.client", "argon2", "logging.handlers")
               if m in sys.modules))
"""


def test_the_operator_commands_name_the_clients_credential_variables():
    assert (ops.USER_ENV, ops.PASSWORD_ENV) == (endpoints.USER_ENV, endpoints.PASSWORD_ENV)


def test_serve_does_not_import_what_only_other_commands_or_configurations_use():
    out = subprocess.run([sys.executable, "-c", _SERVE_IMPORTS], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
