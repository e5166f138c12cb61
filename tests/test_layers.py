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
    try:
        import tomllib                   # Python 3.11 on
    except ImportError:                  # 3.9, 3.10: the same parser, as a package
        import tomli as tomllib
    layers = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))[
        "tool"]["importlinter"]["contracts"][0]["layers"]
    placed = {m.strip() for layer in layers for m in re.split(r"[|:]", layer)}
    here = os.path.join(ROOT, "simindex")
    parts = {f"simindex.{name[:-3] if name.endswith('.py') else name}"
             for name in os.listdir(here)
             if (name.endswith(".py") or os.path.exists(os.path.join(here, name, "__init__.py")))}
    outside = {"simindex.__init__", "simindex.__main__", "simindex._testing"}
    assert parts - outside == placed


def test_no_module_imports_one_that_imports_it_back():
    """The modules' imports, those inside functions too, form no circle: an import hidden
    in a function to break one is a circle all the same."""
    import ast
    here = os.path.join(ROOT, "simindex")
    modules = {}
    for folder, _dirs, files in os.walk(here):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                modules[rel[:-9] if rel.endswith(".__init__") else rel] = path
    graph = {}
    for mod, path in modules.items():
        package = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        targets = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")
                base = base[:len(base) - node.level + 1] if node.level else []
                name = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:      # `from . import x` names a module x
                    full = f"{name}.{alias.name}"
                    targets.add(full if full in modules else name)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
        graph[mod] = {t for t in targets if t in modules and t != mod and
                      not mod.startswith(t + ".")}   # a package's own __init__ aside
    circles = set()

    def walk(mod, path, on_path):
        for nxt in graph[mod]:
            if nxt in on_path:
                circle = path[path.index(nxt):]
                i = circle.index(min(circle))
                circles.add(" -> ".join(circle[i:] + circle[:i]))
            elif nxt not in done:
                walk(nxt, path + [nxt], on_path | {nxt})
        done.add(mod)
    done: set = set()
    for mod in sorted(graph):
        if mod not in done:
            walk(mod, [mod], {mod})
    assert sorted(circles) == []
