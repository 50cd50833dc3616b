"""The examples of docs/client.md, run as programs against a real server.

Fenced blocks carry their role in the info string: ```` ```xml config=NAME ```` is a
server configuration, ```` ```python example=NAME config=NAME ```` a program run (in
document order) against that server, ```` ```text output=NAME ```` what the program
must print. The URI ``tcp://127.0.0.1:9007`` is replaced by the server's, the
journal directory by a temporary one.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serverproc import ServerProcess

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
DOC_URI = "tcp://127.0.0.1:9007"
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)
EXAMPLE_SECONDS_MAX = 60


def blocks() -> list[tuple[str, dict[str, str], str]]:
    out = []
    for lang, info, body in FENCE.findall(DOC.read_text()):
        attrs = dict(part.split("=", 1) for part in info.split() if "=" in part)
        out.append((lang, attrs, body))
    return out


def configs() -> dict[str, str]:
    return {a["config"]: body for lang, a, body in blocks() if lang == "xml" and "config" in a}


def examples(config: str) -> list[tuple[str, str]]:
    return [(a["example"], body) for lang, a, body in blocks() if lang == "python" and a.get("config") == config and "example" in a]


def outputs() -> dict[str, str]:
    return {a["output"]: body for lang, a, body in blocks() if lang == "text" and "output" in a}


def test_the_document_has_the_examples_it_promises():
    assert set(configs()) == {"orders", "priority", "deadletters"}
    names = [name for config in configs() for name, _ in examples(config)]
    assert names == ["publisher", "queue-worker", "async-worker", "priority-worker", "dead-letter-reader"]
    assert set(outputs()) == set(names)


def start_server(tmp_path: Path, xml: str) -> ServerProcess:
    journal = tmp_path / "journal"
    config = tmp_path / "config.xml"
    config.write_text(xml.replace("<JournalDirectory>./data</JournalDirectory>", f"<JournalDirectory>{journal}</JournalDirectory>"))
    return ServerProcess(config).start()  # a configuration the server refuses fails the test


@pytest.mark.parametrize("config", ["orders", "priority", "deadletters"])
def test_examples_run_and_print_what_the_document_says(config, tmp_path):
    server = start_server(tmp_path, configs()[config])
    expected = outputs()
    try:
        for name, code in examples(config):
            assert DOC_URI in code, f"example {name} does not use {DOC_URI}"
            proc = subprocess.run(
                [sys.executable, "-c", code.replace(DOC_URI, server.uri)],
                cwd=tmp_path, capture_output=True, text=True, timeout=EXAMPLE_SECONDS_MAX,
            )
            assert proc.returncode == 0, f"example {name} failed:\n{proc.stderr}"
            assert proc.stdout == expected[name], f"example {name} printed:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    finally:
        server.kill()
