"""conveyor/native.py: which build a process runs (docs/architecture.md, "The compiled
build"). The compiled and pure runs of the suite themselves are `make test`'s; these
check the decision: the environment, a missing or stale build, and that the pure finder
really gives every module of the group its source."""

from __future__ import annotations

import importlib.machinery
import shutil
import subprocess
import sys
from pathlib import Path

from conveyor import native

PACKAGE = Path(native.PACKAGE)
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _package_copy(tmp_path: Path, *, built: bool) -> Path:
    """The group's sources in a directory of their own, with empty stand-ins for the
    extension modules and, when ``built``, a manifest of the sources as they are."""
    for name in native.GROUP:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(PACKAGE / name, tmp_path / name)
        (tmp_path / (name[:-3] + SUFFIX)).write_bytes(b"")
    if built:
        native.write_manifest(str(tmp_path))
    return tmp_path


def test_a_build_runs_compiled_until_a_source_changes(tmp_path):
    package = _package_copy(tmp_path, built=True)
    assert native.decide(str(package)) == (True, f"compiled ({len(native.GROUP)} modules, mypyc)")
    with open(package / "engine/txn.py", "a") as f:
        f.write("# edited after the build\n")
    compiled, why = native.decide(str(package))
    assert not compiled and "engine/txn.py changed since it was compiled" in why and "make build" in why


def test_pure_python_when_asked_never_built_or_half_built(tmp_path):
    package = _package_copy(tmp_path, built=True)
    assert native.decide(str(package), pure="1") == (False, "pure Python (CONVEYOR_PURE is set)")
    assert native.decide(str(package), pure="0")[0]
    (package / ("engine/queue/queue" + SUFFIX)).unlink()
    assert native.decide(str(package)) == (False, "pure Python (engine/queue/queue.py's extension module is missing)")
    (package / "native.txt").unlink()
    assert native.decide(str(package)) == (False, "pure Python (not compiled)")


def test_the_pure_finder_gives_every_module_of_the_group_its_source():
    """In a child process with CONVEYOR_PURE=1, whether or not this tree is compiled."""
    code = ("import importlib, conveyor.native as n\n"
            "files = [importlib.import_module('conveyor.' + m[:-3].replace('/', '.')).__file__ for m in n.GROUP]\n"
            "print(n.describe()); print(sorted({f.rsplit('.', 1)[1] for f in files}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         env={"CONVEYOR_PURE": "1", "PATH": "/usr/bin:/bin"})
    assert out.stdout.splitlines() == ["pure Python (CONVEYOR_PURE is set)", "['py']"], out.stderr


def test_this_process_runs_what_native_says():
    """Under `make test` the tree is compiled and this checks the group's extension
    modules are the ones imported; under `make check` (CONVEYOR_PURE=1) the sources."""
    import conveyor.engine.core as core
    import conveyor.engine.queue.queue as queue

    kinds = {Path(module.__file__ or "").suffix for module in (core, queue)}
    assert kinds == ({".so"} if native.COMPILED else {".py"}), native.describe()
