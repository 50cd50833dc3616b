"""Turn a process kill into a power cut: keep only what the server fsynced.

A SIGKILL loses nothing the server wrote: the kernel still has it. A power cut loses
everything that was not fsynced. To model one without a virtual disk, the server runs
through launcher.py with a **ledger**: after every successful fsync it appends the
file's inode and size (for a directory: the names it holds and their inodes), and every
file creation resets that inode. After the kill, :func:`cut` rewrites the journal
directory to what a power cut may leave:

- a file is kept up to the size its last fsync recorded, plus a random **torn suffix**
  of what was written after it (none, some of the real bytes, or some of the real bytes
  followed by zeros: a file extended on disk before its data reached it);
- a file never fsynced since its creation keeps only such a suffix (often nothing);
- a name created or renamed after the last fsync of its directory may be lost: such a
  file is removed with probability ``name_loss``. (A rename that replaced an older file
  would bring the older file back; we model it as no file, which readers of these files
  must handle as well.) Temporary files are removed.

Un-fsynced pages are assumed to reach the disk in order (the torn suffix is a prefix
of what was written). A disk that writes them out of order can leave valid records
after a hole; recovery then refuses to start rather than guess (docs/journal.md).

:func:`baseline` starts a ledger for a new run: after a cut (or a clean stop),
everything on disk is durable by definition.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path


def _files(root: Path) -> list[Path]:
    return [p for p in [root, *root.rglob("*")] if p.exists()]


def baseline(root: Path, ledger: Path) -> None:
    """A fresh ledger saying everything under ``root`` is durable as it is."""
    lines = []
    for path in _files(root):
        if path.is_dir():
            lines.append({"dir": str(path), "names": {e.name: e.inode() for e in os.scandir(path)}})
        else:
            lines.append({"ino": path.stat().st_ino, "size": path.stat().st_size, "path": str(path)})
    ledger.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _read(ledger: Path) -> tuple[dict[int, int], dict[str, dict[str, int]]]:
    sizes: dict[int, int] = {}  # inode -> durable size
    names: dict[str, dict[str, int]] = {}  # directory -> durable name -> inode
    for text in ledger.read_text().splitlines():
        line = json.loads(text)  # the server writes whole lines; a kill cannot tear one
        if "created" in line:
            sizes[line["created"]] = 0
        elif "dir" in line:
            names[line["dir"]] = line["names"]
        else:
            sizes[line["ino"]] = line["size"]
    return sizes, names


def cut(root: Path, ledger: Path, rng: random.Random, *, name_loss: float = 0.5) -> list[str]:
    """Make ``root`` what a power cut at the moment of the kill may leave; return what
    was changed, one line per file, for the checker's log."""
    sizes, names = _read(ledger)
    changes = []
    for directory in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        durable_names = names.get(str(directory), {})
        for entry in list(os.scandir(directory)):
            if not entry.is_file(follow_symlinks=False):
                continue
            path = Path(entry.path)
            ino = entry.inode()
            if path.name.endswith(".tmp") or (durable_names.get(entry.name) != ino and rng.random() < name_loss):
                path.unlink()
                changes.append(f"lost {path.name}")
                continue
            size = entry.stat().st_size
            durable = min(sizes.get(ino, 0), size)
            keep = durable + _torn(rng, size - durable)
            zeros = rng.choice([0, 0, rng.randrange(1, 4096)]) if keep < size else 0
            if keep < size or zeros:
                os.truncate(path, keep)
                if zeros:
                    with open(path, "ab") as f:
                        f.write(bytes(zeros))
                changes.append(f"{path.name}: {size} -> {keep} (+{zeros} zeros), fsynced {durable}")
    return changes


def _torn(rng: random.Random, unsynced: int) -> int:
    """How many of ``unsynced`` bytes written after the last fsync survive."""
    if unsynced <= 0:
        return 0
    return rng.choice([0, unsynced, rng.randrange(unsynced + 1)])
