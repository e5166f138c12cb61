"""Types: the stubs of the compiled modules (simindex/*/_*.pyi) match the built modules (mypy's
stubtest), and mypy finds nothing wrong in the package, so a signature changed in a .pyx
cannot leave its stub behind and the annotations of the public API stay true."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("mypy")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = [*(f"simindex.engine.{m}" for m in ("_layout", "_lmdb", "_permute", "_slabs",
                                                "_records", "_join", "_query")),
           "simindex.signatures._fingerprint", "simindex.signatures._text"]


def mypy(*args):
    # mypy reads the sources of this checkout (an editable install's import hook is
    # invisible to it) and the configuration in pyproject.toml
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, MYPYPATH=ROOT))


@pytest.mark.timeout(600)
def test_stubs_match_the_compiled_modules():
    # Cython's own additions are allowed; cdef classes are disjoint bases by construction
    run = mypy("mypy.stubtest", "--concise", "--mypy-config-file", "pyproject.toml",
               "--allowlist", "tests/stubtest_allowlist.txt", "--ignore-disjoint-bases",
               *MODULES)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]


@pytest.mark.timeout(600)
def test_mypy_finds_nothing_wrong_in_the_package():
    run = mypy("mypy", "simindex")
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
