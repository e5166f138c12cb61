"""Throughput of the text path on a large corpus: fingerprinting in one process, and
`simindex dedup` end to end on one core and on all, with its peak memory, beside rensa's
greedy deduplication of the same file.

    python tools/throughput_bench.py CORPUS.jsonl [--rounds 3] [--json results.json]
    python tools/throughput_bench.py --make-kernel-corpus OUT.jsonl --kernel LINUX_TREE
    python tools/throughput_bench.py --make-mixed-corpus OUT.jsonl --kernel OLD_TREE \\
        --kernel NEW_TREE

CORPUS.jsonl holds {"id", "text"} rows. The corpora this project reports: `kernel` is the
C sources under drivers/ of one Linux release, in sorted path order, up to 600 MB (large
files: 82 KB a row on average); `mixed` is the text of this machine (tools/dedup_quality.py's
build_corpus, without its word limits), the documentation of two Linux releases and then
their older release's drivers/ C files under 64 KB, up to 600 MB (12 KB a row).

Every measure but fingerprinting runs in a fresh process, so its peak RSS is its own; the
rounds take turns, and each figure is the median (and range) over the rounds. The peak RSS
of the same commands on the corpus written twice over (the same rows, twice the input)
shows whether memory grows with the input.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

LIMIT = 600_000_000


def make_kernel_corpus(out: str, tree: str) -> None:
    paths = sorted(p for p in glob.glob(os.path.join(tree, "drivers", "**", "*"),
                                        recursive=True)
                   if p.endswith((".c", ".h")) and os.path.isfile(p))
    _write(out, ((os.path.relpath(p, tree), _read(p)) for p in paths))


def make_mixed_corpus(out: str, trees: list) -> None:
    import dedup_quality
    import jaccard_bench

    def rows():
        for id_, text in dedup_quality.build_corpus(limit=10 ** 9, min_words=1,
                                                     max_words=10 ** 9):
            yield id_, text
        for id_, text in jaccard_bench.kernel_docs(trees, every=1, min_words=1,
                                                   max_words=10 ** 9):
            yield id_, text
        old = trees[0]
        for p in sorted(glob.glob(os.path.join(old, "drivers", "**", "*.c"), recursive=True)):
            if os.path.getsize(p) <= 65536:
                yield f"{os.path.basename(old)}:{os.path.relpath(p, old)}", _read(p)
    _write(out, rows())


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _write(out: str, rows) -> None:
    total = n = 0
    with open(out, "w", encoding="utf-8") as f:
        for id_, text in rows:
            if total >= LIMIT:
                break
            f.write(json.dumps({"id": id_, "text": text}, ensure_ascii=False) + "\n")
            total += len(text.encode("utf-8", "surrogatepass"))
            n += 1
    print(f"{out}: {n} rows, {total / 1e6:.0f} MB of text")


def text_megabytes(path: str) -> float:
    total = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            total += len(json.loads(line)["text"].encode("utf-8", "surrogatepass"))
    return total / 1e6


def peak_rss(args: list) -> float:
    """Peak RSS in MB of one command, read by GNU time in its own wrapper process."""
    r = subprocess.run(["/usr/bin/time", "-f", "%M", *args], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{r.stderr}")
    return int(r.stderr.strip().splitlines()[-1]) / 1024


FINGERPRINT = """
import json, sys, time
from simindex.signatures import _text
from simindex.signatures.fingerprints import pass_args
texts = [json.loads(line)["text"] for line in open(sys.argv[1], encoding="utf-8")]
mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6
for scheme, width in (("simindex-v1", 64), ("minhash-v1", 64), ("minhash-v1", 256)):
    start = time.perf_counter()
    _text.signatures(texts, 3, **pass_args(scheme, width))
    print(scheme, width, mb / (time.perf_counter() - start))
"""

RENSA = """
import sys
sys.path.insert(0, sys.argv[2])
import jaccard_bench
jaccard_bench.run_rensa(sys.argv[1], float(sys.argv[3]))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", nargs="?")
    ap.add_argument("--make-kernel-corpus")
    ap.add_argument("--make-mixed-corpus")
    ap.add_argument("--kernel", action="append", default=[])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threshold", type=float, default=0.7)
    ap.add_argument("--no-rensa", action="store_true", help="skip the peer (minutes)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.make_kernel_corpus:
        make_kernel_corpus(a.make_kernel_corpus, a.kernel[0])
        return 0
    if a.make_mixed_corpus:
        make_mixed_corpus(a.make_mixed_corpus, a.kernel)
        return 0
    if not a.corpus:
        ap.error("give a corpus")
    work = tempfile.mkdtemp(prefix="throughput-")
    mb = text_megabytes(a.corpus)
    doubled = os.path.join(work, "doubled.jsonl")
    rows = 0
    with open(doubled, "w", encoding="utf-8") as dst:
        for _ in range(2):
            with open(a.corpus, encoding="utf-8") as src:
                for line in src:
                    dst.write(line)
                    rows += 1
    rows //= 2
    out = os.path.join(work, "out.jsonl")
    py = sys.executable
    dedup = [py, "-m", "simindex", "dedup", "--output", out]
    cases = {
        "dedup k=3, 1 core": dedup + ["--jobs", "1"],
        f"dedup --min-similarity {a.threshold}, 1 core":
            dedup + ["--jobs", "1", "--min-similarity", str(a.threshold)],
        "dedup k=3, all cores": list(dedup),
        f"dedup --min-similarity {a.threshold}, all cores":
            dedup + ["--min-similarity", str(a.threshold)],
    }
    times: dict = {name: [] for name in cases}
    rss: dict = {}
    fps: dict = {}
    peer: list = []
    for rnd in range(a.rounds):
        r = subprocess.run([py, "-c", FINGERPRINT, a.corpus], capture_output=True, text=True,
                           check=True)
        for line in r.stdout.splitlines():
            scheme, width, rate = line.split()
            fps.setdefault(f"{scheme} {width}", []).append(float(rate))
        names = list(cases) if rnd % 2 == 0 else list(cases)[::-1]
        for name in names:
            start = time.perf_counter()
            rss.setdefault(name, []).append(peak_rss(cases[name] + [a.corpus]))
            times[name].append(time.perf_counter() - start)
        if not a.no_rensa:
            start = time.perf_counter()
            subprocess.run([py, "-c", RENSA, a.corpus, HERE, str(a.threshold)], check=True)
            peer.append(time.perf_counter() - start)
    doubled_rss = {name: peak_rss(cmd + [doubled]) for name, cmd in cases.items()}
    print(f"# {a.corpus}: {rows} rows, {mb:.0f} MB of text; {a.rounds} rounds")
    print("| measure | MB/s (median) | range | peak RSS, MB | peak RSS on twice the input, MB |")
    print("|---|---|---|---|---|")
    result = {"rows": rows, "mb": mb, "fingerprint": {}, "dedup": {}, "rensa": None}
    for name, rates in fps.items():
        print(f"| fingerprint {name} (one core) | {statistics.median(rates):.0f} | "
              f"{min(rates):.0f}-{max(rates):.0f} | | |")
        result["fingerprint"][name] = rates
    for name, ts in times.items():
        rates = [mb / t for t in ts]
        print(f"| {name} | {statistics.median(rates):.1f} | {min(rates):.1f}-"
              f"{max(rates):.1f} | {statistics.median(rss[name]):.0f} | "
              f"{doubled_rss[name]:.0f} |")
        result["dedup"][name] = {"seconds": ts, "rss_mb": rss[name],
                                 "doubled_rss_mb": doubled_rss[name]}
    if peer:
        rates = [mb / t for t in peer]
        print(f"| rensa greedy at {a.threshold}, exact check (one core) | "
              f"{statistics.median(rates):.1f} | {min(rates):.1f}-{max(rates):.1f} | | |")
        result["rensa"] = peer
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
