"""The text calls in the user's terms: `query_text` and `add_unique_text` with a similarity
threshold (or in an index calibrated for one) answer exactly what a brute force over the
stored texts answers: within the radius, and similar enough by the stored sketch."""

import json
import random
import subprocess
import sys

import msgpack
import pytest

import simindex
from simindex.engine.codec import Packed
from simindex import radius
from simindex.engine.codec import stored_sketch
from simindex.values import words_array
from simindex.signatures.similarity import jaccard, shingle_set, sketch, sketch_jaccard
from textpairs import pair_at, pairs_within, tokens
from trials import ENV


def short_pairs(rng, n, sims=(0.95, 0.85, 0.75, 0.7, 0.65, 0.5, 0.2)):
    """n pairs of texts of 60 words (58 shingles: a sketch holds the whole set, so the
    check is exact) at similarities around 0.7."""
    return [pair_at(rng, rng.choice(sims), n=60)[:2] for _ in range(n)]


def oracle(idx, stored, text, k, t):
    """The ids of `stored` ({id: text}) within k bits of `text` whose Jaccard is >= t."""
    fp, mine = idx.fingerprint(text), shingle_set(text, idx.scheme)
    return {i for i, other in stored.items()
            if simindex.hamming(fp, idx.fingerprint(other)) <= k and
            jaccard(mine, shingle_set(other, idx.scheme)) >= t}


def test_add_unique_text_in_a_calibrated_index_equals_the_brute_force(tmp_path):
    """Texts added in turn: each is refused exactly when a stored text lies within the
    calibration's k and has Jaccard >= its threshold, and the refusal names those texts."""
    rng = random.Random(5)
    texts = [t for pair in short_pairs(rng, 60) for t in pair]
    rng.shuffle(texts)
    cal = simindex.calibrate(texts[:40], 0.7)
    stored = {}
    refused_similar = 0
    with simindex.Index(tmp_path / "i", calibration=cal) as idx:
        assert (idx.scheme, idx.width, idx.k) == (cal.scheme, cal.width, cal.k)
        assert idx.text_check() == simindex.TextCheck(cal.k, 0.7, "jaccard")
        for n, text in enumerate(texts):
            want = oracle(idx, stored, text, cal.k, 0.7)
            found = idx.add_unique_text(f"t{n}", text, meta={"n": n})
            assert {m.id for m in found} == want, n
            assert [m.meta for m in found] == [{"n": int(m.id[1:])} for m in found]
            if not found:
                stored[f"t{n}"] = text
            else:
                refused_similar += 1
        assert len(idx) == len(stored)
        assert refused_similar >= 20     # the pairs at 0.75 and above, nearly all
        # a query with a higher threshold searches at the same radius and checks more
        probe = texts[0] + " " + " ".join(tokens(rng, 3))
        assert {m.id for m in idx.query_text(probe, min_similarity=0.9)} == \
            oracle(idx, stored, probe, cal.k, 0.9)


def test_query_text_with_a_threshold_on_an_uncalibrated_minhash_index(tmp_path):
    """No calibration: the radius is the model's k at the default recall; records stored
    without a sketch (by add) count on their distance alone."""
    rng = random.Random(8)
    pairs = short_pairs(rng, 40)
    need = radius.model_k(128, 0.6, radius.DEFAULT_RECALL)
    with simindex.Index(tmp_path / "i", scheme="minhash-v1", width=128, k=need + 2) as idx:
        stored = {}
        for n, (a, _b) in enumerate(pairs):
            idx.add_text(f"a{n}", a)
            stored[f"a{n}"] = a
        assert idx.text_check(0.6) == simindex.TextCheck(need, 0.6, "jaccard")
        for a, b in pairs:
            got = {m.id for m in idx.query_text(b, min_similarity=0.6)}
            assert got == oracle(idx, stored, b, need, 0.6)
        # without a threshold the calls judge by bits, as before
        assert {m.id for m in idx.query_text(pairs[0][1])} == \
            {i for i, a in stored.items() if simindex.hamming(
                idx.fingerprint(a), idx.fingerprint(pairs[0][1])) <= need + 2}
        # a record stored with add() (no sketch) passes on its distance
        far = " ".join(tokens(rng, 60))
        idx.add("plain", idx.fingerprint(far))
        assert "plain" in {m.id for m in idx.query_text(far, min_similarity=0.99)}


def test_long_texts_are_judged_by_their_sketches(tmp_path):
    """Texts of 300 shingles keep a sketch of 128 values: pairs well above the threshold
    are refused, pairs well below it and unrelated texts go in."""
    rng = random.Random(11)
    cal = simindex.calibrate([], 0.7)
    with simindex.Index(tmp_path / "i", calibration=cal) as idx:
        high = [pair_at(rng, 0.85) for _ in range(60)]
        low = [pair_at(rng, 0.5) for _ in range(60)]
        for n, (a, _b, _j) in enumerate(high + low):
            assert idx.add_unique_text(f"a{n}", a) == []
        refused = [bool(idx.add_unique_text(f"b{n}", b)) for n, (_a, b, _j) in enumerate(high)]
        admitted = [not idx.add_unique_text(f"c{n}", b) for n, (_a, b, _j) in enumerate(low)]
        assert sum(refused) >= 57 and sum(admitted) >= 57
        for n in range(40):
            assert idx.add_unique_text(f"u{n}", " ".join(tokens(rng, 300))) == []


def test_meta_is_handed_back_without_the_sketch_everywhere(tmp_path):
    rng = random.Random(2)
    a, b, _ = pair_at(rng, 0.9, n=80)
    with simindex.Index(tmp_path / "i", calibration=simindex.calibrate([], 0.8)) as idx:
        assert idx.add_text("x", a, meta={"url": "u"}) == idx.fingerprint(a)
        idx.add_text("y", " ".join(tokens(rng, 80)))
        assert idx.get("x").meta == {"url": "u"} and idx.get("y").meta is None
        (m,) = idx.query_text(b)
        assert (m.id, m.meta) == ("x", {"url": "u"})
        assert idx.query(idx.fingerprint(a))[0].meta == {"url": "u"}
        assert [r.meta for r in idx.query_many([idx.fingerprint(a)])[0]] == [{"url": "u"}]
        fp, stored = idx.text_record(a, [1, 2], "z")
        idx.add_many([("z", fp, stored)])
        assert idx.get("z").meta == [1, 2]
        # a meta value that is itself a msgpack extension: kept, unless it is the sketch's
        other = msgpack.ExtType(5, b"raw")
        idx.add("e", 1, other)
        assert idx.get("e").meta == other
        with pytest.raises(simindex.InputError, match="extension of type 83"):
            idx.add("f", 1, msgpack.ExtType(83, b"raw"))

        class Forged(msgpack.ExtType):           # a subclass of the sketch's code too
            pass
        forged = Forged(83, b"\x00\x02hi" + bytes(8) + b"\xa2hi")
        for bad in (forged, Packed(b"\xc7\x03\x53zz"), Packed(b"\xc1")):
            with pytest.raises(simindex.InputError):
                idx.add("f", 1, bad)
            with pytest.raises(simindex.InputError):
                idx.add_many([("f", 1, bad)])
        assert "f" not in idx and idx.verify() == []
    # kept across a reopen, and through the write buffer (sync=False)
    with simindex.Index(tmp_path / "i", sync=False) as idx:
        idx.add_text("w", b, meta="buffered")
        assert {m.id for m in idx.query_text(a)} == {"x", "z", "w"}
        assert idx.get("w").meta == "buffered"


def test_the_stored_sketch_is_the_texts(tmp_path):
    rng = random.Random(3)
    a, b, j = pair_at(rng, 0.75, n=400)
    with simindex.Index(tmp_path / "i", calibration=simindex.calibrate([], 0.7)) as idx:
        idx.add_text("a", a)
        q = words_array([idx.fingerprint(a)], idx.width)
        hits = idx._open_store().query(q, 0, matches=False)[0]
        sk, size = stored_sketch(hits[0][4])
        assert sk == sketch(shingle_set(a, "minhash-v1")) and size == 398
        assert abs(sketch_jaccard(sk, sketch(shingle_set(b, "minhash-v1"))) - j) < 0.15


def test_a_radius_must_be_known_for_the_threshold(tmp_path):
    with simindex.Index(tmp_path / "s", k=3) as idx:          # simhash, no calibration
        assert idx.text_check() is None
        idx.add_text("a", "a b c d")
        assert idx.get("a").meta is None                      # no sketch kept ...
        for k in (None, 2):                                    # ... so no threshold
            with pytest.raises(simindex.ParameterError, match="keeps no text sketches"):
                idx.query_text("a b c d", k=k, min_similarity=0.8)
            with pytest.raises(simindex.ParameterError, match="keeps no text sketches"):
                idx.add_unique_text("b", "a b c d", k=k, min_similarity=0.8)
        assert "b" not in idx
    # calibrated for containment: a lower threshold has no radius unless k is given
    texts = [t for pair in [pair_at(random.Random(9), 0.8)[:2] for _ in range(10)]
             for t in pair]
    cal = simindex.calibrate(texts, 0.7, measure="containment")
    with simindex.Index(tmp_path / "n", calibration=cal) as idx:
        assert idx.text_check().measure == "containment"
        with pytest.raises(simindex.ParameterError, match="no radius is known for "
                                                          "containment >= 0.5"):
            idx.query_text("a b c d", min_similarity=0.5)
        assert idx.text_check(0.5, k=2) == simindex.TextCheck(2, 0.5, "containment")
    with simindex.Index(tmp_path / "m", scheme="minhash-v1", width=64, k=6) as idx:
        with pytest.raises(simindex.ParameterError, match=r"needs k=\d+ at 64 bits; this "
                                                          r"index's tables reach k=6"):
            idx.add_unique_text("a", "a b c d", min_similarity=0.5)
        assert idx.text_check(0.95).k <= 6
    cal = simindex.calibrate([], 0.7, bands=False)         # minhash-v1's search by distance
    with simindex.Index(tmp_path / "c", calibration=cal) as idx:
        assert idx.text_check(0.9) == simindex.TextCheck(cal.k, 0.9, "jaccard")
        with pytest.raises(simindex.ParameterError, match="needs k="):
            idx.text_check(0.5)
        for bad in (0, 1.5, "0.7", True):
            with pytest.raises(simindex.ParameterError, match="min_similarity must be"):
                idx.query_text("a b c d", min_similarity=bad)
    with pytest.raises(simindex.ParameterError, match="calibration"):
        simindex.Index(tmp_path / "c", calibration=simindex.calibrate([], 0.8))


def test_a_meta_value_shaped_like_anything_stays_the_users(tmp_path):
    """Only the sketch extension simindex writes is read as a sketch: a user's list that
    looks like dedup's old record, or another extension, is meta and nothing else."""
    rng = random.Random(6)
    a = " ".join(tokens(rng, 40))
    with simindex.Index(tmp_path / "i", scheme="minhash-v1", width=64, k=20) as idx:
        idx.add("u", idx.fingerprint(a), [b"ABCDEFGH", 7, b"\0\0\0\1", 3])
        idx.add("v", idx.fingerprint(a), [b"ABCDEFGH", 7, b"\0\1"])
        got = idx.query_text(a, min_similarity=0.8)          # no sketch: on distance
        assert {m.id for m in got} == {"u", "v"}
        assert idx.get("u").meta == [b"ABCDEFGH", 7, b"\0\0\0\1", 3]
        assert idx.add_unique_text("w", a, min_similarity=0.8) != []
        with pytest.raises(simindex.InputError, match="with the text's sketch; the limit"):
            idx.add_text("big", a, meta="x" * (16 << 20) + "")


def test_damaged_sketch_bytes_are_corrupt_records(tmp_path):
    from simindex.engine.codec import pack_meta, unpack
    good = pack_meta({"a": 1}, None, (b"abcd" * 3, 9))
    assert unpack(good) == {"a": 1}
    for bad in (good[:-1], good[:3] + b"\x00\x07" + good[5:], good[:1] + b"\x05" + good[2:],
                b"\xc7\x01\x53\x00"):
        with pytest.raises(simindex.CorruptError, match="cannot be decoded: ."):
            unpack(bad)
        with pytest.raises(simindex.CorruptError):
            stored_sketch(bad)


def test_buffered_records_are_checked_without_folding_the_buffer(tmp_path):
    rng = random.Random(12)
    a, b, _ = pair_at(rng, 0.9, n=60)
    far_a, far_b, _ = pair_at(rng, 0.5, n=60)
    path = tmp_path / "i"
    simindex.Index(path, scheme="minhash-v1", width=64, k=16).close()
    with simindex.Index(path, sync=False) as idx:
        idx.add_text("a", a, meta=1)
        idx.add_text("f", far_a)
        idx.flush()                                   # stored; then two more buffered
        idx.add_text("a2", a, meta=2)
        idx.add_text("f2", far_a)
        k = idx.text_check(0.8).k
        near = idx.query_text(b, min_similarity=0.8)
        assert [(m.id, m.meta) for m in near] == [("a", 1), ("a2", 2)]
        assert idx._open_store().buffered() == 2     # still buffered: nothing was folded
        if simindex.hamming(idx.fingerprint(far_a), idx.fingerprint(far_b)) <= k:
            assert idx.query_text(far_b, min_similarity=0.8) == []
    with simindex.Index(path, readonly=True) as idx:           # read-only, 64 bits
        assert {m.id for m in idx.query_text(b, min_similarity=0.8)} == {"a", "a2"}


ADDER = r"""
import json, sys, simindex
texts = json.load(open(sys.argv[2]))
side = sys.argv[3]
with simindex.Index(sys.argv[1]) as idx:
    out = [not idx.add_unique_text(f"{side}{i}", t) for i, t in enumerate(texts)]
print(json.dumps(out))
"""


def test_two_processes_adding_similar_texts_admit_exactly_one_of_each_pair(tmp_path):
    """The check runs inside add_unique's atomic section: of two similar texts added at
    once by two processes, exactly one goes in."""
    rng = random.Random(21)
    cal = simindex.calibrate([], 0.7)
    path = str(tmp_path / "i")
    simindex.Index(path, calibration=cal).close()
    # similar pairs (one of each goes in), then pairs within k but below the threshold
    # (both go in)
    pairs = pairs_within(rng, cal, 150, 0.9) + pairs_within(rng, cal, 30, 0.4)
    files = []
    for side, texts in (("a", [a for a, _ in pairs]), ("b", [b for _, b in pairs])):
        f = tmp_path / f"{side}.json"
        f.write_text(json.dumps(texts))
        files.append((side, f))
    procs = [subprocess.Popen([sys.executable, "-c", ADDER, path, str(f), side], env=ENV,
                              stdout=subprocess.PIPE, text=True) for side, f in files]
    outs = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(x != y for x, y in list(zip(*outs))[:150])
    assert all(x and y for x, y in list(zip(*outs))[150:])
    with simindex.Index(path) as idx:
        assert len(idx) == 150 + 2 * 30
        assert idx.verify() == []


@pytest.mark.parametrize("t", [0.5, 0.7, 0.9])
def test_model_calibration_on_a_planted_corpus_finds_the_pairs(tmp_path, t):
    """A calibration without a sample (a crawl's start): pairs just above t are refused
    at about the model's recall, with whole-set sketches so the check itself is exact."""
    rng = random.Random(int(t * 100))
    cal = simindex.calibrate([], t)
    pairs = [pair_at(rng, t + 0.02, n=100) for _ in range(150)]
    with simindex.Index(tmp_path / "i", calibration=cal) as idx:
        for n, (a, _b, _j) in enumerate(pairs):
            assert idx.add_unique_text(f"a{n}", a) == []
        refused = sum(bool(idx.add_unique_text(f"b{n}", b)) for n, (_a, b, _j) in
                      enumerate(pairs))
    assert refused >= 0.95 * len(pairs)


def test_dedup_judges_rows_against_texts_the_online_calls_stored(tmp_path):
    """An index a crawler filled with add_unique_text, then `dedup --index` over new rows:
    each row is checked against the stored texts' sketches (evidence "sketch"), so a row
    near in bits but below the threshold stays."""
    rng = random.Random(17)
    path = str(tmp_path / "i")
    high = [pair_at(rng, 0.85, n=60) for _ in range(20)]
    low = [pair_at(rng, 0.5, n=60) for _ in range(20)]
    # a radius of bits (a band index's search is tested in test_bands.py)
    with simindex.Index(path, calibration=simindex.calibrate([], 0.7, bands=False)) as idx:
        for n, (a, _b, _j) in enumerate(high + low):
            idx.add_unique_text(f"a{n}", a)
        k = idx.k
        near_low = [n for n, (a, b, _j) in enumerate(low)
                    if simindex.hamming(idx.fingerprint(a), idx.fingerprint(b)) <= k]
    assert near_low                      # rows the bits alone would have removed
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": f"b{n}", "text": b}) + "\n"
                            for n, (_a, b, _j) in enumerate(high + low)))
    got = list(simindex.decisions(str(rows), id_field="id", index=path, min_similarity=0.7))
    removed = {d.id: d for d in got if not d.kept}
    assert {d.id for d in got if d.kept} >= {f"b{20 + n}" for n in near_low}
    assert len(removed) >= 19 and set(removed) <= {f"b{n}" for n in range(20)}
    for d in removed.values():
        assert d.match == "a" + d.id[1:] and d.evidence == "sketch" and d.similarity >= 0.7


def test_cli_build_keeps_sketches_and_query_judges_texts(tmp_path):
    """`simindex build` of text rows into a calibrated index keeps each text's sketch, and
    `simindex query` of text rows answers what query_text answers."""
    rng = random.Random(31)
    cal = simindex.calibrate([], 0.7)
    path = str(tmp_path / "i")
    simindex.Index(path, calibration=cal).close()
    pairs = pairs_within(rng, cal, 5, 0.85) + pairs_within(rng, cal, 5, 0.4)
    (tmp_path / "a.jsonl").write_text("".join(
        json.dumps({"id": f"a{n}", "text": a}) + "\n" for n, (a, _b) in enumerate(pairs)))
    (tmp_path / "b.jsonl").write_text("".join(
        json.dumps({"id": f"b{n}", "text": b}) + "\n" for n, (_a, b) in enumerate(pairs)))
    r = subprocess.run([sys.executable, "-m", "simindex", "build", path,
                        str(tmp_path / "a.jsonl")], env=ENV, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "simindex", "query", path,
                        str(tmp_path / "b.jsonl")], env=ENV, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = {x["id"]: [m["id"] for m in x["matches"]] for x in map(json.loads,
                                                                   r.stdout.splitlines())}
    assert got == {f"b{n}": ([f"a{n}"] if n < 5 else []) for n in range(10)}
    with simindex.Index(path, readonly=True) as idx:
        for n, (a, b) in enumerate(pairs):
            assert [m.id for m in idx.query_text(b)] == got[f"b{n}"]


def test_a_text_answer_gives_each_match_the_similarity_its_sketch_estimates(tmp_path):
    """query_text and add_unique_text answer TextMatches: the Match (equal to it, unpacked
    as it) with the stored text's similarity, the sketch estimate the threshold judged by;
    None for a record stored without a sketch. Without a threshold too, where the index
    keeps sketches."""
    rng = random.Random(9)
    a, b, _ = pair_at(rng, 0.85, n=120)
    cal = simindex.calibrate([], 0.7)
    for made in (dict(calibration=cal), dict(scheme="minhash-v1", width=128, k=30)):
        path = tmp_path / ("cal" if "calibration" in made else "plain")
        with simindex.Index(path, **made) as idx:
            idx.add_text("a", a, meta={"url": "u"})
            idx.add("bits", idx.fingerprint(b))            # no text: no sketch
            want = round(sketch_jaccard(sketch(shingle_set(a, "minhash-v1")),
                                        sketch(shingle_set(b, "minhash-v1"))), 4)
            for found in (idx.query_text(b), idx.add_unique_text("b", b)):
                got = {m.id: m for m in found}
                assert set(got) == {"a", "bits"}
                assert isinstance(got["a"], simindex.TextMatch)
                assert (got["a"].similarity, got["bits"].similarity) == (want, None)
                assert 0.7 <= want < 1
                id_, fp, dist, meta = got["a"]
                assert (id_, meta) == ("a", {"url": "u"}) and got["a"] == \
                    simindex.Match(id_, fp, dist, meta)
            assert idx.query_text(b, min_similarity=min(want + 0.05, 1.0)) in (
                [], [m for m in idx.query_text(b) if m.id == "bits"])
    with simindex.Index(tmp_path / "simhash", k=3) as idx:           # keeps no sketches
        idx.add_text("a", a)
        assert all(type(m) is simindex.Match for m in idx.query_text(a))
