"""Near-duplicates by cosine end to end: documents whose tf-idf vectors have cosine >= s, found
through random-hyperplane signatures, checked with the true cosine, and measured against
the exact answer (every pair's cosine).

    python3 tools/cosine_dedup.py [--dir /usr/share/doc] [--width 128] [--cosine 0.9]
                                  [--recall 0.99] [--signature hyperplanes|words]

The corpus is every */copyright file under --dir (the Debian copyright files on this
machine). Words are runs of \\w in lowercase; weights tf-idf, rows L2-normalized. `hyperplanes`
signs the rows with simindex.Hyperplanes; `words` with simindex.simhash_rows (each word's
own +-1 vector). k comes from radius_for_cosine(s, width, recall); find_all(width=...)
returns the candidate pairs, and the true cosine removes the false positives.
"""

import argparse
import glob
import os
import re
import sys
import time

import numpy as np
import scipy.sparse as sp

import simindex

WORD = re.compile(r"\w+")


def corpus(root):
    """(names, texts) of every */copyright file under root that has a word in it."""
    names, texts = [], []
    for f in sorted(glob.glob(os.path.join(root, "*", "copyright"))):
        with open(f, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        if WORD.search(text):
            names.append(os.path.basename(os.path.dirname(f)))
            texts.append(text)
    return names, texts


def tfidf(texts):
    """(rows L2-normalized tf-idf as CSR, vocabulary)."""
    vocab, rows, cols, vals = {}, [], [], []
    for i, text in enumerate(texts):
        counts = {}
        for w in WORD.findall(text.lower()):
            counts[w] = counts.get(w, 0) + 1
        for w, c in counts.items():
            rows.append(i)
            cols.append(vocab.setdefault(w, len(vocab)))
            vals.append(c)
    X = sp.csr_matrix((np.array(vals, float), (rows, cols)), shape=(len(texts), len(vocab)))
    df = np.bincount(X.indices, minlength=X.shape[1])
    X = X.multiply(np.log((1 + X.shape[0]) / (1 + df)) + 1).tocsr()
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    X = sp.diags(1 / norms) @ X
    words = [None] * len(vocab)
    for w, j in vocab.items():
        words[j] = w
    return X.tocsr(), words


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/usr/share/doc")
    ap.add_argument("--width", type=int, default=128, choices=simindex.WIDTHS)
    ap.add_argument("--cosine", type=float, default=0.9)
    ap.add_argument("--recall", type=float, default=0.99)
    ap.add_argument("--signature", default="hyperplanes", choices=("hyperplanes", "words"))
    a = ap.parse_args(argv)
    names, texts = corpus(a.dir)
    if len(names) < 2:
        print(f"cosine_dedup: fewer than 2 */copyright files with words under {a.dir}",
              file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    X, words = tfidf(texts)
    t1 = time.perf_counter()
    if a.signature == "hyperplanes":
        fps = simindex.Hyperplanes(X.shape[1], width=a.width, seed=0).fingerprints(X)
    else:
        fps = simindex.simhash_rows(X, words, width=a.width)
    k = simindex.radius_for_cosine(a.cosine, a.width, a.recall)
    t2 = time.perf_counter()
    candidates = simindex.find_all(fps, k=k, width=a.width)
    t3 = time.perf_counter()
    pi = np.array([i for i, _ in candidates], dtype=np.int64)
    pj = np.array([j for _, j in candidates], dtype=np.int64)
    values = np.asarray(X[pi].multiply(X[pj]).sum(axis=1)).ravel() if candidates else []
    cos = dict(zip(candidates, map(float, values)))
    found = {p for p, c in cos.items() if c >= a.cosine - 1e-12}
    t4 = time.perf_counter()
    gram = (X @ X.T).tocoo()                          # the exact answer, every pair
    truth = {(int(i), int(j)) for i, j, c in zip(gram.row, gram.col, gram.data)
             if i < j and c >= a.cosine - 1e-12}
    print(f"{len(names)} documents, {X.shape[1]} words; {a.signature}, width {a.width}, "
          f"cosine >= {a.cosine}: k = {k} (recall {a.recall} by the binomial law)")
    print(f"candidates within k: {len(candidates)}; true cosine >= {a.cosine}: {len(found)} "
          f"(false positives removed: {len(candidates) - len(found)})")
    recall = len(found & truth) / len(truth) if truth else 1.0
    print(f"exact answer: {len(truth)} pairs; found {len(found & truth)} (recall {recall:.3f}), "
          f"none wrong: {found <= truth}")
    print(f"seconds: tf-idf {t1 - t0:.2f}, signatures {t2 - t1:.2f}, find_all {t3 - t2:.2f}, "
          f"cosine check {t4 - t3:.2f}")
    for (i, j) in sorted(found, key=lambda p: -cos[p])[:5]:
        print(f"  {names[i]} ~ {names[j]}: cosine {cos[(i, j)]:.3f}")
    return 0


if __name__ == "__main__":
    from piped import exit_with     # `| head`: quietly, as a producer killed by SIGPIPE
    exit_with(main)
