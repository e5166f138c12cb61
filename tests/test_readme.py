"""README's promises: its commands are the ones CI runs, and its example code runs."""

import os
import re

from conftest import ROOT


def readme_commands():
    text = open(os.path.join(ROOT, "README.md")).read()
    return re.findall(r"```sh\n(.*?)\n```", text, re.S)


def test_ci_runs_the_readme_test_command():
    main_job, tests = readme_commands()[:2]
    assert "tools/example.py" in main_job and "pytest" in tests
    ci = open(os.path.join(ROOT, ".ci", "run")).read().splitlines()
    assert tests.strip() in [line.strip() for line in ci]


def test_example_builds_and_finds_near_duplicates(tmp_path):
    import subprocess
    import sys
    corpus = tmp_path / "doc"
    base = " ".join(f"word{i}" for i in range(5000))
    for name, text in [("a", base), ("b", base + " tail"), ("c", "entirely different " * 40)]:
        (corpus / name).mkdir(parents=True)
        (corpus / name / "copyright").write_text(text)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "example.py"),
                        "--dir", str(corpus), "--index", str(tmp_path / "idx")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "indexed 3 copyright files" in p.stdout and "(3 new or changed)" in p.stdout
    assert "1 groups of near-duplicates" in p.stdout
    assert "2: a (0), b (" in p.stdout or "2: b (0), a (" in p.stdout
    again = subprocess.run(p.args, capture_output=True, text=True, timeout=120)
    assert "(0 new or changed)" in again.stdout                  # incremental across runs
    bad = subprocess.run(p.args + ["--k", "5"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "k=5 was given" in bad.stderr and "Traceback" not in bad.stderr
