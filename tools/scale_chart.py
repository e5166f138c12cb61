"""Charts of the scale benchmark: microseconds per row against the number of rows, one chart
per mode, simindex beside the peers of the same run, drawn from `tools/scale_bench.py
--json` output.

    python3 tools/scale_bench.py --rows 100000 300000 1000000 --json scale.json
    python3 tools/scale_chart.py scale.json [big.json ...] --out docs/img

Several results (say, the peers to 1M rows in rounds, and simindex alone at 3M and 10M in
one round) are drawn as one: their runs together, each size's point from the runs of it.
A point is the median over the run's rounds, its whisker the range; a flat line is a cost
per row that does not grow with the input. The SVG files (scale-<mode>.svg) are
deterministic (no date, fixed ids), so a chart changes in git only when its figures do.
Needs matplotlib (`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import charts  # noqa: E402


def curves(result: dict, mode: str) -> list:
    """[(system, [(rows, median us/row, min, max)])] of one mode's ok runs, simindex first,
    the others in the run's order; a system's sizes that did not finish are left out."""
    out = []
    systems = sorted(result["systems"], key=lambda s: s != "simindex")
    for system in systems:
        points = []
        for n in result["rows"]:
            us = [r["seconds"] / n * 1e6 for r in result["runs"]
                  if (r["mode"], r["rows"], r["system"], r["status"]) ==
                  (mode, n, system, "ok")]
            if us:
                points.append((n, statistics.median(us), min(us), max(us)))
        if points:
            out.append((system, points))
    return out


def merged(results: list) -> dict:
    """One result of several scale_bench.py results: every size, mode, system and run of
    them, and the range of their rounds."""
    out: dict = {"rows": [], "modes": [], "systems": [], "runs": [], "rounds": []}
    for r in results:
        for key in ("rows", "modes", "systems"):
            out[key] += [x for x in r[key] if x not in out[key]]
        out["runs"] += r["runs"]
        out["rounds"].append(r["rounds"])
    out["rows"].sort()
    out["rounds"] = (min(out["rounds"]), max(out["rounds"])) if results else (0, 0)
    return out


def rounds_of(rounds: tuple) -> str:
    lo, hi = rounds
    return f"{hi} round{'s' if hi != 1 else ''}" if lo == hi else f"{lo} to {hi} rounds"


def title_of(mode: str) -> str:
    return "k = 3 bits of 64, no similarity check" if mode == "k3" else \
        f"Jaccard >= {mode}"


def draw(lines: list, title: str, path: str, rounds: tuple) -> None:
    fig, ax = charts.figure(7, 4)
    for system, points in lines:
        xs = [p[0] for p in points]
        med = [p[1] for p in points]
        err = [[p[1] - p[2] for p in points], [p[3] - p[1] for p in points]]
        ours = system == "simindex"
        ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=system,
                    linewidth=2.5 if ours else 1.2, color="#1f6feb" if ours else None,
                    zorder=3 if ours else 2)
        ax.annotate(f"{med[-1]:,.0f}", (xs[-1], med[-1]), xytext=(5, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xticks([p[0] for p in lines[0][1]])
    ax.set_xticklabels([f"{p[0]:,}" for p in lines[0][1]])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("rows in the input (log scale)")
    ax.set_ylabel(f"microseconds per row (lower is better)\nmedian and range of "
                  f"{rounds_of(rounds)}")
    ax.set_title(title)
    ax.legend(fontsize=8, frameon=False)
    charts.save(fig, ax, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("result", nargs="+",
                    help="JSON files written by tools/scale_bench.py --json")
    ap.add_argument("--out", default="docs/img", help="folder of the SVG files")
    a = ap.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sys.exit("scale_chart.py needs matplotlib: pip install matplotlib")
    results = []
    for name in a.result:
        with open(name) as f:
            results.append(json.load(f))
    result = merged(results)
    os.makedirs(a.out, exist_ok=True)
    for mode in result["modes"]:
        lines = curves(result, mode)
        if not lines or lines[0][0] != "simindex":
            sys.exit(f"no finished simindex run in mode {mode}: is this scale_bench.py --json?")
        path = os.path.join(a.out, f"scale-{mode}.svg")
        draw(lines, title_of(mode), path, result["rounds"])
        print(f"{path}: " + "; ".join(
            f"{s} " + ", ".join(f"{p[1]:,.0f}" for p in pts) for s, pts in lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
