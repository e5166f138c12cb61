"""Wide fingerprints against faiss: simindex Index(width=...) beside faiss IndexBinaryFlat and
IndexBinaryMultiHash on the same data, one thread, answers checked.

    python3 tools/wide_bench.py [--n 1000000] [--queries 2000] [--rounds 3]
                                [--cases 128:8,256:16,256:31]

Per case (width:k): N random fingerprints, and queries of which half are stored ones with
1..k random bits flipped (each has a match) and half random. Every system answers every
query with all stored fingerprints within k bits; each answer set is compared with faiss
IndexBinaryFlat's (exact) and a wrong one fails the run. faiss multi-hash configurations
(nhash tables of b bits) get the fewest flips that keep them exact (nflip = k // nhash);
those that would probe more than 20,000 sub-hash values per table, or whose sub-hashes are
narrower than 8 bits, are left out.
Rounds alternate the systems; the median and range over rounds are printed. Figures:
build seconds (simindex: add_many of every fingerprint, durable, then compact();
faiss: add), query_many queries/s, single query median microseconds, and simindex's disk
bytes per fingerprint per table.
"""

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np

import simindex


def as_bytes(words):
    """(n, w) uint64 words, most significant first -> (n, 8w) uint8 big-endian, as faiss
    reads binary codes (its bit order does not matter for Hamming distances)."""
    return np.ascontiguousarray(words.astype(">u8")).view(np.uint8).reshape(len(words), -1)


def data(n, width, k, nq, seed):
    rng = np.random.default_rng(seed)
    words = width // 64
    fps = rng.integers(0, 2 ** 64, (n, words), dtype=np.uint64)
    q = fps[rng.integers(0, n, nq // 2)].copy()
    for row in q:
        for b in rng.choice(width, rng.integers(1, k + 1), replace=False):
            row[b // 64] ^= np.uint64(1 << (63 - b % 64))
    q = np.concatenate([q, rng.integers(0, 2 ** 64, (nq - len(q), words), dtype=np.uint64)])
    return fps, q


def faiss_answers(lims, labels):
    return [set(labels[lims[i]:lims[i + 1]].tolist()) for i in range(len(lims) - 1)]


def run_faiss(index, codes, q, k, single):
    t = time.perf_counter()
    index.add(codes)
    build = time.perf_counter() - t
    index.range_search(q[:50], k + 1)                     # warm
    t = time.perf_counter()
    lims, _, labels = index.range_search(q, k + 1)        # distances < k + 1
    many = len(q) / (time.perf_counter() - t)
    times = []
    for i in range(single):
        t = time.perf_counter()
        index.range_search(q[i:i + 1], k + 1)
        times.append(time.perf_counter() - t)
    return build, many, statistics.median(times) * 1e6, faiss_answers(lims, labels)


def run_simindex(fps, q, width, k, single):
    d = tempfile.mkdtemp()
    try:
        t = time.perf_counter()
        with simindex.Index(os.path.join(d, "i"), width=width, k=k, shards=1,
                            expected=len(fps)) as idx:
            idx.add_many(np.arange(len(fps)), fps)
            idx.compact()
            build = time.perf_counter() - t
            idx.query_many(q[:50])                        # warm
            t = time.perf_counter()
            res = idx.query_many(q)
            many = len(q) / (time.perf_counter() - t)
            ints = [int.from_bytes(r.astype(">u8").tobytes(), "big") for r in q[:single]]
            times = []
            for x in ints:
                t = time.perf_counter()
                idx.query(x)
                times.append(time.perf_counter() - t)
            st = idx.stats()
            shard_bytes = sum(os.path.getsize(os.path.join(root, f))
                              for root, _, files in os.walk(os.path.join(d, "i"))
                              if "shard-" in root for f in files)
            plan = f"{st['blocks']} blocks, {st['tables']} tables, flips {st['flips']}"
        return (build, many, statistics.median(times) * 1e6,
                [set(m.id for m in ms) for ms in res],
                shard_bytes / len(fps) / st["tables"], plan)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--single", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="128:8,256:16,256:31")
    a = ap.parse_args()
    import faiss
    faiss.omp_set_num_threads(1)
    for case in a.cases.split(","):
        width, k = map(int, case.split(":"))
        fps, q = data(a.n, width, k, a.queries, seed=width + k)
        codes, qc = as_bytes(fps), as_bytes(q)
        # faiss probes every flip combination of every sub-hash: keep the configurations
        # whose probes per table stay below 20,000 (the others take minutes per batch)
        from math import comb
        # (and sub-hashes of at least 8 bits: narrower buckets hold more than a flat scan)
        configs = [(h, width // h) for h in (2, 4, 8, 16, 32) if 8 <= width // h <= 64 and
                   sum(comb(width // h, i) for i in range(k // h + 1)) <= 20_000]
        figures = {}
        truth = None
        for r in range(a.rounds):
            systems = ["simindex", "flat"] + [f"multihash {h}x{b}" for h, b in configs]
            for name in (systems if r % 2 == 0 else systems[::-1]):
                if name == "simindex":
                    build, many, one, ans, per_table, plan = run_simindex(fps, q, width, k,
                                                                          a.single)
                    figures.setdefault("plan", plan)
                    figures.setdefault("disk", per_table)
                elif name == "flat":
                    build, many, one, ans = run_faiss(faiss.IndexBinaryFlat(width), codes, qc,
                                                      k, a.single)
                else:
                    h, b = map(int, name.split()[1].split("x"))
                    index = faiss.IndexBinaryMultiHash(width, h, b)
                    index.nflip = k // h
                    build, many, one, ans = run_faiss(index, codes, qc, k, a.single)
                if truth is None and name == "flat":
                    truth = ans
                figures.setdefault(name, []).append((build, many, one, ans))
        for name, runs in figures.items():
            if name in ("plan", "disk"):
                continue
            for *_, ans in runs:
                if truth is not None and ans != truth:
                    raise SystemExit(f"{case}: {name} answered differently from the exact scan")
        print(f"\n## width {width}, k={k}: {a.n:,} fingerprints, {a.queries:,} queries; "
              f"simindex plan: {figures['plan']}; disk {figures['disk']:.1f} B per fingerprint "
              f"per table ({width // 8} B raw)")
        print("system\tbuild_s\tquery_many_qps\tsingle_query_us")

        def med(xs):
            return f"{statistics.median(xs):,.2f} ({min(xs):,.2f}-{max(xs):,.2f})"
        best_many = best_one = best_add = None
        for name, runs in figures.items():
            if name in ("plan", "disk"):
                continue
            b, m, o = ([x[i] for x in runs] for i in range(3))
            print(f"{name}\t{med(b)}\t{med(m)}\t{med(o)}")
            if name.startswith("multihash") or name == "flat":
                best_many = max(best_many or 0, statistics.median(m))
                best_one = min(best_one or 1e18, statistics.median(o))
                if name.startswith("multihash"):
                    best_add = min(best_add or 1e18, statistics.median(b))
        s = figures["simindex"]
        print(f"ratios: query_many {statistics.median([x[1] for x in s]) / best_many:.2f}x the "
              f"best faiss; single query {statistics.median([x[2] for x in s]) / best_one:.2f}x "
              f"the best faiss; build {statistics.median([x[0] for x in s]) / best_add:.2f}x "
              f"the fastest multi-hash add", flush=True)


if __name__ == "__main__":
    main()
