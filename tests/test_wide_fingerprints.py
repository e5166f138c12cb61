"""Fingerprints of 128 and 256 bits: md5-128-notebook as the memosstilvi/simhash notebook bit
for bit, pypi-simhash as PyPI simhash f=128, every named token hash against its library,
callables, compute, and the errors."""

import hashlib
import re

import numpy as np
import pytest
import xxhash
from hypothesis import given, strategies as st
from simhash import Simhash

import simindex
from test_fingerprints import real_texts

# ---------------------------------------------------------------- independent references


def vote(hashes_and_weights, width):
    """The documented bit rule in plain Python, at any width."""
    v = [0] * width
    for h, w in hashes_and_weights:
        for i in range(width):
            v[i] += w if (h >> i) & 1 else -w
    return sum(1 << i for i in range(width) if v[i] > 0)


def notebook_simhash(doc):
    """The memosstilvi/simhash notebook, restated: its tokenizer, term-frequency
    weights, the full MD5 as 128 binary digits, and its output bit string."""
    tokens = [t for t in re.split(r"\s+", re.sub("[,;]", " ", str(doc))) if t]
    tf = {}
    for t in tokens:
        tf[t] = tf.get(t, 0) + 1
    sums = [0] * 128
    for t, w in tf.items():
        digits = bin(int(hashlib.md5(t.encode("utf-8")).hexdigest(), 16))[2:].zfill(128)
        sums = [s + w * (1 if d == "1" else -1) for s, d in zip(sums, digits)]
    return "".join("1" if s > 0 else "0" for s in sums)


def xxh3_256(b):
    return (xxhash.xxh3_128_intdigest(b) << 128) | xxhash.xxh3_128_intdigest(b, seed=1)


REFERENCE_HASHES = {
    "xxh3": xxhash.xxh3_64_intdigest,
    "md5-last8": lambda b: int.from_bytes(hashlib.md5(b).digest()[-8:], "big"),
    "md5-first8": lambda b: int.from_bytes(hashlib.md5(b).digest()[:8], "big"),
    "md5": lambda b: int.from_bytes(hashlib.md5(b).digest(), "big"),
    "xxh3-128": xxhash.xxh3_128_intdigest,
    "xxh3-128x2": xxh3_256,
    "sha256": lambda b: int.from_bytes(hashlib.sha256(b).digest(), "big"),
}


def ref_v1(text, width):
    import unicodedata
    cjk = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"
    toks = re.findall(f"[{cjk}]|[^\\W{cjk}]+", unicodedata.normalize("NFKC", text).casefold())
    wins = [toks] if len(toks) < 3 else [toks[i:i + 3] for i in range(len(toks) - 2)]
    h = {64: xxhash.xxh3_64_intdigest, 128: xxhash.xxh3_128_intdigest, 256: xxh3_256}[width]
    return vote(((h(" ".join(w).encode()), 1) for w in wins), width)


NOTEBOOK_DATA = {1: "Im testing simhash algorithm.", 2: "test of simhash algorithm",
                 3: "This is simhash test."}
NOTEBOOK_OUTPUT = ("1010111111101010011011011011100011001000100110000010000001110011"
                   "1100010000100000110010100011011010000001100111010110110110100110")

GOLDEN_V1_WIDE = {   # frozen: a change here is a new scheme
    ("The quick brown fox jumps over the lazy dog.", 128):
        0xe84f65d6bb6547fc3fbd087efc73e940,
    ("The quick brown fox jumps over the lazy dog.", 256):
        0xe84f65d6bb6547fc3fbd087efc73e9401859a94c3f4dfe49594e390e62a134c8,
    ("你好世界，这是一个测试。", 128): 0x6520000418c54840ec23008a27704145,
}

# ---------------------------------------------------------------- the notebook


def test_the_notebooks_output_is_reproduced_bit_for_bit():
    fp = simindex.fingerprint(str(NOTEBOOK_DATA), scheme="md5-128-notebook")
    assert format(fp, "0128b") == NOTEBOOK_OUTPUT
    assert notebook_simhash(str(NOTEBOOK_DATA)) == NOTEBOOK_OUTPUT    # the restated oracle


@given(st.text(alphabet=st.sampled_from("ab c,;\t\n\u00a0\u2003xyzé,"), max_size=60))
def test_md5_128_notebook_equals_the_notebook_on_any_text(text):
    expected = notebook_simhash(text)
    if not simindex.tokenize(text, scheme="md5-128-notebook"):
        with pytest.raises(simindex.InputError, match="no tokens"):
            simindex.fingerprint(text, scheme="md5-128-notebook")
        assert expected == "0" * 128                                   # the notebook's value
    else:
        assert format(simindex.fingerprint(text, scheme="md5-128-notebook"), "0128b") == expected


def test_md5_128_notebook_equals_the_notebook_on_real_texts():
    for text in real_texts(60):
        if text.split():
            assert format(simindex.fingerprint(text, scheme="md5-128-notebook"), "0128b") == \
                notebook_simhash(text)


# ---------------------------------------------------------------- PyPI simhash at f=128


def test_pypi_simhash_scheme_at_128_bits_is_bit_exact_with_the_package():
    rng = np.random.default_rng(5)
    texts = [t for t in real_texts(120)]
    texts += ["".join(rng.choice(list("abcdefgh 中文,."), size=rng.integers(1, 200)))
              for _ in range(200)]
    compared = 0
    for t in texts:
        try:
            expected = Simhash(t, f=128).value
        except OverflowError:              # PyPI simhash under NumPy 2, weights > 255
            continue
        if not re.findall("[\\w\u4e00-\u9fcc]+", t.lower()):
            continue
        assert simindex.fingerprint(t, scheme="pypi-simhash", width=128) == expected, t[:80]
        compared += 1
    assert compared > 250


def test_md5_features_at_128_bits_are_bit_exact_with_pypi_simhash():
    rng = np.random.default_rng(6)
    for _ in range(50):
        words = [f"w{int(x)}" for x in rng.integers(0, 400, size=rng.integers(1, 60))]
        weighted = {w: int(rng.integers(1, 200)) for w in words}
        assert simindex.simhash(weighted, width=128, hash="md5") == \
            Simhash(weighted, f=128).value
        assert simindex.simhash(words, width=128, hash="md5") == Simhash(words, f=128).value


# ---------------------------------------------------------------- simindex-v1 at every width


@pytest.mark.parametrize("key,fp", GOLDEN_V1_WIDE.items())
def test_simindex_v1_wide_golden_vectors(key, fp):
    text, width = key
    assert simindex.fingerprint(text, width=width) == fp
    assert ref_v1(text, width) == fp


@pytest.mark.parametrize("width", [64, 128, 256])
def test_simindex_v1_matches_the_reference_at_every_width(width):
    for text in real_texts(60)[:25]:
        if simindex.tokenize(text):
            assert simindex.fingerprint(text, width=width) == ref_v1(text, width)


def test_schemes_name_their_widths():
    assert simindex.WIDTHS == (64, 128, 256)
    assert simindex.schemes["simindex-v1"].widths == (64, 128, 256)
    assert simindex.schemes["pypi-simhash"].widths == (64, 128)
    assert simindex.schemes["seomoz-simhash"].widths == (64,)
    assert simindex.schemes["md5-128-notebook"].widths == (128,)
    assert simindex.fingerprint("a b c", scheme="md5-128-notebook") >> 64       # 128 by default
    with pytest.raises(simindex.ParameterError, match="makes 64, 128-bit .* not 256"):
        simindex.fingerprint("a b c", scheme="pypi-simhash", width=256)
    with pytest.raises(simindex.ParameterError, match="not 128"):
        simindex.fingerprint("a b c d e", scheme="seomoz-simhash", width=128)
    with pytest.raises(simindex.ParameterError, match="not supported"):
        simindex.fingerprint("a b c", width=96)


def test_an_index_refuses_a_scheme_without_its_width(tmp_path):
    with pytest.raises(simindex.ParameterError, match="makes 128-bit fingerprints, not 64"):
        simindex.Index(tmp_path / "i", scheme="md5-128-notebook")
    assert not (tmp_path / "i").exists()


# ---------------------------------------------------------------- token hashes


@pytest.mark.parametrize("name", list(REFERENCE_HASHES))
def test_every_named_hash_votes_with_its_library_value_at_every_width_it_covers(name):
    bits = simindex.HASHES[name][1]
    feats = ["", "a", "héllo wörld", "x" * 300, "中文"]
    ref = REFERENCE_HASHES[name]
    for width in (64, 128, 256):
        if width > bits:
            with pytest.raises(simindex.ParameterError, match="fewer than the width"):
                simindex.simhash(feats, width=width, hash=name)
            continue
        expected = vote(((ref(f.encode()) % (1 << width), 1) for f in feats), width)
        assert simindex.simhash(feats, width=width, hash=name) == expected
        weighted = {f: i + 1 for i, f in enumerate(feats)}
        assert simindex.simhash(weighted, width=width, hash=name) == \
            vote(((ref(f.encode()) % (1 << width), w) for f, w in weighted.items()), width)


@given(st.lists(st.tuples(st.binary(max_size=6), st.floats(0, 1e6)), min_size=1, max_size=30),
       st.sampled_from([128, 256]))
def test_float_weights_follow_the_bit_rule_at_wide_widths(features, width):
    name = simindex.signatures.fingerprints.DEFAULT_HASH[width]
    ref = REFERENCE_HASHES[name]
    got = simindex.simhash(features, width=width)
    v = [0.0] * width
    for f, w in features:
        h = ref(f)
        for i in range(width):
            v[i] += w if (h >> i) & 1 else -w
    assert got == sum(1 << i for i in range(width) if v[i] > 0)


def test_a_hash_callable_returning_bytes_or_ints_votes_like_the_named_hash():
    feats = {"alpha": 3, "beta": 1, "gamma": 7}
    named = simindex.simhash(feats, width=128, hash="md5")
    assert simindex.simhash(feats, width=128, hash=lambda b: hashlib.md5(b).digest()) == named
    assert simindex.simhash(
        feats, width=128, hash=lambda b: int(hashlib.md5(b).hexdigest(), 16)) == named
    sha = simindex.simhash(feats, width=256, hash="sha256")
    assert simindex.simhash(feats, width=256, hash=lambda b: hashlib.sha256(b).digest()) == sha
    # wider than the width: the low bits, the last bytes (PyPI simhash's truncation)
    assert simindex.simhash(feats, width=128, hash=lambda b: hashlib.sha256(b).digest()) == \
        simindex.simhash(feats, width=128,
                         hash=lambda b: int.from_bytes(hashlib.sha256(b).digest()[16:], "big"))


def test_hash_callables_narrower_than_the_width_are_refused():
    with pytest.raises(simindex.ParameterError, match="looks narrower than the width 128"):
        simindex.simhash(["a"], width=128, hash=xxhash.xxh3_64_intdigest)
    with pytest.raises(simindex.ParameterError, match="looks narrower than the width 256"):
        simindex.simhash(["a"], width=256, hash=lambda b: hashlib.md5(b).digest())
    with pytest.raises(simindex.ParameterError, match="must return an int >= 0 or bytes"):
        simindex.simhash(["a"], width=64, hash=lambda b: "nope")
    calls = iter(range(1000))

    def shrinking(b):       # wide on the probes, then short: caught feature by feature
        return hashlib.md5(b).digest() if next(calls) < 8 else b"\x01"
    with pytest.raises(simindex.InputError, match="hash of feature 0 is 1 bytes; width 128"):
        simindex.simhash(["a", "b"], width=128, hash=shrinking)
    with pytest.raises(simindex.ParameterError, match="unknown token hash 'sha1'"):
        simindex.simhash(["a"], hash="sha1")


# ---------------------------------------------------------------- compute


@pytest.mark.parametrize("width", [64, 128, 256])
def test_compute_takes_ints_bytes_and_word_arrays(width):
    rng = np.random.default_rng(width)
    words = rng.integers(0, 2 ** 63, size=(40, width // 64), dtype=np.uint64) * 2 + 1
    ints = [int.from_bytes(r.astype(">u8").tobytes(), "big") for r in words]
    expected = vote(((h, 1) for h in ints), width)
    assert simindex.compute(ints, width=width) == expected
    assert simindex.compute([h.to_bytes(width // 8, "big") for h in ints], width=width) == expected
    assert simindex.compute(words, width=width) == expected
    if width == 64:
        assert simindex.compute(words[:, 0], width=64) == expected


def test_compute_errors_name_the_value_and_the_rule():
    with pytest.raises(simindex.InputError, match=rf"at position 1: hash {2 ** 128} is out of "
                       r"range: at width 128 it must be in \[0, 2\*\*128\)"):
        simindex.compute([1, 2 ** 128], width=128)
    with pytest.raises(simindex.InputError, match="at position 0: .* is 8 bytes; a width-128"):
        simindex.compute([b"\x00" * 8], width=128)
    with pytest.raises(simindex.InputError, match=r"shape \(n, 4\)"):
        simindex.compute(np.zeros((3, 2), np.uint64), width=256)
    with pytest.raises(simindex.InputTypeError, match="must be an int or bytes"):
        simindex.compute(["ff"], width=128)
    with pytest.raises(simindex.InputError, match="negative word"):
        simindex.compute(np.array([[1, -1]]), width=128)
    with pytest.raises(simindex.InputError, match="no hashes"):
        simindex.compute([], width=256)


def test_an_unhashable_hash_callable_is_probed_every_call():
    class Md5:
        __hash__ = None            # an eq-dataclass, say

        def __call__(self, b):
            return int.from_bytes(hashlib.md5(b).digest(), "big")
    assert simindex.simhash(["a", "b"], width=128, hash=Md5()) == \
        simindex.simhash(["a", "b"], width=128, hash="md5")
