"""Charts of the benchmark page, drawn from `tools/bench.py --json` output.

    python3 tools/bench.py --n 1000000 --json run1.json      # once per run, several runs
    python3 tools/charts.py run*.json --out docs/img

Each chart sets simindex beside the peers that bench.py ran in the same process on the same
data: the bar is the median over the runs, the whisker the range. Three charts: batched
query throughput, the latency of one query, and the time of a bulk build. The SVG files are
deterministic (no date, fixed ids), so a chart changes in git only when its figures do.
Needs matplotlib (`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys

# (file name, title, unit, simindex's figure, the peers' figure, higher is better)
CHARTS = [
    ("query-throughput.svg", "Batched queries, 1 thread", "queries per second",
     "query_many, 1 thread", "range_search batch, 1 thread", True),
    ("query-latency.svg", "One query, median latency", "microseconds",
     "query single call, median", "single query, median", False),
    ("build-time.svg", "Bulk build", "seconds",
     "build (add_many, durable)", "build (add, in RAM)", False),
]


def load(paths: list) -> list:
    """Per run, {(system, figure): value} of its finite figures."""
    runs = []
    for path in paths:
        with open(path) as f:
            rows = json.load(f)
        runs.append({(r["system"], r["figure"]): r["value"] for r in rows
                     if isinstance(r["value"], (int, float)) and math.isfinite(r["value"])})
    return runs


def series(runs: list, ours: str, theirs: str) -> list:
    """[(label, median, low, high)] of simindex and each peer that has the figure in every
    run, simindex first and the peers in their order of appearance."""
    systems: list = []
    for run in runs:
        for system, figure in run:
            if (figure == ours and system == "simindex") or \
                    (figure == theirs and system != "simindex"):
                if (system, figure) not in systems:
                    systems.append((system, figure))
    out = []
    for system, figure in systems:
        values = [run[(system, figure)] for run in runs if (system, figure) in run]
        if len(values) == len(runs):
            out.append((system, statistics.median(values), min(values), max(values)))
    return out


def figure(width: float, height: float) -> tuple:
    """(fig, ax) of a chart drawn off screen, with stable SVG ids (a diff shows figures)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    matplotlib.rcParams["svg.hashsalt"] = "simindex"
    return plt.subplots(figsize=(width, height))


def save(fig, ax, path: str) -> None:
    """Write a chart as an SVG file without a date, and let it go."""
    import matplotlib.pyplot as plt
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)


def draw(points: list, title: str, unit: str, higher: bool, path: str, n_runs: int) -> None:
    labels = [p[0] for p in points]
    med = [p[1] for p in points]
    err = [[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]]
    colors = ["#1f6feb" if lab == "simindex" else "#8b949e" for lab in labels]
    fig, ax = figure(7, 0.5 + 0.45 * len(points))
    ax.barh(labels, med, xerr=err, color=colors, capsize=3)
    ax.invert_yaxis()
    ax.set_xlabel(f"{unit} ({'higher' if higher else 'lower'} is better); "
                  f"median and range of {n_runs} run{'s' if n_runs != 1 else ''}")
    ax.set_title(title)
    for y, v in enumerate(med):
        ax.annotate(f"{v:,.0f}" if v >= 100 else f"{v:.2f}", (v, y), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)
    save(fig, ax, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="JSON files written by tools/bench.py --json")
    ap.add_argument("--out", default="docs/img", help="folder of the SVG files")
    a = ap.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("charts.py needs matplotlib: pip install matplotlib")
    runs = load(a.runs)
    os.makedirs(a.out, exist_ok=True)
    for name, title, unit, ours, theirs, higher in CHARTS:
        points = series(runs, ours, theirs)
        if not any(p[0] == "simindex" for p in points):
            sys.exit(f"no run holds simindex's {ours!r}: are these bench.py --json files?")
        path = os.path.join(a.out, name)
        draw(points, title, unit, higher, path, len(runs))
        print(f"{path}: {', '.join(f'{p[0]} {p[1]:,.2f}' for p in points)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
