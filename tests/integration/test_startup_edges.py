"""``conveyor serve``'s start-up as a new user meets it (issue 34, items 11, 14 and 16),
on real server processes: a port that is taken is refused before anything is created on
disk, in the words the port was given in (``--port``, ``--admin-port``, the element
path); the journal's lock names the process that holds it and is taken over from a
killed one; the restart line says what the checkpoint restored; a plain start logs no
internals."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from conveyor.journal.lock import HOLDER_FILE
from tests.integration.test_cli_names import QUEUE, conveyor
from tests.serverproc import REPO, STARTUP_SECONDS_MAX, ServerProcess, write_config

MESSAGES = 2000
DEFAULT_PORT = 9007  # the embedded default configuration's client port


class Serve:
    """``conveyor [-v] serve ARGS`` run until it prints ``conveyor ready`` (or exits)."""

    def __init__(self, *args: str, verbose: bool = False) -> None:
        command = Path(sys.executable).with_name("conveyor")
        program = [str(command)] if command.exists() else [sys.executable, "-m", "conveyor"]
        self.proc = subprocess.Popen([*program, *(["-v"] if verbose else []), "serve", *args], cwd=REPO, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.stderr: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + STARTUP_SECONDS_MAX
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line or line.startswith("conveyor ready"):
                break
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    @property
    def log(self) -> str:
        return "".join(self.stderr)

    def wait_log(self, text: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.log:
            assert time.monotonic() < deadline, f"{text!r} not in the log:\n{self.log}"
            time.sleep(0.02)
        return self.log

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def _queues_config(tmp_path: Path) -> Path:
    return write_config(tmp_path, recorded="Work", queues=QUEUE, admin=True)


# --- item 14: a start that is refused leaves nothing behind, and says why in the user's words ----


def test_a_taken_client_port_is_refused_before_the_journal_is_created(server_factory, tmp_path):
    running = server_factory(recorded="Work")
    journal = tmp_path / "new" / "data"
    proc = conveyor("serve", "--port", str(running.port), "--admin-port", "0", "--journal", str(journal))
    assert proc.returncode == 2, proc.stderr
    assert (f"--port {running.port}: cannot listen on 127.0.0.1:{running.port}: the address is already in use "
            "(hint: choose another with --port N, or --port 0 for any free port)") in proc.stderr, proc.stderr
    assert "Transport[1]" not in proc.stderr  # the user wrote no configuration
    assert not (tmp_path / "new").exists()  # neither the directory nor its parent
    assert "created a new, empty journal" not in proc.stderr


def test_the_default_client_port_is_named_as_the_default(tmp_path):
    # The embedded default configuration listens on 9007: taken here (or already taken
    # by someone else, which is the same for this test).
    with socket.socket() as taken:
        try:
            taken.bind(("127.0.0.1", DEFAULT_PORT))
            taken.listen(1)
        except OSError:
            pass
        journal = tmp_path / "data"
        proc = conveyor("serve", "--no-admin", "--journal", str(journal))
    assert proc.returncode == 2, proc.stderr
    assert (f"the default client port: cannot listen on 127.0.0.1:{DEFAULT_PORT}: the address is already in use "
            "(hint: choose another with --port N") in proc.stderr, proc.stderr
    assert not journal.exists()


def test_a_taken_admin_port_names_admin_port(server_factory, tmp_path):
    running = server_factory(recorded="Work", admin=True)
    admin_port = int(running.admin_url.rsplit(":", 1)[1])
    journal = tmp_path / "data"
    proc = conveyor("serve", "--port", "0", "--admin-port", str(admin_port), "--journal", str(journal))
    assert proc.returncode == 2, proc.stderr
    assert f"--admin-port {admin_port}: cannot listen on 127.0.0.1:{admin_port} for the admin interface" in proc.stderr
    assert "choose another with --admin-port N" in proc.stderr and "--no-admin" in proc.stderr
    assert not journal.exists()


def test_a_taken_port_of_a_configuration_file_keeps_its_element_path(server_factory, tmp_path):
    running = server_factory(recorded="Work")
    mine = tmp_path / "mine"
    mine.mkdir()
    config = write_config(mine)
    config.write_text(config.read_text().replace("127.0.0.1:0", f"127.0.0.1:{running.port}"))
    proc = conveyor("serve", "--config", str(config), "--no-admin")
    assert proc.returncode == 2, proc.stderr
    assert (f"AMPSConfig/Transports/Transport[1]/InetAddr: cannot listen on 127.0.0.1:{running.port}: "
            "the address is already in use") in proc.stderr, proc.stderr
    assert not (mine / "journal").exists()


def test_a_start_the_engine_refuses_removes_the_journal_it_created(tmp_path):
    config = write_config(tmp_path, recorded="Work", queues=QUEUE.replace(
        "</UnderlyingTopic>", "</UnderlyingTopic><Filter>/n = = 1</Filter>"))
    proc = conveyor("serve", "--config", str(config), "--no-admin")
    assert proc.returncode == 2 and "Queue[1]/Filter" in proc.stderr, proc.stderr
    assert not (tmp_path / "journal").exists()


def test_the_lock_refusal_names_the_running_server(server_factory, tmp_path):
    running = server_factory(recorded="Work")
    # The same configuration, so the same journal, and even the same port: the journal's
    # holder is what the user needs to hear about first.
    proc = conveyor("serve", "--config", str(running.config), "--port", str(running.port))
    assert proc.returncode == 1, proc.stderr
    journal = tmp_path / "journal"
    assert f"journal directory {journal} is in use by another process (pid {running.proc.pid}, " in proc.stderr
    assert "`conveyor serve --config " in proc.stderr and ", since 20" in proc.stderr, proc.stderr
    holder = json.loads((journal / HOLDER_FILE).read_text())
    assert holder["pid"] == running.proc.pid


def test_a_killed_server_s_lock_is_taken_over_and_a_stopped_one_leaves_no_holder(server_factory, tmp_path):
    server = server_factory(recorded="Work")
    journal = tmp_path / "journal"
    first = server.proc.pid
    server.kill()  # SIGKILL: the kernel drops the lock; the holder file stays, naming a dead pid
    assert json.loads((journal / HOLDER_FILE).read_text())["pid"] == first
    server.restart()
    assert json.loads((journal / HOLDER_FILE).read_text())["pid"] == server.proc.pid != first
    assert server.stop() == 0
    assert not (journal / HOLDER_FILE).exists()


# --- item 11: the restart says what the checkpoint restored ----------------------------------------


def test_the_restart_line_names_the_checkpoint_and_its_messages(tmp_path):
    server = ServerProcess(_queues_config(tmp_path)).start()
    try:
        lines = tmp_path / "work.txt"
        lines.write_text("".join(f'{{"n": {n}}}\n' for n in range(MESSAGES)))
        proc = conveyor("publish", "Work", "--file", str(lines), "--server", server.uri)
        assert proc.returncode == 0, proc.stderr
        assert server.stop() == 0  # a clean stop checkpoints at the journal's end
        server.stderr_lines.clear()
        server.restart()
        line = next(x for x in server.wait_log("recovered").splitlines() if "recovered" in x)
        assert re.search(r"recovered 0 journal records in [\d.]+ s on top of the checkpoint at position \d+, "
                         rf"which restored {MESSAGES} queued message\(s\) from 1 queue snapshot\(s\); "
                         rf"queues hold {MESSAGES} message\(s\): WorkToDo {MESSAGES}$", line), line
        # The counters count since this start, and the table says so.
        proc = conveyor("queues", "--admin", server.admin_url)
        assert proc.returncode == 0, proc.stderr
        rows = {row.split()[0]: row.split() for row in proc.stdout.splitlines()[1:] if row.startswith("WorkToDo")}
        assert rows["WorkToDo"][1] == str(MESSAGES) and rows["WorkToDo"][7] == "0"  # DEPTH, ENQUEUED
        assert "(ENQUEUED, DELIVERED, ACKED, EXPIRED: counted since the server started)" in proc.stdout
    finally:
        server.kill()


def test_without_a_checkpoint_the_line_says_the_whole_journal_was_replayed(tmp_path):
    server = ServerProcess(_queues_config(tmp_path)).start()
    try:
        proc = conveyor("publish", "Work", "--server", server.uri, input='{"n": 1}\n{"n": 2}\n')
        assert proc.returncode == 0, proc.stderr
        assert server.stop() == 0
        (tmp_path / "journal" / "queues.ack").unlink()
        server.stderr_lines.clear()
        server.restart()
        log = server.wait_log("recovered")
        assert "(no checkpoint: the whole journal); queues hold 2 message(s): WorkToDo 2" in log, log
    finally:
        server.kill()


# --- item 16: a plain start logs what an operator needs ---------------------------------------------


def test_a_plain_start_logs_no_collector_or_clean_scrub_lines(tmp_path):
    plain = Serve("--port", "0", "--admin-port", "0", "--journal", str(tmp_path / "plain"))
    try:
        log = plain.wait_log("recovered")
    finally:
        assert plain.stop() == 0
    log = plain.log
    assert " INFO conveyor.server: listening on 127.0.0.1:" in log and "conveyor.server: recovered" in log
    assert "collector:" not in log and "journal scrub: pass" not in log, log
    assert "DEBUG" not in log
    # They are still there for whoever asks for debug.
    verbose = Serve("--port", "0", "--admin-port", "0", "--journal", str(tmp_path / "verbose"), verbose=True)
    try:
        verbose.wait_log("journal scrub: pass 1 checked")
        log = verbose.log
    finally:
        assert verbose.stop() == 0
    assert re.search(r"DEBUG conveyor.server: collector: \d+ objects frozen after recovery", log), log
    assert re.search(r"DEBUG conveyor.server: journal scrub: pass 1 checked \d+ records", log), log
