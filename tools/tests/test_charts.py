"""tools/charts.py: the benchmark page's charts from bench.py's JSON, simindex beside the
peers of the same runs, medians with their ranges, and the same SVG for the same figures."""

import json
import os
import sys

import pytest

pytest.importorskip("matplotlib")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import charts  # noqa: E402


def run(path, q, faiss_q, lat, faiss_lat, build, faiss_build):
    rows = [("simindex", "query_many, 1 thread", q), ("simindex", "query single call, median", lat),
            ("simindex", "build (add_many, durable)", build),
            ("faiss MultiHash 4x16 nflip0", "range_search batch, 1 thread", faiss_q),
            ("faiss MultiHash 4x16 nflip0", "single query, median", faiss_lat),
            ("faiss MultiHash 4x16 nflip0", "build (add, in RAM)", faiss_build),
            ("seomoz simhash-py 0.4.0", "-", float("nan"))]
    path.write_text(json.dumps([{"system": s, "figure": f, "value": v, "unit": "", "ok": True,
                                 "note": ""} for s, f, v in rows]))
    return str(path)


def test_each_chart_holds_the_median_and_range_of_simindex_and_its_peers(tmp_path, capsys):
    runs = [run(tmp_path / "a.json", 700_000, 150_000, 3.0, 15.0, 0.3, 0.5),
            run(tmp_path / "b.json", 600_000, 170_000, 3.4, 14.0, 0.4, 0.4),
            run(tmp_path / "c.json", 650_000, 160_000, 3.2, 16.0, 0.5, 0.6)]
    points = charts.series(charts.load(runs), "query_many, 1 thread",
                           "range_search batch, 1 thread")
    assert points == [("simindex", 650_000, 600_000, 700_000),
                      ("faiss MultiHash 4x16 nflip0", 160_000, 150_000, 170_000)]
    out = tmp_path / "img"
    assert charts.main([*runs, "--out", str(out)]) == 0
    names = sorted(os.listdir(out))
    assert names == ["build-time.svg", "query-latency.svg", "query-throughput.svg"]
    first = (out / "query-throughput.svg").read_text()
    assert "simindex" in first and "faiss MultiHash 4x16 nflip0" in first
    assert "median and range of 3 runs" in first
    charts.main([*runs, "--out", str(out)])
    assert (out / "query-throughput.svg").read_text() == first     # deterministic
    assert "query-throughput.svg: simindex 650,000.00" in capsys.readouterr().out


def test_files_without_simindex_figures_are_refused(tmp_path):
    other = tmp_path / "x.json"
    other.write_text(json.dumps([{"system": "faiss", "figure": "-", "value": 1.0}]))
    with pytest.raises(SystemExit, match="are these bench.py --json files"):
        charts.main([str(other), "--out", str(tmp_path / "img")])
