"""The compiled build (bench/bench_compiled.py, docs/architecture.md "Compiled hot
paths") still builds and runs: mypyc compiles the group in a worktree of HEAD, and the
engine's tests and the SOW and views integration tests pass against it. Slow (the
build alone takes about two minutes on two cores): `make test-slow`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench.bench_compiled import ROOT, build, env_of, worktree

pytestmark = pytest.mark.slow


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_the_compiled_group_builds_and_passes_the_engine_tests():
    with tempfile.TemporaryDirectory() as tmp:
        tree = worktree("HEAD", Path(tmp) / "compiled")
        try:
            build(tree)  # raises unless every module of the group imports from its extension module
            out = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-rs", "-x", "-n", "2", "-p", "no:cacheprovider",
                 "tests/engine", "tests/integration/test_sow.py"],
                cwd=tree, env={**env_of(tree), "CONVEYOR_SIM_SCALE": "0.05"}, capture_output=True, text=True,
                timeout=1500,
            )
            assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
            assert "Queue is compiled" in out.stdout  # test_queue_tidy's skip: they ran against the build
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
