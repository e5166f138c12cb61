"""A radius from the data: the calibration's arithmetic on hand-made numbers and sets, its
recall on planted pairs, and what `simindex dedup --min-similarity` and `simindex
calibrate` do with it (real files, real CLI processes)."""

import itertools
import json
import math
import random
import subprocess
import sys
import types
from fractions import Fraction

import numpy as np
import pytest

import simindex
from simindex import radius as cal
from simindex.bands import band_recall, rows_for
from simindex.scheme_names import lsh_name
from simindex.datasets import run as dedup_module
from textpairs import pair_at, tokens
from trials import ENV


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "simindex", *map(str, args)], env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ---------------------------------------------------------------- the arithmetic
def exact_cdf(k, n, p):
    p = Fraction(p)
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))


@pytest.mark.parametrize("k,n,p", [(0, 10, 0.5), (3, 10, 0.25), (8, 64, 0.05),
                                   (17, 64, 0.15), (52, 256, 0.15), (80, 256, 0.25)])
def test_binomial_cdf_is_the_exact_sum(k, n, p):
    assert cal.binomial_cdf(k, n, p) == pytest.approx(float(exact_cdf(k, n, p)), rel=1e-9)


@pytest.mark.parametrize("width,t,recall", list(itertools.product(
    (64, 128, 256), (0.5, 0.7, 0.9), (0.9, 0.99, 0.999))))
def test_the_model_k_is_the_least_that_reaches_the_recall(width, t, recall):
    k = cal.model_k(width, t, recall)
    p = (1 - t) / 2                               # a bit of a pair at exactly J = t differs
    assert float(exact_cdf(k, width, p)) >= recall
    assert k == 0 or float(exact_cdf(k - 1, width, p)) < recall


def test_known_radii():
    # at 64 bits a pair at J = 0.9 differs in Binomial(64, 0.05) bits: 99% within 8
    assert cal.model_k(64, 0.9, 0.99) == 8
    assert cal.model_k(128, 0.7, 0.99) == 29
    assert cal.model_k(256, 0.5, 0.99) == 80


def test_the_lower_bound_is_clopper_pearsons():
    assert cal.recall_lower_bound(0, 10) == 0.0 and cal.recall_lower_bound(3, 0) == 0.0
    assert cal.recall_lower_bound(300, 300) == pytest.approx(0.05 ** (1 / 300))
    for found, pairs in [(5, 10), (9, 10), (2500, 2527), (98, 100)]:
        low = cal.recall_lower_bound(found, pairs)
        # at the bound, seeing `found` or more is exactly 5% likely (the float sum, checked
        # against exact fractions above, where fractions would grow too large)
        tail = 1 - (exact_cdf(found - 1, pairs, low) if pairs <= 100 else
                    cal.binomial_cdf(found - 1, pairs, low))
        assert float(tail) == pytest.approx(0.05, abs=1e-6), (found, pairs)
        assert low < found / pairs


def brute_pairs(sets, t, measure):
    out = set()
    for i, j in itertools.combinations(range(len(sets)), 2):
        a, b = set(sets[i].tolist()), set(sets[j].tolist())
        inter = len(a & b)
        base = len(a | b) if measure == "jaccard" else len(b)      # b: the later set
        if base and inter / base >= t:
            out.add((i, j))
    return out


@pytest.mark.parametrize("measure", ["jaccard", "containment"])
def test_sample_pairs_equal_brute_force(measure):
    rng = np.random.default_rng(5)
    pool = rng.integers(0, 1 << 63, 400, dtype=np.uint64)
    common = pool[:40]                         # shared by many sets: boilerplate
    sets = []
    for n in range(60):
        size = int(rng.integers(1, 120))
        own = rng.choice(pool, size)
        if n % 3 == 0:
            own = np.concatenate([own, common])
        if n % 7 == 1 and sets:                # a near copy of an earlier set
            own = np.concatenate([sets[-1][: len(sets[-1]) * 9 // 10], own[:3]])
        sets.append(np.unique(own))
    sets.append(np.empty(0, np.uint64))
    for t in (0.3, 0.5, 0.7, 0.9, 1.0):
        i, j = cal.sample_pairs(sets, t, measure)
        assert set(zip(i.tolist(), j.tolist())) == brute_pairs(sets, t, measure), t


def test_pair_distances_are_popcounts():
    rng = random.Random(1)
    for words in (1, 2, 4):
        codes = np.array([[rng.getrandbits(64) for _ in range(words)] for _ in range(40)],
                         dtype=np.uint64)
        d = cal.pair_distances(codes)
        for i, j in [(0, 1), (5, 39), (7, 7), (39, 0)]:
            want = sum(bin(int(a) ^ int(b)).count("1") for a, b in zip(codes[i], codes[j]))
            assert d[i, j] == want


def planted_texts(rng, pairs, jaccard):
    """The texts of `pairs` pairs at (just above) `jaccard`, each pair's texts in turn."""
    return [text for _ in range(pairs) for text in pair_at(rng, jaccard)[:2]]


def test_a_calibration_reports_its_table_and_choice():
    """The search by distance at each width (the band search aside: see test_bands.py)."""
    c = cal.calibrate(planted_texts(random.Random(3), 30, 0.8), 0.7, bands=False)
    assert c.scheme == "minhash-v1" and c.min_similarity == 0.7 and c.measure == "jaccard"
    assert [row.width for row in c.table] == [64, 128, 256]
    for row in c.table:
        assert row.k == cal.model_k(row.width, 0.7, 0.99)
        assert row.pairs == 30 and row.found == 30                  # every planted pair
        assert row.recall_low == pytest.approx(0.05 ** (1 / 30))
        assert row.seconds > 0 and row.candidates >= 0
    assert c.chosen.width == c.width and c.k == c.chosen.k
    assert c.expected_recall == pytest.approx(cal.model_recall(c.width, c.k, 0.7))
    assert "minhash-v1" in c.describe() and f"k={c.k}" in c.describe()
    stored = c.stored()
    assert stored == {"scheme": "minhash-v1", "width": c.width, "k": c.k,
                      "min_similarity": 0.7, "measure": "jaccard", "recall": 0.99,
                      "expected_recall": c.expected_recall}


@pytest.mark.parametrize("pairs", [1, 30, 59])
def test_a_sample_of_few_pairs_says_it_cannot_bound_the_recall(pairs):
    """All of 59 pairs found bound the recall at 0.95; fewer bound it lower for want of
    pairs, not of recall, and the summary says the model's recall stands."""
    c = cal.calibrate(planted_texts(random.Random(4), pairs, 0.8), 0.7, bands=False)
    assert c.chosen.pairs == c.chosen.found == pairs
    assert c.chosen.recall_low == pytest.approx(0.05 ** (1 / pairs))
    assert ("too few for the sample to bound the recall" in c.describe()) == (pairs < 59)
    assert (c.chosen.recall_low >= 0.95) == (pairs >= cal.BOUND_PAIRS)


def test_a_simhash_scheme_is_calibrated_on_the_sample_alone():
    c = cal.calibrate(planted_texts(random.Random(4), 40, 0.75), 0.7, scheme="simindex-v1",
                      recall=0.9, widths=[64])
    [row] = c.table
    assert row.model_recall is None and row.pairs == 40
    assert row.found >= 36                      # the least k that finds 90% of them
    assert c.expected_recall == row.found / row.pairs


def test_bad_parameters_are_named():
    with pytest.raises(simindex.ParameterError, match="min_similarity"):
        cal.calibrate(["a b c"], 0)
    with pytest.raises(simindex.ParameterError, match="recall"):
        cal.calibrate(["a b c"], 0.5, recall=1)
    with pytest.raises(simindex.ParameterError, match="measure"):
        cal.calibrate(["a b c"], 0.5, measure="cosine")
    with pytest.raises(simindex.ParameterError, match="scheme"):
        cal.calibrate(["a b c"], 0.5, scheme="nope")
    with pytest.raises(simindex.InputError, match="needs a sample"):
        cal.calibrate([], 0.5, scheme="simindex-v1")
    with pytest.raises(simindex.InputError, match="needs a sample"):
        cal.calibrate([], 0.5, measure="containment")


def test_without_a_sample_the_model_alone_decides():
    """No texts: minhash-v1's k is the model's at each width, and the width is the one of
    least modelled time for the rows it is made for."""
    for t in (0.5, 0.7, 0.9):
        c = cal.calibrate([], t, recall=0.99, bands=False)
        assert c.sample_rows == 0 and c.expected_rows == cal.MODEL_ROWS
        for choice in c.table:
            assert choice.k == cal.model_k(choice.width, t, 0.99)
            assert choice.model_recall >= 0.99 > cal.model_recall(choice.width, choice.k - 1, t)
            assert choice.pairs == 0 and choice.recall_low is None
        assert c.chosen == min(c.table, key=lambda x: (x.seconds, x.width))
        assert c.expected_recall == c.chosen.model_recall
    # unrelated texts (bits differ with probability 1/2) within k make 64 bits costly at 0.5
    assert cal.calibrate([], 0.5, bands=False).width > 64


# ---------------------------------------------------------------- recall on planted pairs
def test_dedup_finds_planted_pairs_at_the_threshold_and_keeps_those_below(tmp_path):
    """200 pairs at Jaccard just above 0.7 (the hardest the threshold asks for), 100 pairs
    at 0.6 and 100 unrelated texts, with the defaults: the check removes nothing below the
    threshold, and the calibrated radius finds the pairs above it at the model's rate."""
    rng = random.Random(11)
    rows, above, below = [], [], []
    for n in range(200):
        a, b, j = pair_at(rng, 0.7)
        assert 0.7 <= j < 0.71
        rows += [{"id": f"a{n}", "text": a}, {"id": f"b{n}", "text": b}]
        above.append(f"b{n}")
    for n in range(100):
        a, b, j = pair_at(rng, 0.6)
        rows += [{"id": f"c{n}", "text": a}, {"id": f"d{n}", "text": b}]
        below.append(f"d{n}")
    rows += [{"id": f"u{n}", "text": " ".join(tokens(rng, 300))} for n in range(100)]
    write_jsonl(tmp_path / "in.jsonl", rows)
    summary = dedup_module.Summary()
    removed = {d.id for d in simindex.decisions(str(tmp_path / "in.jsonl"), id_field="id",
                                                 min_similarity=0.7, summary=summary)
               if not d.kept}
    r = summary.radius
    assert r["scheme"] == "minhash-v1" and r["min_similarity"] == 0.7
    assert r["k"] == cal.model_k(r["width"], 0.7, 0.99)
    assert removed <= set(above)                 # nothing below the threshold, no chain
    # each pair is found with probability >= 0.99: 200 pairs miss 2 on average
    assert len(removed) >= 195, len(removed)


# ---------------------------------------------------------------- the command line
def corpus(tmp_path, rng, name="in.jsonl", pairs=40, others=40):
    rows = []
    for n in range(pairs):
        a, b, _ = pair_at(rng, 0.85)
        rows += [{"id": f"{name}-a{n}", "text": a}, {"id": f"{name}-b{n}", "text": b}]
    rows += [{"id": f"{name}-u{n}", "text": " ".join(tokens(rng, 300))} for n in range(others)]
    write_jsonl(tmp_path / name, rows)
    return rows


def test_cli_dedup_chooses_and_reports_its_radius_and_the_index_keeps_it(tmp_path):
    rng = random.Random(12)
    corpus(tmp_path, rng)
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "out.jsonl", "--id-field", "id",
            "--min-similarity", "0.8", "--removed", tmp_path / "rm.jsonl",
            "--index", tmp_path / "idx")
    assert r.returncode == 0, r.stderr
    assert "minhash-v1" in r.stderr and "jaccard >= 0.8" in r.stderr
    assert "expected recall" in r.stderr
    rm = read_jsonl(tmp_path / "rm.jsonl")
    assert len(rm) == 40 and all(x["id"].split("-")[1].startswith("b") for x in rm)
    with simindex.Index(tmp_path / "idx", readonly=True) as idx:
        stored = idx.calibration
    assert stored["min_similarity"] == 0.8 and stored["scheme"] == "minhash-v1"
    for x in rm:
        assert x["evidence"] == "exact" and x["similarity"] >= 0.8
        assert (x["scheme"], x["width"], x["k"]) == \
            ("minhash-v1", stored["width"], stored["k"])
        assert x["expected_recall"] == pytest.approx(stored["expected_recall"])
    # a later run judges alike: the stored threshold, without repeating it
    corpus(tmp_path, rng, "later.jsonl", pairs=5, others=5)
    rows = read_jsonl(tmp_path / "in.jsonl")
    with open(tmp_path / "later.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"id": "again", "text": rows[0]["text"] + " tail"}) + "\n")
    r = run("dedup", tmp_path / "later.jsonl", "-o", tmp_path / "out2.jsonl", "--id-field",
            "id", "--index", tmp_path / "idx", "--removed", tmp_path / "rm2.jsonl")
    assert r.returncode == 0, r.stderr
    rm2 = {x["id"]: x for x in read_jsonl(tmp_path / "rm2.jsonl")}
    assert rm2["again"]["match"] == rows[0]["id"] and rm2["again"]["evidence"] == "sketch"
    assert len(rm2) == 6
    # another threshold would judge otherwise: refused, naming the stored one
    r = run("dedup", tmp_path / "later.jsonl", "-o", tmp_path / "out3.jsonl", "--id-field",
            "id", "--index", tmp_path / "idx", "--min-similarity", "0.5")
    assert r.returncode == 1 and "calibrated for jaccard >= 0.8" in r.stderr
    assert not (tmp_path / "out3.jsonl").exists()


def test_cli_calibrate_prints_the_trade(tmp_path):
    corpus(tmp_path, random.Random(13))
    r = run("calibrate", tmp_path / "in.jsonl", "--min-similarity", "0.8")
    assert r.returncode == 0, r.stderr
    lines = [x.split("\t") for x in r.stdout.strip().splitlines()]
    assert lines[0][:4] == ["scheme", "width", "k", "model_recall"]
    table = {int(x[1]): x for x in lines[1:] if x[0] == "minhash-v1"}
    assert sorted(table) == [64, 128, 256]
    for w, x in table.items():
        assert int(x[2]) == cal.model_k(w, 0.8, 0.99)
        assert (int(x[4]), int(x[5])) == (40, 40)
    bands = [x for x in lines[1:] if x[0] != "minhash-v1"]     # the band search, weighed
    assert [x[:4] for x in bands] == [       # one per band count, its most rows for 0.99
        [lsh_name(r, b), str(32 * b), str(b - 1), f"{band_recall(r, 0.8, b):.4f}"]
        for b in (8, 16, 24, 32) for r in [rows_for(0.8, 0.99, b)]]
    assert sum(x[-1].startswith("<- chosen") for x in lines[1:]) == 1
    assert "expected recall" in r.stderr
    r = run("calibrate", tmp_path / "in.jsonl", "--min-similarity", "0.8", "--width", "128",
            "--recall", "0.9")
    assert r.returncode == 0 and len(r.stdout.strip().splitlines()) == 2
    assert r.stdout.splitlines()[1].split("\t")[2] == str(cal.model_k(128, 0.8, 0.9))
    assert run("calibrate", tmp_path / "in.jsonl").returncode == 2   # the threshold is needed


def test_a_time_budget_caps_k_and_says_so(tmp_path, monkeypatch):
    """With a budget the recall's k would exceed, each width gets the largest k whose
    estimated time fits, the calibration says the recall falls short, and an index made
    by dedup with that budget keeps the capped k."""
    # the sample's pass is timed; a clock that ticks once per reading makes every
    # calibration below estimate the same times, so their choices can be compared
    ticks = iter(range(10**9))
    monkeypatch.setattr(cal, "time", types.SimpleNamespace(
        perf_counter=lambda: next(ticks) * 1e-3))
    texts = planted_texts(random.Random(23), 30, 0.8)
    free = cal.calibrate(texts, 0.6, expected_rows=10**6, bands=False)
    budget = min(c.seconds for c in free.table) / 4
    capped = cal.calibrate(texts, 0.6, expected_rows=10**6, time_budget=budget, bands=False)
    for a, b in zip(free.table, capped.table):
        assert b.capped and b.k < a.k and b.seconds <= budget
        assert cal.calibrate(texts, 0.6, expected_rows=10**6, widths=[a.width],
                             time_budget=budget, bands=False).k == b.k
        if b.k + 1 < a.k:                             # the largest k that fits
            assert cal.calibrate(texts, 0.6, expected_rows=10**6, widths=[a.width],
                                 time_budget=b.seconds * 0.999, bands=False).k <= b.k
    assert capped.expected_recall == max(c.model_recall for c in capped.table)
    assert capped.expected_recall < 0.99
    assert "capped by the time budget" in capped.describe()
    roomy = cal.calibrate(texts, 0.6, expected_rows=10**6, bands=False,   # (float rounding)
                          time_budget=free.chosen.seconds * (1 + 1e-9))
    assert roomy.k == free.k and not roomy.chosen.capped
    with pytest.raises(simindex.ParameterError, match="time_budget"):
        cal.calibrate(texts, 0.6, time_budget=0)
    # through dedup: the run takes the capped calibration, and its summary says so
    corpus(tmp_path, random.Random(24))
    r = run("calibrate", tmp_path / "in.jsonl", "--min-similarity", "0.6",
            "--time-budget", "1e-9", "--scheme", "minhash-v1")
    assert r.returncode == 0, r.stderr
    assert all(x.split("\t")[10] == "yes" for x in r.stdout.splitlines()[1:])
    assert "capped by the time budget of 1e-09 s" in r.stderr
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "o.jsonl", "--min-similarity",
            "0.6", "--time-budget", "1e-9", "--index", tmp_path / "idx", "--scheme",
            "minhash-v1")
    assert r.returncode == 0 and "capped by the time budget" in r.stderr, r.stderr
    with simindex.Index(str(tmp_path / "idx"), readonly=True) as idx:
        assert idx.k == 0 and idx.calibration["expected_recall"] < 0.99


def test_recall_and_containment_need_a_threshold(tmp_path):
    corpus(tmp_path, random.Random(14), pairs=2, others=2)
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "o.jsonl", "--recall", "0.9")
    assert r.returncode == 2 and "--min-similarity" in r.stderr


# ---------------------------------------------------------------- the check decides
def test_checks_across_batches_of_one_run_are_exact(tmp_path, monkeypatch):
    monkeypatch.setattr(dedup_module, "BATCH", 5)      # most pairs cross a batch boundary
    rng = random.Random(15)
    rows = []
    for n in range(20):
        a, b, _ = pair_at(rng, 0.9)
        rows += [{"id": f"a{n}", "text": a}] + [{"id": f"x{n}{m}", "text": " ".join(
            tokens(rng, 50))} for m in range(3)] + [{"id": f"b{n}", "text": b}]
    write_jsonl(tmp_path / "in.jsonl", rows)
    got = [d for d in simindex.decisions(str(tmp_path / "in.jsonl"), id_field="id",
                                         min_similarity=0.85) if not d.kept]
    assert sorted(d.id for d in got) == sorted(f"b{n}" for n in range(20))
    assert all(d.evidence == "exact" and d.match == "a" + d.id[1:] for d in got)


def test_a_rerun_after_a_stop_writes_what_one_run_writes(tmp_path, monkeypatch):
    """A run stopped midway (its kept rows committed) and run again decides every row as an
    uninterrupted run does, the rows kept before the stop still checked exactly."""
    monkeypatch.setattr(dedup_module, "BATCH", 4)
    rng = random.Random(16)
    rows = []
    for n in range(12):
        a, b, _ = pair_at(rng, 0.75)
        c, d, _ = pair_at(rng, 0.65)
        rows += [{"id": f"a{n}", "text": a}, {"id": f"c{n}", "text": c},
                 {"id": f"b{n}", "text": b}, {"id": f"d{n}", "text": d}]
    write_jsonl(tmp_path / "in.jsonl", rows)
    opts = dict(id_field="id", min_similarity=0.7, k=40, width=128)
    whole = [(d.id, d.kept, d.match, d.evidence) for d in simindex.decisions(
        str(tmp_path / "in.jsonl"), index=str(tmp_path / "one"), **opts)]
    it = simindex.decisions(str(tmp_path / "in.jsonl"), index=str(tmp_path / "two"), **opts)
    for _ in range(23):
        next(it)
    it.close()                                 # the first batches are in the index
    again = [(d.id, d.kept, d.match, d.evidence) for d in simindex.decisions(
        str(tmp_path / "in.jsonl"), index=str(tmp_path / "two"), **opts)]
    assert again == whole
    assert sorted(x[0] for x in whole if not x[1]) == sorted(f"b{n}" for n in range(12))


def test_containment_removes_a_short_text_inside_a_long_one(tmp_path):
    rng = random.Random(17)
    long = tokens(rng, 600)
    short = " ".join(long[100:200])
    write_jsonl(tmp_path / "in.jsonl", [{"id": "long", "text": " ".join(long)},
                                        {"id": "short", "text": short}])
    path = str(tmp_path / "in.jsonl")
    # the Jaccard similarity is about 1/6: no radius finds it, no check passes it
    assert all(d.kept for d in simindex.decisions(path, id_field="id", min_similarity=0.8,
                                                  k=127, width=128))
    got = list(simindex.decisions(path, id_field="id", min_similarity=0.8, k=127,
                                  width=128, containment=True))
    assert [d.kept for d in got] == [True, False]
    assert got[1].match == "long" and got[1].similarity == 1.0 and got[1].evidence == "exact"
    # the other way round, the long text is not inside the short one
    write_jsonl(tmp_path / "rev.jsonl", [{"id": "short", "text": short},
                                         {"id": "long", "text": " ".join(long)}])
    assert all(d.kept for d in simindex.decisions(str(tmp_path / "rev.jsonl"), id_field="id",
                                                  min_similarity=0.8, k=127, width=128,
                                                  containment=True))


def test_components_remove_only_what_passes_against_the_kept_row(tmp_path):
    """A ~ B and B ~ C pass the check, A ~ C does not: the component is A, B, C, and A is
    kept; B goes, C stays (a chain alone removes nothing). Without the check all but A go."""
    rng = random.Random(18)
    toks = tokens(rng, 400)
    a = " ".join(toks[:300])
    b = " ".join(toks[50:350])
    c = " ".join(toks[100:400])
    write_jsonl(tmp_path / "in.jsonl", [{"id": x, "text": t} for x, t in
                                        zip("ABC", (a, b, c))])
    path = str(tmp_path / "in.jsonl")
    got = {d.id: d for d in simindex.decisions(path, id_field="id", mode="components",
                                               min_similarity=0.6, k=127, width=128)}
    assert got["A"].kept and not got["B"].kept and got["C"].kept
    assert got["B"].match == "A" and got["B"].similarity >= 0.6
    plain = {d.id: d for d in simindex.decisions(path, id_field="id", mode="components",
                                                 k=127, width=128)}
    assert plain["A"].kept and not plain["B"].kept and not plain["C"].kept


@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.gz"])
def test_a_second_thread_reads_ahead_without_changing_a_decision(tmp_path, monkeypatch, name):
    """With jobs > 1 the next batch is read and fingerprinted while one is judged (by
    worker processes in parts of a plain JSON lines file, one line each here; in threads
    for a gzipped one): the decisions are those of one thread, a bad row stops the run in
    its place, and a caller that stops early leaves no thread behind."""
    import gzip
    import threading
    from simindex.datasets import parts
    monkeypatch.setattr(dedup_module, "BATCH", 6)
    monkeypatch.setattr(parts, "PART_BYTES", 1)
    rng = random.Random(19)
    rows = []
    for n in range(15):
        a, b, _ = pair_at(rng, 0.8)
        rows += [{"id": f"a{n}", "text": a}, {"id": f"b{n}", "text": b}]
    path = str(tmp_path / name)

    def write(bad: bool) -> None:
        data = "".join(json.dumps(r) + "\n" for r in rows) + ("not json\n" if bad else "")
        with (gzip.open if name.endswith(".gz") else open)(path, "wt") as f:
            f.write(data)
    write(False)
    one = [(d.id, d.kept, d.match) for d in simindex.decisions(path, id_field="id",
                                                              min_similarity=0.7, jobs=1)]
    two = [(d.id, d.kept, d.match) for d in simindex.decisions(path, id_field="id",
                                                              min_similarity=0.7, jobs=2)]
    assert one == two and sum(not x[1] for x in one) == 15
    write(True)
    seen = []
    with pytest.raises(simindex.BadLine, match=rf"{name}:31"):
        for d in simindex.decisions(path, id_field="id", min_similarity=0.7, jobs=2):
            seen.append(d.id)
    assert len(seen) == 30                      # every row before the bad one was judged
    it = simindex.decisions(path, id_field="id", min_similarity=0.7, jobs=2)
    next(it)
    it.close()
    assert not [t for t in threading.enumerate() if t.name == "simindex-dedup-reader"]


def test_a_damaged_calibration_is_refused_on_open(tmp_path):
    """The manifest's calibration is checked field by field: one that names another k, a
    threshold out of range or a missing field makes the index refuse to open."""
    import msgpack
    from simindex.engine import manifest
    rng = random.Random(20)
    corpus(tmp_path, rng, pairs=3, others=3)
    assert run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "o.jsonl", "--index",
               tmp_path / "idx", "--min-similarity", "0.8").returncode == 0
    path = tmp_path / "idx" / manifest.NAME
    good = msgpack.unpackb(path.read_bytes(), raw=False)
    for change in ({"k": good["calibration"]["k"] + 1}, {"min_similarity": 1.5},
                   {"measure": "cosine"}, {"recall": "high"}):
        bad = dict(good, calibration=dict(good["calibration"], **change))
        path.write_bytes(msgpack.packb(bad))
        with pytest.raises(simindex.CorruptError, match="calibration"):
            simindex.Index(tmp_path / "idx", readonly=True)
    cal = dict(good["calibration"])
    del cal["recall"]
    path.write_bytes(msgpack.packb(dict(good, calibration=cal)))
    with pytest.raises(simindex.CorruptError, match="calibration"):
        simindex.Index(tmp_path / "idx", readonly=True)
    path.write_bytes(msgpack.packb(good))
    with simindex.Index(tmp_path / "idx", readonly=True) as idx:
        assert idx.calibration == good["calibration"]


@pytest.mark.parametrize("how", [["--jobs", "1"], ["--jobs", "2"], ["--mode", "components"],
                                 ["--jobs", "1", "--min-similarity", "0.9"]])
def test_kept_json_lines_are_written_back_byte_for_byte(tmp_path, how):
    """A kept JSON line goes to the output as it was read: key order, spacing, number
    forms and escapes included (one reader or parts, either rule, with a check)."""
    lines = ['{"text": "alpha beta gamma delta", "id": 1, "x": 1.50}',
             '{ "id" : 2 , "text" : "alpha beta gamma delta" }',
             '{"id": 3, "text": "caf\\u00e9 au lait tout de suite", "n": 1e3}']
    (tmp_path / "in.jsonl").write_text("\r\n".join(lines) + "\n", encoding="utf-8")
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "out.jsonl", "--id-field", "id",
            *how)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out.jsonl").read_text(encoding="utf-8") == \
        lines[0] + "\n" + lines[2] + "\n"


def test_a_calibration_that_is_not_the_index_s_is_refused_before_anything_is_made(tmp_path):
    c = cal.calibrate([pair_at(random.Random(21), 0.9)[0]] * 3, 0.8)
    with pytest.raises(simindex.ParameterError, match="not a calibration of scheme"):
        simindex.Index(tmp_path / "i", k=c.k, width=c.width, calibration=c.stored())
    assert not (tmp_path / "i" / "manifest.msgpack").exists()
    with simindex.Index(tmp_path / "i", k=c.k, width=c.width, scheme="minhash-v1",
                        calibration=c.stored()) as idx:
        assert idx.calibration == c.stored()


def test_fingerprints_from_a_column_keep_the_default_scheme(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "text": "x y z w", "fp": "1"}])
    list(simindex.decisions(str(tmp_path / "in.jsonl"), id_field="id", fingerprint_field="fp",
                            min_similarity=0.8, index=str(tmp_path / "idx")))
    with simindex.Index(tmp_path / "idx", readonly=True) as idx:
        assert idx.scheme == "simindex-v1" and idx.k == 3 and idx.calibration is None


def test_codes_from_shingle_sets_equal_the_text_pass(tmp_path):
    """A calibrated run codes its sampled rows from their sets and the rest from the text:
    both give the same code, and the sketch of the sorted set is similarity's."""
    from simindex.signatures import _text
    from simindex.signatures.similarity import sketch
    rng = random.Random(22)
    texts = [" ".join(tokens(rng, n)) for n in (1, 2, 3, 40, 300, 3000)]
    texts += ["Straße STRASSE ﬁne e\u0301 漢字 😀 " * 20, "short"]
    raws = _text.signatures(texts, 3, shingles=True)[2]
    sets = [_text.sorted_set(r) for r in raws]
    for words in (1, 2, 4):
        from_text = _text.signatures(texts, 3, mh_words=words)[0]
        assert (_text.minhash_codes(sets, words) == from_text).all()
        assert (_text.minhash_codes(raws, words) == from_text).all()
    for x in sets:
        assert _text.sketch_of_set(x) == sketch(x)
    made: list = []                          # the pass's own sketches, text by text
    distinct = _text.signatures(texts, 3, shingles=True, distinct=True, sketches=made)[2]
    assert [x.tolist() for x in distinct] == [x.tolist() for x in sets]
    assert made == [sketch(x) for x in sets]


def test_a_text_of_one_shingle_repeated_is_the_code_of_that_shingle():
    # the later rounds read each distinct shingle once, however often the text repeats it
    text = "ha " * 300_000
    for width in (64, 256):
        assert simindex.fingerprint(text, scheme="minhash-v1", width=width) == \
            simindex.fingerprint("ha ha ha", scheme="minhash-v1", width=width)


@pytest.mark.parametrize("name", ["in.jsonl.gz", "in.jsonl"])
def test_bad_rows_read_ahead_are_reported_by_the_caller_s_thread_in_order(tmp_path,
                                                                          monkeypatch, name):
    """Before the decisions of their batch (of 3 rows, read by a thread, from the gzipped
    file), or of their part (a line each, read by a worker process, from the plain one)."""
    import gzip
    import threading
    from simindex.datasets import parts
    monkeypatch.setattr(dedup_module, "BATCH", 3)
    monkeypatch.setattr(parts, "PART_BYTES", 1)
    rows = [json.dumps({"id": n, "text": f"alpha beta {n} gamma"}) for n in range(9)]
    rows[4] = "not json"
    path = tmp_path / name
    with (gzip.open if name.endswith(".gz") else open)(path, "wt") as f:
        f.write("\n".join(rows) + "\n")
    seen = []

    def on_error(e):
        seen.append(("bad", e.where, threading.current_thread() is threading.main_thread()))
    summary = dedup_module.Summary()
    for d in simindex.decisions(str(path), id_field="id", jobs=2,
                                on_error=on_error, summary=summary):
        seen.append(("row", d.id, threading.current_thread() is threading.main_thread()))
    bad = [("bad", f"{path}:5")]
    assert [x[:2] for x in seen] == [("row", 0), ("row", 1), ("row", 2)] + (
        bad + [("row", 3)] if name.endswith(".gz") else [("row", 3)] + bad) + [
        ("row", 5), ("row", 6), ("row", 7), ("row", 8)]
    assert all(x[2] for x in seen)
    assert (summary.rows, summary.skipped, summary.kept) == (9, 1, 8)


def test_a_calibrated_run_stopped_and_run_again_with_two_jobs_writes_what_one_run_writes(
        tmp_path, monkeypatch):
    monkeypatch.setattr(dedup_module, "BATCH", 5)
    rng = random.Random(23)
    rows = []
    for n in range(15):
        a, b, _ = pair_at(rng, 0.8)
        rows += [{"id": f"a{n}", "text": a}, {"id": f"u{n}", "text": " ".join(tokens(rng, 60))},
                 {"id": f"b{n}", "text": b}]
    write_jsonl(tmp_path / "in.jsonl", rows)
    path = str(tmp_path / "in.jsonl")
    opts = dict(id_field="id", min_similarity=0.75, jobs=2)
    whole = [(d.id, d.kept, d.match, d.evidence) for d in simindex.decisions(
        path, index=str(tmp_path / "one"), **opts)]
    it = simindex.decisions(path, index=str(tmp_path / "two"), **opts)
    for _ in range(22):
        next(it)
    it.close()
    again = [(d.id, d.kept, d.match, d.evidence) for d in simindex.decisions(
        path, index=str(tmp_path / "two"), id_field="id", jobs=2)]   # the stored threshold
    assert again == whole
    with simindex.Index(tmp_path / "one", readonly=True) as a, \
            simindex.Index(tmp_path / "two", readonly=True) as b:
        assert a.calibration == b.calibration and a.calibration["min_similarity"] == 0.75


def test_the_rows_a_run_expects_are_counted_in_small_files_and_estimated_in_large(
        tmp_path, monkeypatch):
    """A JSON lines file's lines are counted up to COUNT_BYTES and the rest estimated by its
    size, so a large input is not read through before its run starts."""
    from simindex.datasets import settings
    rng = random.Random(3)
    path = tmp_path / "rows.jsonl"
    with open(path, "w") as f:
        for i in range(5000):
            f.write(json.dumps({"id": i, "text": "w " * rng.randrange(20, 60)}) + "\n")
    size = path.stat().st_size
    assert settings.estimate_rows([str(path)], 10, 1000) == 5000       # under the bytes
    monkeypatch.setattr(settings, "COUNT_BYTES", size // 10)
    read = []
    real_open = open

    class Counted:
        """The file, with the bytes read from it counted."""
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def __getattr__(self, name):
            return getattr(self.f, name)

        def read(self, n=-1):
            chunk = self.f.read(n)
            read.append(len(chunk))
            return chunk

    monkeypatch.setattr("builtins.open", lambda name, mode="r", *a, **k: Counted(
        real_open(name, mode, *a, **k)) if str(name) == str(path) else
        real_open(name, mode, *a, **k))
    got = settings.estimate_rows([str(path)], 10, 1000)
    assert abs(got - 5000) <= 5000 * 0.1
    assert 0 < sum(read) < size                                        # not read through
    # the bytes to count are for the input as a whole: of many files, the first counted
    shards = []
    for i in range(20):
        shard = tmp_path / f"shard-{i}.jsonl"
        shard.write_bytes(path.read_bytes())
        shards.append(str(shard))
    monkeypatch.setattr(settings, "COUNT_BYTES", size + size // 2)
    got = settings.estimate_rows(shards, 10, 5000)    # (a sample of longer rows than most)
    assert abs(got - 20 * 5000) <= 20 * 5000 * 0.05
