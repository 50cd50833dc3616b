"""``conveyor spark prepare``: Spark's zips rebuilt with bytecode (conveyor.spark.prepare).

The proof that the bytecode is used is a subprocess in which compiling a module from
the zip raises: importing from the original zip fails there, from the prepared one it
succeeds. No timing is asserted (docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from conveyor import errors
from conveyor.cli.main import main
from conveyor.spark import prepare

#: imports MODULES with ZIP first on the path, where compiling anything from the zip raises
NO_COMPILE = textwrap.dedent("""
    import builtins, sys
    zip_path, modules = sys.argv[1], sys.argv[2:]
    real = builtins.compile
    def compile(source, filename, *args, **kwargs):
        if str(filename).startswith(zip_path):
            raise RuntimeError("compiled from the zip: " + str(filename))
        return real(source, filename, *args, **kwargs)
    builtins.compile = compile
    sys.path.insert(0, zip_path)
    for name in modules:
        __import__(name)
    print("ok", sys.modules[modules[-1]].__file__)
""")


def imports_without_compiling(zip_path: Path, *modules: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_COMPILE, str(zip_path), *modules],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})


def fake_home(tmp_path: Path) -> Path:
    lib = tmp_path / "spark" / "python" / "lib"
    lib.mkdir(parents=True)
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as z:
        z.writestr("pkg/__init__.py", "VALUE = 1\n")
        z.writestr("pkg/mod.py", "from pkg import VALUE\nDOUBLE = VALUE * 2\n")
        z.writestr("pkg/data.txt", "kept as it is\n")
        z.writestr("pkg/tests/__init__.py", "")
        z.writestr("pkg/tests/test_mod.py", "raise SystemExit('a test suite')\n")
    return tmp_path / "spark"


def test_prepare_adds_bytecode_drops_tests_keeps_the_original(tmp_path):
    home = fake_home(tmp_path)
    zip_path = home / "python" / "lib" / "pyspark.zip"
    before = zip_path.read_bytes()
    assert imports_without_compiling(zip_path, "pkg.mod").returncode != 0

    outcome = prepare.prepare(zip_path)
    assert (outcome.state, outcome.entries, outcome.compiled) == ("prepared", 5, 2)
    with zipfile.ZipFile(zip_path) as z:
        assert sorted(z.namelist()) == ["conveyor-prepared", "pkg/__init__.py", "pkg/__init__.pyc", "pkg/data.txt",
                                        "pkg/mod.py", "pkg/mod.pyc"]
        assert z.read("pkg/data.txt") == b"kept as it is\n"
    assert (zip_path.parent / "pyspark.zip.orig").read_bytes() == before
    done = imports_without_compiling(zip_path, "pkg.mod")
    assert done.returncode == 0, done.stderr
    assert prepare.status(zip_path) == "already prepared"
    assert prepare.prepare(zip_path).state == "already prepared"

    assert prepare.restore(zip_path).state == "restored"
    assert zip_path.read_bytes() == before and prepare.status(zip_path) == "original"


def test_an_edited_source_is_not_shadowed_by_its_bytecode(tmp_path):
    """The .pyc are hash-checked: a source that differs from the one compiled wins."""
    zip_path = fake_home(tmp_path) / "python" / "lib" / "pyspark.zip"
    prepare.prepare(zip_path)
    edited = tmp_path / "edited.zip"
    with zipfile.ZipFile(zip_path) as src, zipfile.ZipFile(edited, "w") as out:
        for info in src.infolist():
            data = src.read(info)
            out.writestr(info, b"DOUBLE = 'edited'\n" if info.filename == "pkg/mod.py" else data)
    run = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import pkg.mod; "
                          "print(pkg.mod.DOUBLE)", str(edited)], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "edited", run.stderr


def test_bytecode_for_another_python_is_rebuilt_from_the_original(tmp_path):
    zip_path = fake_home(tmp_path) / "python" / "lib" / "pyspark.zip"
    prepare.prepare(zip_path)
    rebuilt = tmp_path / "other.zip"
    with zipfile.ZipFile(zip_path) as src, zipfile.ZipFile(rebuilt, "w") as out:
        for info in src.infolist():  # as another interpreter's prepare leaves it
            out.writestr(info, b"bytecode for magic 0000" if info.filename == prepare.MARKER else src.read(info))
    rebuilt.replace(zip_path)
    assert prepare.status(zip_path) == "prepared for another Python"
    assert prepare.prepare(zip_path).state == "prepared"
    assert prepare.status(zip_path) == "already prepared"


def test_the_command(tmp_path, capsys):
    home = fake_home(tmp_path)
    assert main(["spark", "status", "--spark-home", str(home)]) == 0
    assert capsys.readouterr().out.strip().endswith("pyspark.zip: original")
    assert main(["spark", "prepare", "--spark-home", str(home)]) == 0
    assert "pyspark.zip: prepared (5 entries, 2 compiled)" in capsys.readouterr().out
    assert main(["spark", "restore", "--spark-home", str(home)]) == 0
    assert main(["spark", "prepare", "--spark-home", str(tmp_path)]) == 2
    assert "is not a Spark home" in capsys.readouterr().err
    with pytest.raises(errors.ConfigError, match="not a Spark home"):
        prepare.spark_home(str(tmp_path))


def test_a_read_only_spark_home_is_a_clear_error(tmp_path, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes through directory permissions")
    home = fake_home(tmp_path)
    lib = home / "python" / "lib"
    lib.chmod(0o555)
    try:
        assert main(["spark", "prepare", "--spark-home", str(home)]) == 1
        assert "Permission denied" in capsys.readouterr().err
    finally:
        lib.chmod(0o755)


@pytest.mark.spark
def test_the_installed_pyspark_imports_from_a_prepared_copy_without_compiling(tmp_path):
    """A copy of the installed pyspark.zip, prepared: the streaming source runner's
    imports (what every query's runner process does first) compile nothing from it."""
    lib = prepare.spark_home() / "python" / "lib"
    original = lib / "pyspark.zip.orig" if (lib / "pyspark.zip.orig").exists() else lib / "pyspark.zip"
    copy = tmp_path / "pyspark.zip"
    copy.write_bytes(original.read_bytes())
    if prepare.status(copy) != "original":
        pytest.skip("no original pyspark.zip to copy")
    assert prepare.prepare(copy).state == "prepared"
    run = imports_without_compiling(copy, "pyspark.sql.streaming.python_streaming_source_runner")
    assert run.returncode == 0, run.stderr[-2000:]
    assert str(copy) in run.stdout
