"""Time the engine's main calls at a given size (no peers; tools/bench.py compares peers).

    python tools/timing.py --n 1000000

Fixed seed, k=3; N random fingerprints plus 10k queries (half planted within k, half random).
The first line names the version and parameters, so the output can be pasted into the docs.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

import simindex


def timed(label, fn, n=None, unit="ops"):
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    rate = f"  {n / dt:>12,.0f} {unit}/s" if n else ""
    print(f"{label:<44} {dt:9.3f} s{rate}", flush=True)
    return out, dt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--dir", default=None, help="where to build (default: a temp dir)")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(42)
    fps = rng.integers(0, 2**64, a.n, dtype=np.uint64)
    ids = list(range(a.n))
    half = a.queries // 2
    picks = fps[rng.integers(0, a.n, half)]
    flips = np.zeros(half, dtype=np.uint64)
    for j in range(half):
        for b in rng.choice(64, rng.integers(0, a.k + 1), replace=False):
            flips[j] |= np.uint64(1) << np.uint64(b)
    queries = np.concatenate([picks ^ flips, rng.integers(0, 2**64, half, dtype=np.uint64)])
    root = a.dir or tempfile.mkdtemp(prefix="simindex-timing-")
    path = os.path.join(root, "idx")
    print(f"# simindex {simindex.__version__}, n={a.n:,}, k={a.k}, shards={a.shards}, "
          f"queries={len(queries):,}; python {sys.version.split()[0]}")
    try:
        idx = simindex.Index(path, k=a.k, shards=a.shards)
        timed("add_many columnar (bulk, durable)", lambda: idx.add_many(ids, fps), a.n, "rec")
        timed("compact", idx.compact)
        idx.query_many(queries[:1000])                       # warm the page cache
        res, _ = timed("query_many (1 thread)", lambda: idx.query_many(queries),
                       len(queries), "q")
        found = sum(len(r) for r in res[:half])
        assert found >= half, "planted queries must find their source"
        lat = []
        for q in queries[:2000].tolist():
            t = time.perf_counter()
            idx.query(q)
            lat.append(time.perf_counter() - t)
        print(f"{'query single call, median':<44} {np.median(lat) * 1e6:9.1f} us")
        more = rng.integers(0, 2**64, 100_000, dtype=np.uint64)

        def incremental():
            for i in range(0, len(more), 1000):
                idx.add_many(range(a.n + i, a.n + i + 1000), more[i:i + 1000])
        timed("add_many batches of 1,000 (sync on)", incremental, len(more), "rec")
        timed("pairs() over the index", lambda: sum(1 for _ in idx.pairs()))
        timed("find_all in memory", lambda: simindex.find_all(fps, k=a.k))
        s = idx.stats()
        print(f"{'bytes on disk per fingerprint per table':<44} "
              f"{s['bytes'] / s['count'] / s['tables']:9.1f}")
        idx.close()
    finally:
        if not a.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
