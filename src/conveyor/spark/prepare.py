"""``conveyor spark prepare``: bytecode for the Python that Spark starts (docs/spark.md).

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on the path
of every Python process it starts, ahead of the installed package. The zip holds only
sources, and ``zipimport`` cannot cache bytecode, so each such process compiles the
pyspark modules it imports again: about a second of CPU on every query's streaming
source runner and every executor's Python daemon. And each of those processes calls
``importlib.invalidate_caches()`` once started, which re-reads the zip's directory once
per package imported from it (19 here), so the directory's size counts too.

``prepare`` rebuilds each zip with a ``.pyc`` beside every ``.py`` (hash-checked against
its source, so an edited source is never shadowed) and without pyspark's own test
suites (1,053 of the 1,485 entries of PySpark 4.3's zip; no worker imports them). The
original is kept as ``<zip>.orig``; ``restore`` puts it back. The bytecode is for the
interpreter that runs ``prepare``: run it with the Python the workers use
(``PYSPARK_PYTHON``). Another interpreter ignores it and compiles as before.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
import zipfile
from dataclasses import dataclass
from importlib import _bootstrap_external  # type: ignore[attr-defined]
from pathlib import Path, PurePosixPath

import _imp

from conveyor import errors

#: an entry of a prepared zip (not a module): which interpreter's bytecode it holds
MARKER = "conveyor-prepared"
BACKUP = ".orig"


def _magic() -> bytes:
    return b"bytecode for magic " + importlib.util.MAGIC_NUMBER.hex().encode()


def spark_home(explicit: str | None = None) -> Path:
    """``explicit``, else ``$SPARK_HOME``, else the pip-installed pyspark package."""
    home = explicit or os.environ.get("SPARK_HOME")
    if home:
        path = Path(home)
    else:
        spec = importlib.util.find_spec("pyspark")
        if spec is None or spec.origin is None:
            raise errors.ConfigError("pyspark is not installed and SPARK_HOME is not set (pip install conveyor[spark])")
        path = Path(spec.origin).parent
    if not (path / "python" / "lib").is_dir():
        raise errors.ConfigError(f"{path} is not a Spark home: it has no python/lib directory")
    return path


def zips(home: Path) -> list[Path]:
    """The zips Spark puts on its Python processes' path."""
    return sorted(p for p in (home / "python" / "lib").glob("*.zip"))


@dataclass(frozen=True)
class Outcome:
    zip: Path
    state: str  # "prepared", "already prepared", "original", "restored", "prepared for another Python"
    entries: int = 0
    compiled: int = 0

    def __str__(self) -> str:
        counts = f" ({self.entries} entries, {self.compiled} compiled)" if self.compiled else ""
        return f"{self.zip}: {self.state}{counts}"


def status(path: Path) -> str:
    with zipfile.ZipFile(path) as z:
        if MARKER not in z.namelist():
            return "original"
        return "already prepared" if z.read(MARKER) == _magic() else "prepared for another Python"


def _is_test(name: str) -> bool:
    return "tests" in PurePosixPath(name).parts[:-1]


def _pyc(source: bytes, filename: str) -> bytes:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pyspark's own SyntaxWarnings, compiled as Python would
        code = compile(source, filename, "exec", dont_inherit=True)
    source_hash = _imp.source_hash(_bootstrap_external._RAW_MAGIC_NUMBER, source)
    return bytes(_bootstrap_external._code_to_hash_pyc(code, source_hash, checked=True))


def prepare(path: Path) -> Outcome:
    """Rebuild ``path`` with bytecode and without test suites; keeps ``path.orig``."""
    state = status(path)
    if state == "already prepared":
        return Outcome(path, state)
    backup = path.with_name(path.name + BACKUP)
    if state == "original":
        tmp_backup = backup.with_name(backup.name + ".tmp")
        tmp_backup.write_bytes(path.read_bytes())
        os.replace(tmp_backup, backup)  # a copy that is whole or absent
    elif not backup.exists():
        raise errors.ConfigError(f"{path} was prepared for another Python and its original ({backup}) is gone")
    tmp = path.with_name(path.name + ".tmp")
    entries = compiled = 0
    with zipfile.ZipFile(backup) as src, zipfile.ZipFile(tmp, "w") as out:
        names = set(src.namelist())
        for info in src.infolist():
            if _is_test(info.filename):
                continue
            data = src.read(info)
            out.writestr(info, data)
            entries += 1
            if info.filename.endswith(".py") and info.filename + "c" not in names:
                # the file name zipimport gives the module's code, for tracebacks
                out.writestr(zipfile.ZipInfo(info.filename + "c", info.date_time),
                             _pyc(data, str(path / info.filename)), compress_type=zipfile.ZIP_DEFLATED)
                entries += 1
                compiled += 1
        out.writestr(MARKER, _magic())
    os.replace(tmp, path)  # processes already running keep the old file open
    return Outcome(path, "prepared", entries, compiled)


def restore(path: Path) -> Outcome:
    backup = path.with_name(path.name + BACKUP)
    if not backup.exists():
        return Outcome(path, status(path))
    os.replace(backup, path)
    return Outcome(path, "restored")
