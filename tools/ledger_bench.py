"""Writes and query batches of a simindex.distributed.Cluster whose records are split over
1, 2 and 4 ledgers (ledger actors), on one machine's local Ray.

    python3 tools/ledger_bench.py --n 400000 --rounds 3

Per round and ledger count, in turns: a fresh index (k=3, SHARDS shards), N random
fingerprints added in add_many batches of BATCH (each batch commits in every ledger at
once, then the shards apply it in one transaction each), then QUERIES queries in
query_many batches of 1,000 (half planted within k of a stored record, so they have
matches; every ledger resolves its part). Answers are checked against the one-ledger
run's. Figures are the median (and range) over the rounds.

On a machine of few cores every actor shares them, so the totals cannot grow with the
ledgers. What carries to many nodes is each actor's own work, from Cluster.busy(): the
wall seconds each ledger spent committing its records and resolving its candidates, and
each shard applying and scanning. From them: the records/s one ledger commits and the
queries/s it resolves, and the rates the ledgers would allow if each had a node of its own
(N / the busiest ledger's seconds), beside the busiest shard's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import ray

import simindex
from simindex.distributed import Cluster
from simindex.distributed.sandbox import loopback_only


def data(n: int, queries: int, k: int, seed: int = 7) -> tuple:
    rng = np.random.default_rng(seed)
    fps = rng.integers(0, 2 ** 64, n, dtype=np.uint64)
    half = queries // 2
    q = np.concatenate([fps[rng.integers(0, n, half)],
                        rng.integers(0, 2 ** 64, queries - half, dtype=np.uint64)])
    for j in range(half):                        # within k of a stored one
        for b in rng.choice(64, int(rng.integers(0, k + 1)), replace=False):
            q[j] ^= np.uint64(1) << np.uint64(b)
    return fps, q


def one_run(path: str, ledgers: int, fps, queries, a) -> tuple:
    """(figures, answers) of one fresh index with `ledgers` ledgers."""
    shutil.rmtree(path, ignore_errors=True)
    simindex.Index(path, k=a.k, shards=a.shards).close()
    ids = np.arange(len(fps), dtype=np.uint64)
    with Cluster(path, ledgers=ledgers) as c:
        t = time.perf_counter()
        for i in range(0, len(fps), a.batch):
            c.add_many(ids[i:i + a.batch].tolist(), fps[i:i + a.batch])
        adds = len(fps) / (time.perf_counter() - t)
        written = c.busy()
        answers = []
        t = time.perf_counter()
        for i in range(0, len(queries), 1000):
            answers += c.query_many(queries[i:i + 1000])
        qps = len(queries) / (time.perf_counter() - t)
        read = c.busy()
        counts = ray.get([led.count.remote() for led in c.ledgers])
    names = [n for n in written if isinstance(n, str)]
    commit = [seconds(written[n], "commit") for n in names]
    resolve = [seconds(read[n], "resolve") - seconds(written[n], "resolve") for n in names]
    apply = [seconds(written[s], "apply") for s in written if not isinstance(s, str)]
    scan = [seconds(read[s], "scan") - seconds(written[s], "scan")
            for s in read if not isinstance(s, str)]
    figures = {
        "adds": adds, "queries": qps,
        "ledger_adds": statistics.median(n / t for n, t in zip(counts, commit)),
        "ledgers_allow_adds": len(fps) / max(commit),
        "shards_allow_adds": len(fps) / max(apply),
        "ledger_queries": statistics.median(len(queries) / t for t in resolve),
        "ledgers_allow_queries": len(queries) / max(resolve),
        "shards_allow_queries": len(queries) / max(scan),
    }
    return figures, [sorted((m.id, m.distance) for m in ms) for ms in answers]


def seconds(busy: dict, method: str) -> float:
    return busy.get(method, (0, 0.0))[1]


def spread(xs: list) -> str:
    return f"{statistics.median(xs):>10,.0f} ({min(xs):,.0f}-{max(xs):,.0f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--ledgers", default="1,2,4")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    counts = [int(x) for x in a.ledgers.split(",")]
    why = loopback_only()
    if why:
        print(f"no loopback-only network namespace ({why}); not starting Ray", file=sys.stderr)
        return 1
    ray.init(include_dashboard=False, logging_level="WARNING")
    cpus = int(ray.cluster_resources().get("CPU", 1))
    fps, queries = data(a.n, a.queries, a.k)
    root = tempfile.mkdtemp(prefix="simindex-ledgers-")
    runs: dict = {n: [] for n in counts}
    try:
        for r in range(a.rounds):
            want = None
            for n in counts:                       # interleaved: every count each round
                figures, got = one_run(os.path.join(root, "i"), n, fps, queries, a)
                if want is None:
                    want = got
                elif got != want:
                    print(f"answers with {n} ledgers differ from {counts[0]}'s",
                          file=sys.stderr)
                    return 1
                runs[n].append(figures)
                print(f"# round {r + 1}: {n} ledger(s): " + ", ".join(
                    f"{k} {v:,.0f}" for k, v in figures.items()), file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    print(f"# simindex {simindex.__version__}: {a.n:,} records in add_many batches of "
          f"{a.batch:,}, {a.queries:,} queries in batches of 1,000 (half with matches); "
          f"k={a.k}, {a.shards} shards, {cpus} CPUs; median (range) of {a.rounds} rounds")
    print("| ledgers | adds/s, all on this machine | records/s one ledger commits | adds/s "
          "the ledgers allow | adds/s the shards allow | queries/s, all on this machine | "
          "queries/s one ledger resolves | queries/s the ledgers allow | queries/s the "
          "shards allow |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in counts:
        col = lambda key: spread([f[key] for f in runs[n]])          # noqa: E731
        print(f"| {n} | {col('adds')} | {col('ledger_adds')} | {col('ledgers_allow_adds')} "
              f"| {col('shards_allow_adds')} | {col('queries')} | {col('ledger_queries')} | "
              f"{col('ledgers_allow_queries')} | {col('shards_allow_queries')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
