"""The minhash-v1 scheme: a pure-Python reference of its documented rule, frozen golden
vectors, and the property it exists for (its bits differ with probability (1 - J) / 2)."""

import math
import random
import re
import unicodedata

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings, strategies as st

import simindex
from simindex.signatures.similarity import shingle_set

CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"
GOLDEN = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1


def ref_tokens(text):
    t = unicodedata.normalize("NFKC", text).casefold()
    return re.findall(f"[{CJK}]|[^\\W{CJK}]+", t)


def ref_shingles(text):
    toks = ref_tokens(text)
    wins = [toks] if len(toks) < 3 else [toks[i:i + 3] for i in range(len(toks) - 2)]
    return {xxhash.xxh3_64_intdigest(" ".join(w).encode("utf-8", "surrogatepass"))
            for w in wins if w}


def splitmix(x):
    x = (x + GOLDEN) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def ref_bins(xs, bins):
    """The documented bins over a set of shingle hashes: each bin's smallest (round,
    value), rounds until every bin holds one (minhash-v1 has one bin per bit)."""
    shift = 64 - int(math.log2(bins))
    best = {}
    r = 0
    while xs and len(best) < bins and r < 64 * bins:
        for x in xs:
            g = splitmix((x + r * GOLDEN) & M64)
            b, v = g >> shift, g & ((1 << shift) - 1)
            if b not in best or (r, v) < best[b]:
                best[b] = (r, v)
        r += 1
    return best


def ref_code(xs, width):
    """The documented rule over a set of shingle hashes."""
    return sum(1 << b for b, (_, v) in ref_bins(xs, width).items() if v & 1)


def ref_minhash(text, width=64):
    return ref_code(ref_shingles(text), width)


GOLDEN_VECTORS = {   # frozen: a change here is a new scheme
    ("The quick brown fox jumps over the lazy dog.", 64): 0xf3b938651fe75413,
    ("The quick brown fox jumps over the lazy dog.", 256):
        0x74363eba58e79b4941ef20665d99eb0aa4c55ccd291211faae8e825c89d11484,
}


def test_golden_vectors_and_the_reference_agree():
    texts = ["The quick brown fox jumps over the lazy dog.",
             "the QUICK brown fox   jumps over the lazy dog",
             "Ｆｕｌｌｗｉｄｔｈ text and ligatures: ﬁne ﬂow", "你好世界，这是一个测试。",
             "Straße STRASSE strasse", "a b", "x"]
    for (text, width), fp in GOLDEN_VECTORS.items():
        assert simindex.fingerprint(text, scheme="minhash-v1", width=width) == fp
    for text in texts:
        for width in (64, 128, 256):
            assert simindex.fingerprint(text, scheme="minhash-v1", width=width) == \
                ref_minhash(text, width), (text, width)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(
    list("abcAB _-.,;\n") + ["ß", "ẞ", "İ", "Σ", "ς", "µ", "Å", "é", "e\u0301", "\u0301",
                             "ﬁ", "１", "Ａ", "漢", "か", "カ", "・", "\u00a0", "…", "™",
                             "가", "\u1100", "\u1161", "\u11a8", "𝐀", "\U00010400", "😀",
                             "\u0915\u093c", "\u0b47", "\u0b3e"]), max_size=60).map("".join),
       st.sampled_from([64, 128, 256]))
def test_the_compiled_pass_equals_the_reference(text, width):
    if not ref_tokens(text):
        with pytest.raises(simindex.InputError):
            simindex.fingerprint(text, scheme="minhash-v1", width=width)
        return
    assert simindex.fingerprint(text, scheme="minhash-v1", width=width) == \
        ref_minhash(text, width)
    assert shingle_set(text, "minhash-v1").tolist() == sorted(ref_shingles(text))


# the pieces of mostly-ASCII text: runs of 16 ASCII characters are tokenized 16 at a time,
# so word characters, case, the other ASCII characters and a rare one above ASCII (which
# sends its 16 the slow way) fall on every side of a 16-character boundary
ASCII_PIECES = list("abzAMZ09_ .,-@[`{\n\t\x7f") + ["word ", "WORD ", "Mixed_Case9 ",
                                                     "é", "ß", "Å"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(ASCII_PIECES), max_size=400).map("".join))
def test_mostly_ascii_text_is_tokenized_as_the_reference_tokenizes_it(text):
    if not ref_tokens(text):
        with pytest.raises(simindex.InputError):
            simindex.fingerprint(text, scheme="minhash-v1")
        return
    assert shingle_set(text, "minhash-v1").tolist() == sorted(ref_shingles(text))


def test_a_text_longer_than_the_pass_keeps_is_tokenized_whole():
    """The pass keeps only the last tokens' bytes (it drops the rest beyond 64 KiB)."""
    rng = random.Random(5)
    text = " ".join(rng.choice(["alpha", "Beta", "GAMMA", "d_1", "x", "é"]) +
                    rng.choice(["", ",", " ", "..."]) for _ in range(60000))
    assert len(text) > 4 * 65536
    assert shingle_set(text, "minhash-v1").tolist() == sorted(ref_shingles(text))


def test_the_code_is_of_the_shingle_set_repeats_change_nothing():
    c = "one two three one two three one two three"
    assert ref_shingles(c) == ref_shingles("one two three one two three")
    assert simindex.fingerprint(c, scheme="minhash-v1") == \
        simindex.fingerprint("one two three one two three", scheme="minhash-v1")


@pytest.mark.parametrize("width", [64, 128, 256])
def test_bits_differ_with_probability_one_minus_jaccard_over_two(width):
    # two texts of n distinct random tokens sharing their first m share m - 2 of their
    # n - 2 shingles each; with 40 shingles (the later rounds fill the bins) and with
    # 2,000, over 200 pairs the mean distance is w(1 - J)/2 within 4 standard errors of a
    # binomial, and the spread is a binomial's within 25%
    rnd = random.Random(width)
    for n, m in [(42, 36), (2002, 1400), (302, 290)]:
        dist = []
        for _ in range(200):
            toks = [f"t{rnd.getrandbits(48):x}" for _ in range(2 * n - m)]
            a = " ".join(toks[:n])
            b = " ".join(toks[:m] + toks[n:])
            dist.append(bin(simindex.fingerprint(a, scheme="minhash-v1", width=width) ^
                            simindex.fingerprint(b, scheme="minhash-v1", width=width))
                        .count("1"))
        j = (m - 2) / (2 * (n - 2) - (m - 2))
        p = (1 - j) / 2
        mean, sd = width * p, math.sqrt(width * p * (1 - p))
        assert abs(np.mean(dist) - mean) < 4 * sd / math.sqrt(len(dist)), (n, m)
        assert 0.75 * sd < np.std(dist) < 1.25 * sd, (n, m)


def test_real_texts_match_the_reference():
    rnd = random.Random(3)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    for n in (1, 2, 3, 5, 50, 500, 3000):
        text = " ".join(rnd.choice(words) + str(rnd.randrange(40)) for _ in range(n))
        for width in (64, 128, 256):
            assert simindex.fingerprint(text, scheme="minhash-v1", width=width) == \
                ref_minhash(text, width)


MARKS = ["a", "b", " ", "e\u0301", "\u0301", "\u0308", "ﬁ", "\u00a0", "가", "\u1161",
         "\u11a8", "😀", "𝐀", "\u0915\u093c", "\u0e38", "Å", "ß"]


_NF = []


def needs_neighbours(ch):
    """A character the tables cannot map alone: above the BMP, or marked COMPLEX."""
    from simindex.signatures import _text
    if not _NF:
        _NF.append(_text.build_tables()[0])
    c = ord(ch)
    return c >= 0x10000 or (c >= 128 and bool(_NF[0][c] & 0x40000000))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(MARKS), max_size=80).map("".join))
def test_stretches_normalized_alone_normalize_the_whole(text):
    """Each run of characters that need their neighbours, with the character before it, is
    normalized alone; every other character is left for the tables, which map it alone
    (NFKC of it alone); and the result normalizes to the text's NFKC."""
    from simindex.signatures import _text
    out, mode = _text.normalize_around(text)
    nfkc = unicodedata.normalize("NFKC", text)
    if mode == 1:
        assert out == nfkc
        return
    pieces, mapped, last, i = [], [], 0, 0
    while i <= len(text):
        if i == len(text) or needs_neighbours(text[i]):
            end = i
            while end < len(text) and needs_neighbours(text[end]):
                end += 1
            start = max(i - 1, last) if end > i else i
            stretch = unicodedata.normalize("NFKC", text[start:end])
            pieces += [text[last:start], stretch]
            mapped += [unicodedata.normalize("NFKC", ch) for ch in text[last:start]]
            mapped.append(stretch)
            last, i = end, end + 1 if end == i else end
        else:
            i += 1
    assert out == "".join(pieces)
    # mapped one character at a time outside the stretches, it is the text's NFKC
    assert "".join(mapped) == nfkc


def test_many_stretches_normalize_the_whole_text_at_once():
    from simindex.signatures import _text
    text = " ".join(f"word{i}e\u0301" for i in range(_text.SEGMENTS + 10))
    out, mode = _text.normalize_around(text)
    assert mode == 1 and out == unicodedata.normalize("NFKC", text)
    few = " ".join(f"word{i}e\u0301" for i in range(5))
    assert _text.normalize_around(few)[1] == 2
    for t in (text, few):
        assert simindex.fingerprint(t, scheme="minhash-v1") == ref_minhash(t)


# values as shingle hashes are (spread evenly) and as they are not (a shared top byte,
# small numbers, repeats): the compiled sort buckets by the top byte
_SPREAD = st.integers(0, M64)
_NARROW = st.builds(lambda top, low: (top << 56) | low, st.sampled_from([0, 0xAB, 0xFF]),
                    st.integers(0, 300))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_SPREAD, _NARROW), max_size=400), st.integers(0, 3))
def test_a_shingle_set_is_its_hashes_sorted_without_repeats(values, repeat):
    from simindex.signatures import _text
    a = np.array(values * (1 + repeat), dtype=np.uint64)
    assert np.asarray(_text.sorted_set(a)).tolist() == np.unique(a).tolist()
