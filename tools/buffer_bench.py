"""Time single-record calls with sync=False: add one by one, and single queries with an empty
and with a partly filled write buffer, beside PyPI simhash's SimhashIndex.add.

    python tools/buffer_bench.py [--base 100000] [--adds 100000] [--queries 10000]

Fixed seeds, k=3. The index first gets --base records in one add_many; then --adds single
`add` calls (sync=False) are timed, then the median latency of single `query` calls: with
nothing buffered (as the adds left the tables, then after compact()), then with --buffered
records added (unfolded) before each round of queries, checked against a numpy brute force
on a sample. Last, PyPI simhash's SimhashIndex.add of the same fingerprints, if installed.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

import simindex
from simindex import _testing as hook


def brute(ids, fps, q, k):
    x = np.bitwise_xor(fps, np.uint64(q))
    d = np.unpackbits(x.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)
    return {ids[i] for i in np.nonzero(d <= k)[0].tolist()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=int, default=100_000)
    ap.add_argument("--adds", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--buffered", type=int, default=2_000)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--fold", type=int, default=None,
                    help="records a write buffer holds before it folds (simindex.engine.writebuffer.FOLD)")
    a = ap.parse_args(argv)
    if a.fold is not None:
        hook.tune(fold=a.fold)
    rng = np.random.default_rng(42)
    base = rng.integers(0, 2**64, a.base, dtype=np.uint64)
    more = rng.integers(0, 2**64, a.adds, dtype=np.uint64)
    # half the queries near a stored fingerprint, half random
    picks = base[rng.integers(0, a.base, a.queries // 2)] ^ np.uint64(0b101)
    queries = np.concatenate([picks, rng.integers(0, 2**64, a.queries - len(picks),
                                                  dtype=np.uint64)]).tolist()
    root = tempfile.mkdtemp(prefix="simindex-buffer-bench-")
    fold = hook.KNOBS["fold"][0].FOLD
    print(f"# simindex {simindex.__version__} ({os.path.dirname(simindex.__file__)}), "
          f"base={a.base:,} adds={a.adds:,} queries={a.queries:,} k={a.k}, FOLD={fold}; "
          f"python {sys.version.split()[0]}")
    try:
        path = os.path.join(root, "idx")
        with simindex.Index(path, k=a.k) as idx:
            idx.add_many(range(a.base), base)
        idx = simindex.Index(path, sync=False)
        adds = list(zip(range(a.base, a.base + a.adds), more.tolist()))
        add = idx.add
        t = time.perf_counter()
        for i, fp in adds:
            add(i, fp)
        dt = time.perf_counter() - t
        print(f"single add, sync=False           {a.adds / dt:12,.0f} rec/s")
        t = time.perf_counter()
        idx.flush()
        print(f"flush() after them               {(time.perf_counter() - t) * 1e3:12.1f} ms")
        ids = np.arange(a.base + a.adds)
        fps = np.concatenate([base, more])

        def latencies(qs):
            lat = []
            for q in qs:
                t = time.perf_counter()
                idx.query(q)
                lat.append(time.perf_counter() - t)
            return lat

        idx.query_many(queries)                           # warm
        lat = latencies(queries)
        print(f"query, empty buffer, median      {np.median(lat) * 1e6:12.1f} us "
              f"({idx.stats()['runs']} runs)")
        idx.compact()
        idx.query_many(queries)
        lat = latencies(queries)
        print(f"query, empty buffer, compacted   {np.median(lat) * 1e6:12.1f} us "
              f"({idx.stats()['runs']} runs)")
        # rounds of queries, each after --buffered fresh adds (well within the 1 s age)
        lat, nxt, extra_ids, extra_fps = [], a.base + a.adds, [], []
        step = 1000
        for r in range(0, len(queries), step):
            fresh = rng.integers(0, 2**64, a.buffered, dtype=np.uint64).tolist()
            for fp in fresh:
                idx.add(nxt, fp)
                extra_ids.append(nxt)
                extra_fps.append(fp)
                nxt += 1
            buffered = hook.buffered(idx)
            lat += latencies(queries[r:r + step])
            sample = queries[r:r + step:100]
            allids = np.concatenate([ids, np.array(extra_ids)])
            allfps = np.concatenate([fps, np.array(extra_fps, dtype=np.uint64)])
            for q in sample:
                assert {m.id for m in idx.query(q)} == brute(allids, allfps, q, a.k)
            idx.flush()
        print(f"query, {a.buffered:,} buffered, median  {np.median(lat) * 1e6:12.1f} us "
              f"(buffer held {buffered:,} records)")
        idx.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    try:
        from simhash import Simhash, SimhashIndex
    except ImportError:
        print("PyPI simhash not installed")
        return 0
    objs = [(str(i), Simhash(fp)) for i, fp in zip(range(a.adds), more.tolist())]
    single = SimhashIndex([], k=a.k)
    t = time.perf_counter()
    for i, h in objs:
        single.add(i, h)
    dt = time.perf_counter() - t
    print(f"PyPI SimhashIndex.add            {a.adds / dt:12,.0f} rec/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
