"""Query speed of table plans, flips included, on random fingerprints (one process, 1 thread).

    python3 tools/flip_bench.py N K BLOCKS,PREFIX_BLOCKS ...
    python3 tools/flip_bench.py 1000000 8 10,2 5,1 4,1 3,1 1,0

Each plan gets its own index of N random fingerprints (one shard, compacted); queries are
2,000 stored fingerprints with K random bits flipped, so each has at least one match at
distance K. Prints per plan: tables, flips, probes per query, build seconds, query_many
queries/s, the mean single query, the matches found (equal for every plan: they are
exact) and bytes on disk per fingerprint.
"""

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

import simindex


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("plans", nargs="+", help="BLOCKS,PREFIX_BLOCKS")
    ap.add_argument("--queries", type=int, default=2000)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    fps = rng.integers(0, 2 ** 64, a.n, dtype=np.uint64)
    qs = fps[rng.integers(0, a.n, a.queries)].copy()
    for i in range(len(qs)):
        for b in rng.choice(64, a.k, replace=False):
            qs[i] ^= np.uint64(1 << int(b))
    print("blocks\tprefix_blocks\ttables\tflips\tprobes\tbuild_s\tquery_many_qps\tsingle_us"
          "\tfound\tbytes_per_fp", flush=True)
    for spec in a.plans:
        m, p = map(int, spec.split(","))
        d = tempfile.mkdtemp()
        try:
            t0 = time.perf_counter()
            with simindex.Index(os.path.join(d, "i"), k=a.k, blocks=m, prefix_blocks=p,
                                shards=1) as idx:
                idx.add_many(np.arange(a.n), fps)
                idx.compact()
                build = time.perf_counter() - t0
                idx.query_many(qs[:100])                      # warm the pages
                t0 = time.perf_counter()
                found = sum(map(len, idx.query_many(qs)))
                many = len(qs) / (time.perf_counter() - t0)
                t0 = time.perf_counter()
                for q in qs[:300].tolist():
                    idx.query(q)
                single = (time.perf_counter() - t0) / 300 * 1e6
                st = idx.stats()
            print(f"{m}\t{p}\t{st['tables']}\t{st['flips']}\t{st['probes']}\t{build:.1f}\t"
                  f"{many:,.0f}\t{single:.0f}\t{found}\t{st['bytes'] / a.n:.0f}", flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
