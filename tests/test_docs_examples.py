"""Every code example in README.md and docs/ runs as written and prints what the page shows.

The collector reads every fenced block of README.md and of docs/**/*.md. A fence names its
language, and the language decides what the test does with it:

- ```python: run. A page's Python blocks are one script: they run in page order, in one
  process (a page is one tutorial, so a block may use what an earlier block of the page
  defined), in a fresh temporary directory, with PYTHONPATH the checkout. The script must
  exit 0. Its lines keep their numbers in the page, so a traceback names the page and line.
- ```console, or ```sh / ```bash holding lines that start with `$ `: a terminal
  transcript, replayed in a fresh temporary directory of its own (a block makes every file
  it uses). Each `$ ` line (with the lines after it while it ends in a backslash) is a
  command, run by bash in that directory, which holds `tools`, a link to the checkout's
  tools/, and where `simindex` and `python3` are this checkout's, first on PATH. The lines after a command, up to the next
  `$ `, are what the page says it prints (stdout and stderr together). Every command must
  exit 0 (a page that shows a failure shows its status: `...; echo "exit $?"`), and what
  it prints must match what is shown, line for line (trailing spaces aside), except that:
    - `...` (with a space on either side of it) matches any text within a line, and a
      line that is only `...` any lines, none included (the page cut the output);
    - a duration (a number followed by ` s`, ` ms` or ` rows/s`) matches any number;
    - in a block marked `numbers vary`, every number matches any number;
    - a command ending in `&` runs in the background: the test waits (up to 60 s) until
      it has printed what is shown for it, and stops it (SIGTERM) when the block ends;
    - in a block that serves on port 8080, every 8080 (in commands and output) becomes a
      free port of this machine, so that the test never takes a port in use.
- ```sh / ```bash without `$ ` lines: a script, run by `bash -e`; it must exit 0.
- ```text: not code (a listing, a log excerpt, output shown alone); never run.
- Any other language, or none: the test fails, since it cannot tell whether to run it.

A comment on the line just before a fence marks a block the test must treat otherwise; any
other comment there is an error:

- `<!-- test: not run, REASON -->`: the block is reported as skipped with REASON (for
  commands that cannot run here: installs, which CI runs itself, and benchmarks). A block
  that installs software (`apt-get install`, `pip install`) must carry it: the test never
  runs one;
- `<!-- test: needs a Ray cluster -->`: run only with `-m deep`; on a Python block, its
  page's script then runs in a network namespace where only loopback is up (a local Ray
  starts there);
- `<!-- test: numbers vary, REASON -->`: numbers in the shown output compare loosely.
"""

import glob
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import NamedTuple, Optional

import pytest

from conftest import ROOT

RUN = {"python", "console", "sh", "bash"}
MARKER = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->\s*$")
NOT_RUN = re.compile(r"^not run, (\S.*)$")
VARY = re.compile(r"^numbers vary, (\S.*)$")
RAY = "needs a Ray cluster"
INSTALLS = re.compile(r"\b(apt-get|apt|pip|pip3) +install\b|-m pip install\b")


class Block(NamedTuple):
    page: str            # relative to the checkout: README.md, docs/guide/python.md
    line: int            # line number in the page of the block's first line of code
    lang: str
    code: str
    marker: Optional[str]

    @property
    def name(self):
        return f"{self.page}:{self.line}"

    @property
    def skip_reason(self):
        m = self.marker and NOT_RUN.match(self.marker)
        return m.group(1) if m else None

    @property
    def loose_numbers(self):
        return bool(self.marker and VARY.match(self.marker))

    @property
    def needs_ray(self):
        return self.marker == RAY


def pages():
    docs = sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return ["README.md"] + [os.path.relpath(p, ROOT) for p in docs]


def blocks_of(page):
    """The fenced blocks of a page, in order."""
    lines = open(os.path.join(ROOT, page), encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(.*)$", lines[i])
        if not m:
            i += 1
            continue
        indent, lang = len(m.group(1)), m.group(2).strip()
        prev = lines[i - 1].strip() if i else ""
        marker = MARKER.match(prev)
        marker = marker.group(1) if marker else (prev if prev.startswith("<!--") else None)
        start, i = i + 1, i + 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        assert i < len(lines), f"{page}:{start}: a fence that is never closed"
        code = "\n".join(line[indent:] for line in lines[start:i])
        out.append(Block(page, start + 1, lang, code, marker))
        i += 1
    return out


ALL = [b for p in pages() for b in blocks_of(p)]


def test_every_block_says_what_it_is():
    """A fence names a language the test runs or `text`, and a marker is one it knows."""
    bad = []
    for b in ALL:
        if b.lang not in RUN | {"text"}:
            bad.append(f"{b.name}: fence language {b.lang!r}: say python, console, sh, bash "
                       f"(run) or text (not code)")
        if b.lang in RUN and not b.skip_reason and INSTALLS.search(b.code):
            bad.append(f"{b.name}: installs software: mark it 'not run, REASON' (the test "
                       f"never installs anything)")
        if b.marker is None:
            continue
        if b.lang == "text":
            bad.append(f"{b.name}: a marker on a text block, which never runs")
        elif not (b.skip_reason or b.loose_numbers or b.needs_ray):
            bad.append(f"{b.name}: unknown marker {b.marker!r}: say 'not run, REASON', "
                       f"'numbers vary, REASON' or {RAY!r}")
    assert not bad, "\n".join(bad)
    assert any(b.lang == "python" for b in ALL) and any(b.lang == "console" for b in ALL)


# --- Python: one script per page -------------------------------------------------------

def python_pages():
    out = []
    for page in pages():
        code = [b for b in blocks_of(page) if b.lang == "python"]
        if not code:
            continue
        run = [b for b in code if not b.skip_reason]
        marks = []
        if any(b.needs_ray for b in run):
            marks.append(pytest.mark.deep)
        if not run:
            marks.append(pytest.mark.skip(reason="; ".join(f"{b.name}: {b.skip_reason}" for b in code)))
        out.append(pytest.param(page, run, marks=marks, id=page))
    return out


def page_script(blocks):
    """The page's Python blocks as one script, each block on its own lines of the page."""
    lines = []
    for b in blocks:
        assert len(lines) < b.line, b.name
        lines += [""] * (b.line - 1 - len(lines)) + b.code.split("\n")
    return "\n".join(lines) + "\n"


def environment(bindir=None):
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
    if bindir:
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


IN_SANDBOX = """import runpy, sys
from simindex.distributed import sandbox
why = sandbox.loopback_only()
if why:
    print(f"SKIP: no loopback-only network namespace for Ray: {why}")
    sys.exit(0)
runpy.run_path(sys.argv[1], run_name="__main__")
"""


@pytest.mark.parametrize("page,blocks", python_pages())
def test_python_blocks_run(page, blocks, tmp_path):
    script = tmp_path / "page" / page
    script.parent.mkdir(parents=True)
    script.write_text(page_script(blocks), encoding="utf-8")
    work = tmp_path / "run"
    work.mkdir()
    cmd = [sys.executable, str(script)]
    if any(b.needs_ray for b in blocks):
        pytest.importorskip("ray", reason="Ray is not installed (pip install 'simindex[ray]')")
        cmd = [sys.executable, "-c", IN_SANDBOX, str(script)]
    for again in (False, True):      # a reader runs a page twice: it still runs
        p = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600,
                           env=environment())
        if p.stdout.startswith("SKIP: "):
            pytest.skip(p.stdout[6:].strip())
        assert p.returncode == 0, \
            f"{page}{' run again' if again else ''} (lines are the page's):\n{p.stderr[-3000:]}"


# --- Shell transcripts: one per block --------------------------------------------------

def shell_blocks():
    out = []
    for b in ALL:
        if b.lang in ("console", "sh", "bash"):
            marks = [pytest.mark.skip(reason=f"{b.name}: {b.skip_reason}")] if b.skip_reason else []
            if b.needs_ray:
                marks.append(pytest.mark.deep)
            out.append(pytest.param(b, marks=marks, id=b.name))
    return out


def commands_of(code):
    """[(command, shown output lines)] of a console block."""
    out = []
    lines = code.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            cmd = line[2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd += "\n" + lines[i]
            out.append((cmd, []))
        else:
            assert out, f"output before the first command: {line!r}"
            out[-1][1].append(line)
        i += 1
    return out


NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?(?:e[+-]?\d+)?"     # 7, 3,387, 0.47, 6.1e+03
DURATION = re.compile(rf"(?<![\w.]){NUMBER}(?= (?:s|ms|rows/s)\b)")
ANY_NUMBER = re.compile(rf"(?<![\w.]){NUMBER}(?![\w])")


def line_pattern(line, loose):
    """The regular expression of one shown line."""
    out = []
    for n, piece in enumerate(re.split(r" ?\.\.\. ?", line)):
        if n:
            out.append(r"[^\n]*")
        numbers = ANY_NUMBER if loose else DURATION
        pos = 0
        for m in numbers.finditer(piece):
            out.append(re.escape(piece[pos:m.start()]) + NUMBER)
            pos = m.end()
        out.append(re.escape(piece[pos:]))
    return "".join(out)


def shown_pattern(shown, loose):
    parts = []
    for line in shown:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(line_pattern(line.rstrip(), loose) + r"\n")
    return re.compile("".join(parts))


def printed(text):
    """Output as compared: each line without trailing spaces, every line ended by \\n."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return "".join(line.rstrip() + "\n" for line in lines)


def test_the_comparison_rules():
    """The loose rules above, on examples: they loosen only what they say."""
    ok = lambda shown, got, loose=False: bool(shown_pattern(shown, loose).fullmatch(printed(got)))
    assert ok(["simindex: added 841 records, in 0.47 s"], "simindex: added 841 records, in 1.02 s\n")
    assert not ok(["simindex: added 841 records, in 0.47 s"], "simindex: added 840 records, in 0.47 s")
    assert ok(["added 841 records"], "added 715 records", loose=True)
    assert not ok(["3b777a4ba751eeeb"], "3b777a4ba751eeec", loose=True)   # a hex word is no number
    assert ok(['[{"a": 1}, ...]'], '[{"a": 1},{"b": 2}]') and ok(["a ... b"], "a b")
    assert ok(['"d":0,"meta"'], '"d":3,"meta"', loose=True)
    assert not ok(['"d":0,"meta"'], '"d":3,"meta"')
    assert ok(["first", "...", "last"], "first\nlast\n") and ok(["first", "...", "last"], "first\n2\n3\nlast")
    assert not ok(["first", "last"], "first\nlast\nmore\n")
    assert ok(["a  "], "a\n") and ok([], "")
    assert ok(["rows in 841 (3,387 rows/s)"], "rows in 841 (12 rows/s)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("block", shell_blocks())
def test_shell_blocks_run_and_print_what_they_show(block, tmp_path):
    assert not INSTALLS.search(block.code), f"{block.name} installs software: mark it not run"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "simindex").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m simindex "$@"\n')
    (bindir / "simindex").chmod(0o755)
    (bindir / "python3").symlink_to(sys.executable)
    work = tmp_path / "work"
    work.mkdir()
    (work / "tools").symlink_to(os.path.join(ROOT, "tools"))
    env = environment(str(bindir))
    code = block.code
    if "8080" in code:
        code = code.replace("8080", str(free_port()))
    if not any(line.startswith("$ ") for line in code.split("\n")):
        assert block.lang != "console", f"{block.name}: a console block without a `$ ` command"
        p = subprocess.run(["bash", "-e", "-c", code], cwd=work, capture_output=True,
                           text=True, timeout=300, env=env)
        assert p.returncode == 0, f"{block.name}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"
        return
    background = []
    try:
        for cmd, shown in commands_of(code):
            pattern = shown_pattern(shown, block.loose_numbers)
            where = f"{block.name}: $ {cmd}"
            if cmd.rstrip().endswith("&") and not cmd.rstrip().endswith("&&"):
                log = tmp_path / f"background-{len(background)}.log"
                with open(log, "w") as fh:
                    proc = subprocess.Popen(["bash", "-c", cmd.rstrip()[:-1]], cwd=work,
                                            stdout=fh, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
                background.append((proc, log, pattern, where))
                deadline = time.monotonic() + 60
                while not pattern.fullmatch(printed(log.read_text())):
                    assert proc.poll() is None and time.monotonic() < deadline, \
                        f"{where}\nshown:\n" + "\n".join(shown) + f"\nprinted:\n{log.read_text()}"
                    time.sleep(0.2)
                continue
            p = subprocess.run(["bash", "-c", cmd], cwd=work, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=300, env=env)
            got = printed(p.stdout)
            assert p.returncode == 0, f"{where}\nexit {p.returncode}:\n{got}"
            assert pattern.fullmatch(got), \
                f"{where}\nshown:\n" + "\n".join(shown) + f"\nprinted:\n{got}"
    finally:
        for proc, *_ in background:
            stop(proc)
    for proc, log, pattern, where in background:
        assert pattern.fullmatch(printed(log.read_text())), f"{where}\n{log.read_text()}"
