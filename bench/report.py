"""Shared helpers for benchmarks: timing, medians, machine facts, docs/benchmarks.md sections."""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
import sys
import threading
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def median(values) -> float:
    return statistics.median(values)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.cpu_count()} cores ({cpu}){mem}, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def git_rev(path: str | None = None) -> str:
    """The short commit of this checkout (or of the one ``path`` is in)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                              cwd=path).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def write_section(title: str, body: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace (or append) the section ``## title`` of docs/benchmarks.md."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\nFigures measured with the suites in `bench/`; see each section for the command.\n"
    section = f"## {title}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text)
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text.rstrip() + "\n")


def serve(config: Path, *, env: dict | None = None, cwd: str | None = None) -> tuple[subprocess.Popen, int, list[str]]:
    """Start ``conveyor serve --config config`` and wait for its readiness line: the
    process, its client port, and its log lines (filled in as they come). The caller
    kills the process."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "serve", "--config", str(config)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
    )
    port = 0
    for line in proc.stdout:
        if line.startswith("conveyor listening on port "):
            port = int(line.split()[-1])
            break
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
    return proc, port, log


def spark_python() -> str:
    """Whether Spark's Python processes start from a prepared pyspark.zip
    (``conveyor spark prepare``, docs/spark.md): a second a query, so every Spark
    figure says which."""
    from conveyor.spark import prepare

    states = {prepare.status(z) for z in prepare.zips(prepare.spark_home())}
    if states == {"already prepared"}:
        return "Spark's pyspark.zip prepared (`conveyor spark prepare`)"
    return "Spark's pyspark.zip as installed (not prepared)"
