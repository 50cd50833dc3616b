"""docs/getting-started.md runs as written: its shell commands, against the embedded
default configuration (``make run``), served here on free ports and found by the
commands through $CONVEYOR_SERVER and $CONVEYOR_ADMIN, as a user beside ``make run``
would set them."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.serverproc import REPO, STARTUP_SECONDS_MAX

DOC = REPO / "docs" / "getting-started.md"


def _conveyor_program() -> list[str]:
    command = Path(sys.executable).with_name("conveyor")
    return [str(command)] if command.exists() else [sys.executable, "-m", "conveyor"]


def _section_commands(number: int) -> list[str]:
    """The ``.venv/bin/conveyor`` lines of the sh block of section ``number``."""
    text = DOC.read_text()
    section = re.search(rf"^## {number}\..*?(?=^## |\Z)", text, re.S | re.M).group(0)
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.startswith(".venv/bin/conveyor ")]


def _run(line: str, *, cwd: Path, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    """One documented line, the conveyor command being this environment's; a ``> FILE``
    redirection is honoured."""
    words = shlex.split(line, comments=True)
    stdout_file = None
    if ">" in words:
        at = words.index(">")
        words, stdout_file = words[:at], words[at + 1]
    proc = subprocess.run([*_conveyor_program(), *words[1:]], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)
    if stdout_file is not None:
        (cwd / stdout_file).write_text(proc.stdout)
    return proc


def _serve(args: list[str], cwd: Path) -> tuple[subprocess.Popen, dict[str, str]]:
    """``conveyor serve ARGS`` in ``cwd``: the process and what its readiness lines say."""
    proc = subprocess.Popen([*_conveyor_program(), "serve", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    seen: dict[str, str] = {}
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("conveyor admin on "):
            seen["admin"] = line.rsplit(" ", 1)[1].strip()
        elif line.startswith("conveyor listening on port "):
            seen.setdefault("uri", f"tcp://127.0.0.1:{int(line.rsplit(' ', 1)[1])}")
        elif line.startswith("conveyor ready"):
            return proc, seen
    proc.kill()
    raise AssertionError("the server did not start: " + proc.stderr.read()[-2000:])  # type: ignore[union-attr]


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(STARTUP_SECONDS_MAX)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_the_getting_started_walkthrough_runs_as_written(tmp_path):
    # Section 1: `make run` is the embedded default configuration; here on free ports.
    server, where = _serve(["--port", "0", "--admin-port", "0"], tmp_path)
    try:
        env = dict(os.environ, CONVEYOR_SERVER=where["uri"], CONVEYOR_ADMIN=where["admin"])
        # Section 2, from the repository (the example files are there).
        results = []
        for line in _section_commands(2):
            # A loaded machine may take more than the documented second to start a replay.
            proc = _run(line.replace("--timeout 1", "--timeout 10"), cwd=REPO, env=env)
            assert proc.returncode == 0, (line, proc.stderr)
            assert "warning" not in proc.stderr and "Traceback" not in proc.stderr, (line, proc.stderr)
            results.append(proc)
        taken, replayed = results[-2].stdout, results[-1].stdout
        assert json.loads(taken) == {"order": 1, "qty": 5}
        orders = [json.loads(line)["order"] for line in replayed.splitlines()]
        assert orders == [1, 2, 3, 4, 5, 6, 7]  # the one published to WorkToDo is recorded on Work
        # Section 3.
        for line in _section_commands(3):
            proc = _run(line, cwd=REPO, env=env)
            assert proc.returncode == 0 and proc.stdout and "Traceback" not in proc.stderr, (line, proc.stderr)
        # The prose of section 2: a mistyped name is a warning naming the nearest one.
        proc = _run(""".venv/bin/conveyor publish Wrok '{"order": 9}'""", cwd=REPO, env=env)
        assert proc.returncode == 0 and "reached no one" in proc.stderr and "'Work'" in proc.stderr, proc.stderr
        # Section 5, beside the server still running (as beside `make run`).
        for line in _section_commands(5):
            if " serve " in line:
                args = shlex.split(line, comments=True)[2:]
                # The documented ports, free here or not, are the point of the line: it
                # names ports and a journal other than make run's. Any free ports here.
                assert args[args.index("--port") + 1] != "9007" and args[args.index("--admin-port") + 1] != "8085"
                assert args[args.index("--journal") + 1] != "data"
                args[args.index("--port") + 1] = "0"
                args[args.index("--admin-port") + 1] = "0"
                mine, _ = _serve(args, tmp_path)
                _stop(mine)
                continue
            proc = _run(line, cwd=tmp_path, env=env)
            assert proc.returncode == 0, (line, proc.stderr)
        assert (tmp_path / "data-mine").is_dir() and (tmp_path / "data").is_dir()
    finally:
        _stop(server)
