"""Interleaved A/B of two simindex source trees with tools/bench.py: before and after a change.

    python3 tools/ab.py BEFORE_TREE AFTER_TREE [--rounds 5] [-- bench.py arguments]

Each tree is a checkout whose compiled modules are built in place
(`python3 setup.py build_ext --inplace`); `git worktree add ../before <commit>` makes one.
Rounds alternate the trees (A B, B A, A B...) so that a drift of this shared machine's speed
hits both alike; each run is a fresh process of this checkout's tools/bench.py with the tree
first on sys.path. Prints, per figure, each tree's median and range over the rounds and the
ratio of the medians (after / before).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIGURES = [   # (figure name in bench.py's rows, short label, higher is better)
    ("build (add_many, durable)", "bulk build, durable (s)", False),
    ("query_many, 1 thread", "query_many (q/s)", True),
    ("query single call, median", "query, one call, median (us)", False),
    ("get() single call, median", "get(), one call, median (us)", False),
    ("add_many batches of 1000, sync", "batches of 1,000, sync (rec/s)", True),
    ("query_many, 2 threads", "query_many, 2 threads (q/s)", True),
    ("pairs() over the stored index", "pairs() (s)", False),
    ("single add, sync=False", "single add, sync=False (rec/s)", True),
    ("find_all in memory", "find_all (s)", False),
]


def fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 1000 else f"{v:.2f}" if v >= 1 else f"{v:.3f}"


def run(tree: str, bench_args: list) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    where = subprocess.run([sys.executable, "-c", "import simindex; print(simindex.__file__)"],
                           env=env, capture_output=True, text=True, check=True, cwd=tree)
    if not where.stdout.startswith(os.path.abspath(tree)):
        raise SystemExit(f"{tree}: simindex imports from {where.stdout.strip()}; build it in "
                         f"place first (python3 setup.py build_ext --inplace)")
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run([sys.executable, os.path.join(HERE, "bench.py"), "--json", out.name,
                        *bench_args], env=env, cwd=tree, check=True,
                       stdout=subprocess.DEVNULL)
        rows = json.load(open(out.name))
    return {r["figure"]: r["value"] for r in rows if r["system"] == "simindex"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=5)
    argv = sys.argv[1:] if argv is None else list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])
    bench_args = argv[cut + 1:]                  # after "--": bench.py's own arguments
    got = {"before": [], "after": []}
    for r in range(a.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for which in order:
            got[which].append(run(getattr(a, which), bench_args))
            print(f"# round {r + 1}/{a.rounds} {which} done", file=sys.stderr, flush=True)
    print(f"{'figure':<34} {'before: median (range)':>30} {'after: median (range)':>30} "
          f"{'after/before':>12}")
    for name, label, _higher in FIGURES:
        cols = []
        for which in ("before", "after"):
            vals = [g[name] for g in got[which] if name in g]
            cols.append((statistics.median(vals), min(vals), max(vals)) if vals else None)
        if None in cols:
            continue
        text = [f"{fmt(m)} ({fmt(lo)}-{fmt(hi)})" for m, lo, hi in cols]
        print(f"{label:<34} {text[0]:>30} {text[1]:>30} {cols[1][0] / cols[0][0]:>11.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
