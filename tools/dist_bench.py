"""Throughput of simindex.distributed on this machine: distributed build, fan-out queries and batch
pairs with 1, 2 and 4 workers (shard actors), beside the single-process Index.

    python3 tools/dist_bench.py --n 1000000

Runs a local Ray inside a loopback-only network namespace (root; see simindex.distributed.sandbox)
unless --address joins an existing cluster. Fixed seed, k=3; input is N random fingerprints
plus planted near-duplicates written as 4 TSV files (one parse task each); 10k queries,
half planted. Every answer is checked against the single-process index.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

import simindex


def data(n, queries, seed=42):
    rng = np.random.default_rng(seed)
    fps = rng.integers(0, 2**64, n, dtype=np.uint64)
    plant = rng.integers(0, n, n // 100)
    fps[plant] = fps[(plant + 1) % n] ^ np.uint64(0b1011)       # 1% near-duplicates
    q = fps[rng.integers(0, n, queries)].copy()
    q[: queries // 2] ^= np.uint64(0b101)
    q[queries // 2:] = rng.integers(0, 2**64, queries - queries // 2, dtype=np.uint64)
    return fps, q


def write_parts(d, fps, parts=4):
    paths = []
    for p, chunk in enumerate(np.array_split(np.arange(len(fps)), parts)):
        path = os.path.join(d, f"part{p}.tsv")
        with open(path, "w") as f:
            f.write("".join(f"{i}\t{int(fps[i]):016x}\n" for i in chunk))
        paths.append(path)
    return paths


def row(name, workers, secs, n, unit):
    print(f"| {name:<44} | {workers:>7} | {secs:8.2f} s | {n / secs:>12,.0f} {unit}/s |",
          flush=True)


def du(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--workers", default="1,2,4", help="shard actor counts to run")
    ap.add_argument("--address", default=None, help="an existing Ray cluster (default: local)")
    ap.add_argument("--cpus", type=int, default=os.cpu_count())
    ap.add_argument("--dir", default=None)
    a = ap.parse_args(argv)
    import ray

    from simindex import distributed as dist
    from simindex.distributed.sandbox import loopback_only
    if a.address is None:
        why = loopback_only()
        if why:
            sys.exit(f"dist_bench: {why}; run as root or pass --address")
        ray.init(num_cpus=a.cpus, include_dashboard=False, logging_level="ERROR")
    else:
        ray.init(address=a.address, logging_level="ERROR")
    base = a.dir or tempfile.mkdtemp(prefix="simindex-dist-")
    disk = ""
    fps, queries = data(a.n, a.queries)
    paths = write_parts(base, fps)
    print(f"simindex {simindex.__version__}, Ray {ray.__version__}, {a.n:,} fingerprints in "
          f"{len(paths)} TSV files, {a.queries:,} queries, k=3, "
          f"{int(ray.cluster_resources().get('CPU', 0))} Ray CPUs, {os.cpu_count()} cores")
    print("| figure | workers | time | rate |\n|---|---:|---:|---:|")
    ref_path = os.path.join(base, "single")
    t = time.perf_counter()
    with simindex.Index(ref_path, k=3, shards=4) as ref:
        ref.add_many(list(range(a.n)), fps)
    row("single-process add_many (columnar)", "-", time.perf_counter() - t, a.n, "rec")
    with simindex.Index(ref_path, readonly=True) as ref:
        ref.query_many(queries[:1000])
        t = time.perf_counter()
        want = []
        for i in range(0, len(queries), 1000):
            want += ref.query_many(queries[i:i + 1000])
        row("single-process query_many (batches of 1000)", "-", time.perf_counter() - t,
            len(queries), "q")
        t = time.perf_counter()
        want_pairs = sorted(ref.pairs())
        row("single-process pairs()", "-", time.perf_counter() - t, a.n, "rec")
    want = [[(m.id, m.distance) for m in ms] for ms in want]
    for w in [int(x) for x in a.workers.split(",")]:
        path = os.path.join(base, f"dist{w}")
        t = time.perf_counter()
        dist.build(path, paths, shards=w, k=3)
        row("dist.build from 4 TSV files", w, time.perf_counter() - t, a.n, "rec")
        if w == 1:
            with simindex.Index(path, readonly=True) as idx:
                tables = idx.stats()["tables"]
            shard_bytes = du(os.path.join(path, "shard-000"))
            disk = (f"on disk: records/ {du(os.path.join(path, 'records')) / a.n:.1f} B per "
                    f"record, one shard holding all {tables} tables {shard_bytes / a.n / tables:.1f}"
                    f" B per fingerprint per table")
        with dist.Cluster(path) as c:
            c.query_many(queries[:1000])                     # warm every actor
            t = time.perf_counter()
            got = []
            for i in range(0, len(queries), 1000):
                got += c.query_many(queries[i:i + 1000])
            row("Cluster.query_many (batches of 1000)", w, time.perf_counter() - t,
                len(queries), "q")
            if [[(int(m.id), m.distance) for m in ms] for ms in got] != want:
                sys.exit(f"dist_bench: WRONG ANSWERS from the {w}-shard cluster")
            t = time.perf_counter()
            for q in queries[:200]:
                c.query(int(q))
            row("Cluster.query (single calls)", w, time.perf_counter() - t, 200, "q")
        t = time.perf_counter()
        got_pairs = sorted((int(x), int(y), d) for x, y, d in dist.pairs(path, partitions=2 * w))
        row("dist.pairs over the stored index", w, time.perf_counter() - t, a.n, "rec")
        if got_pairs != want_pairs:
            sys.exit(f"dist_bench: WRONG PAIRS with {w} partitions")
    print(disk)
    ray.shutdown()
    if a.dir is None:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
