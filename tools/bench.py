"""simindex side by side with the peers a user would pick instead, on the same data, in one run.

    python tools/bench.py [--n 1000000] [--queries 10000] [--k 3] [--json out.json]

Data: a fixed seed; N random 64-bit fingerprints with near-duplicates planted at every
distance 0..k, and queries half planted, half random. Every system is warmed with one untimed
batch, and every system's answers are checked against a numpy brute force on a sample of
queries: a wrong answer is reported as a failure, never as a figure.

Peers (skipped with a note when not installed): faiss-cpu IndexBinaryMultiHash (nhash=4 b=16
nflip=0; nhash=2 b=32 nflip=1; faiss keeps dis < radius, so radius k+1) and IndexBinaryFlat;
PyPI simhash 2.1.2 SimhashIndex (on --simhash-n fingerprints: it is slow to build); seomoz
simhash-py 0.4.0 does not install on Python 3.11 and its module name clashes with PyPI
simhash, so it is reported as not installable.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import simindex


def make_data(n, nq, k, seed=42):
    rng = np.random.default_rng(seed)
    fps = rng.integers(0, 2**64, n, dtype=np.uint64)
    # plant near-duplicates at every distance 0..k of some stored fingerprints
    planted = max(1, n // 100)
    src = rng.integers(0, n, planted)
    for j, i in enumerate(src):
        d = j % (k + 1)
        flip = np.uint64(0)
        for b in rng.choice(64, d, replace=False):
            flip |= np.uint64(1) << np.uint64(b)
        fps[(i + 1 + j) % n] = fps[i] ^ flip
    half = nq // 2
    picks = fps[rng.integers(0, n, half)].copy()
    for j in range(half):
        for b in rng.choice(64, rng.integers(0, k + 1), replace=False):
            picks[j] ^= np.uint64(1) << np.uint64(b)
    queries = np.concatenate([picks, rng.integers(0, 2**64, nq - half, dtype=np.uint64)])
    return fps, queries


def brute(fps, q, k):
    x = np.bitwise_xor(fps, np.uint64(q))
    d = np.unpackbits(x.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)
    return set(np.nonzero(d <= k)[0].tolist())


class Row:
    def __init__(self, system, figure, value, unit, ok=True, note=""):
        self.system, self.figure, self.value, self.unit, self.ok, self.note = \
            system, figure, value, unit, ok, note


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def bench_simindex(fps, queries, k, sample, truth, rows, root):
    path = os.path.join(root, "simindex")
    idx = simindex.Index(path, k=k)
    _, dt = timed(lambda: idx.add_many(range(len(fps)), fps))
    rows.append(Row("simindex", "build (add_many, durable)", dt, "s"))
    idx.compact()
    idx.query_many(queries[:1000])                                   # warm
    res, dt = timed(lambda: idx.query_many(queries, k=k))
    ok = all({m.id for m in res[i]} == truth[i] for i in sample)
    rows.append(Row("simindex", "query_many, 1 thread", len(queries) / dt, "q/s", ok))
    one = len(queries) / dt
    halves = np.array_split(queries, 2)
    with ThreadPoolExecutor(2) as pool:
        _, dt = timed(lambda: list(pool.map(lambda q: idx.query_many(q, k=k), halves)))
    rows.append(Row("simindex", "query_many, 2 threads", len(queries) / dt, "q/s",
                    note=f"  {len(queries) / dt / one:.2f}x its 1-thread rate"))
    lat = []
    for q in queries[:2000].tolist():
        t = time.perf_counter()
        idx.query(q)
        lat.append(time.perf_counter() - t)
    rows.append(Row("simindex", "query single call, median", np.median(lat) * 1e6, "us"))
    _, dt = timed(lambda: sum(1 for _ in idx.pairs()))
    rows.append(Row("simindex", "pairs() over the stored index", dt, "s"))
    idx.close()
    _, dt = timed(lambda: simindex.find_all(fps, k=k))
    rows.append(Row("simindex", "find_all in memory", dt, "s"))


def bench_faiss(fps, queries, k, sample, truth, rows):
    try:
        import faiss
    except ImportError:
        rows.append(Row("faiss", "-", float("nan"), "", note="faiss-cpu not installed"))
        return
    faiss.omp_set_num_threads(1)
    xb = fps.view(np.uint8).reshape(-1, 8)
    xq = queries.view(np.uint8).reshape(-1, 8)
    configs = [("faiss MultiHash 4x16 nflip0", lambda: faiss.IndexBinaryMultiHash(64, 4, 16), 0),
               ("faiss MultiHash 2x32 nflip1", lambda: faiss.IndexBinaryMultiHash(64, 2, 32), 1),
               ("faiss BinaryFlat", lambda: faiss.IndexBinaryFlat(64), None)]
    for name, make, nflip in configs:
        index = make()
        if nflip is not None:
            index.nflip = nflip
        _, dt = timed(lambda: index.add(xb))
        rows.append(Row(name, "build (add, in RAM)", dt, "s"))
        nq = len(queries) if nflip is not None else min(len(queries), 200)
        index.range_search(xq[:min(nq, 500)], k + 1)                 # warm
        (lims, _dis, labels), dt = timed(lambda: index.range_search(xq[:nq], k + 1))
        ok = all(set(labels[lims[i]:lims[i + 1]].tolist()) == truth[i] for i in sample
                 if i < nq)
        rows.append(Row(name, "range_search batch, 1 thread", nq / dt, "q/s", ok))
        if nflip is not None:
            lat = []
            for i in range(2000):
                t = time.perf_counter()
                index.range_search(xq[i:i + 1], k + 1)
                lat.append(time.perf_counter() - t)
            rows.append(Row(name, "single query, median", np.median(lat) * 1e6, "us"))


def bench_pypi_simhash(fps, queries, k, rows, n):
    try:
        from simhash import Simhash, SimhashIndex
    except ImportError:
        rows.append(Row("PyPI simhash", "-", float("nan"), "", note="simhash 2.1.2 not installed"))
        return
    sub = fps[:n]
    objs = [(str(i), Simhash(int(v))) for i, v in enumerate(sub.tolist())]
    index, dt = timed(lambda: SimhashIndex(objs, k=k))
    rows.append(Row(f"PyPI simhash (n={n:,})", "build (add)", n / dt, "rec/s"))
    qs = queries[:1000].tolist()
    res, dt = timed(lambda: [index.get_near_dups(Simhash(int(q))) for q in qs])
    ok = all(set(map(int, r)) == brute(sub, q, k) for r, q in zip(res[:50], qs[:50]))
    rows.append(Row(f"PyPI simhash (n={n:,})", "get_near_dups", len(qs) / dt, "q/s", ok))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--check", type=int, default=200, help="queries checked by brute force")
    ap.add_argument("--simhash-n", type=int, default=100_000)
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args(argv)
    fps, queries = make_data(a.n, a.queries, a.k)
    sample = list(range(0, len(queries), max(1, len(queries) // a.check)))
    truth = {i: brute(fps, int(queries[i]), a.k) for i in sample}
    rows = []
    root = tempfile.mkdtemp(prefix="simindex-bench-")
    print(f"# n={a.n:,} k={a.k} queries={a.queries:,}; simindex {simindex.__version__}; "
          f"python {sys.version.split()[0]}; {os.cpu_count()} cores", flush=True)
    try:
        bench_simindex(fps, queries, a.k, sample, truth, rows, root)
        bench_faiss(fps, queries, a.k, sample, truth, rows)
        bench_pypi_simhash(fps, queries, a.k, rows, min(a.n, a.simhash_n))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows.append(Row("seomoz simhash-py 0.4.0", "-", float("nan"), "",
                    note="not installable on Python 3.11 (and its module clashes with PyPI "
                         "simhash)"))
    best = {}
    for r in rows:
        if r.ok and r.unit == "q/s" and r.system.startswith("faiss MultiHash"):
            best["q/s"] = max(best.get("q/s", 0), r.value)
        if r.ok and r.unit == "us" and r.system.startswith("faiss"):
            best["us"] = min(best.get("us", float("inf")), r.value)
    print(f"{'system':<32} {'figure':<32} {'value':>12} {'unit':<6} ratio")
    for r in rows:
        ratio = ""
        if r.system == "simindex" and r.unit in best:
            if "2 threads" not in r.figure:
                ratio = f"{r.value / best[r.unit]:.2f}x best faiss multi-hash"
        status = "" if r.ok else "WRONG ANSWERS"
        print(f"{r.system:<32} {r.figure:<32} {r.value:>12,.1f} {r.unit:<6} {ratio}{status}"
              f"{r.note}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump([r.__dict__ for r in rows], f, indent=1)
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
