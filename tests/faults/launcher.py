"""Run the real ``conveyor`` command with faults injected (tests only).

usage: ``python -m tests.faults.launcher serve --config ...`` with the faults in the
environment variable ``CONVEYOR_TEST_FAULTS``, a comma-separated list of:

- ``write_batch=raise@N``: the N-th call of ``Journal.write_batch`` raises RuntimeError
  (a bug in the writer, not a disk error);
- ``write=ERRNO@N``: the N-th write of a journal segment fails with ``OSError(ERRNO)``
  (``EIO``, ``ENOSPC``...) before writing anything;
- ``fsync=ERRNO@N``: the N-th fsync of a journal segment file fails with
  ``OSError(ERRNO)`` after the real fsync (the page cache is then in an unknown state);
- ``ledger=PATH``: the power-cut ledger (powercut.py): every successful fsync appends
  the file's inode and size (or a directory's names) to PATH, and every file creation
  resets its inode, so that a crash can later be turned into a power cut that keeps
  only what was fsynced.

Everything else runs unchanged: the CLI parses the arguments, builds the server and
maps its errors to exit codes exactly as ``conveyor`` does. Nothing here is imported by
the package; production code carries no fault hooks.
"""

from __future__ import annotations

import errno
import json
import os
import sys

from conveyor.journal import Journal
from conveyor.journal.storage import FileStorage

FAULTS_ENV = "CONVEYOR_TEST_FAULTS"


def _parse(spec: str) -> dict[str, str]:
    faults = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, _, value = item.partition("=")
        faults[key] = value
    return faults


def _nth(value: str) -> tuple[str, int]:
    what, _, n = value.partition("@")
    return what, int(n or 1)


def _errno(name: str) -> int:
    return getattr(errno, name)


def _fd_path(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def install(faults: dict[str, str]) -> None:
    if "write_batch" in faults:
        _, n = _nth(faults["write_batch"])
        real_write_batch = Journal.write_batch
        calls = [0]

        def write_batch(self, batch):
            calls[0] += 1
            if calls[0] == n:
                raise RuntimeError(f"injected failure in write_batch (call {n})")
            return real_write_batch(self, batch)

        Journal.write_batch = write_batch  # type: ignore[method-assign]

    if "write" in faults:
        name, n = _nth(faults["write"])
        real_write = FileStorage.write
        writes = [0]

        def write(self, base, data, *, create):
            writes[0] += 1
            if writes[0] == n:
                code = _errno(name)  # what the kernel says, as it says it
                raise OSError(code, os.strerror(code), self.path(base))
            return real_write(self, base, data, create=create)

        FileStorage.write = write  # type: ignore[method-assign]

    real_fsync = os.fsync
    fsync_fault = _nth(faults["fsync"]) if "fsync" in faults else None
    ledger_fd = -1
    if "ledger" in faults:
        ledger_fd = os.open(faults["ledger"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    segment_fsyncs = [0]

    def record(line: dict) -> None:
        # One write(2) per line with O_APPEND: a SIGKILL cannot tear or reorder it.
        os.write(ledger_fd, (json.dumps(line) + "\n").encode())

    def fsync(fd: int) -> None:
        real_fsync(fd)
        path = _fd_path(fd)
        if fsync_fault is not None and path.endswith(".log"):
            segment_fsyncs[0] += 1
            if segment_fsyncs[0] == fsync_fault[1]:
                code = _errno(fsync_fault[0])
                raise OSError(code, os.strerror(code), path)
        if ledger_fd >= 0:
            st = os.fstat(fd)
            if os.path.isdir(path):
                names = {e.name: e.inode() for e in os.scandir(path)}
                record({"dir": path, "names": names})
            else:
                record({"ino": st.st_ino, "size": st.st_size, "path": path})

    if fsync_fault is not None or ledger_fd >= 0:
        os.fsync = fsync  # type: ignore[assignment]

    if ledger_fd >= 0:
        real_open = os.open

        def open_(path, flags, mode=0o777, *, dir_fd=None):
            fd = real_open(path, flags, mode, dir_fd=dir_fd)
            if flags & os.O_CREAT:
                # A new file (or one truncated to nothing): whatever an earlier file with
                # this inode had fsynced says nothing about it.
                record({"created": os.fstat(fd).st_ino, "path": _fd_path(fd)})
            return fd

        os.open = open_  # type: ignore[assignment]


def main() -> int:
    install(_parse(os.environ.get(FAULTS_ENV, "")))
    from conveyor.cli.main import main as conveyor_main

    return conveyor_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
