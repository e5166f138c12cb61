"""A bulk build of an empty index against faiss's multi-hash `add`, in interleaved rounds.

    python tools/build_bench.py [--n 100000000] [--plan 5/2] [--rounds 3] [--root DIR]

The same data as tools/bench.py (fixed seed, near-duplicates planted). Each round times
simindex's `add_many` into a new index (durable: it returns after the fsyncs) and faiss
IndexBinaryMultiHash 4x16's `add` (in RAM, one thread), one after the other, each in a
fresh process that loads the data first (untimed). Fresh processes, because on a VM
whose host takes back freed memory the first touch of fresh memory costs ~4 µs per 4 KiB
page and a build allocates gigabytes: on the benchmarks' VM faiss's 100M `add` takes
119-143 s in tools/bench.py's process and 30 s in one whose heap holds pages another build
freed. The ratio is reported per round, as the median and range of the rounds.

Where the host takes back the memory the guest frees (free page reporting), the first
write of each 4 KiB page after that costs ~7 us instead of ~0.7 us, and a durable 100M
build puts ~11 GB into the page cache. The tool measures and prints that cost first.
`--keep-freed-memory` (root) stops the reporting for the run (restored at the end), so the
rounds after the first run on memory the guest keeps, as on a machine without it.
"""

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import simindex  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import du, make_data, plan_arg, timed  # noqa: E402


def build_simindex(fps, root, k, plan):
    path = os.path.join(root, "simindex")
    blocks, prefix = plan or (None, None)
    with simindex.Index(path, k=k, expected=len(fps), blocks=blocks,
                        prefix_blocks=prefix) as idx:
        _, dt = timed(lambda: idx.add_many(range(len(fps)), fps))
        st = idx.stats()
    tables = sum(du(os.path.join(path, d)) for d in os.listdir(path) if d.startswith("shard-"))
    shutil.rmtree(path)
    return dt, st["tables"], st["shards"], tables / len(fps) / st["tables"]


def build_faiss(fps):
    import faiss
    faiss.omp_set_num_threads(1)
    index = faiss.IndexBinaryMultiHash(64, 4, 16)
    _, dt = timed(lambda: index.add(fps.view(np.uint8).reshape(-1, 8)))
    return dt                           # the index is freed on return


def child(system, data, root, k, plan):
    """Build in this (fresh) process and print the figures as one line, its peak RSS
    (GB) last."""
    fps = np.load(data)
    figures = [build_faiss(fps)] if system == "faiss" else build_simindex(fps, root, k, plan)
    print(*figures, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)


REPORTING = "/sys/module/page_reporting/parameters/page_reporting_order"


def page_cache_write_us(root, size=1 << 30):
    """µs per 4 KiB page of writing `size` bytes into a new file, twice (the second right
    after the first file is deleted, into the pages it freed)."""
    buf, out = b"\0" * (1 << 20), []
    for _ in range(2):
        path = os.path.join(root, "pages")
        with open(path, "wb", buffering=0) as f:
            t = time.perf_counter()
            for _ in range(size >> 20):
                f.write(buf)
            out.append((time.perf_counter() - t) / (size / 4096) * 1e6)
        os.unlink(path)
    return out


def run_child(system, data, root, a):
    args = [sys.executable, os.path.abspath(__file__), "--child", system, data, root,
            "--k", str(a.k)] + (["--plan", "%d/%d" % a.plan] if a.plan else [])
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout.split()
    return [float(x) for x in out]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000_000)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--plan", type=plan_arg, default=None, metavar="BLOCKS/PREFIX",
                    help="blocks and leading blocks instead of the planner's (5/2: 10 tables)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--root", default=None, help="where the index is built (a temp dir)")
    ap.add_argument("--keep-freed-memory", action="store_true",
                    help="root: stop free page reporting for the run (see above)")
    ap.add_argument("--child", nargs=3, metavar=("SYSTEM", "DATA", "ROOT"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(*a.child, a.k, a.plan)
    root = tempfile.mkdtemp(dir=a.root)
    ratios, order = [], None
    try:
        if a.keep_freed_memory and not os.path.exists(REPORTING):
            print("# no free page reporting on this machine: --keep-freed-memory does nothing")
        elif a.keep_freed_memory:
            with open(REPORTING) as f:
                was = f.read().strip()
            try:
                with open(REPORTING, "w") as f:
                    f.write("11\n")         # above the largest free block: none reported
            except PermissionError:
                ap.error("--keep-freed-memory needs root")
            order = was
        first, again = page_cache_write_us(root)
        print(f"writing into the page cache: {first:.2f} us per 4 KiB page, {again:.2f} us "
              f"into the pages just freed", flush=True)
        data = os.path.join(root, "fps.npy")
        np.save(data, make_data(a.n, 10, a.k)[0])
        for r in range(a.rounds):
            s, tables, shards, disk, srss = run_child("simindex", data, root, a)
            f, frss = run_child("faiss", data, root, a)
            ratios.append(s / f)
            print(f"round {r + 1}: simindex {s:.1f} s ({tables:.0f} tables, {shards:.0f} "
                  f"shards, {disk:.1f} B per entry, peak RSS {srss:.1f} GB), faiss 4x16 add "
                  f"{f:.1f} s (peak RSS {frss:.1f} GB): {s / f:.2f}x", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if order is not None:
            with open(REPORTING, "w") as f:
                f.write(order + "\n")
    ratios.sort()
    print(f"n={a.n:,}: build / faiss 4x16 add, median {np.median(ratios):.2f}x "
          f"({ratios[0]:.2f}-{ratios[-1]:.2f}x over {len(ratios)} rounds)")


if __name__ == "__main__":
    main()
