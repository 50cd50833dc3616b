"""The compiled build (docs/architecture.md, "The compiled build").

pyproject.toml describes the package; this file adds mypyc's extension modules for the
group that ``conveyor.native.GROUP`` names, and writes the manifest that tells the
package at import that its extension modules match their sources. Without a C compiler
or mypyc, or with ``CONVEYOR_PURE=1``, it builds the same package as pure Python and
says so in one line. Where a compiler is, a compile that fails fails the build: that is
a fault in the source to fix, not a machine to work around.

    python setup.py build_ext --inplace     # what `make build` runs, in the source tree
    pip wheel --no-deps -w dist .           # what `make wheel` runs
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("_conveyor_native", ROOT / "src" / "conveyor" / "native.py")
assert _spec is not None and _spec.loader is not None
native = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(native)


def why_pure() -> str | None:
    if os.environ.get("CONVEYOR_PURE", "") not in ("", "0"):
        return "CONVEYOR_PURE is set"
    if importlib.util.find_spec("mypyc") is None:
        return "mypyc is not installed"
    if shutil.which((os.environ.get("CC") or "cc").split()[0]) is None:  # CC may carry flags
        return "no C compiler"
    return None


class BuildExt(build_ext):
    """Builds the group, then writes the manifest beside the package's sources (in
    place) or into the build's copy of the package (a wheel)."""

    def run(self) -> None:
        # A module that left the group would keep an extension module that imports from
        # a group library without it (in place), or ride along into the next wheel (pip
        # reuses build/): every earlier build's output goes first.
        target = ROOT / "src" if self.inplace else Path(self.build_lib)
        for stale in [*target.joinpath("conveyor").rglob("*.so"), *target.glob("conveyor__mypyc*"),
                      target / "conveyor" / "native.txt"]:
            stale.unlink(missing_ok=True)
        super().run()
        if self.extensions:
            native.write_manifest(str(target / "conveyor"))


def ext_modules() -> list:
    reason = why_pure()
    if reason is not None:
        print(f"conveyor: building pure Python ({reason})", file=sys.stderr)
        return []
    import mypyc
    from mypyc.build import mypycify

    extensions = mypycify([f"src/conveyor/{name}" for name in native.GROUP], opt_level="3", group_name="conveyor",
                           multi_file=True)
    # Reproducible wheels: the compiler writes the directories it read from into the
    # debug information, and pip's build environment is a new temporary one each time.
    prefixes = [f"-ffile-prefix-map={Path(mypyc.__file__).parent}=mypyc", f"-ffile-prefix-map={ROOT}=."]
    for extension in extensions:
        extension.extra_compile_args = [*extension.extra_compile_args, *prefixes]
    return extensions


setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExt})
