"""Quality of near-duplicate detection against exact Jaccard similarity, on real documents.

    python tools/dedup_quality.py [--limit 6000] [--thresholds 0.5 0.7 0.9] [--rounds 3]
                                  [--corpus corpus.jsonl] [--json results.json]

The corpus is real text found on this machine (`build_corpus`: Debian license texts,
copyright files, changelogs, documentation, Python standard library docstrings and manual
pages with their roff macros stripped), written to one JSONL file (`id`, `text`) that every
system reads. The truth is the exact Jaccard similarity of the documents' sets of word
3-shingles (`words`, `shingle_set`), computed for every pair from a sparse binary
documents x shingles matrix. A system is judged on the duplicate PAIRS it reports:
precision, recall and F1 against the pairs whose Jaccard is at least each threshold.

Systems: simindex (`find_all` over the fingerprints of every scheme and width, k swept and
the best k per threshold chosen on this same corpus), datasketch MinHashLSH (the same
shingle sets, 128 permutations, each threshold; raw LSH candidates and candidates whose
MinHash estimate reaches the threshold), and text-dedup's minhash and simhash scripts when
`--text-dedup-python` names an interpreter that has text-dedup. Wall times are end to end
from the JSONL file, median of `--rounds` interleaved runs.
"""

from __future__ import annotations

import argparse
import ast
import glob
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import simindex

WORD = re.compile(r"\w+")
SHINGLE = 3
NUM_PERM = 128
THRESHOLDS = (0.5, 0.7, 0.9)
# (scheme, width, the k swept): 64-bit k 0..12, 128-bit k 0..28
CONFIGS = (("simindex-v1", 64, range(13)), ("simindex-v1", 128, range(0, 29, 2)),
           ("seomoz-simhash", 64, range(13)), ("pypi-simhash", 64, range(13)),
           ("pypi-simhash", 128, range(0, 29, 2)), ("md5-128-notebook", 128, range(0, 29, 2)))
# candidates within k bits kept when the exact Jaccard of the scheme's shingles reaches the
# threshold: what `simindex dedup --min-similarity` checks (k swept wider: the check keeps
# precision, so a larger k buys recall)
VERIFIED = (("simindex-v1", 64, range(0, 25, 2)),)


# --- the truth: word shingles and exact Jaccard --------------------------------------------

def words(text: str) -> list:
    """The tokenizer of the truth and of MinHash: runs of word characters, lowercased."""
    return WORD.findall(text.lower())


def shingle_set(text: str, n: int = SHINGLE) -> set:
    """The set of n consecutive words joined by a space (one shingle of all the words when
    there are fewer than n)."""
    w = words(text)
    if len(w) < n:
        return {" ".join(w)} if w else set()
    return {" ".join(w[i:i + n]) for i in range(len(w) - n + 1)}


def shingle_matrix(sets: list):
    """A binary CSR matrix, one row per document, one column per distinct shingle."""
    from scipy import sparse
    vocab: dict = {}
    indptr = [0]
    indices: list = []
    for s in sets:
        indices.extend(vocab.setdefault(x, len(vocab)) for x in s)
        indptr.append(len(indices))
    data = np.ones(len(indices), dtype=np.int32)
    return sparse.csr_matrix((data, np.array(indices, dtype=np.int64), np.array(indptr)),
                             shape=(len(sets), max(len(vocab), 1)))


def jaccard_pairs(X, floor: float = 0.5, block: int = 512) -> tuple:
    """(i, j, jaccard) arrays of every pair i < j with Jaccard >= floor: the intersections
    are X @ X.T, computed a block of rows at a time so memory stays bounded, and the union
    is |A| + |B| - |A & B|. Two empty sets are not a pair."""
    sizes = np.asarray(X.sum(axis=1)).ravel()
    XT = X.T.tocsc()
    out_i, out_j, out_s = [], [], []
    for start in range(0, X.shape[0], block):
        inter = (X[start:start + block] @ XT).tocoo()
        i = inter.row + start
        j = inter.col
        keep = j > i
        i, j, a = i[keep], j[keep], inter.data[keep].astype(np.float64)
        jac = a / (sizes[i] + sizes[j] - a)
        keep = jac >= floor
        out_i.append(i[keep])
        out_j.append(j[keep])
        out_s.append(jac[keep])
    cat = (lambda parts, t: np.concatenate(parts).astype(t) if parts else np.empty(0, t))
    return cat(out_i, np.int64), cat(out_j, np.int64), cat(out_s, np.float64)


def truth_at(pairs: tuple, t: float) -> set:
    """The pairs (i, j) whose Jaccard is at least t."""
    i, j, s = pairs
    keep = s >= t
    return set(zip(i[keep].tolist(), j[keep].tolist()))


def scores(predicted: set, truth: set) -> dict:
    """Precision, recall and F1 of predicted pairs against the true ones. With no pair
    predicted precision is 1 (nothing wrong was said); with no true pair recall is 1."""
    tp = len(predicted & truth)
    p = tp / len(predicted) if predicted else 1.0
    r = tp / len(truth) if truth else 1.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": p, "recall": r, "f1": f, "tp": tp,
            "fp": len(predicted) - tp, "fn": len(truth) - tp}


# --- the corpus --------------------------------------------------------------------------

ROFF_ESCAPE = re.compile(r"\\(f[BIRP1-4]|f\(..|f\[[^]]*\]|s[-+]?\d|\(..|\*\(..|\*\[[^]]*\]|"
                         r"\*.|[-&|^,/e0~ ]|.)")


def strip_roff(src: str) -> str:
    """Man page roff source as text: comment lines dropped, a macro line keeps its
    arguments (its macro name dropped), inline escapes removed (`\\-` becomes `-`)."""
    out = []
    for line in src.splitlines():
        if line.startswith((".\\\"", "'\\\"", '.\\"')) or line.strip() in (".", "'"):
            continue
        if line.startswith((".", "'")):
            line = line[1:].split(None, 1)[1] if len(line[1:].split(None, 1)) > 1 else ""
            line = line.replace('"', " ")
        out.append(ROFF_ESCAPE.sub(lambda m: "-" if m.group(1) == "-" else " ", line))
    return "\n".join(out)


def read_text(path: str) -> str:
    """A file's text (gunzipped when it ends in .gz), undecodable bytes replaced."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as fh:
        return fh.read().decode("utf-8", errors="replace")


def stdlib_docs() -> list:
    """(id, text) of the Python standard library's modules: each module's docstrings
    (module, classes, functions), in sorted path order."""
    root = os.path.dirname(os.__file__)
    out = []
    for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
        if "site-packages" in path or "/test" in path[len(root):]:
            continue
        try:
            tree = ast.parse(read_text(path))
        except (SyntaxError, ValueError, OSError):
            continue
        docs = [ast.get_docstring(n) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                  ast.AsyncFunctionDef))]
        out.append(("pydoc:" + os.path.relpath(path, root), "\n\n".join(d for d in docs if d)))
    return out


def sources() -> list:
    """Every candidate (id, path or None, text or None) in the corpus's fixed order."""
    def files(pattern, recursive=False):
        return sorted(glob.glob(pattern, recursive=recursive))
    docs = []
    docs += [("license:" + os.path.basename(p), p) for p in files("/usr/share/common-licenses/*")]
    docs += [("copyright:" + p.split("/")[-2], p) for p in files("/usr/share/doc/*/copyright")]
    docs += [("changelog:" + p[len("/usr/share/doc/"):], p)
             for p in files("/usr/share/doc/*/changelog*.gz")]
    docs += [("doc:" + p[len("/usr/share/doc/"):], p)
             for pat in ("*.txt", "*.md", "*.txt.gz", "*.md.gz")
             for p in files("/usr/share/doc/**/" + pat, recursive=True)]
    return docs


def build_corpus(limit: int = 4000, min_words: int = 50, max_words: int = 20_000) -> list:
    """[(id, text)] of real documents, in a fixed order: license texts, copyright files,
    changelogs, .txt/.md documentation under /usr/share/doc, Python stdlib docstrings, then
    English manual pages (man1-man8, roff with macros stripped, evenly spaced in sorted
    order) up to `limit` documents. Kept: min_words..max_words words (`words`); a text seen
    before byte for byte is kept too (exact copies are near-duplicates)."""
    out = []
    seen_ids = set()

    def add(id_, text):
        n = len(words(text))
        if min_words <= n <= max_words and id_ not in seen_ids and len(out) < limit:
            seen_ids.add(id_)
            out.append((id_, text))
    for id_, path in sources():
        try:
            add(id_, read_text(path))
        except OSError:
            continue
    for id_, text in stdlib_docs():
        add(id_, text)
    mans = sorted(glob.glob("/usr/share/man/man[1-8]/*"))
    room = limit - len(out)
    if room > 0 and mans:
        step = max(1, len(mans) // room)
        for path in mans[::step]:
            if len(out) >= limit:
                break
            try:
                add("man:" + path[len("/usr/share/man/"):], strip_roff(read_text(path)))
            except OSError:
                continue
    return out


def write_jsonl(docs: list, path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for id_, text in docs:
            fh.write(json.dumps({"id": id_, "text": text}, ensure_ascii=False) + "\n")


def read_jsonl(path: str) -> tuple:
    """(ids, texts) of the corpus file, in order."""
    ids, texts = [], []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            ids.append(row["id"])
            texts.append(row["text"])
    return ids, texts


# --- the systems: each reads the JSONL file and returns its pairs -------------------------

def simindex_fps(texts: list, scheme: str, width: int) -> list:
    return [simindex.fingerprint(t, scheme=scheme, width=width) for t in texts]


def simindex_pairs(fps: list, k: int, width: int) -> set:
    """Pairs of positions whose fingerprints are within k bits (`simindex.find_all`)."""
    return set(simindex.find_all(fps, k=k, width=width)) if len(fps) > 1 else set()


def run_simindex(path: str, scheme: str, width: int, k: int) -> set:
    """End to end: read, fingerprint, every pair within k."""
    _, texts = read_jsonl(path)
    return simindex_pairs(simindex_fps(texts, scheme, width), k, width)


def run_decisions(path: str, scheme: str, width: int, k: int,
                  min_similarity: float = None) -> int:
    """End to end, a real greedy dedup of the file (`simindex.decisions`, one process):
    the number of rows removed."""
    return sum(not d.kept for d in simindex.decisions(path, id_field="id", k=k, scheme=scheme,
                                                        width=width, jobs=1,
                                                        min_similarity=min_similarity))


def verified_pairs(cands: set, sets: dict, t: float, cache: dict = None) -> set:
    """The candidate pairs whose exact Jaccard (`simindex.signatures.similarity.jaccard` of the
    scheme's shingle sets, `sets` by position) is at least t."""
    from simindex.signatures.similarity import jaccard
    cache = {} if cache is None else cache
    out = set()
    for i, j in cands:
        if (i, j) not in cache:
            cache[i, j] = jaccard(sets[i], sets[j])
        if cache[i, j] >= t:
            out.add((i, j))
    return out


def run_verified(path: str, scheme: str, width: int, k: int, t: float) -> set:
    """End to end: read, fingerprint, every pair within k, then the exact Jaccard of the
    scheme's shingles of the documents in a candidate pair."""
    from simindex.signatures.similarity import shingle_set as scheme_shingles
    _, texts = read_jsonl(path)
    cands = simindex_pairs(simindex_fps(texts, scheme, width), k, width)
    sets = {i: scheme_shingles(texts[i], scheme) for i in {x for p in cands for x in p}}
    return verified_pairs(cands, sets, t)


def minhashes(sets: list, num_perm: int = NUM_PERM) -> list:
    """datasketch MinHash of each shingle set (UTF-8 shingles, update_batch)."""
    from datasketch import MinHash
    out = []
    for s in sets:
        m = MinHash(num_perm=num_perm)
        if s:
            m.update_batch([x.encode("utf-8") for x in s])
        out.append(m)
    return out


def lsh_pairs(mhs: list, t: float, num_perm: int = NUM_PERM) -> tuple:
    """(raw, verified): the candidate pairs of a MinHashLSH at threshold t (every document
    inserted, then each queried), and those whose MinHash Jaccard estimate is >= t."""
    from datasketch import MinHashLSH
    lsh = MinHashLSH(threshold=t, num_perm=num_perm)
    for i, m in enumerate(mhs):
        lsh.insert(i, m)
    raw = set()
    for i, m in enumerate(mhs):
        raw.update((min(i, j), max(i, j)) for j in lsh.query(m) if j != i)
    verified = {(i, j) for i, j in raw if mhs[i].jaccard(mhs[j]) >= t}
    return raw, verified


def run_minhash(path: str, t: float, verify: bool) -> set:
    """End to end: read, shingle, MinHash, LSH insert and query (and verify)."""
    _, texts = read_jsonl(path)
    raw, verified = lsh_pairs(minhashes([shingle_set(x) for x in texts]), t)
    return verified if verify else raw


def run_text_dedup(python: str, algo: str, path: str, t: float, workdir: str) -> set:
    """text-dedup's script (`python -m text_dedup.minhash|simhash` on the JSON file, one
    process, its own tokenizer) end to end; its pairs: every pair of documents that its
    union-find (dumped with --debug) puts in one cluster."""
    out = os.path.join(workdir, f"td-{algo}")
    args = [python, "-m", f"text_dedup.{algo}", "--path", "json", "--data_files", path,
            "--split", "train", "--output", out, "--column", "text", "--num_proc", "1",
            "--debug", "--ngram", str(SHINGLE)]
    if algo == "minhash":
        args += ["--threshold", str(t), "--num_perm", str(NUM_PERM)]
    else:
        bits = simhash_bits_for(t)     # its tables need more buckets than bits
        args += ["--bit_diff", str(bits), "--num_bucket", str(bits + 1)]
    subprocess.run(args, check=True, capture_output=True, cwd=workdir)
    dump = ("import json, pickle, sys; uf = pickle.load(open(sys.argv[1], 'rb')); "
            "print(json.dumps({i: uf.find(i) for i in uf.parent}))")
    got = subprocess.run([python, "-c", dump, os.path.join(out, "uf.pkl")], check=True,
                         capture_output=True, text=True).stdout
    return cluster_pairs(json.loads(got))


def simhash_bits_for(t: float) -> int:
    """text-dedup simhash's bit_diff (64 bits) for a threshold: its default 3 at 0.9 and
    above, 6 at 0.7, 10 at 0.5 (not tuned)."""
    return 3 if t >= 0.9 else 6 if t >= 0.7 else 10


def cluster_pairs(clusters: dict) -> set:
    """Every pair (i, j), i < j, of documents that share a cluster id."""
    groups: dict = {}
    for i, c in clusters.items():
        groups.setdefault(c, []).append(int(i))
    return {(a, b) for g in groups.values() for a in g for b in g if a < b}


# --- the evaluation ------------------------------------------------------------------------

def sweep(texts: list, truth: dict, configs=CONFIGS) -> list:
    """Scores of simindex at every (scheme, width, k) and threshold: one row per
    (scheme, width, threshold) at its best k (by F1), with every k's F1 kept too."""
    rows = []
    for scheme, width, ks in configs:
        fps = simindex_fps(texts, scheme, width)
        per_k = {k: simindex_pairs(fps, k, width) for k in ks}
        for t, tr in truth.items():
            by_k = {k: scores(p, tr) for k, p in per_k.items()}
            best = max(by_k, key=lambda k: (by_k[k]["f1"], -k))
            rows.append({"system": f"simindex {scheme} w{width}", "scheme": scheme,
                         "width": width, "threshold": t, "k": best, **by_k[best],
                         "f1_by_k": {k: round(s["f1"], 4) for k, s in by_k.items()}})
    return rows


def sweep_verified(texts: list, truth: dict, configs=VERIFIED) -> list:
    """Scores of simindex's candidates checked by exact Jaccard, one row per (scheme,
    width, threshold) at its best k."""
    from simindex.signatures.similarity import shingle_set as scheme_shingles
    rows = []
    for scheme, width, ks in configs:
        fps = simindex_fps(texts, scheme, width)
        sets = [scheme_shingles(x, scheme) for x in texts]
        per_k = {k: simindex_pairs(fps, k, width) for k in ks}
        cache: dict = {}
        for t, tr in truth.items():
            by_k = {k: scores(verified_pairs(p, sets, t, cache), tr) for k, p in per_k.items()}
            best = max(by_k, key=lambda k: (by_k[k]["f1"], -k))
            rows.append({"system": f"simindex {scheme} w{width} + Jaccard", "scheme": scheme,
                         "width": width, "threshold": t, "k": best, "verified": True,
                         "candidates": len(per_k[best]), **by_k[best],
                         "f1_by_k": {k: round(s["f1"], 4) for k, s in by_k.items()},
                         "scores_by_k": by_k, "candidates_by_k":
                             {k: len(p) for k, p in per_k.items()}})
    return rows


def cheapest_rows(rows: list) -> list:
    """For each verified row: the same configuration at the smallest k whose F1 reaches the
    best MinHashLSH row's at that threshold (a smaller k finds fewer candidates to check,
    so it runs faster), when that k is not the best one already."""
    out = []
    for row in [r for r in rows if r.get("verified")]:
        theirs = [r["f1"] for r in rows if r["threshold"] == row["threshold"]
                  and r["system"].startswith("MinHashLSH")]
        if not theirs:
            continue
        ks = sorted(k for k, f in row["scores_by_k"].items() if f["f1"] >= max(theirs))
        if ks and ks[0] != row["k"]:
            k = ks[0]
            out.append({**row, "system": row["system"] + " (smallest k)", "k": k,
                        "candidates": row["candidates_by_k"][k], **row["scores_by_k"][k]})
    return out


def minhash_rows(texts: list, truth: dict) -> list:
    """Scores of MinHashLSH, raw and verified, at each threshold (empty without
    datasketch)."""
    try:
        mhs = minhashes([shingle_set(x) for x in texts])
    except ImportError:
        return []
    rows = []
    for t, tr in truth.items():
        raw, verified = lsh_pairs(mhs, t)
        for label, pred in (("raw", raw), ("verified", verified)):
            rows.append({"system": f"MinHashLSH {label}", "threshold": t, **scores(pred, tr)})
    return rows


def timings(path: str, jobs: list, rounds: int) -> dict:
    """Seconds of each (name, thunk), median of `rounds` runs; rounds alternate the order."""
    times: dict = {name: [] for name, _ in jobs}
    for r in range(rounds):
        for name, fn in (jobs if r % 2 == 0 else jobs[::-1]):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


def evaluate(docs: list, thresholds=THRESHOLDS, rounds: int = 3, workdir: str = None,
             configs=CONFIGS, text_dedup_python: str = None, time_it: bool = True,
             verified=VERIFIED) -> dict:
    """The whole benchmark on [(id, text)]: corpus facts, truth counts, quality rows and
    end-to-end times."""
    workdir = workdir or tempfile.mkdtemp(prefix="dedup-quality-")
    path = os.path.join(workdir, "corpus.jsonl")
    write_jsonl(docs, path)
    ids, texts = read_jsonl(path)
    t0 = time.perf_counter()
    sets = [shingle_set(x) for x in texts]
    pairs = jaccard_pairs(shingle_matrix(sets), floor=min(thresholds))
    truth_seconds = time.perf_counter() - t0
    truth = {t: truth_at(pairs, t) for t in thresholds}
    checked, minhash = sweep_verified(texts, truth, verified), minhash_rows(texts, truth)
    rows = sweep(texts, truth, configs) + checked + cheapest_rows(checked + minhash) + minhash
    if text_dedup_python:
        rows += text_dedup_rows(text_dedup_python, path, truth, workdir)
    result = {"documents": len(texts), "words": sum(len(words(x)) for x in texts),
              "bytes": os.path.getsize(path), "truth_pairs": {t: len(v) for t, v in truth.items()},
              "truth_seconds": truth_seconds, "rows": rows, "corpus": path}
    if time_it:
        result["seconds"] = timings(path, timing_jobs(path, rows, thresholds,
                                                      text_dedup_python, workdir), rounds)
        for row in rows:
            row["seconds"] = result["seconds"].get(time_key(row))
    return result


def text_dedup_rows(python: str, path: str, truth: dict, workdir: str) -> list:
    rows = []
    for algo in ("minhash", "simhash"):
        for t, tr in truth.items():
            try:
                pred = run_text_dedup(python, algo, path, t, workdir)
            except (subprocess.CalledProcessError, OSError) as e:
                print(f"text-dedup {algo} failed: {e}", file=sys.stderr)
                break
            rows.append({"system": f"text-dedup {algo}", "threshold": t, **scores(pred, tr)})
    return rows


def time_key(row: dict) -> str:
    """The name of the timed run a quality row corresponds to."""
    if row.get("verified"):
        return f"{row['system']} k={row['k']} t={row['threshold']}"
    if row["system"].startswith("simindex"):
        return f"{row['system']} k={row['k']}"
    return f"{row['system']} t={row['threshold']}"


def timing_jobs(path: str, rows: list, thresholds, text_dedup_python, workdir) -> list:
    """(name, thunk) of every timed end-to-end run: simindex at each best k found, the
    greedy dedup (`decisions`) at the best simindex-v1 64-bit k, MinHashLSH at each
    threshold, text-dedup when given."""
    jobs: dict = {}
    for row in rows:
        name = time_key(row)
        if name in jobs:
            continue
        if row.get("verified"):
            s, w, k, t = row["scheme"], row["width"], row["k"], row["threshold"]
            jobs[name] = (lambda s=s, w=w, k=k, t=t: run_verified(path, s, w, k, t))
            if s == "simindex-v1" and w == 64:
                jobs[f"simindex decisions (greedy dedup, min_similarity={t}) w64 k={k}"] = \
                    (lambda k=k, t=t: run_decisions(path, "simindex-v1", 64, k, t))
        elif row["system"].startswith("simindex"):
            s, w, k = row["scheme"], row["width"], row["k"]
            jobs[name] = (lambda s=s, w=w, k=k: run_simindex(path, s, w, k))
            if s == "simindex-v1" and w == 64:
                jobs[f"simindex decisions (greedy dedup) w64 k={k}"] = \
                    (lambda k=k: run_decisions(path, "simindex-v1", 64, k))
        elif row["system"].startswith("MinHashLSH"):
            t, v = row["threshold"], row["system"].endswith("verified")
            jobs[name] = (lambda t=t, v=v: run_minhash(path, t, v))
        elif row["system"].startswith("text-dedup"):
            algo, t = row["system"].split()[1], row["threshold"]
            jobs[name] = (lambda a=algo, t=t:
                          run_text_dedup(text_dedup_python, a, path, t, workdir))
    return list(jobs.items())


# --- the report ----------------------------------------------------------------------------

def table(result: dict) -> str:
    """The markdown table: per threshold, every system's best row, then goal checks."""
    lines = [f"Corpus: {result['documents']:,} documents, {result['words']:,} words "
             f"({result['bytes'] / 1e6:.1f} MB JSONL); pairs with word-3-shingle Jaccard >= "
             + ", ".join(f"{t}: {n:,}" for t, n in result["truth_pairs"].items()), "",
             "| threshold | system | k | precision | recall | F1 | seconds |",
             "|---|---|---|---|---|---|---|"]
    for t in result["truth_pairs"]:
        for row in (r for r in result["rows"] if r["threshold"] == t):
            secs = row.get("seconds")
            lines.append(f"| {t} | {row['system']} | {row.get('k', '')} | "
                         f"{row['precision']:.3f} | {row['recall']:.3f} | {row['f1']:.3f} | "
                         f"{'' if secs is None else f'{secs:.2f}'} |")
    extra = {n: s for n, s in result.get("seconds", {}).items() if "decisions" in n}
    if extra:
        lines.append("")
    for name, secs in extra.items():
        lines.append(f"- {name}: {secs:.2f} s end to end")
    lines += [""] + goals(result)
    return "\n".join(lines)


def goals(result: dict) -> list:
    """Per threshold: the best simindex row against the best MinHashLSH row, F1 difference
    and the ratio of their end-to-end times."""
    out = []
    for t in result["truth_pairs"]:
        rows = [r for r in result["rows"] if r["threshold"] == t]
        ours = [r for r in rows if r["system"].startswith("simindex")]
        theirs = [r for r in rows if r["system"].startswith("MinHashLSH")]
        if not ours or not theirs:
            continue
        a = max(ours, key=lambda r: r["f1"])
        b = max(theirs, key=lambda r: r["f1"])
        out.append(f"- t={t}: best {a['system']} k={a['k']} F1 {a['f1']:.3f} vs best "
                   f"{b['system']} F1 {b['f1']:.3f} (difference {a['f1'] - b['f1']:+.3f})"
                   + speedup(b, a))
        good = [r for r in ours if r["f1"] >= b["f1"] and r.get("seconds")]
        if good:
            c = min(good, key=lambda r: r["seconds"])
            out.append(f"  - fastest simindex with F1 >= {b['f1']:.3f}: {c['system']} "
                       f"k={c['k']} F1 {c['f1']:.3f}" + speedup(b, c))
        else:
            out.append(f"  - no simindex configuration reaches F1 {b['f1']:.3f}")
    return out


def speedup(slow: dict, fast: dict) -> str:
    """'; MinHashLSH / simindex time N.Nx' when both rows were timed."""
    if not slow.get("seconds") or not fast.get("seconds"):
        return ""
    return (f"; time {fast['seconds']:.2f} s vs {slow['seconds']:.2f} s, "
            f"{slow['seconds'] / fast['seconds']:.1f}x")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=4000, help="documents at most")
    ap.add_argument("--max-words", type=int, default=20_000, help="longest document kept")
    ap.add_argument("--thresholds", type=float, nargs="+", default=list(THRESHOLDS))
    ap.add_argument("--rounds", type=int, default=3, help="timed runs per system (median)")
    ap.add_argument("--corpus", help="also keep the corpus JSONL here")
    ap.add_argument("--json", help="write the results as JSON here")
    ap.add_argument("--text-dedup-python", help="a Python that has text-dedup installed")
    ap.add_argument("--no-time", action="store_true", help="quality only")
    a = ap.parse_args(argv)
    docs = build_corpus(a.limit, max_words=a.max_words)
    with tempfile.TemporaryDirectory(prefix="dedup-quality-") as work:
        result = evaluate(docs, tuple(a.thresholds), a.rounds, work,
                          text_dedup_python=a.text_dedup_python, time_it=not a.no_time)
        if a.corpus:
            os.replace(result["corpus"], a.corpus)
    print(table(result))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
