"""`simindex dedup --ray` beside `simindex dedup` on one machine: the same input, the same
answer (checked), and where the time, the bytes and the memory go.

    python3 tools/dist_dedup_bench.py CORPUS.jsonl --megabytes 100 --rounds 3

CORPUS.jsonl holds {"id", "text"} rows (tools/throughput_bench.py makes the corpora this
project reports). Its first MEGABYTES of rows are dealt into SHARDS JSON lines files. For
each worker count (Ray CPUs), a local Ray runs in a loopback-only network namespace (root;
see simindex.distributed.sandbox), and rounds that take turns run:
- `simindex dedup` on one machine (`--jobs` = workers), as a fresh process;
- `simindex dedup --ray ADDRESS` joining that Ray, as a fresh process (its peak RSS, read by GNU time,
  is the driver's memory);
- simindex.distributed.dedup in this process with `timings`, each stage waited for in turn:
  its wall time, its rows/s and MB/s per worker, and the bytes of the objects it made per
  row (what a cluster would send between nodes at most).
Every figure is the median (and range) over the rounds; the kept rows and the removed
report of every run are compared with the one-machine run's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

STAGES = ("read", "join", "check", "components", "decide", "assemble", "write", "index")


def deal(corpus: str, out: str, megabytes: float, shards: int) -> tuple:
    """The corpus's first `megabytes` of rows dealt into `shards` files: (rows, bytes)."""
    os.makedirs(out, exist_ok=True)
    files = [open(os.path.join(out, f"shard-{i:03d}.jsonl"), "w", encoding="utf-8")
             for i in range(shards)]
    rows = size = 0
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            if size >= megabytes * 1e6:
                break
            files[rows % shards].write(line)
            rows += 1
            size += len(line.encode("utf-8"))
    for fh in files:
        fh.close()
    return rows, size


def timed_process(args: list) -> tuple:
    """(seconds, peak RSS in MB, stderr) of a command run as a fresh process. GNU time
    reads the peak in a small wrapper process: a child of this (large) process would count
    this process's memory at the time it was forked."""
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", *args], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    secs = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"dist_dedup_bench: {' '.join(args[:6])} ... failed:\n{p.stderr[-2000:]}")
    return secs, int(p.stderr.strip().splitlines()[-1]) / 1024, p.stderr


def rows_of(path: str) -> list:
    if os.path.isdir(path):
        return [r for n in sorted(os.listdir(path)) for r in rows_of(os.path.join(path, n))]
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def spread(values: list, fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-" \
           f"{fmt.format(max(values))})"


def run_workers(workers: int, shards: str, base: str, rows: int, size: int, options: list,
                rounds: int, api: dict) -> dict:
    import ray

    from simindex.distributed.datasets import dedup

    ray.init(num_cpus=workers, include_dashboard=False, logging_level="ERROR")
    address = ray.get_runtime_context().gcs_address
    exe = [sys.executable, "-m", "simindex", "dedup", shards, "--id-field", "id", "-q",
           *options]
    got: dict = {"one": [], "ray": [], "driver_mb": [], "one_mb": [],
                 "stages": {s: [] for s in STAGES}, "bytes": {s: [] for s in STAGES},
                 "api": []}
    try:
        for r in range(rounds):
            one = os.path.join(base, f"one-{workers}-{r}.jsonl")
            secs, rss, _ = timed_process(exe + ["-o", one, "--removed", one + ".removed",
                                                "--jobs", str(workers)])
            got["one"].append(secs)
            got["one_mb"].append(rss)
            out = os.path.join(base, f"ray-{workers}-{r}")
            secs, rss, _ = timed_process(exe + ["-o", out, "--removed", out + ".removed",
                                                "--ray", address])
            got["ray"].append(secs)
            got["driver_mb"].append(rss)
            timings: dict = {}
            inproc = os.path.join(base, f"api-{workers}-{r}")
            t = time.perf_counter()
            dedup(shards, inproc, removed=inproc + ".removed", id_field="id",
                  timings=timings, **api)
            got["api"].append(time.perf_counter() - t)
            for s in STAGES:
                got["stages"][s].append(timings[s]["seconds"])
                got["bytes"][s].append(timings[s]["bytes"])
            for d in (out, inproc):
                if rows_of(d) != rows_of(one) or \
                        rows_of(d + ".removed") != rows_of(one + ".removed"):
                    sys.exit(f"dist_dedup_bench: {d} differs from the one-machine run")
            for d in (one, one + ".removed", out, out + ".removed", inproc,
                      inproc + ".removed"):
                shutil.rmtree(d) if os.path.isdir(d) else os.remove(d)
    finally:
        ray.shutdown()
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus")
    ap.add_argument("--megabytes", type=float, default=100)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--workers", default="1,2", help="Ray CPU counts to run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threshold", type=float, default=0.7,
                    help="--min-similarity (0: judge by --k 3 alone)")
    ap.add_argument("--scheme", help="the scheme both runs search with (default: the one "
                    "their calibration chooses, the same for both)")
    ap.add_argument("--dir", help="where to write the shards and outputs (default: temp)")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args(argv)
    from simindex import __version__
    from simindex.distributed.sandbox import loopback_only
    why = loopback_only()
    if why:
        sys.exit(f"dist_dedup_bench: {why}; it runs Ray where only loopback is reachable")
    base = a.dir or tempfile.mkdtemp(prefix="simindex-dist-dedup-")
    shards = os.path.join(base, "shards")
    rows, size = deal(a.corpus, shards, a.megabytes, a.shards)
    options = ["--min-similarity", str(a.threshold)] if a.threshold else ["--k", "3"]
    api = {"min_similarity": a.threshold} if a.threshold else {"k": 3}
    if a.scheme:
        options += ["--scheme", a.scheme]
        api["scheme"] = a.scheme
    mb = size / 1e6
    print(f"simindex {__version__}: {rows:,} rows, {mb:.1f} MB of text in {a.shards} JSON "
          f"lines files, `simindex dedup {' '.join(options)}`, {os.cpu_count()} cores; "
          f"median (range) of {a.rounds} rounds")
    results = {}
    for w in [int(x) for x in a.workers.split(",")]:
        got = run_workers(w, shards, base, rows, size, options, a.rounds, api)
        results[w] = got
        ratio = [r / o for r, o in zip(got["ray"], got["one"])]
        print(f"\n{w} worker(s)\n")
        print("| run | seconds | MB/s | peak RSS, MB |\n|---|---|---|---|")
        print(f"| `simindex dedup --jobs {w}` | {spread(got['one'])} | "
              f"{spread([mb / s for s in got['one']], '{:.1f}')} | "
              f"{spread(got['one_mb'], '{:.0f}')} |")
        print(f"| `simindex dedup --ray` (joins the running Ray) | {spread(got['ray'])} | "
              f"{spread([mb / s for s in got['ray']], '{:.1f}')} | "
              f"{spread(got['driver_mb'], '{:.0f}')} (driver) |")
        print(f"| `distributed.dedup` in a process on that Ray, stages waited for | "
              f"{spread(got['api'])} | {spread([mb / s for s in got['api']], '{:.1f}')} | |")
        print(f"\n`--ray` over one machine: {spread(ratio)}x\n")
        print("| stage | seconds | rows/s per worker | MB/s per worker | object bytes per "
              "row |\n|---|---|---|---|---|")
        for s in STAGES:
            secs = got["stages"][s]
            print(f"| {s} | {spread(secs, '{:.3f}')} | "
                  f"{statistics.median(rows / x / w for x in secs if x > 0):,.0f} | "
                  f"{statistics.median(mb / x / w for x in secs if x > 0):,.1f} | "
                  f"{statistics.median(got['bytes'][s]) / rows:,.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "bytes": size, "options": options,
                       "workers": results}, f, indent=1)
    if not a.dir:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
