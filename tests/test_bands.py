"""The band search of minhash-lsh-v1: band keys by the scheme's documented rule, an index
that finds exactly the records sharing a band (applied to the shards or not), the
calibration that weighs it, and dedup and the text calls judging as a brute-force oracle
over bands and exact similarities judges."""

import json
import random
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import simindex
from simindex import _testing, radius as cal
from simindex.bands import BAND_RADIUS, band_recall, rows_for, shares_band
from simindex.datasets import run as dedup_module
from simindex.engine.codec import encode_id, pack_meta
from simindex.scheme_names import lsh_shape
from simindex.signatures.similarity import jaccard, shingle_set, sketch, sketch_jaccard
from test_minhash_scheme import GOLDEN, M64, ref_bins, ref_shingles, splitmix
from textpairs import tokens
from trials import ENV

def ref_bands(text, rows, bands=8):
    """The documented rule of minhash-lsh-v1's scheme of `bands` bands of `rows`, in Python."""
    bins = 1 << (bands * rows - 1).bit_length()      # the least power of two >= bands x rows
    best = ref_bins(sorted(ref_shingles(text)), bins)
    out = 0
    for t in range(bands):
        h = (t + 1) * GOLDEN & M64
        for j in range(rows):
            attempt, value = best.get(t * rows + j, (-1, M64))
            h = splitmix((splitmix(h ^ value) + (attempt & M64)) & M64)
        out |= (h >> 32) << (32 * (bands - 1 - t))
    return out


GOLDEN_VECTORS = {   # frozen: a change here is a new scheme
    ("The quick brown fox jumps over the lazy dog.", 1):
        0xacabaa811014dbe369660c0a967348cc778fb2a9124de3b5d1ffc59e37f8fa96,
    ("The quick brown fox jumps over the lazy dog.", 3):
        0x4c7163934970d47a468723a4dfbc770d6e80ba041328313898f6ae056443ae9a,
}
GOLDEN_VECTORS_16 = {   # frozen: 16 bands, 512 bits
    ("The quick brown fox jumps over the lazy dog.", 1):
        0xacabaa81984811e88b4591613f511188683598b60f540263f6f474e17cf14e92
        << 256 | 0x2fc4ce68dbe6cd7707576d1937263874057b8223c2c634af40c285dda3a757db,
    ("The quick brown fox jumps over the lazy dog.", 2):
        0x51e357c5c49fd8e599e0a1f97e4fbacd9de2015fb6a79930343d5b6a0fbd9f78
        << 256 | 0x6a5915f2f637e278275ddd7e1c082e88ca1e7faa3a0b1de6dc741f267f0f7b0d,
}


def run(*args):
    return subprocess.run([sys.executable, "-m", "simindex", *map(str, args)],
                          capture_output=True, text=True, env=ENV, timeout=300)


def scheme(rows, bands=8):
    return f"minhash-lsh-v1-r{rows}" if bands == 8 else f"minhash-lsh-v1-b{bands}-r{rows}"


# ---------------------------------------------------------------- the scheme
def test_band_keys_follow_the_documented_rule():
    texts = ["The quick brown fox jumps over the lazy dog.",
             "the QUICK brown fox   jumps over the lazy dog", "Straße STRASSE strasse",
             "你好世界，这是一个测试。", "a b", "x",
             " ".join(tokens(random.Random(1), 400))]
    for (text, rows), fp in GOLDEN_VECTORS.items():
        assert simindex.fingerprint(text, scheme=scheme(rows)) == fp
    for text in texts:
        for rows in (1, 2, 5, 32):
            assert simindex.fingerprint(text, scheme=scheme(rows), width=256) == \
                ref_bands(text, rows), (text, rows)
        for bands, rows in ((16, 1), (16, 2), (16, 3), (16, 16), (24, 2), (24, 10), (32, 1),
                            (32, 8)):
            assert simindex.fingerprint(text, scheme=scheme(rows, bands),
                                        width=32 * bands) == \
                ref_bands(text, rows, bands), (text, bands, rows)
    for (text, rows), fp in GOLDEN_VECTORS_16.items():
        assert simindex.fingerprint(text, scheme=scheme(rows, 16)) == fp


def test_the_family_has_a_name_per_bands_and_rows_and_no_other():
    assert simindex.schemes[scheme(7)].widths == (256,)
    assert simindex.schemes[scheme(7, 16)].widths == (512,)
    assert simindex.schemes[scheme(10, 24)].widths == (768,)
    assert simindex.schemes[scheme(8, 32)].widths == (1024,)
    assert scheme(7) not in list(simindex.schemes)       # chosen by the calibration
    assert scheme(2, 16) in simindex.schemes and scheme(2, 16) not in list(simindex.schemes)
    for bad in ("minhash-lsh-v1-r0", "minhash-lsh-v1-r33", "minhash-lsh-v1-r01",
                "minhash-lsh-v1-r\u00b2", "minhash-lsh-v1-r", "minhash-lsh-v1",
                "minhash-lsh-v1-b16-r17", "minhash-lsh-v1-b16-r0", "minhash-lsh-v1-b8-r2",
                "minhash-lsh-v1-b64-r2", "minhash-lsh-v1-b16r2", "minhash-lsh-v1-b16-",
                "minhash-lsh-v1-b24-r11", "minhash-lsh-v1-b32-r9", "minhash-lsh-v1-b016-r2",
                "minhash-lsh-v1-b16-b24-r2", "minhash-lsh-v1-b24-b16-r2", "minhash-lsh-v1-b8-r2",
                "minhash-lsh-v1-r2\n", "minhash-lsh-v1-b16-r\u0662"):
        with pytest.raises(simindex.ParameterError, match="unknown fingerprint scheme"):
            simindex.fingerprint("a b c", scheme=bad)
    with pytest.raises(simindex.ParameterError, match="256-bit"):
        simindex.fingerprint("a b c", scheme=scheme(2), width=128)
    with pytest.raises(simindex.ParameterError, match="512-bit"):
        simindex.fingerprint("a b c", scheme=scheme(2, 16), width=256)
    with pytest.raises(simindex.ParameterError, match="not supported"):
        simindex.fingerprint("a b c", scheme="minhash-v1", width=512)


@pytest.mark.parametrize("bands,cases", [(8, ((1, 0.3), (2, 0.5), (4, 0.8))),
                                         (16, ((2, 0.5), (3, 0.6))), (24, ((2, 0.45),)),
                                         (32, ((2, 0.4),))])
def test_a_band_is_shared_at_the_rate_of_the_s_curve(bands, cases):
    """Pairs at Jaccard J share each band with probability J**rows, so at least one of b
    with 1 - (1 - J**rows)**b: over 300 pairs the rate lies within 4 standard errors."""
    rng = random.Random(5)
    from textpairs import pair_at
    for rows, j in cases:
        hits = n = 0
        for _ in range(300):
            a, b, exact = pair_at(rng, j, n=120)
            fa = simindex.fingerprint(a, scheme=scheme(rows, bands))
            fb = simindex.fingerprint(b, scheme=scheme(rows, bands))
            hits += shares_band(fa, fb, bands)
            n += 1
        p = band_recall(rows, j, bands)
        assert abs(hits / n - p) <= 4 * (p * (1 - p) / n) ** 0.5 + 0.01, (rows, j, hits)


# ---------------------------------------------------------------- the index
def planted_codes(rng, n, bands=8):
    """n random codes of `bands` 32-bit keys, each after the first sharing 0 to all bands
    (first and last included) with an earlier one."""
    codes = [rng.getrandbits(32 * bands) for _ in range(n)]
    for i in range(1, n):
        j = rng.randrange(i)
        for t in rng.sample(range(bands), rng.choice([0, 0, 1, 1, 2, bands])):
            m = ((1 << 32) - 1) << (32 * t)
            codes[i] = (codes[i] & ~m) | (codes[j] & m)
    return codes


def oracle(codes, q, bands=8):
    return sorted(i for i, c in enumerate(codes) if shares_band(c, q, bands))


@pytest.mark.parametrize("bands", [8, 16, 24, 32])
def test_a_band_index_finds_exactly_the_records_sharing_a_band(tmp_path, bands):
    """Records the shards have not taken yet (added through an admission, which leaves
    them to a later group) are found as the tables would find them, then the same once
    applied, and the same after a reopen."""
    rng = random.Random(7)
    codes = planted_codes(rng, 600, bands)
    queries = codes[::7] + planted_codes(rng, 40, bands)
    oracle_ = lambda codes, q: oracle(codes, q, bands)      # noqa: E731
    with simindex.Index(str(tmp_path / "idx"), scheme=scheme(3, bands)) as idx:
        assert (idx.width, idx.k, idx.blocks, idx.prefix_blocks, idx.bands) == \
            (32 * bands, bands - 1, bands, 1, 3)
        idx._admit(lambda adm: adm.put([encode_id(i) for i in range(len(codes))],
                                       idx.queries(codes),
                                       [pack_meta(None, i) for i in range(len(codes))]))
        assert idx.stats()["unapplied"] > 0
        store = idx._open_store()          # the core's own answer, before any Python filter
        for answer in (lambda q: [h[3] for h in store.query(idx.queries([q]), BAND_RADIUS,
                                                            matches=False)[0]],
                       lambda q: [m.id for m in idx.query(q, k=BAND_RADIUS)],
                       lambda q: [m.id for m in idx.query_many([q], k=BAND_RADIUS)[0]]):
            for q in queries:
                assert sorted(answer(q)) == oracle_(codes, q)
        idx.flush()
        assert idx.stats()["unapplied"] == 0
        for q in queries:
            assert sorted(m.id for m in idx.query(q, k=BAND_RADIUS)) == oracle_(codes, q)
        # distances as they are, above 255 bits too: per match, and per pair of the join
        q = queries[-1]
        assert {m.id: m.distance for m in idx.query(q, k=BAND_RADIUS)} == \
            {i: bin(codes[i] ^ q).count("1") for i in oracle_(codes, q)}
        want = {(i, j): bin(codes[i] ^ codes[j]).count("1") for j in range(len(codes))
                for i in range(j) if shares_band(codes[i], codes[j], bands)}
        assert {(a, b): d for a, b, d in idx.pairs(k=BAND_RADIUS)} == want
        assert max(want.values()) > 255 if bands > 8 else True
    with simindex.Index(str(tmp_path / "idx"), readonly=True) as idx:
        assert idx.bands == 3 and idx.scheme == scheme(3, bands)
        got = idx.query_many(queries, k=BAND_RADIUS)
        assert [sorted(m.id for m in ms) for ms in got] == [oracle_(codes, q) for q in queries]
        with pytest.raises(simindex.ParameterError, match="index's k"):
            idx.query(queries[0], k=100)              # a radius between: not a search


def test_run_filters_spare_reads_and_change_no_answer(tmp_path):
    """Each run of a table holds a filter of its band keys: a probe of a key the run lacks
    reads none of its slabs. Over many runs (one a flush; filters made at one snapshot
    kept at the next, merged runs filtered anew), with the filters and without, every
    query finds exactly the records sharing a band."""
    rng = random.Random(11)
    codes = planted_codes(rng, 12000, 8)
    queries = codes[::53] + planted_codes(rng, 60, 8)
    with simindex.Index(str(tmp_path / "idx"), scheme=scheme(2, 8)) as idx:
        for i in range(0, len(codes), 1500):
            idx.add_many([str(j) for j in range(i, i + 1500)], codes[i:i + 1500])
            idx.flush()
            seen = codes[:i + 1500]
            assert [sorted(int(m.id) for m in idx.query(q, k=BAND_RADIUS))
                    for q in queries[::5]] == [oracle(seen, q) for q in queries[::5]]
        answers = [sorted(int(m.id) for m in ms)
                   for ms in idx.query_many(queries, k=BAND_RADIUS)]
        assert _testing.run_filters_built(idx) > 8
        assert answers == [oracle(codes, q) for q in queries]
    with _testing.run_filters(0), simindex.Index(str(tmp_path / "idx"), readonly=True) as idx:
        assert [sorted(int(m.id) for m in idx.query(q, k=BAND_RADIUS))
                for q in queries] == answers
        assert _testing.run_filters_built(idx) == 0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.integers(2, 120), st.sampled_from([8, 16, 24, 32]))
def test_the_join_pairs_the_codes_that_share_a_band(seed, n, bands):
    codes = planted_codes(random.Random(seed), n, bands)
    got = simindex.find_all(codes, k=bands - 1, blocks=bands, prefix_blocks=1,
                            width=32 * bands, radius=BAND_RADIUS)
    want = [(i, j) for j in range(n) for i in range(j)
            if shares_band(codes[i], codes[j], bands)]
    assert got == sorted(want)


def test_a_band_index_has_one_plan(tmp_path):
    for bad in ({"k": 3}, {"width": 128}, {"blocks": 4}, {"prefix_blocks": 2}):
        with pytest.raises(simindex.ParameterError, match="a table per band"):
            simindex.Index(str(tmp_path / "x"), scheme=scheme(2), **bad)
    with simindex.Index(str(tmp_path / "y"), scheme=scheme(2), k=7, width=256) as idx:
        assert idx.bands == 2
    with simindex.Index(str(tmp_path / "z"), scheme=simindex.schemes[scheme(2)]) as idx:
        assert (idx.k, idx.blocks, idx.prefix_blocks, idx.bands) == (7, 8, 1, 2)
    for bad in ({"k": 7}, {"width": 256}, {"blocks": 8}):
        with pytest.raises(simindex.ParameterError, match="width 512, k 15, blocks 16"):
            simindex.Index(str(tmp_path / "x16"), scheme=scheme(2, 16), **bad)
    with simindex.Index(str(tmp_path / "w"), scheme=scheme(2, 16)) as idx:
        assert (idx.width, idx.k, idx.blocks, idx.prefix_blocks, idx.bands) == \
            (512, 15, 16, 1, 2)


# ---------------------------------------------------------------- the calibration
def family_texts(rng, families, size=60):
    """Texts in families: a base text of `size` random words, then variants with a share
    of their words replaced (Jaccard from about 0.2 to 1), exact copies and strangers."""
    out = []
    for _ in range(families):
        base = tokens(rng, size)
        out.append(" ".join(base))
        for _ in range(rng.randrange(1, 5)):
            words = list(base)
            for i in rng.sample(range(size), rng.choice([0, 1, 2, 4, 8, 15])):
                words[i] = tokens(rng, 1)[0]
            out.append(" ".join(words))
        out.append(" ".join(tokens(rng, size)))
    rng.shuffle(out)
    return out


def test_the_calibration_weighs_the_band_search():
    texts = family_texts(random.Random(3), 60)
    for t in (0.5, 0.7, 0.9):
        c = cal.calibrate(texts, t, expected_rows=10**6)
        band = [x for x in c.table if x.scheme != "minhash-v1"]
        shapes = [(b, rows_for(t, 0.99, b)) for b in (8, 16, 24, 32)]   # most rows for 0.99
        assert [(x.scheme, x.width, x.k) for x in band] == \
            [(scheme(r, b), 32 * b, b - 1) for b, r in shapes]
        for x, (b, r) in zip(band, shapes):
            assert x.model_recall == band_recall(r, t, b) >= 0.99
        assert band[0].query_us < min(x.query_us for x in c.table if x.scheme == "minhash-v1")
        assert c.chosen == min(c.table, key=lambda x: (x.seconds, x.width))
    c = cal.calibrate(texts, 0.7, expected_rows=10**6)
    bands, rows = lsh_shape(c.scheme)              # a band search, the least estimated time
    assert rows == rows_for(0.7, 0.99, bands) and f"{bands} bands of {rows} rows" in c.describe()
    assert cal.calibrate(texts, 0.7, expected_rows=10**6, bands=False).scheme == "minhash-v1"
    assert all(x.scheme == "minhash-v1" for x in
               cal.calibrate(texts, 0.7, widths=[128]).table)
    # a named band scheme: its own rows, whatever the recall asked
    named = cal.calibrate(texts, 0.7, scheme=scheme(5), recall=0.9)
    assert [x.scheme for x in named.table] == [scheme(5)]
    assert named.expected_recall == band_recall(5, 0.7)
    with pytest.raises(simindex.ParameterError, match="containment"):
        cal.calibrate(texts, 0.7, scheme=scheme(5), measure="containment")
    # no sample: the model alone, unrelated texts meeting only by 32-bit collisions
    model = cal.calibrate([], 0.8, expected_rows=10**8)
    assert model.scheme == scheme(rows_for(0.8, 0.99))
    # a budget below the band search's estimate: more rows per band, less recall
    free = cal.calibrate(texts, 0.5, expected_rows=10**6)
    capped = cal.calibrate(texts, 0.5, expected_rows=10**6,
                           time_budget=min(x.seconds for x in free.table) * 0.5)
    assert [x.width for x in free.table] == [x.width for x in capped.table]  # row by row
    for b, cb in zip(free.table, capped.table):
        if b.scheme != "minhash-v1":    # per band count
            assert cb.capped and cb.scheme != b.scheme and cb.model_recall < b.model_recall
            assert lsh_shape(cb.scheme)[0] == lsh_shape(b.scheme)[0]


# ---------------------------------------------------------------- dedup
def write_rows(path, texts, start=0):
    with open(path, "w") as f:
        for i, text in enumerate(texts, start):
            f.write(json.dumps({"id": i, "text": text}) + "\n")


def greedy_oracle(texts, rows, t, bands=8):
    """The ids greedy dedup keeps when a candidate is a kept row sharing a band and the
    check is the exact Jaccard similarity of the two rows' shingles."""
    fps = [simindex.fingerprint(x, scheme=scheme(rows, bands)) for x in texts]
    sets = [shingle_set(x, "minhash-v1") for x in texts]
    kept = []
    for i in range(len(texts)):
        if not any(shares_band(fps[i], fps[j], bands) and jaccard(sets[i], sets[j]) >= t
                   for j in kept):
            kept.append(i)
    return kept


@pytest.mark.parametrize("t,bands,jobs", [(0.5, 8, 1), (0.5, 24, 1), (0.5, 24, 2),
                                          (0.6, 16, 1), (0.7, 8, 1), (0.7, 8, 2),
                                          (0.7, 16, 1), (0.9, 8, 1), (0.45, 32, 1)])
def test_dedup_by_bands_keeps_what_the_oracle_keeps(tmp_path, monkeypatch, t, bands, jobs):
    """Small batches, so that rows meet their near-copies in the same batch, in earlier
    batches (applied or not), and in an earlier run's kept index; also with two jobs
    (the batches prepared by worker processes and a reader's thread)."""
    monkeypatch.setattr(dedup_module, "BATCH", 37)
    texts = family_texts(random.Random(int(t * 10)), 70)
    rows = rows_for(t, 0.99, bands)
    want = greedy_oracle(texts, rows, t, bands)
    assert 0 < len(want) < len(texts)
    write_rows(tmp_path / "all.jsonl", texts)
    got = [d.id for d in simindex.decisions(str(tmp_path / "all.jsonl"), id_field="id",
                                            min_similarity=t, scheme=scheme(rows, bands),
                                            jobs=jobs)
           if d.kept]
    assert got == want
    # the same in two runs that keep an index between them
    half = len(texts) // 2
    write_rows(tmp_path / "a.jsonl", texts[:half])
    write_rows(tmp_path / "b.jsonl", texts[half:], half)
    idx = str(tmp_path / "idx")
    first = [d.id for d in simindex.decisions(str(tmp_path / "a.jsonl"), id_field="id",
                                              min_similarity=t, scheme=scheme(rows, bands),
                                              index=idx, jobs=jobs) if d.kept]
    second = [d.id for d in simindex.decisions(str(tmp_path / "b.jsonl"), id_field="id",
                                               index=idx, jobs=jobs) if d.kept]
    assert first + second == want
    with simindex.Index(idx, readonly=True) as i:
        assert i.bands == rows and len(i) == len(want)


def test_a_band_run_records_its_search_as_earlier_versions_did():
    """A run's token names how it judges; a band search is recorded as k = the index's
    width (k=256 for 8 bands, as runs have recorded it), so a run again resumes an index
    it kept, whatever the search radius's sentinel is."""
    from simindex.datasets.settings import judging
    assert judging("greedy", BAND_RADIUS, "jaccard", 0.7, 256) == "greedy k=256 jaccard >= 0.7"
    assert judging("greedy", BAND_RADIUS, "jaccard", 0.5, 768) == "greedy k=768 jaccard >= 0.5"
    assert judging("greedy", 3, "jaccard", None, 64) == "greedy k=3"


def test_a_width_asks_for_its_band_searches_only(tmp_path):
    texts = family_texts(random.Random(4), 40)
    write_rows(tmp_path / "in.jsonl", texts)
    for width, want in (("256", {("minhash-v1", "256"), (scheme(1), "256")}),
                        ("512", {(scheme(1, 16), "512")}),    # 2 rows: 0.98998 at 0.5
                        ("1024", {(scheme(2, 32), "1024")})):
        r = run("calibrate", tmp_path / "in.jsonl", "--min-similarity", "0.5", "--width", width)
        assert r.returncode == 0, r.stderr
        assert {tuple(x.split("\t")[:2]) for x in r.stdout.splitlines()[1:]} == want, r.stdout
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "o.jsonl", "--id-field", "id",
            "--min-similarity", "0.5", "--width", "768", "--index", tmp_path / "idx")
    assert r.returncode == 0 and f"{scheme(2, 24)} 768 bits, 24 bands of 2 rows" in r.stderr
    assert [json.loads(x)["id"] for x in open(tmp_path / "o.jsonl")] == \
        greedy_oracle(texts, 2, 0.5, 24)


def test_dedup_by_bands_says_so_and_refuses_what_it_cannot_judge(tmp_path):
    texts = family_texts(random.Random(9), 150)
    write_rows(tmp_path / "in.jsonl", texts)
    rows = rows_for(0.7, 0.99)
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "o.jsonl", "--id-field", "id",
            "--min-similarity", "0.7", "--removed", tmp_path / "rm.jsonl",
            "--index", tmp_path / "idx", "--scheme", scheme(rows))
    assert r.returncode == 0, r.stderr
    assert f"{scheme(rows)} 256 bits, 8 bands of {rows} rows" in r.stderr
    kept = [json.loads(x)["id"] for x in open(tmp_path / "o.jsonl")]
    assert kept == greedy_oracle(texts, rows, 0.7)
    removed = [json.loads(x) for x in open(tmp_path / "rm.jsonl")]
    assert removed and all(x["scheme"] == scheme(rows) and x["k"] is None and
                           x["bands"] == 8 and x["rows_per_band"] == rows and
                           x["similarity"] >= 0.7 for x in removed)
    # a band index judges by similarity only, and compares band keys of its own scheme
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "o2.jsonl", "--index",
            tmp_path / "idx", "--min-similarity", "0.5")
    assert r.returncode == 1 and "calibrated for jaccard >= 0.7" in r.stderr
    with simindex.Index(str(tmp_path / "plain"), scheme=scheme(rows)):
        pass
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "o3.jsonl", "--index",
            tmp_path / "plain")
    assert r.returncode == 1 and "give --min-similarity" in r.stderr
    with simindex.Index(str(tmp_path / "other"), scheme=scheme(rows + 1)):
        pass
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "o4.jsonl", "--against",
            tmp_path / "other", "--min-similarity", "0.7")
    assert r.returncode == 1 and "band keys of one scheme only" in r.stderr, r.stderr
    for name in ("o2.jsonl", "o3.jsonl", "o4.jsonl"):
        assert not (tmp_path / name).exists()


# ---------------------------------------------------------------- the text calls
@pytest.mark.parametrize("bands", [8, 16, 32])
def test_text_calls_on_a_band_index_judge_the_records_sharing_a_band(tmp_path, bands):
    """query_text is the records that share a band and whose stored sketch passes;
    add_unique_text admits a text only when none does."""
    rng = random.Random(12)
    texts = family_texts(rng, 40)
    rows = rows_for(0.7, 0.99, bands)
    fps = [simindex.fingerprint(x, scheme=scheme(rows, bands)) for x in texts]
    sks = [sketch(shingle_set(x, "minhash-v1")) for x in texts]
    with simindex.Index(str(tmp_path / "idx"), scheme=scheme(rows, bands)) as idx:
        admitted = []
        for i, text in enumerate(texts):
            blocked = idx.add_unique_text(i, text, min_similarity=0.7)
            want = [j for j in admitted if shares_band(fps[i], fps[j], bands) and
                    sketch_jaccard(sks[i], sks[j]) >= 0.7]
            assert sorted(m.id for m in blocked) == want
            if not want:
                admitted.append(i)
        for i, text in enumerate(texts):
            got = sorted(m.id for m in idx.query_text(text, min_similarity=0.8))
            assert got == [j for j in admitted if shares_band(fps[i], fps[j], bands) and
                           sketch_jaccard(sks[i], sks[j]) >= 0.8]
        with pytest.raises(simindex.ParameterError, match="fewer rows per band"):
            idx.query_text(texts[0], min_similarity=0.3)


@pytest.mark.parametrize("bands", [8, 16])
def test_every_text_path_of_a_band_index_holds_to_the_bands(tmp_path, bands):
    """Buffered records (sync=False), an explicit k (the width or more) and a record without
    a sketch: a text call still judges only the records that share a band (and a record
    without a sketch counts on sharing one)."""
    rng = random.Random(14)
    text = " ".join(tokens(rng, 80))
    near = text.replace(text.split()[40], "changed")
    with simindex.Index(str(tmp_path / "idx"), scheme=scheme(2, bands), sync=False) as idx:
        idx.add_text("near", near)
        idx.add("stranger", rng.getrandbits(32 * bands))      # shares no band, no sketch
        idx.add("twin", idx.fingerprint(text))                # every band, no sketch
        for k in (None, BAND_RADIUS, 32 * bands):        # the width: every distance too
            assert sorted(m.id for m in idx.query_text(text, k=k, min_similarity=0.7)) == \
                ["near", "twin"]
        assert sorted(m.id for m in idx.add_unique_text("new", text, k=BAND_RADIUS,
                                                        min_similarity=0.7)) == ["near", "twin"]
