"""`make wheel`'s promises (docs/architecture.md, "The compiled build"): the compiled
wheel is the same bytes when built twice from one commit, and a machine without a C
compiler still builds and installs conveyor, as pure Python. Slow (two compiled builds,
about five minutes on two cores): `make test-slow`."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _wheel(into: Path, **env: str) -> Path:
    stamp = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(into), str(ROOT)],
                   env={**os.environ, "PYTHONHASHSEED": "0", "SOURCE_DATE_EPOCH": stamp, **env}, check=True,
                   capture_output=True, timeout=1200)
    (wheel,) = into.glob("*.whl")
    return wheel


@pytest.mark.timeout(1500)
def test_the_compiled_wheel_is_the_same_bytes_twice(tmp_path):
    first, second = _wheel(tmp_path / "a"), _wheel(tmp_path / "b")
    assert first.name.endswith("-linux_x86_64.whl") or "-cp3" in first.name, first.name
    with zipfile.ZipFile(first) as wheel:
        names = wheel.namelist()
    assert "conveyor/native.txt" in names and sum(name.endswith(".so") for name in names) == 36
    assert hashlib.sha256(first.read_bytes()).digest() == hashlib.sha256(second.read_bytes()).digest()


def test_without_a_c_compiler_the_wheel_is_pure_python_and_runs(tmp_path):
    wheel = _wheel(tmp_path / "w", CC=str(tmp_path / "no-such-cc"))
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        assert not [name for name in archive.namelist() if name.endswith(".so") or name.endswith("native.txt")]
        archive.extractall(tmp_path / "site")
    out = subprocess.run([sys.executable, "-c", "import conveyor.native as n, conveyor.engine.core as c; "
                          "print(n.describe(), c.__file__.endswith('.py'))"],
                         env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"}, capture_output=True,
                         text=True, check=True, timeout=120)
    assert out.stdout.strip() == "pure Python (not compiled) True", out.stderr
