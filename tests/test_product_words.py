"""The product speaks of itself: README, the documentation, the code, the tests and the tools
describe simindex and its use, never the history of its making. What changed and when
belongs in CHANGELOG.md alone. A benchmark states its method and conditions ("on a 2-core
VM whose host takes back freed memory"), not a log of dated runs on one machine.

Each rule below names a kind of phrase that only makes sense to someone who followed the
work, with a pattern precise enough that legitimate text (a hash seed, a MinHash round, a
process's own session, records of a dedup's earlier runs) does not match it. The examples
of what each rule finds carry a '·' inside a word, removed before matching, so that this
file holds none of the phrases it looks for."""

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THIS = os.path.relpath(os.path.abspath(__file__), ROOT)

# (what the phrase is, pattern); matched case-insensitively, one line at a time
RULES = [
    ("an issue or pull request number",
     r"\b(?:issue|pull request|PR|ticket)\s*#?\d+\b|(?:^|[\s(\[])#\d+(?=[\s)\],.:]|$)"),
    ("a numbered round, sprint or milestone of work",
     r"\b(?:round|sprint|milestone)\s+[1-9]\d*\b"),
    ("a planning document by number", r"\bseeds?\s+0\d+\b"),
    ("an option of a design discussion", r"\boption\s+[1-9]\b"),
    ("one particular machine", r"\bthis VM\b|\bthis project's machines?\b|\bmeasured here\b|"
                               r"\bon our (?:machine|VM|box)\b"),
    ("an absolute path of a working machine", r"(?<![\w.~])/(?:work|root|home/\w+)/"),
    ("a session of work", r"(?<!own )(?<!new )\bsessions?\b"),
    ("a dated run", r"(?:^|[\s(;,])20\d\d-[01]\d-[0-3]\d\b"),
    ("a before-and-after of the code",
     r"\bwe used to\b|\bit used to\b|\bused to be\b|\bnow we\b|\bwe now\b|\bthe fix for\b|"
     r"\bno longer than before\b|\bthe run before\b|\ban hour earlier\b|\blatest runs?\b|"
     r"\bthe (?:old|new) code\b"),
    ("a plan not yet carried out", r"\bnot (?:built|done|implemented) yet\b|\bfor now\b|"
                                   r"(?-i:\bTODO\b|\bFIXME\b)"),
]
PATTERNS = [(what, re.compile(p, re.IGNORECASE)) for what, p in RULES]


def product_files():
    """Every tracked text file but CHANGELOG.md, generated C and this file."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    for path in out.decode().split("\0"):
        if not path or path == "CHANGELOG.md" or path == THIS or \
                (path.startswith("ext/") and path.endswith(".c")):
            continue
        with open(os.path.join(ROOT, path), "rb") as f:
            raw = f.read()
        if b"\0" in raw:
            continue                                   # binary
        try:
            yield path, raw.decode("utf-8")
        except UnicodeDecodeError:
            continue                                   # binary


def findings(files):
    """'path:line: [what] matched text' for every phrase any rule matches."""
    found = []
    for path, text in files:
        for n, line in enumerate(text.splitlines(), 1):
            for what, pattern in PATTERNS:
                for m in pattern.finditer(line):
                    found.append(f"{path}:{n}: [{what}] {m.group(0).strip()!r} in "
                                 f"{line.strip()[:120]!r}")
    return found


def test_no_file_speaks_of_the_history_or_planning_of_the_work():
    found = findings(product_files())
    assert not found, "phrases that speak of the work, not the product:\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    "Fixed as of is·sue 32, see #·35.",
    "Performance, rou·nd 3: the scan is faster.",
    "as planned in se·ed 004",
    "we went with opt·ion 2",
    "on this V·M the build takes 40 s",
    "the cost model measured on this pro·ject's machines",
    "copy it to /wo·rk/main/index first",
    "left over from the previous ses·sion",
    "the lat·est runs (2026-11·-25) gave 3.9x",
    "the run be·fore gave 29.7x",
    "we us·ed to sort in Python",
    "bounded by memory for n·ow; not bu·ilt yet",
    "# TO·DO: split the records by seq range",
])
def test_each_kind_of_phrase_is_found(line):
    assert not findings([("x.md", line)])            # as written here: nothing to find
    assert findings([("x.md", line.replace("·", ""))])


@pytest.mark.parametrize("line", [
    "xxh3-128 with seed 0, then with seed 1",
    "rng = np.random.default_rng(seed=42)  # seed 1163 of the deep sweep",
    "python3 tools/serve_bench.py --rounds 5",
    "subprocess.Popen(cmd, start_new_session=True)   # in its own session",
    "sessionStorage.getItem('simindex-token')",
    "records of earlier runs and of a reference",
    "the order of each record's latest add",
    "color: #555; background: #1d1d1f",
    'a["date"] = "2026-01-15"',
    "the kernel's readahead (8 MiB on the benchmarks' VM)",
    "simindex plan --size N prints the estimates for this machine",
    "todo = [s for s in range(lo, hi) if top - applied[s] >= lag]",
])
def test_legitimate_text_is_not_found(line):
    assert not findings([("x.md", line)])
