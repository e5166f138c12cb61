"""README's promises: its commands are the ones CI runs, and the site builds."""

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


def test_example_stops_quietly_when_its_reader_closes_the_pipe(tmp_path):
    """`python3 tools/example.py | head -1` (as the serve tutorial runs it): no traceback."""
    import subprocess
    import sys
    for i in range(40):                                  # 40 x 4 KB: more than a pipe holds
        (tmp_path / f"p{i}").mkdir()
        (tmp_path / f"p{i}" / "copyright").write_text(f"package {i} " + "word " * 800)
    p = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "example.py"), "--dir",
                          str(tmp_path), "--emit-jsonl"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=ROOT))
    assert p.stdout.readline().startswith(b'{"id": "p0"')
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == 141 and b"Traceback" not in err, err


def test_readme_is_short():
    """README is read in five minutes; its code runs in tests/test_docs_examples.py."""
    assert len(open(os.path.join(ROOT, "README.md")).read().splitlines()) < 250


def test_install_page_shows_readme_commands():
    """The Install page repeats README's set-up and test commands, as they are."""
    install = open(os.path.join(ROOT, "docs", "install.md")).read()
    assert readme_commands()[:2] == re.findall(r"```sh\n(.*?)\n```", install, re.S)[:2]


def test_the_documentation_site_builds_strictly(tmp_path):
    """mkdocs builds docs/ with every page in the navigation, every link resolved and the
    API reference generated from the docstrings, warnings counted as errors."""
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d",
                        str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "add_unique_text" in api and "CorruptError" in api
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert all(f"simindex {c}" in cli for c in ("build", "dedup", "serve", "repair"))
    for ref in ("schemes", "stats", "errors"):                 # in the nav, so built
        assert (tmp_path / "site" / "reference" / ref / "index.html").exists(), ref
    readme = open(os.path.join(ROOT, "README.md")).read()
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert os.path.exists(os.path.join(ROOT, link)), link


def test_ci_runs_the_test_command_in_a_fresh_virtual_environment():
    """As README advises: a venv's python loses what the system's has installed."""
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    make, activate, command = (ci.index("python3 -m venv"), ci.index("/bin/activate"),
                               ci.index("python3 -m pytest"))
    assert make < activate < command
