"""simindex side by side with the peers a user would pick instead, on the same data, in one run.

    python tools/bench.py [--n 1000000] [--queries 10000] [--k 3] [--json out.json]

Data: a fixed seed; N random 64-bit fingerprints with near-duplicates planted at every
distance 0..k, and queries half planted, half random. Every system is warmed with one untimed
batch, and every system's answers are checked against a numpy brute force on a sample of
queries: a wrong answer is reported as a failure, never as a figure.

Peers (skipped with a note when not installed): faiss-cpu IndexBinaryMultiHash (nhash=4 b=16
nflip=0; nhash=2 b=32 nflip=1; faiss keeps dis < radius, so radius k+1) and IndexBinaryFlat;
PyPI simhash 2.1.2 SimhashIndex (on --simhash-n fingerprints: it is slow to build); seomoz
simhash-py 0.4.0 find_all, from --simhash-py SITE_PACKAGES (its sdist does not build on
Python 3.11 as shipped and its module name clashes with PyPI simhash: build it in an
environment of its own and name that environment's site-packages; its compiled module is
loaded here under another name).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

# numpy's OpenBLAS threads spin for a while after a BLAS call, taking the other core from
# whatever is timed next (8% of a query loop's samples): one thread for every system alike
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

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


QUERY_PROCESS = r"""
import sys, time, numpy as np, simindex
path, qfile, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = np.load(qfile)
def read_bytes():   # bytes this process made the kernel read from disk (mmap faults too)
    return int([l for l in open("/proc/self/io") if l.startswith("read_bytes")][0].split()[1])
r0 = read_bytes()
with simindex.Index(path, readonly=True) as idx:
    t = time.perf_counter()
    idx.query_many(q, k=k)
    dt = time.perf_counter() - t
    r1 = read_bytes()
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
kb = lambda f: int(status[f].split()[0])
print(len(q) / dt, kb("RssAnon"), kb("RssFile"), kb("RssShmem"), r1 - r0)
"""


def query_process(path, queries, k, root, cold):
    """(q/s, private RSS MB, file-backed RSS MB, bytes read from disk by the open and the
    queries) of a fresh process querying the index; with `cold`, after dropping the page
    cache (root only; None otherwise)."""
    import subprocess
    qfile = os.path.join(root, "queries.npy")
    np.save(qfile, queries)
    if cold:
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError:
            return None
    out = subprocess.run([sys.executable, "-c", QUERY_PROCESS, path, qfile, str(k)],
                         capture_output=True, text=True, check=True).stdout.split()
    rate, anon, file_, shmem = float(out[0]), int(out[1]), int(out[2]), int(out[3])
    return rate, (anon + shmem) / 1024, file_ / 1024, int(out[4])


def du(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def bench_simindex(fps, queries, k, sample, truth, rows, root, incremental, plan=None):
    path = os.path.join(root, "simindex")
    # the size planner picks blocks and shards; --plan overrides the blocks
    blocks, prefix = plan or (None, None)
    idx = simindex.Index(path, k=k, expected=len(fps), blocks=blocks, prefix_blocks=prefix)
    _, dt = timed(lambda: idx.add_many(range(len(fps)), fps))
    rows.append(Row("simindex", "build (add_many, durable)", dt, "s"))
    idx.compact()
    n, tables = len(fps), idx.stats()["tables"]
    ns = idx.stats()["shards"]
    print(f"# simindex plan: blocks={idx.blocks}, {tables} tables, {ns} shard{'s' * (ns > 1)}",
          flush=True)
    shards = sum(du(os.path.join(path, d)) for d in os.listdir(path) if d.startswith("shard-"))
    rows.append(Row("simindex", "disk, tables only, per fp per table", shards / n / tables, "B",
                    note=f"  (with records/: "
                         f"{du(path) / n / tables:.1f} B)"))
    # fresh query processes on the index as built (n records, like the peers' indexes, not
    # the 2n of the incremental batches below), with this process's handle closed: pages
    # it maps could not be dropped from the cache
    idx.close()
    warm = query_process(path, queries, k, root, cold=False)
    rows.append(Row("simindex", "query process: private RSS", warm[1], "MB",
                    note=f"  (+{warm[2]:.0f} MB of the index's pages mapped)"))
    cold = query_process(path, queries, k, root, cold=True)
    if cold is None:
        rows.append(Row("simindex", "query_many, cold page cache", float("nan"), "q/s",
                        note="  needs root to drop the page cache"))
    else:
        rows.append(Row("simindex", "query_many, cold page cache", cold[0], "q/s",
                        note=f"  fresh process after drop_caches (warm process: "
                             f"{warm[0]:,.0f} q/s); read {cold[3] / len(queries) / 1024:.1f} "
                             f"KiB per query ({cold[3] / 2**20:.0f} MiB in all, code pages "
                             f"of the libraries included)"))
    idx = simindex.Index(path)
    idx.query_many(queries)          # warm: the whole batch (1,000 left 100M half cold)
    res, dt = timed(lambda: idx.query_many(queries, k=k))
    ok = all({m.id for m in res[i]} == truth[i] for i in sample)
    rows.append(Row("simindex", "query_many, 1 thread", len(queries) / dt, "q/s", ok))
    # thread scaling: the batch above called 4 times, in turn on 1 thread and 2 calls on
    # each of 2 threads, so every call does the same work (seven interleaved pairs, the
    # median pair reported: one pair takes ~0.1 s, so a stray process on the other core,
    # or a neighbour on the host's shared cache, could decide it). Beside it, the ratio of
    # one call per thread on half of 4 copies of the batch: there the two calls build
    # their results (under the GIL) at the same moment, and each resolves every record it
    # hits twice where the 1-thread call, on all 4 copies, resolves it once.
    calls = [queries] * 4
    halves = np.array_split(np.concatenate(calls), 2)
    pairs, halved = [], []
    with ThreadPoolExecutor(2) as pool:
        for _ in range(7):
            _, dt1 = timed(lambda: [idx.query_many(q, k=k) for q in calls])
            _, dt2 = timed(lambda: list(pool.map(lambda q: idx.query_many(q, k=k), calls)))
            pairs.append((dt1 / dt2, dt1, dt2))
            _, h1 = timed(lambda: idx.query_many(np.concatenate(calls), k=k))
            _, h2 = timed(lambda: list(pool.map(lambda q: idx.query_many(q, k=k), halves)))
            halved.append(h1 / h2)
    pairs.sort()
    halved.sort()
    ratio, dt1, dt2 = pairs[len(pairs) // 2]
    nq = len(queries) * len(calls)
    rows.append(Row("simindex", "query_many, 2 threads", nq / dt2, "q/s",
                    note=f"  {ratio:.2f}x its 1-thread rate on the same {len(calls)} calls of "
                         f"{len(queries):,} queries (median of {len(pairs)} pairs; "
                         f"{pairs[0][0]:.2f}-{pairs[-1][0]:.2f}x; one call of "
                         f"{len(halves[0]):,} per thread: {halved[len(halved) // 2]:.2f}x, "
                         f"{halved[0]:.2f}-{halved[-1]:.2f}x)"))
    lat = []
    for q in queries[:2000].tolist():
        t = time.perf_counter()
        idx.query(q)
        lat.append(time.perf_counter() - t)
    rows.append(Row("simindex", "query single call, median", np.median(lat) * 1e6, "us"))
    lat = []
    for i in range(0, len(fps), max(1, len(fps) // 2000)):
        t = time.perf_counter()
        idx.get(i)
        lat.append(time.perf_counter() - t)
    rows.append(Row("simindex", "get() single call, median", np.median(lat) * 1e6, "us"))
    _, dt = timed(lambda: sum(1 for _ in idx.pairs()))
    rows.append(Row("simindex", "pairs() over the stored index", dt, "s"))
    if incremental:
        rng = np.random.default_rng(7)
        more = rng.integers(0, 2**64, incremental, dtype=np.uint64)
        ids = list(range(n, n + incremental))

        def batches():
            for i in range(0, incremental, 1000):
                idx.add_many(ids[i:i + 1000], more[i:i + 1000])
            idx.flush()         # the last group in the tables too (group commit), timed

        _, dt = timed(batches)
        rows.append(Row("simindex", "add_many batches of 1000, sync", incremental / dt,
                        "rec/s", note=f"  {incremental:,} more into the {n:,} index"))
    idx.close()
    single = simindex.Index(os.path.join(root, "single"), k=k, sync=False)
    m = min(n, 100_000)
    # timed up to the close, which folds the write buffer's last records into the tables
    _, dt = timed(lambda: ([single.add(i, v) for i, v in enumerate(fps[:m].tolist())],
                           single.close()))
    rows.append(Row("simindex", "single add, sync=False", m / dt, "rec/s",
                    note=f"  {m:,} adds into a new index, then close()"))
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
        index.range_search(xq[:nq], k + 1)                           # warm, likewise
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
    single = SimhashIndex([], k=k)
    _, dt = timed(lambda: [single.add(i, h) for i, h in objs])
    rows.append(Row(f"PyPI simhash (n={n:,})", "single add", n / dt, "rec/s"))
    qs = queries[:1000].tolist()
    res, dt = timed(lambda: [index.get_near_dups(Simhash(int(q))) for q in qs])
    ok = all(set(map(int, r)) == brute(sub, q, k) for r, q in zip(res[:50], qs[:50]))
    rows.append(Row(f"PyPI simhash (n={n:,})", "get_near_dups", len(qs) / dt, "q/s", ok))


def figure_of(rows, system, figure, pick=max):
    """The best (by `pick`) correct value of a figure whose system and name start so."""
    vals = [r.value for r in rows if r.ok and r.system.startswith(system) and
            r.figure.startswith(figure) and r.value == r.value]
    return pick(vals) if vals else None


def targets(rows, n):
    """The first target rows: the measured ratio of each, and whether it is met."""
    def get(system, figure, pick=max):
        return figure_of(rows, system, figure, pick)

    def line(name, value, goal, met):
        if value is None:
            print(f"| {name} | - | {goal} | no figure (peer missing) |")
        else:
            print(f"| {name} | {value} | {goal} | {'met' if met else 'NOT met'} |")

    print(f"\n| target (n={n:,}) | measured | goal | |\n|---|---|---|---|")
    q, fq = get("simindex", "query_many, 1"), get("faiss MultiHash", "range_search")
    r = q / fq if q and fq else None
    line("query_many vs best faiss multi-hash", r and f"{r:.2f}x", ">= 1.5x (1M), >= 1.0x (10M)",
         r and r >= (1.5 if n <= 1_000_000 else 1.0))
    s, fs = get("simindex", "query single"), get("faiss", "single query", min)
    r = s / fs if s and fs else None
    line("single query latency vs faiss", r and f"{r:.2f}x", "<= 0.5x", r and r <= 0.5)
    t = [x for x in rows if x.figure.startswith("query_many, 2 threads")]
    r = float(t[0].note.split("x")[0]) if t else None
    line("query_many, 2 threads vs 1", r and f"{r:.2f}x", ">= 1.8x", r and r >= 1.8)
    b, fb = get("simindex", "build"), get("faiss MultiHash", "build", min)
    r = b / fb if b and fb else None
    line("bulk build (durable) vs faiss add", r and f"{r:.2f}x", "<= 2x", r and r <= 2)
    inc = get("simindex", "add_many batches")
    line("incremental batches of 1000, sync", inc and f"{inc:,.0f} rec/s", ">= 100k rec/s",
         inc and inc >= 100_000)
    a, pa = get("simindex", "single add"), get("PyPI simhash", "single add")
    r = a / pa if a and pa else None
    line("single add sync=False vs PyPI SimhashIndex.add", r and f"{r:.2f}x", ">= 1.0x",
         r and r >= 1)
    d = get("simindex", "disk, tables only")
    line("disk per fingerprint per table", d and f"{d:.1f} B", "<= 12 B", d and d <= 12)
    m = get("simindex", "query process: private RSS")
    line("query process private RSS", m and f"{m:.0f} MB", "<= 64 MB", m and m <= 64)
    sp = get("seomoz simhash-py", "find_all")
    p, f = get("simindex", "pairs()"), get("simindex", "find_all")
    r = p / sp if p and sp else None
    line("pairs() over the stored index vs simhash-py find_all", r and f"{r:.2f}x", "<= 0.1x",
         r and r <= 0.1)
    r = f / sp if f and sp else None
    line("find_all in memory vs simhash-py find_all", r and f"{r:.2f}x", "<= 0.25x",
         r and r <= 0.25)


def goals(rows, n):
    """The speed goals at this size: each figure, its goal, met or not.
    Every ratio is taken within this run; read several runs' medians, not one."""
    def get(system, figure, pick=max):
        return figure_of(rows, system, figure, pick)

    def line(name, value, goal, met):
        state = "no figure" if value is None else "met" if met else \
            "NOT met" if met is not None else "not a goal at this size"
        print(f"| {name} | {value or '-'} | {goal} | {state} |")

    print(f"\n| goal (n={n:,}) | measured | goal | |\n|---|---|---|---|")
    q, fq = get("simindex", "query_many, 1"), get("faiss MultiHash", "range_search")
    r = q / fq if q and fq else None
    want = 1.5 if n >= 100_000_000 else 2.5
    line("query_many vs the best faiss multi-hash", r and f"{r:.2f}x", f">= {want}x",
         r and r >= want)
    s, fs = get("simindex", "query single"), get("faiss", "single query", min)
    line("single query, median", s and f"{s:.2f} us", "<= 4 us at 1M",
         (s <= 4) if s and n == 1_000_000 else None)
    r = s / fs if s and fs else None
    line("single query vs faiss's best", r and f"{r:.2f}x", "<= 0.3x", r and r <= 0.3)
    b, fb = get("simindex", "build"), get("faiss MultiHash 4x16", "build")
    r = b / fb if b and fb else None
    line("bulk build, durable, vs faiss 4x16 add", r and f"{r:.2f}x", "<= 1.0x", r and r <= 1.0)
    d = get("simindex", "disk, tables only")
    line("disk per fingerprint per table, after compact()", d and f"{d:.1f} B", "<= 11 B",
         d and d <= 11)
    inc = get("simindex", "add_many batches")
    want = 100_000 if n >= 100_000_000 else 150_000
    line("batches of 1,000 with sync", inc and f"{inc:,.0f} rec/s",
         f">= {want:,} rec/s at 10M and 100M", (inc >= want) if inc and n >= 10_000_000 else None)
    c = get("simindex", "query_many, cold")
    r = c / fq if c and fq else None
    line("cold page cache vs warm faiss", r and f"{r:.2f}x", ">= 0.5x at 1M",
         (r >= 0.5) if r and n == 1_000_000 else None)


def load_simhash_py(site):
    """seomoz simhash-py's compiled module from another environment's site-packages (its
    module name clashes with PyPI simhash), loaded here under another name."""
    import glob
    import importlib.util
    import types
    found = glob.glob(os.path.join(site, "simhash", "simhash.cpython-*.so"))
    if not found:
        return None
    sys.modules.setdefault("seomoz", types.ModuleType("seomoz"))
    spec = importlib.util.spec_from_file_location("seomoz.simhash", found[0])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bench_simhash_py(fps, k, rows, site):
    mod = load_simhash_py(site) if site else None
    if mod is None:
        rows.append(Row("seomoz simhash-py 0.4.0", "-", float("nan"), "",
                        note="  not installed (see docs/benchmarks.md: it builds only by hand on 3.11)"))
        return
    values = fps.tolist()
    got, dt = timed(lambda: mod.find_all(values, k + 2, k))
    # its answer is pairs of distinct values; simindex.find_all's (checked by the tests
    # against a brute force) over the same data is the reference
    want = {(min(fps[i], fps[j]), max(fps[i], fps[j]))
            for i, j in simindex.find_all(fps, k=k) if fps[i] != fps[j]}
    ok = {(min(a, b), max(a, b)) for a, b in got} == {(int(a), int(b)) for a, b in want}
    rows.append(Row("seomoz simhash-py 0.4.0", f"find_all (blocks {k + 2})", dt, "s", ok))


def plan_arg(text):
    """--plan BLOCKS/PREFIX as two ints, or argparse's usage error naming the value."""
    try:
        blocks, prefix = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not BLOCKS/PREFIX, e.g. 5/2") from None
    return blocks, prefix


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--check", type=int, default=200, help="queries checked by brute force")
    ap.add_argument("--simhash-n", type=int, default=100_000)
    ap.add_argument("--incremental", type=int, default=None,
                    help="records added in batches of 1000 after the build (default: n)")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--plan", type=plan_arg, default=None, metavar="BLOCKS/PREFIX",
                    help="blocks and prefix blocks of simindex's tables instead of the "
                         "planner's (e.g. 5/2: 10 tables at k=3)")
    ap.add_argument("--simhash-py", default=None, metavar="SITE_PACKAGES",
                    help="site-packages of an environment where seomoz simhash-py is built")
    a = ap.parse_args(argv)
    fps, queries = make_data(a.n, a.queries, a.k)
    sample = list(range(0, len(queries), max(1, len(queries) // a.check)))
    truth = {i: brute(fps, int(queries[i]), a.k) for i in sample}
    rows = []
    root = tempfile.mkdtemp(prefix="simindex-bench-")
    print(f"# n={a.n:,} k={a.k} queries={a.queries:,}; simindex {simindex.__version__}; "
          f"python {sys.version.split()[0]}; {os.cpu_count()} cores", flush=True)
    try:
        bench_simindex(fps, queries, a.k, sample, truth, rows, root,
                       a.n if a.incremental is None else a.incremental, a.plan)
        bench_faiss(fps, queries, a.k, sample, truth, rows)
        bench_pypi_simhash(fps, queries, a.k, rows, min(a.n, a.simhash_n))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    bench_simhash_py(fps, a.k, rows, a.simhash_py)
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
    targets(rows, a.n)
    goals(rows, a.n)
    if a.json:
        with open(a.json, "w") as f:
            json.dump([r.__dict__ for r in rows], f, indent=1)
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
