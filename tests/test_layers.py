"""The package's layers, as pyproject.toml's import-linter contract states them: the
integrations over the dataset workflow over the Index API over the storage engine and the
signatures, which know nothing of each other. A module importing upwards fails here."""

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("importlinter")


def test_every_module_imports_only_from_the_layers_below_it():
    p = subprocess.run([sys.executable, "-c",
                        "import importlinter.cli as c; c.lint_imports_command()"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.returncode == 0 and "0 broken" in p.stdout, p.stdout[-4000:] + p.stderr[-2000:]


def test_every_part_of_the_package_has_a_layer():
    """A new module or subpackage is placed in a layer, or the contract would not see it."""
    import tomllib
    layers = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))[
        "tool"]["importlinter"]["contracts"][0]["layers"]
    placed = {m.strip() for layer in layers for m in re.split(r"[|:]", layer)}
    here = os.path.join(ROOT, "simindex")
    parts = {f"simindex.{name[:-3] if name.endswith('.py') else name}"
             for name in os.listdir(here)
             if (name.endswith(".py") or os.path.exists(os.path.join(here, name, "__init__.py")))}
    outside = {"simindex.__init__", "simindex.__main__", "simindex._testing"}
    assert parts - outside == placed
