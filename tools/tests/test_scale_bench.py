"""tools/scale_bench.py on a tiny grid: a table for every mode with a line for every system
that runs it, and a corpus of rows of 80 to 400 words with the intended share of copies."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("rensa")
pytest.importorskip("datasketch")        # the peers' bands and rows are datasketch's choice
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N = 2000


def systems_of(table: str) -> list:
    """The system named on each line of a markdown table of the benchmark."""
    return [line.split("|")[2].strip() for line in table.splitlines()
            if line.startswith(f"| {N:,} |")]


def test_a_tiny_grid_and_its_corpus(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "scale_bench.py"),
                        "--rows", str(N), "--rounds", "1", "--modes", "0.7", "k3",
                        "--systems", "simindex", "rensa", "rensa-dedup", "rensa-split",
                        "--jobs", "1", "2", "--workdir", str(tmp_path),
                        "--json", str(tmp_path / "runs.json")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    tables = p.stdout.split("\n## ")[1:]
    assert [t.splitlines()[0] for t in tables] == ["Jaccard >= 0.7",
                                                   "k=3 bits of 64, no similarity check"]
    assert systems_of(tables[0]) == ["simindex", "simindex-j2", "rensa", "rensa-dedup",
                                     "rensa-split"]
    assert systems_of(tables[1]) == ["simindex", "simindex-j2"]   # no MinHash counterpart
    for table in tables:
        for line in table.splitlines()[4:4 + len(systems_of(table))]:
            cells = [c.strip() for c in line.split("|")[1:-1]]
            assert float(cells[4]) > 0 and cells[5] == "x1.00"      # us/row, growth

    with open(tmp_path / f"corpus-{N}-seed1.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(N)]
    assert all(80 <= len(r["text"].split()) <= 400 for r in rows)
    seen: set = set()
    exact = 0
    for r in rows:
        exact += r["text"] in seen
        seen.add(r["text"])
    with open(tmp_path / "runs.json") as f:
        result = json.load(f)
    made = result["corpora"][str(N)]
    assert made["exact_copies"] == exact and 0.01 <= exact / N <= 0.03
    assert 0.035 <= made["near_copies"] / N <= 0.065
    assert 1300 <= made["bytes"] / N <= 1600
    # identical rows have identical MinHashes: rensa removes every exact copy, and nothing
    # beyond the copies (a near copy shares about 85% of its shingles with its source)
    rensa = [r for r in result["runs"] if r["system"] == "rensa"]
    assert len(rensa) == 1 and rensa[0]["status"] == "ok" and rensa[0]["maxrss_kib"] > 0
    assert exact <= rensa[0]["removed"] <= exact + made["near_copies"]
    # on this corpus (lowercase words between single spaces) text.split() makes the
    # tokenizer's shingles: rensa's deduplicator decides alike fed either
    dedup = {r["system"]: r["removed"] for r in result["runs"]
             if r["system"] in ("rensa-dedup", "rensa-split")}
    assert dedup["rensa-dedup"] == dedup["rensa-split"] > 0
    # --jobs 2 reads the file in parts in worker processes: the same rows removed
    simindex = {(r["mode"], r["system"]): r["removed"] for r in result["runs"]
                if r["system"].startswith("simindex")}
    assert simindex[("0.7", "simindex")] == simindex[("0.7", "simindex-j2")]
    assert simindex[("k3", "simindex")] == simindex[("k3", "simindex-j2")]
