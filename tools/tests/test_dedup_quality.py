"""The quality benchmark's arithmetic (tools/dedup_quality.py) on hand-made corpora whose
shingle sets and Jaccard similarities are counted by hand."""

import os
import sys

import pytest

import simindex

pytest.importorskip("scipy")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dedup_quality as q  # noqa: E402

# "a b c d e": {abc, bcd, cde}; "a b c d f": {abc, bcd, cdf}; "A b, c d e g" lowercased:
# {abc, bcd, cde, deg}; "x y z": {xyz}
SMALL = ["a b c d e", "a b c d f", "a b c d e", "x y z", "A b, c d e g"]
# J(0,1) = 2/4, J(0,2) = 1, J(0,4) = 3/4, J(1,2) = 2/4, J(1,4) = 2/5, J(2,4) = 3/4, J(., 3) = 0
JACCARD = {(0, 1): 0.5, (0, 2): 1.0, (0, 4): 0.75, (1, 2): 0.5, (2, 4): 0.75}


def test_tokenizer_and_shingles():
    assert q.words("A b, c-D_e!") == ["a", "b", "c", "d_e"]
    assert q.shingle_set("a b c d e") == {"a b c", "b c d", "c d e"}
    assert q.shingle_set("a b c a b c") == {"a b c", "b c a", "c a b"}   # a set: once
    assert q.shingle_set("a b") == {"a b"}
    assert q.shingle_set("!!") == set()


def test_jaccard_from_the_sparse_product():
    sets = [q.shingle_set(t) for t in SMALL]
    X = q.shingle_matrix(sets)
    assert X.shape == (5, 6)                  # abc bcd cde cdf xyz deg
    assert X.sum(axis=1).ravel().tolist() == [[3, 3, 3, 1, 4]]
    for block in (1, 2, 512):                 # the block size changes nothing
        i, j, s = q.jaccard_pairs(X, floor=0.5, block=block)
        got = dict(zip(zip(i.tolist(), j.tolist()), s.tolist()))
        assert got == pytest.approx(JACCARD)
        assert all(a < b for a, b in got)
    i, j, s = q.jaccard_pairs(X, floor=0.3)
    assert dict(zip(zip(i.tolist(), j.tolist()), s.tolist()))[(1, 4)] == pytest.approx(0.4)


def test_threshold_filter():
    pairs = q.jaccard_pairs(q.shingle_matrix([q.shingle_set(t) for t in SMALL]), floor=0.5)
    assert q.truth_at(pairs, 0.5) == set(JACCARD)
    assert q.truth_at(pairs, 0.7) == {(0, 2), (0, 4), (2, 4)}
    assert q.truth_at(pairs, 0.75) == {(0, 2), (0, 4), (2, 4)}       # >= t
    assert q.truth_at(pairs, 0.9) == {(0, 2)}


def test_precision_recall_f1():
    s = q.scores({(0, 2), (0, 1), (3, 4)}, {(0, 2), (0, 4), (2, 4)})
    assert (s["tp"], s["fp"], s["fn"]) == (1, 2, 2)
    assert s["precision"] == pytest.approx(1 / 3)
    assert s["recall"] == pytest.approx(1 / 3)
    assert s["f1"] == pytest.approx(1 / 3)
    s = q.scores({(0, 2)}, {(0, 2), (0, 4)})
    assert (s["precision"], s["recall"], s["f1"]) == pytest.approx((1, 0.5, 2 / 3))
    assert q.scores(set(), set())["f1"] == 1.0
    assert q.scores(set(), {(0, 1)})["f1"] == 0.0
    assert q.scores({(0, 1)}, set())["precision"] == 0.0


def test_cluster_pairs():
    assert q.cluster_pairs({"0": 0, "1": 0, "2": 2, "3": 0, "4": 4}) == {(0, 1), (0, 3), (1, 3)}


def test_strip_roff():
    src = '.\\" a comment\n.TH LS 1\n.SH NAME\nls \\- list \\fBfiles\\fR\n.B "bold words"\n'
    assert q.strip_roff(src).split() == ["LS", "1", "NAME", "ls", "-", "list", "files",
                                         "bold", "words"]


def forty(prefix, swap_from=40, other="z"):
    """40 distinct words (38 shingles); from position `swap_from` on, another prefix."""
    return " ".join(f"{prefix if i < swap_from else other}{i}" for i in range(40))


# d0 = d1; d2 changes the last word: 37 shared of 39 shingles (0.949); d3/d5 share 28 of
# 48 (0.583); d6/d7 share 34 of 42 (0.810); d4 shares 18 of 58 (0.310) with d3 and d5
DOCS = [forty("w"), forty("w"), forty("w", 39), forty("v"), forty("v", 20, "u"),
        forty("v", 30, "t"), forty("y"), forty("y", 36, "s")]
CONFIGS = (("simindex-v1", 64, range(0, 8)), ("simindex-v1", 128, range(0, 16, 4)))
VERIFIED = (("simindex-v1", 64, range(0, 40, 8)),)


def test_end_to_end_on_a_tiny_corpus(tmp_path):
    docs = [(f"d{i}", t) for i, t in enumerate(DOCS)]
    r = q.evaluate(docs, (0.5, 0.7, 0.9), rounds=1, workdir=str(tmp_path), configs=CONFIGS,
                   verified=VERIFIED)
    assert r["documents"] == 8 and r["words"] == 320
    assert r["truth_pairs"] == {0.5: 5, 0.7: 4, 0.9: 3}
    ours = [row for row in r["rows"] if row["system"].startswith("simindex")
            and not row.get("verified")]
    assert len(ours) == 2 * 3
    truth = {0.5: {(0, 1), (0, 2), (1, 2), (3, 5), (6, 7)}, 0.7: {(0, 1), (0, 2), (1, 2), (6, 7)},
             0.9: {(0, 1), (0, 2), (1, 2)}}
    for row in ours:        # every k's F1: the pairs within k by brute force, scored by hand
        fps = [simindex.fingerprint(t, width=row["width"]) for t in DOCS]
        for k, f1 in row["f1_by_k"].items():
            pred = {(a, b) for a in range(8) for b in range(a + 1, 8)
                    if bin(fps[a] ^ fps[b]).count("1") <= k}
            tp = len(pred & truth[row["threshold"]])
            p = tp / len(pred) if pred else 1.0
            rec = tp / len(truth[row["threshold"]])
            assert f1 == pytest.approx(2 * p * rec / (p + rec) if tp else 0.0, abs=1e-4)
    for row in ours:
        assert row["f1"] == pytest.approx(max(row["f1_by_k"].values()), abs=1e-4)
        assert row["seconds"] > 0
    assert any("decisions" in name for name in r["seconds"])
    assert "| 0.9 | simindex simindex-v1 w64 |" in q.table(r)
    # with the exact Jaccard check: the pairs within k whose Jaccard reaches t, by hand
    checked = [row for row in r["rows"] if row.get("verified")]
    assert [row["threshold"] for row in checked] == [0.5, 0.7, 0.9]
    fps = [simindex.fingerprint(t) for t in DOCS]
    for row in checked:
        for k, f1 in row["f1_by_k"].items():
            pred = {(a, b) for a in range(8) for b in range(a + 1, 8)
                    if bin(fps[a] ^ fps[b]).count("1") <= k} & truth[row["threshold"]]
            rec = len(pred) / len(truth[row["threshold"]])
            assert f1 == pytest.approx(2 * rec / (1 + rec) if pred else 0.0, abs=1e-4)
        assert row["precision"] == 1.0 and row["seconds"] > 0
    assert any("min_similarity=0.5" in name for name in r["seconds"])


def test_minhash_on_a_tiny_corpus(tmp_path):
    pytest.importorskip("datasketch")
    docs = [(f"d{i}", t) for i, t in enumerate(DOCS)]
    r = q.evaluate(docs, (0.5, 0.9), rounds=1, workdir=str(tmp_path), configs=CONFIGS[:1])
    mh = {(row["system"], row["threshold"]): row for row in r["rows"]
          if row["system"].startswith("MinHashLSH")}
    assert set(mh) == {(f"MinHashLSH {v}", t) for v in ("raw", "verified") for t in (0.5, 0.9)}
    for (name, t), row in mh.items():
        assert row["tp"] + row["fn"] == r["truth_pairs"][t]
        assert row["seconds"] > 0
    # identical documents have identical MinHashes: always a candidate, estimate 1
    assert mh[("MinHashLSH verified", 0.9)]["tp"] >= 1
    assert any(line.startswith("- t=0.9: best simindex") for line in q.goals(r))
    for row in (x for x in r["rows"] if x["system"].endswith("(smallest k)")):
        best = max(x["f1"] for x in r["rows"] if x["threshold"] == row["threshold"]
                   and x["system"].startswith("MinHashLSH"))
        assert row["f1"] >= best and all(
            f < best for k, f in row["f1_by_k"].items() if k < row["k"])
