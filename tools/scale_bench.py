"""How the cost of near-duplicate removal per row grows with the number of rows: `simindex
dedup` beside the MinHash libraries' greedy deduplication, on rows of web-text size, in one run.

    python tools/scale_bench.py [--rows 100000 300000 1000000] [--big] [--modes 0.7 k3]
        [--systems simindex rensa gaoya [datasketch]] [--rounds 3] [--jobs 1 [2 ...]]
        [--timeout 900] [--seed 1] [--workdir DIR] [--json results.json]

The corpus, made once per size and seed and kept in --workdir (default: a temporary folder,
removed at the end): rows {"id": "r<n>", "text": ...} of 80 to 400 words (1.4 KB on
average), drawn at random in proportion to the word frequencies of this machine's text (the
plain and gzipped text files under /usr/share/doc and /usr/share/common-licenses, runs of
1 to 15 letters, lowercased; the table is kept in --workdir too). 5% of the rows are near
copies of an earlier row (one word in 50 replaced by another), 2% exact copies.

The modes: a threshold t (0.5, 0.6, 0.7 or 0.9) is the rule "a row is removed when a row kept
before it has a Jaccard similarity of word 3-shingles of at least t"; k3 is simindex's rule
without a threshold (a kept row within 3 bits of the row's 64-bit fingerprint), which the
MinHash libraries have no counterpart of: only simindex runs it.

Each run is a fresh process, timed from its start to its exit (reading the file included),
its peak RSS the ru_maxrss that wait4 reports (the process is forked from a small launcher,
not from the benchmark, whose size it would inherit):
- simindex: `simindex dedup FILE --output OUT --min-similarity t --jobs J` (k3: `--k 3`
  instead of --min-similarity), with no --index: the index lives in the run's temporary
  folder, whose size dedup does not report; simindex-jN, the same with --jobs N (for each
  further value of --jobs; its worker processes are timed with it, from start to exit);
- rensa-dedup: rensa's own deduplicator (RMinHashDeduplicator, LSH, 128 permutations, the
  bands above, the same shingles), which decides by the MinHash estimate alone;
- rensa-split: the same deduplicator fed the 3-shingles of `text.split()`, the quickest
  shingling a Python user writes (on this corpus of lowercase words between single spaces
  they are the same shingles: it measures rensa without the cost of simindex's tokenizer
  in Python);
- rensa, gaoya, datasketch (only when asked: it is slow): tools/jaccard_bench.py's way (128
  permutations, the bands and rows it picks for t, its shingles and its exact Jaccard check
  of every candidate), greedy in input order, on one core; the process reads the JSONL line
  by line and writes the kept rows, and checks a candidate against the kept row read again
  from the input (holding every kept row's set of shingles would take about 20 KB a row).
A run longer than --timeout seconds is killed and reported as a timeout; the system is then
not run on that size or larger ones in that mode.

Rounds take turns: the first round of every mode, size and system, then the second, and so
on. A table per mode gives for every size and system the median seconds (and range), rows/s,
microseconds per row and its growth from the smallest size, peak RSS (the largest of the
rounds), the rows removed (each figure the rounds gave, if they disagree), and simindex's
rows/s over the peer's (for a peer that timed out, the least it can be).
"""

from __future__ import annotations

import argparse
import collections
import functools
import gzip
import itertools
import json
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from array import array

# numpy is imported where the corpus is made: a peer's process loads only its own library
# and jaccard_bench's tokenizer
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jaccard_bench import NUM_PERM, jaccard, lsh_params, shingles  # noqa: E402

ROWS = (100_000, 300_000, 1_000_000)
BIG = (3_000_000, 10_000_000)
MODES = ("0.5", "0.6", "0.7", "0.9", "k3")
SYSTEMS = ("simindex", "rensa", "rensa-dedup", "rensa-split", "gaoya", "datasketch")
DOC_ROOTS = ("/usr/share/doc", "/usr/share/common-licenses")
TEXT_SUFFIXES = ("", ".txt", ".md", ".rst", ".gz")
READ_CAP = 1 << 18          # bytes read from the start of each file for the word table
WORD = re.compile(rb"\b[a-z]{1,15}\b")
SLOT = 16                   # bytes of a word and its space in the sampler's table
MIN_WORDS, MAX_WORDS = 80, 400
EXACT, NEAR = 0.02, 0.05    # shares of rows that copy an earlier row, exactly or nearly
REPLACE = 50                # a near copy replaces one word in this many
CHUNK = 8192                # rows made at once


# --- the corpus ------------------------------------------------------------------------------

def text_files():
    """The text files under DOC_ROOTS (not links), in sorted order."""
    for root in DOC_ROOTS:
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(folder, name)
                if os.path.splitext(name)[1].lower() in TEXT_SUFFIXES and \
                        os.path.isfile(path) and not os.path.islink(path):
                    yield path


def read_start(path: str) -> bytes:
    """The first READ_CAP bytes of a file (decompressed if gzipped); empty if unreadable."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            return f.read(READ_CAP)
    except (OSError, EOFError):
        return b""


def word_table(workdir: str) -> tuple:
    """(words, counts) of this machine's text seen twice or more, kept in workdir/words.tsv."""
    path = os.path.join(workdir, "words.tsv")
    if not os.path.exists(path):
        counts: collections.Counter = collections.Counter()
        for p in text_files():
            data = read_start(p)
            if b"\0" not in data[:8192]:
                counts.update(WORD.findall(data.lower()))
        ranked = sorted((w for w, c in counts.items() if c >= 2), key=lambda w: (-counts[w], w))
        if not ranked:
            raise SystemExit(f"no text found under {' or '.join(DOC_ROOTS)}")
        with open(path + ".tmp", "wb") as f:
            f.writelines(b"%s\t%d\n" % (w, counts[w]) for w in ranked)
        os.replace(path + ".tmp", path)
    words, counts = [], []
    with open(path, "rb") as f:
        for line in f:
            w, c = line.split(b"\t")
            words.append(w)
            counts.append(int(c))
    return words, counts


def alias_table(counts: list) -> tuple:
    """Walker's alias table (probability, alias) for drawing i in proportion to counts[i]."""
    import numpy as np
    n, total = len(counts), sum(counts)
    scaled = [c * n / total for c in counts]
    prob, alias = [1.0] * n, list(range(n))
    small = [i for i, p in enumerate(scaled) if p < 1]
    large = [i for i, p in enumerate(scaled) if p >= 1]
    while small and large:
        s, g = small.pop(), large[-1]
        prob[s], alias[s] = scaled[s], g
        scaled[g] -= 1 - scaled[s]
        if scaled[g] < 1:
            small.append(large.pop())
    return np.array(prob), np.array(alias)


class Sampler:
    """Draws words in proportion to their counts, and texts of them, in numpy."""

    def __init__(self, words: list, counts: list):
        import numpy as np
        self.words = words
        # every word and its space in 16 zero-padded bytes, one complex128 element each: a
        # text is one take of these elements with the zero bytes deleted
        self.slots = np.frombuffer(b"".join((w + b" ").ljust(SLOT, b"\0") for w in words),
                                   np.complex128)
        self.size = np.array([len(w) + 1 for w in words], np.int64)
        self.cumulative = list(itertools.accumulate(counts))
        prob, alias = alias_table(counts)
        self.prob, self.alias = prob.astype(np.float32), alias.astype(np.int32)

    def draw(self, rng, n: int):
        """n word numbers."""
        import numpy as np
        col = rng.integers(0, len(self.prob), n, dtype=np.int32)
        return np.where(rng.random(n, dtype=np.float32) < self.prob[col], col, self.alias[col])

    def texts(self, rng, lengths) -> list:
        """Texts of lengths[i] words each, as memoryviews of one buffer."""
        import numpy as np
        words = self.draw(rng, int(lengths.sum()))
        buf = memoryview(np.take(self.slots, words).tobytes().translate(None, b"\0"))
        first = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        ends = np.cumsum(np.add.reduceat(self.size[words], first)).tolist()
        return [buf[a:b - 1] for a, b in zip([0] + ends[:-1], ends)]

    def near_copy(self, rnd: random.Random, text) -> bytes:
        """text with one word in REPLACE (at least one) replaced by another drawn word."""
        words = bytes(text).split(b" ")
        for p in rnd.sample(range(len(words)), max(1, round(len(words) / REPLACE))):
            new = words[p]
            while new == words[p]:
                new = rnd.choices(self.words, cum_weights=self.cumulative)[0]
            words[p] = new
        return b" ".join(words)


def make_corpus(path: str, n: int, seed: int, sampler: Sampler) -> dict:
    """Write n rows to path (JSONL); return its counts: rows, exact and near copies, bytes."""
    import numpy as np
    rng = np.random.default_rng(seed)
    rnd = random.Random(seed)              # the near copies' changes
    start = np.zeros(n, np.int64)          # where each row's text is in the file
    size = np.zeros(n, np.int64)
    made = {"rows": n, "seed": seed, "exact_copies": 0, "near_copies": 0}
    pos = 0
    with open(path + ".tmp", "w+b") as f:
        for first in range(0, n, CHUNK):
            m = min(CHUNK, n - first)
            fresh = sampler.texts(rng, rng.integers(MIN_WORDS, MAX_WORDS + 1, m))
            kind = rng.random(m).tolist()
            source = (rng.random(m) * np.arange(first, first + m)).astype(np.int64).tolist()
            f.flush()                      # earlier chunks' rows are read back for copies
            texts, parts, at = [], [], []
            for j in range(m):
                i, text = first + j, fresh[j]
                if i and kind[j] < EXACT + NEAR:
                    s = source[j]
                    text = texts[s - first] if s >= first else \
                        os.pread(f.fileno(), int(size[s]), int(start[s]))
                    if kind[j] < EXACT:
                        made["exact_copies"] += 1
                    else:
                        text = sampler.near_copy(rnd, text)
                        made["near_copies"] += 1
                head = b'{"id": "r%d", "text": "' % i
                at.append(pos + len(head))
                pos += len(head) + len(text) + 3
                texts.append(text)
                parts += (head, text, b'"}\n')
            f.write(b"".join(parts))
            start[first:first + m] = at
            size[first:first + m] = [len(t) for t in texts]
    os.replace(path + ".tmp", path)
    made["bytes"] = pos
    with open(path + ".json", "w") as f:
        json.dump(made, f)
    return made


def corpus(workdir: str, n: int, seed: int, sampler) -> tuple:
    """(path, make_corpus's counts) of the corpus of n rows, made unless present."""
    path = os.path.join(workdir, f"corpus-{n}-seed{seed}.jsonl")
    if os.path.exists(path) and os.path.exists(path + ".json"):
        with open(path + ".json") as f:
            return path, json.load(f)
    start = time.perf_counter()
    made = make_corpus(path, n, seed, sampler())
    print(f"# made {path} in {time.perf_counter() - start:.1f} s", flush=True)
    return path, made


# --- the peers: run in their own process by `scale_bench.py --peer ...` ------------------------

def peer_index(system: str, t: float, bands: int, rows: int) -> tuple:
    """(query, insert) of a peer's LSH index, made as tools/jaccard_bench.py makes it."""
    if system == "rensa":
        from rensa import RMinHash, RMinHashLSH
        lsh = RMinHashLSH(threshold=t, num_perm=NUM_PERM, num_bands=bands)

        def query(text):
            sh = shingles(text)
            m = RMinHash(num_perm=NUM_PERM, seed=42)
            m.update(list(sh))
            return m, lsh.query(m), sh
        return query, lambda i, text, m: lsh.insert(i, m)
    if system == "gaoya":                 # its own word 3-grams: no shingles until a check
        from gaoya.minhash import MinHashStringIndex
        index = MinHashStringIndex(32, t, bands, rows, None, "word", True, (3, 3), "vec")
        return (lambda text: (None, index.query(text), None),
                lambda i, text, _: index.insert_document(i, text))
    from datasketch import MinHash, MinHashLSH
    lsh = MinHashLSH(threshold=t, num_perm=NUM_PERM, params=(bands, rows))

    def query(text):
        sh = shingles(text)
        m = MinHash(num_perm=NUM_PERM)
        m.update_batch([s.encode("utf-8", "surrogatepass") for s in sh])
        return m, lsh.query(m), sh
    return query, lambda i, text, m: lsh.insert(i, m)


def split_shingles(text: str) -> set:
    """The word 3-shingles of `text.split()`."""
    toks = text.split()
    if len(toks) < 3:
        return {" ".join(toks)} if toks else set()
    return {" ".join(toks[i:i + 3]) for i in range(len(toks) - 2)}


def rensa_dedup(t: float, bands: int, path: str, out: str, shingled=shingles,
                name: str = "rensa-dedup") -> None:
    """rensa's own deduplicator (RMinHashDeduplicator with LSH): a row is a duplicate when a
    kept row's MinHash estimate reaches t; no exact check, as rensa decides."""
    from rensa import RMinHash, RMinHashDeduplicator
    dedup = RMinHashDeduplicator(threshold=t, num_perm=NUM_PERM, use_lsh=True,
                                 num_bands=bands)
    n = removed = 0
    with open(path, "rb") as f, open(out, "wb") as w:
        for n, line in enumerate(f, 1):
            m = RMinHash(num_perm=NUM_PERM, seed=42)
            m.update(list(shingled(json.loads(line)["text"])))
            if dedup.add(str(n), m):
                w.write(line)
            else:
                removed += 1
    print(f"{name}: rows in {n}, removed {removed}")


def peer_dedup(system: str, t: float, bands: int, rows: int, path: str, out: str) -> None:
    """Greedy deduplication of path by a peer, in input order, kept rows written to out."""
    if system == "rensa-dedup":
        return rensa_dedup(t, bands, path, out)
    if system == "rensa-split":
        return rensa_dedup(t, bands, path, out, split_shingles, system)
    query, insert = peer_index(system, t, bands, rows)   # (sketch, candidates, shingles)
    at = array("q", [0])                   # where each row's line starts, and the end
    removed = 0
    with open(path, "rb") as f, open(out, "wb") as w:

        def kept_text(c):
            return json.loads(os.pread(f.fileno(), at[c + 1] - at[c], at[c]))["text"]
        for i, line in enumerate(f):
            at.append(at[-1] + len(line))
            text = json.loads(line)["text"]
            sketch, candidates, sh = query(text)
            if candidates:
                sh = sh if sh is not None else shingles(text)
                if any(jaccard(sh, shingles(kept_text(c))) >= t for c in candidates):
                    removed += 1
                    continue
            insert(i, text, sketch)
            w.write(line)
    print(f"{system}: rows in {len(at) - 1}, removed {removed}")


# --- running and timing ----------------------------------------------------------------------

def command(system: str, mode: str, path: str, out: str, jobs: int) -> tuple:
    """(argv, setting) of one run: simindex at `jobs`, or simindex-jN at --jobs N."""
    if system.startswith("simindex"):
        jobs = int(system.split("-j")[1]) if "-j" in system else jobs
        rule = ["--k", "3"] if mode == "k3" else ["--min-similarity", mode]
        return [sys.executable, "-m", "simindex", "dedup", path, "--output", out, *rule,
                "--jobs", str(jobs)], ""
    bands, rows = lsh_params(float(mode), divides=system.startswith("rensa"))
    return ([sys.executable, os.path.abspath(__file__), "--peer", system, mode, str(bands),
             str(rows), path, out], f"{bands}x{rows}")


# A run's peak RSS as wait4 reports it starts at the size of the process it was forked from
# (Linux keeps the high-water mark across exec), so runs are forked from this small process
# (about 8 MB, less than any Python program) rather than from the benchmark; it times the run
# from the fork to the exit and writes "seconds maxrss_kib exit_code" to the file it is given.
LAUNCHER = """
import os, sys, time
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - start
with open(sys.argv[1], "w") as f:
    f.write(f"{seconds} {usage.ru_maxrss} {os.waitstatus_to_exitcode(status)}")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def timed_run(argv: list, timeout: float, log: str, env: dict) -> dict:
    """Status ("ok", "timeout", "failed"), seconds and peak RSS (KiB) of argv run afresh."""
    killed = threading.Event()
    report = log + ".rusage"
    with open(log, "wb") as out:
        start = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-I", "-S", "-c", LAUNCHER, report, *argv],
                             stdout=out, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)

        def kill():
            killed.set()
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            p.wait()
        finally:
            timer.cancel()
    r = {"status": "timeout" if killed.is_set() else "ok" if p.returncode == 0 else "failed",
         "seconds": time.perf_counter() - start, "maxrss_kib": 0, "exit": p.returncode}
    if os.path.exists(report):             # not there if the launcher itself was killed
        with open(report) as f:
            seconds, rss, code = f.read().split()
        r["seconds"], r["maxrss_kib"], r["exit"] = float(seconds), int(rss), int(code)
        os.remove(report)
    return r


def removed_count(log: str) -> tuple:
    """(rows removed, setting) from a run's log: dedup's summary or the peer's last line."""
    with open(log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    m = re.search(r"rows in [\d,]+,(?: kept [\d,]+,)? removed ([\d,]+)(?:.*?; (.*))?", text)
    if not m:
        return None, ""
    return int(m.group(1).replace(",", "")), (m.group(2) or "").strip()


def run_one(system, mode, n, path, a, rnd) -> dict:
    """One timed run, in a folder (output, log, TMPDIR) of its own, removed afterwards."""
    folder = os.path.join(a.workdir, "run")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    log = os.path.join(folder, "log.txt")
    argv, setting = command(system, mode, path, os.path.join(folder, "out.jsonl"), a.jobs[0])
    r = timed_run(argv, a.timeout, log, {**os.environ, "TMPDIR": folder})
    removed, said = removed_count(log) if r["status"] == "ok" else (None, "")
    if r["status"] == "failed":
        with open(log, encoding="utf-8", errors="replace") as f:
            print(f"# {system} {mode} {n:,} rows failed (exit code {r['exit']}; negative: "
                  f"killed by that signal), the end of its output:\n{f.read()[-2000:]}",
                  file=sys.stderr)
    shutil.rmtree(folder, ignore_errors=True)
    return {"mode": mode, "rows": n, "system": system, "round": rnd, **r, "removed": removed,
            "setting": said or setting}


# --- the report ------------------------------------------------------------------------------

def systems_in(mode: str, systems: list) -> list:
    """The systems that run a mode: k3 is simindex's alone."""
    return [s for s in systems if mode != "k3" or s.startswith("simindex")]


def figures(runs: list, mode: str, n: int, system: str) -> dict:
    """The median, range and peak of the ok runs of one cell, or its status."""
    cell = [r for r in runs if (r["mode"], r["rows"], r["system"]) == (mode, n, system)]
    ok = [r for r in cell if r["status"] == "ok"]
    if not ok:
        timed_out = any(r["status"] == "timeout" and r["rows"] <= n and
                        (r["mode"], r["system"]) == (mode, system) for r in runs)
        return {"status": "timeout" if timed_out else "failed" if cell else "not run"}
    secs = [r["seconds"] for r in ok]
    med = statistics.median(secs)
    return {"status": "ok", "seconds": med, "min": min(secs), "max": max(secs),
            "rate": n / med, "us": med / n * 1e6,
            "rss_mb": max(r["maxrss_kib"] for r in ok) / 1024,
            "removed": sorted({r["removed"] for r in ok}, key=lambda x: (x is None, x)),
            "setting": ok[-1]["setting"]}


def table(runs: list, mode: str, sizes: list, systems: list, timeout: float) -> list:
    """The lines of one mode's markdown table."""
    title = "k=3 bits of 64, no similarity check" if mode == "k3" else f"Jaccard >= {mode}"
    lines = [f"## {title}", "",
             "| rows | system | seconds (min-max) | rows/s | us/row | growth | peak RSS, MB "
             "| removed | simindex rows/s over this | setting |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for n in sizes:
        ours = figures(runs, mode, n, "simindex")
        for system in systems_in(mode, systems):
            f = figures(runs, mode, n, system)
            if f["status"] != "ok":
                ratio = ""
                if f["status"] == "timeout" and ours["status"] == "ok" and system != "simindex":
                    ratio = f">x{ours['rate'] / (n / timeout):.2f}"
                status = f"timeout (> {timeout:g} s)" if f["status"] == "timeout" else f["status"]
                lines.append(f"| {n:,} | {system} | {status} | | | | | | {ratio} | |")
                continue
            base = figures(runs, mode, sizes[0], system)
            growth = f"x{f['us'] / base['us']:.2f}" if base["status"] == "ok" else "-"
            ratio = "-" if system == "simindex" or ours["status"] != "ok" else \
                f"x{ours['rate'] / f['rate']:.2f}" if not system.startswith("simindex") else \
                f"(its rows/s: x{f['rate'] / ours['rate']:.2f} simindex's)"
            removed = " or ".join("?" if x is None else f"{x:,}" for x in f["removed"])
            lines.append(f"| {n:,} | {system} | {f['seconds']:.2f} ({f['min']:.2f}-"
                         f"{f['max']:.2f}) | {f['rate']:,.0f} | {f['us']:.1f} | {growth} | "
                         f"{f['rss_mb']:.0f} | {removed} | {ratio} | {f['setting']} |")
    if mode == "k3":
        lines.append("")
        lines.append("(k3 is simindex's rule alone: the MinHash libraries take a threshold.)")
    return lines


def versions(systems: list) -> str:
    """The versions of the systems and of Python."""
    from importlib import metadata
    out = []
    for s in systems:
        if s.startswith("simindex-j"):
            continue
        try:
            out.append(f"{s} {metadata.version(s.split('-')[0])}")
        except metadata.PackageNotFoundError:
            out.append(f"{s} (version unknown)")
    return ", ".join(out) + f"; python {platform.python_version()}; {os.cpu_count()} cores"


def grid(a, sizes: list, systems: list, paths: dict) -> list:
    """Every run of the grid, rounds in turn; a system that timed out skips larger sizes."""
    runs: list = []
    gave_up: dict = {}                     # (mode, system): the size it timed out at
    for rnd in range(1, a.rounds + 1):
        for mode in a.modes:
            for n in sizes:
                order = systems_in(mode, systems)
                for system in order if rnd % 2 else order[::-1]:
                    if n >= gave_up.get((mode, system), float("inf")):
                        continue
                    r = run_one(system, mode, n, paths[n], a, rnd)
                    runs.append(r)
                    if r["status"] == "timeout":
                        gave_up[(mode, system)] = n
                    print(f"# round {rnd}: {mode} {n:,} rows {system}: {r['status']} "
                          f"{r['seconds']:.2f} s, {r['maxrss_kib'] / 1024:.0f} MB, "
                          f"removed {r['removed']}", flush=True)
    return runs


def main(argv=None) -> int:
    """Run the grid and print a table per mode (with --peer: one peer's run)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    ap.add_argument("--big", action="store_true", help="add 3,000,000 and 10,000,000 rows")
    ap.add_argument("--modes", nargs="+", default=["0.7", "k3"], choices=MODES)
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS[:4]), choices=SYSTEMS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, nargs="+", default=[1],
                    help="simindex's --jobs (peers: one core); more values add systems "
                    "simindex-jN, the same run at --jobs N")
    ap.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", help="where corpora and the word table are kept")
    ap.add_argument("--json", help="write every round's figures here")
    ap.add_argument("--peer", nargs=6, help=argparse.SUPPRESS,
                    metavar=("SYSTEM", "T", "BANDS", "ROWS", "INPUT", "OUTPUT"))
    a = ap.parse_args(argv)
    if a.peer:
        system, t, bands, rows, path, out = a.peer
        peer_dedup(system, float(t), int(bands), int(rows), path, out)
        return 0
    sizes = sorted(set(a.rows + (list(BIG) if a.big else [])))
    systems = [s for s in SYSTEMS if s in a.systems]
    if "simindex" in systems:
        systems[1:1] = [f"simindex-j{j}" for j in a.jobs[1:]]
    temporary = a.workdir is None
    a.workdir = a.workdir or tempfile.mkdtemp(prefix="scale-bench-")
    os.makedirs(a.workdir, exist_ok=True)
    print(f"# {versions(systems)}; simindex --jobs {a.jobs[0]}; {a.rounds} rounds; "
          f"timeout {a.timeout:g} s", flush=True)
    try:
        sampler = functools.cache(lambda: Sampler(*word_table(a.workdir)))
        corpora = {n: corpus(a.workdir, n, a.seed, sampler) for n in sizes}
        for n, (path, made) in corpora.items():
            print(f"# {n:,} rows: {made['bytes'] / 1e6:.1f} MB ({made['bytes'] / n:,.0f} B a "
                  f"row), {made['exact_copies']:,} exact and {made['near_copies']:,} near "
                  f"copies of earlier rows", flush=True)
        runs = grid(a, sizes, systems, {n: path for n, (path, _) in corpora.items()})
        for mode in a.modes:
            print()
            print("\n".join(table(runs, mode, sizes, systems, a.timeout)))
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"versions": versions(systems), "jobs": a.jobs[0], "seed": a.seed,
                           "timeout": a.timeout, "rows": sizes, "modes": a.modes,
                           "systems": systems, "rounds": a.rounds,
                           "corpora": {str(n): made for n, (_, made) in corpora.items()},
                           "runs": runs}, f, indent=1)
    finally:
        if temporary:
            shutil.rmtree(a.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
