"""Greedy deduplication at a Jaccard threshold: simindex with its defaults against MinHash
libraries given the same exact check, scored against the exact greedy answer, side by side.

    python tools/jaccard_bench.py --corpus machine-docs [--limit 3000]
    python tools/jaccard_bench.py --corpus kernel-docs --kernel /path/linux-source-6.1 \\
        --kernel /path/linux-source-6.12
    python tools/jaccard_bench.py --jsonl FILE.jsonl         # any JSONL of {"id", "text"}
        [--thresholds 0.5 0.7 0.9] [--rounds 3] [--json results.json]

The rule every system follows: rows are judged in input order, and a row is removed when a
row kept before it has a Jaccard similarity of word 3-shingles of at least t. The truth
applies it exactly (the similarity of every pair, from a sparse documents x shingles
product). A system proposes candidates among the kept rows and confirms each with the exact
check; its removed rows are scored (precision, recall, F1) against the truth's.

- simindex: `simindex.decisions(path, min_similarity=t, id_field="id", jobs=1)`, nothing
  else: the scheme, width and k are its own choice from the data (`simindex calibrate`).
- rensa (RMinHash + RMinHashLSH), gaoya (MinHashStringIndex, its own Rust word 3-grams,
  lowercased) and datasketch (MinHash + MinHashLSH): 128 permutations, the bands and rows
  datasketch finds optimal for t (for rensa, among those that divide 128); shingles made in Python with simindex's tokenizer (NFKC,
  casefold, runs of word characters, Han and Kana characters alone); the check is the exact
  Jaccard of the two rows' Python sets of shingles.

Every system reads the JSONL file itself; times are end to end, one process, median (and
range) of --rounds rounds in which the systems take turns.

The corpora: `machine-docs` is the text of this machine (tools/dedup_quality.py's
build_corpus: Debian licenses, copyright files, changelogs, documentation, Python docstrings,
manual pages); `kernel-docs` is the documentation of two Linux releases (Debian's
linux-source-6.1 and linux-source-6.12 packages, unpacked): every fourth .rst or .txt file
under Documentation/ in sorted order of its path, each release's copy of it in turn.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import sys
import tempfile
import time
import unicodedata

# numpy and simindex are imported where they are used: a peer's process that takes only
# the tokenizer from here (tools/scale_bench.py) loads neither
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NUM_PERM = 128
THRESHOLDS = (0.5, 0.7, 0.9)
CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"
TOKEN = re.compile(f"[{CJK}]|[^\\W{CJK}]+")


# --- shingles and the truth ---------------------------------------------------------------

def shingles(text: str) -> set:
    """The word 3-shingles of a text as strings (simindex's tokenizer, in Python)."""
    toks = TOKEN.findall(unicodedata.normalize("NFKC", text).casefold())
    if len(toks) < 3:
        return {" ".join(toks)} if toks else set()
    return {" ".join(toks[i:i + 3]) for i in range(len(toks) - 2)}


def jaccard(a: set, b: set) -> float:
    if not a and not b:
        return 1.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def similar_pairs(sets: list, floor: float) -> tuple:
    """(i, j, similarity) of every pair i < j whose Jaccard is at least floor."""
    import numpy as np
    from scipy import sparse
    vocab: dict = {}
    indptr, indices = [0], []
    for s in sets:
        indices.extend(vocab.setdefault(x, len(vocab)) for x in s)
        indptr.append(len(indices))
    X = sparse.csr_matrix((np.ones(len(indices), np.int32), np.array(indices, np.int64),
                           np.array(indptr)), shape=(len(sets), max(len(vocab), 1)))
    sizes = np.diff(X.indptr)
    XT = X.T.tocsc()
    out = ([], [], [])
    for start in range(0, len(sets), 512):
        inter = (X[start:start + 512] @ XT).tocoo()
        i, j = inter.row + start, inter.col
        keep = j > i
        i, j, a = i[keep], j[keep], inter.data[keep].astype(np.float64)
        sim = a / (sizes[i] + sizes[j] - a)
        keep = sim >= floor
        for part, v in zip(out, (i[keep], j[keep], sim[keep])):
            part.append(v)
    return tuple(np.concatenate(p) for p in out)


def greedy_truth(n: int, pairs: tuple, t: float) -> set:
    """The rows the exact rule removes at threshold t."""
    i, j, s = pairs
    keep = s >= t
    before: dict = {}
    for a, b in zip(i[keep].tolist(), j[keep].tolist()):
        before.setdefault(b, []).append(a)
    kept, removed = set(), set()
    for r in range(n):
        if any(a in kept for a in before.get(r, ())):
            removed.add(r)
        else:
            kept.add(r)
    return removed


def scores(removed: set, truth: set) -> dict:
    tp = len(removed & truth)
    p = tp / len(removed) if removed else 1.0
    r = tp / len(truth) if truth else 1.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0,
            "removed": len(removed), "missed": len(truth - removed),
            "wrong": len(removed - truth)}


# --- the corpora ---------------------------------------------------------------------------

def kernel_docs(roots: list, every: int = 4, min_words: int = 50,
                max_words: int = 20_000) -> list:
    """[(id, text)]: every `every`-th documentation path (sorted) present in any of the
    release trees, each tree's copy in the order the roots are given."""
    paths: set = set()
    for root in roots:
        for ext in ("rst", "txt"):
            for p in glob.glob(os.path.join(root, "Documentation", "**", f"*.{ext}"),
                               recursive=True):
                paths.add(os.path.relpath(p, root))
    out = []
    for rel in sorted(paths)[::every]:
        for root in roots:
            p = os.path.join(root, rel)
            if not os.path.isfile(p):
                continue
            with open(p, encoding="utf-8", errors="replace") as f:
                text = f.read()
            if min_words <= len(text.split()) <= max_words:
                out.append((f"{os.path.basename(os.path.normpath(root))}:{rel}", text))
    return out


def read_jsonl(path: str) -> list:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# --- the systems: each reads the file and returns the positions it removes -------------------

def run_simindex(path: str, t: float) -> tuple:
    import simindex
    summary = simindex.datasets.run.Summary()
    removed = {n for n, d in enumerate(simindex.decisions(
        path, id_field="id", min_similarity=t, jobs=1, summary=summary)) if not d.kept}
    r = summary.radius
    return removed, f"{r['scheme']} w{r['width']} k={r['k']}"


def lsh_params(t: float, divides: bool = False) -> tuple:
    """The (bands, rows) datasketch finds optimal for t (false positives and negatives
    weighed alike); with `divides`, among those whose product is NUM_PERM (rensa's rule)."""
    from datasketch.lsh import (_false_negative_probability, _false_positive_probability,
                                _optimal_param)
    if not divides:
        return _optimal_param(t, NUM_PERM, 0.5, 0.5)
    best = None
    for b in range(1, NUM_PERM + 1):
        if NUM_PERM % b:
            continue
        r = NUM_PERM // b
        err = 0.5 * _false_positive_probability(t, b, r) + \
            0.5 * _false_negative_probability(t, b, r)
        if best is None or err < best[0]:
            best = (err, b, r)
    return best[1], best[2]


def _greedy(rows: list, t: float, candidates, keep) -> set:
    removed = set()
    sets: dict = {}
    for i, row in enumerate(rows):
        sh = shingles(row["text"])
        sig, cands = candidates(row["text"], sh)
        if any(jaccard(sh, sets[c]) >= t for c in cands):
            removed.add(i)
        else:
            sets[i] = sh
            keep(i, row["text"], sig)
    return removed


def run_rensa(path: str, t: float) -> tuple:
    from rensa import RMinHash, RMinHashLSH
    b, _ = lsh_params(t, divides=True)
    lsh = RMinHashLSH(threshold=t, num_perm=NUM_PERM, num_bands=b)

    def candidates(text, sh):
        m = RMinHash(num_perm=NUM_PERM, seed=42)
        m.update(list(sh))
        return m, lsh.query(m)
    return _greedy(read_jsonl(path), t, candidates,
                   lambda i, text, m: lsh.insert(i, m)), f"bands {b}"


def run_gaoya(path: str, t: float) -> tuple:
    from gaoya.minhash import MinHashStringIndex
    b, r = lsh_params(t)
    index = MinHashStringIndex(32, t, b, r, None, "word", True, (3, 3), "vec")
    return _greedy(read_jsonl(path), t, lambda text, sh: (None, index.query(text)),
                   lambda i, text, _: index.insert_document(i, text)), f"{b}x{r}"


def run_datasketch(path: str, t: float) -> tuple:
    from datasketch import MinHash, MinHashLSH
    lsh = MinHashLSH(threshold=t, num_perm=NUM_PERM)

    def candidates(text, sh):
        m = MinHash(num_perm=NUM_PERM)
        m.update_batch([s.encode("utf-8", "surrogatepass") for s in sh])
        return m, lsh.query(m)
    return _greedy(read_jsonl(path), t, candidates,
                   lambda i, text, m: lsh.insert(i, m)), "{}x{}".format(*lsh_params(t))


SYSTEMS = {"simindex": run_simindex, "rensa": run_rensa, "gaoya": run_gaoya,
           "datasketch": run_datasketch}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", choices=("machine-docs", "kernel-docs"))
    ap.add_argument("--jsonl", help="a JSONL file of {id, text} rows instead")
    ap.add_argument("--kernel", action="append", default=[],
                    help="an unpacked Linux source tree (kernel-docs; give two releases)")
    ap.add_argument("--limit", type=int, default=3000)
    ap.add_argument("--thresholds", type=float, nargs="+", default=list(THRESHOLDS))
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args(argv)
    import numpy as np
    work = tempfile.mkdtemp(prefix="jaccard-bench-")
    if a.jsonl:
        path = a.jsonl
    else:
        if a.corpus == "kernel-docs":
            docs = kernel_docs(a.kernel)
        elif a.corpus == "machine-docs":
            import dedup_quality
            docs = dedup_quality.build_corpus(limit=a.limit)
        else:
            ap.error("give --corpus or --jsonl")
        path = os.path.join(work, "corpus.jsonl")
        import dedup_quality
        dedup_quality.write_jsonl(docs, path)
    rows = read_jsonl(path)
    mb = os.path.getsize(path) / 1e6
    sets = [shingles(r["text"]) for r in rows]
    pairs = similar_pairs(sets, min(a.thresholds))
    print(f"# {len(rows)} rows, {mb:.1f} MB; pairs at Jaccard >= "
          + ", ".join(f"{t}: {int(np.count_nonzero(pairs[2] >= t))}" for t in a.thresholds))
    results = []
    for t in a.thresholds:
        truth = greedy_truth(len(rows), pairs, t)
        times: dict = {s: [] for s in a.systems}
        got: dict = {}
        for rnd in range(a.rounds):
            order = a.systems if rnd % 2 == 0 else a.systems[::-1]
            for name in order:
                start = time.perf_counter()
                removed, how = SYSTEMS[name](path, t)
                times[name].append(time.perf_counter() - start)
                got[name] = (removed, how)
        for name in a.systems:
            removed, how = got[name]
            sc = scores(removed, truth)
            med = statistics.median(times[name])
            row = {"threshold": t, "system": name, "setting": how, **sc,
                   "seconds": med, "seconds_min": min(times[name]),
                   "seconds_max": max(times[name]), "truth_removed": len(truth)}
            results.append(row)
            print(f"t={t}\t{name}\t{how}\tP={sc['precision']:.4f}\tR={sc['recall']:.4f}\t"
                  f"F1={sc['f1']:.4f}\tremoved={sc['removed']}/{len(truth)}\t"
                  f"{med:.2f} s ({min(times[name]):.2f}-{max(times[name]):.2f})", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": len(rows), "mb": mb, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
