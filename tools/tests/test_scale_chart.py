"""tools/scale_chart.py: a chart per mode of the scale benchmark's cost per row, simindex
first and its peers beside it, medians of the rounds with their ranges, and the same SVG
for the same figures."""

import json
import os
import sys

import pytest

pytest.importorskip("matplotlib")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import scale_chart  # noqa: E402


def result(tmp_path):
    runs = []
    for mode, system, secs in [("0.7", "rensa", {1000: [2.0, 2.2], 3000: [6.5, 6.1]}),
                               ("0.7", "simindex", {1000: [1.0, 1.2], 3000: [3.3, 3.0]}),
                               ("k3", "simindex", {1000: [0.5, 0.5], 3000: [1.5, 1.8]})]:
        for n, values in secs.items():
            for rnd, s in enumerate(values):
                runs.append({"mode": mode, "rows": n, "system": system, "round": rnd,
                             "status": "ok", "seconds": s, "maxrss_kib": 1000,
                             "removed": 1, "setting": ""})
    runs.append({"mode": "0.7", "rows": 3000, "system": "gaoya", "round": 0,
                 "status": "timeout", "seconds": None})
    path = tmp_path / "scale.json"
    path.write_text(json.dumps({"rows": [1000, 3000], "modes": ["0.7", "k3"], "rounds": 2,
                                "systems": ["rensa", "gaoya", "simindex"], "runs": runs}))
    return path


def test_a_chart_per_mode_with_the_median_and_range_of_each_size(tmp_path, capsys):
    path = result(tmp_path)
    with open(path) as f:
        lines = scale_chart.curves(json.load(f), "0.7")
    assert [s for s, _ in lines] == ["simindex", "rensa"]        # gaoya never finished
    assert [(n, round(a), round(b), round(c)) for n, a, b, c in lines[0][1]] == \
        [(1000, 1100, 1000, 1200), (3000, 1050, 1000, 1100)]
    out = tmp_path / "img"
    assert scale_chart.main([str(path), "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["scale-0.7.svg", "scale-k3.svg"]
    first = (out / "scale-0.7.svg").read_text()
    assert "simindex" in first and "rensa" in first and "Jaccard" in first
    assert scale_chart.main([str(path), "--out", str(out)]) == 0
    assert (out / "scale-0.7.svg").read_text() == first              # deterministic


def test_results_of_several_runs_draw_as_one(tmp_path):
    """The peers' rounds to one size and simindex alone at a larger one: one curve per
    system over every size it ran."""
    small = result(tmp_path)
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"rows": [10000], "modes": ["0.7"], "rounds": 1,
                               "systems": ["simindex"],
                               "runs": [{"mode": "0.7", "rows": 10000, "system": "simindex",
                                         "round": 1, "status": "ok", "seconds": 9.0}]}))
    with open(small) as f, open(big) as g:
        both = scale_chart.merged([json.load(f), json.load(g)])
    assert both["rows"] == [1000, 3000, 10000] and both["rounds"] == (1, 2)
    lines = dict(scale_chart.curves(both, "0.7"))
    assert [p[0] for p in lines["simindex"]] == [1000, 3000, 10000]
    assert [p[0] for p in lines["rensa"]] == [1000, 3000]
    out = tmp_path / "img"
    assert scale_chart.main([str(small), str(big), "--out", str(out)]) == 0
    assert "1 to 2 rounds" in (out / "scale-0.7.svg").read_text()
