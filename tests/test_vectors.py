"""Signatures from vectors: the documented hyperplane generator, the sign of each
dot product, dense and sparse alike, the per-word +-1 form equal to simhash(), the binomial
law behind the cosine helpers, and the errors."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import binom

import simindex

M64 = (1 << 64) - 1


def mix64(x):
    """splitmix64's output function, as documented."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def documented_hyperplane(seed, e, distribution):
    key = mix64(seed)
    a = mix64((key + 2 * e) & M64)
    if distribution == "sign":
        return -1.0 if a >> 63 else 1.0
    b = mix64((key + 2 * e + 1) & M64)
    u1 = ((a >> 11) + 1) / 2 ** 53
    u2 = (b >> 11) / 2 ** 53
    return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


def as_ints(fps):
    fps = fps.reshape(len(fps), -1)
    return [int.from_bytes(r.astype(">u8").tobytes(), "big") for r in fps]


def distances(a, b):
    return np.unpackbits((a ^ b).reshape(len(a), -1).view(np.uint8), axis=1).sum(axis=1)


# ---------------------------------------------------------------- the hyperplanes


@pytest.mark.parametrize("distribution", ["normal", "sign"])
@pytest.mark.parametrize("seed", [0, 1, 2 ** 64 - 1])
def test_hyperplanes_are_the_documented_function_of_the_seed(distribution, seed):
    h = simindex.Hyperplanes(7, width=128, seed=seed, distribution=distribution)
    m = h.matrix
    assert m.shape == (7, 128) and not m.flags.writeable
    for e in [0, 1, 127, 128, 500, 7 * 128 - 1]:
        assert m.flat[e] == pytest.approx(documented_hyperplane(seed, e, distribution),
                                          rel=1e-15, abs=1e-300)
    again = simindex.Hyperplanes(7, width=128, seed=seed, distribution=distribution)
    assert np.array_equal(again.matrix, m)


def test_golden_hyperplanes():            # frozen: stable across versions and machines
    m = simindex.Hyperplanes(3, width=64, seed=0).matrix
    assert m[0, :2].tolist() == pytest.approx([0.46343130599142984, 1.1470287976208016],
                                              rel=1e-15)
    s = simindex.Hyperplanes(3, width=64, seed=0, distribution="sign").matrix
    assert s[0, :8].tolist() == [-1, -1, 1, -1, -1, -1, 1, 1]


@pytest.mark.parametrize("width", [64, 128, 256])
def test_bit_i_is_the_sign_of_the_dot_product_with_hyperplane_i(width):
    rng = np.random.default_rng(width)
    X = rng.standard_normal((200, 40))
    h = simindex.Hyperplanes(40, width=width, seed=9)
    fps = h.fingerprints(X)
    assert fps.shape == ((200,) if width == 64 else (200, width // 64)) and fps.dtype == np.uint64
    for row, fp in zip(X[:20], as_ints(fps)):
        for i in range(width):
            dot = math.fsum(float(row[j]) * float(h.matrix[j, i]) for j in range(40))
            if abs(dot) > 1e-9:                      # clear of rounding
                assert (fp >> i) & 1 == (dot > 0)
    assert h.fingerprint(X[3]) == as_ints(fps)[3]


@pytest.mark.parametrize("width", [64, 256])
def test_sparse_and_dense_documents_get_the_same_signatures(width):
    rng = np.random.default_rng(3)
    dense = rng.random((300, 500)) * (rng.random((300, 500)) < 0.05)
    dense[:, 0] += 0.1                                # no empty row
    h = simindex.Hyperplanes(500, width=width, seed=1)
    assert np.array_equal(h.fingerprints(dense), h.fingerprints(sp.csr_matrix(dense)))
    assert np.array_equal(h.fingerprints(dense), h.fingerprints(sp.csc_array(dense)))


def test_batches_do_not_change_the_result():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((20_000, 8))               # more rows than one batch
    h = simindex.Hyperplanes(8, width=128)
    whole = h.fingerprints(X)
    assert np.array_equal(whole[9000:9100], h.fingerprints(X[9000:9100]))


@pytest.mark.parametrize("width", [64, 128, 256])
def test_the_distance_follows_the_binomial_law_of_the_angle(width):
    rng = np.random.default_rng(11)
    a = rng.standard_normal((3000, 200))
    b = a + 0.6 * rng.standard_normal((3000, 200))
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    h = simindex.Hyperplanes(200, width=width, seed=2)
    d = distances(h.fingerprints(a), h.fingerprints(b))
    p = np.arccos(cos) / np.pi
    expected, var = (width * p).sum(), (width * p * (1 - p)).sum()
    assert abs(d.sum() - expected) < 5 * math.sqrt(var)   # fixed seed: deterministic


# ---------------------------------------------------------------- simhash_rows: word vectors


@pytest.mark.parametrize("width", [64, 128, 256])
def test_simhash_rows_equals_simhash_of_each_row(width):
    rng = np.random.default_rng(width + 1)
    counts = (rng.random((60, 300)) < 0.05) * rng.integers(1, 6, size=(60, 300))
    counts[:, 7] += 1
    vocab = [f"word{j}" for j in range(300)]
    fps = as_ints(simindex.simhash_rows(sp.csr_matrix(counts.astype(float)), vocab,
                                        width=width))
    for r in range(60):
        row = {vocab[j]: int(counts[r, j]) for j in np.nonzero(counts[r])[0]}
        assert fps[r] == simindex.simhash(row, width=width)
    dense = simindex.simhash_rows(counts, vocab, width=width)
    assert as_ints(dense) == fps
    named = simindex.simhash_rows(counts, None, width=width, hash="sha256" if width > 128
                                  else "md5")
    row0 = {str(j): int(counts[0, j]) for j in np.nonzero(counts[0])[0]}
    assert as_ints(named)[0] == simindex.simhash(
        row0, width=width, hash="sha256" if width > 128 else "md5")


def test_simhash_rows_takes_any_finite_weight():
    X = np.array([[1.0, -2.0, 0.5], [-1.0, 0.0, 0.0]])
    vocab = ["a", "b", "c"]
    fps = simindex.simhash_rows(X, vocab, width=64)
    hashes = simindex.signatures.fingerprints.token_hashes(vocab, "xxh3", 64)[:, 0]
    for r in range(2):
        v = [sum(X[r, j] * (1 if (int(hashes[j]) >> i) & 1 else -1) for j in range(3))
             for i in range(64)]
        assert int(fps[r]) == sum(1 << i for i in range(64) if v[i] > 0)


# ---------------------------------------------------------------- errors


def test_bad_vectors_name_the_row():
    h = simindex.Hyperplanes(3)
    with pytest.raises(simindex.InputError, match="row 2 is all zeros"):
        h.fingerprints(np.array([[1, 0, 0], [0, 1, 0], [0, 0, 0]]))
    with pytest.raises(simindex.InputError, match="row 1 has a value that is not finite"):
        h.fingerprints(np.array([[1, 0, 0], [0, np.nan, 0]]))
    with pytest.raises(simindex.InputError, match="row 1 has a value that is not finite"):
        h.fingerprints(sp.csr_matrix(np.array([[1, 0, 0], [0, np.inf, 0]])))
    with pytest.raises(simindex.InputError, match="row 1 is all zeros"):
        h.fingerprints(sp.csr_matrix(np.array([[1, 0, 0], [0, 0, 0]])))
    with pytest.raises(simindex.InputError, match="4 columns; this projector has dim = 3"):
        h.fingerprints(np.ones((2, 4)))
    with pytest.raises(simindex.InputError, match="one vector, got 2 rows"):
        h.fingerprint(np.ones((2, 3)))
    with pytest.raises(simindex.InputTypeError, match="numeric array"):
        h.fingerprints([["a", "b", "c"]])
    with pytest.raises(simindex.InputError, match="row 0 is all zeros"):
        simindex.simhash_rows(np.zeros((1, 2)), ["a", "b"])
    with pytest.raises(simindex.InputError, match="vocabulary is 1 words; the matrix has 2"):
        simindex.simhash_rows(np.ones((1, 2)), ["a"])
    with pytest.raises(simindex.InputTypeError, match="vocabulary entry 1 must be str"):
        simindex.simhash_rows(np.ones((1, 2)), ["a", 3])


def test_bad_projector_parameters():
    with pytest.raises(simindex.ParameterError, match="distribution must be one of"):
        simindex.Hyperplanes(3, distribution="uniform")
    with pytest.raises(simindex.ParameterError, match="not supported"):
        simindex.Hyperplanes(3, width=100)
    with pytest.raises(simindex.ParameterTypeError, match="dim must be an int"):
        simindex.Hyperplanes(3.0)
    with pytest.raises(simindex.ParameterError, match="dim must be >= 1"):
        simindex.Hyperplanes(0)
    with pytest.raises(simindex.ParameterError, match="seed must be in"):
        simindex.Hyperplanes(3, seed=-1)


# ---------------------------------------------------------------- cosine and radius


@pytest.mark.parametrize("width", [64, 128, 256])
def test_match_probability_is_the_binomial_cdf(width):
    for cos in (0.99, 0.9, 0.7, 0.3, 0.0):
        p = math.acos(cos) / math.pi
        for k in (0, 3, width // 8, width // 4, width):
            assert simindex.match_probability(cos, k, width) == pytest.approx(
                binom.cdf(k, width, p), abs=1e-12)


@pytest.mark.parametrize("width", [64, 128, 256])
def test_radius_and_cosine_are_inverse(width):
    for cos in (0.98, 0.95, 0.9, 0.8, 0.7):
        for recall in (0.9, 0.99):
            k = simindex.radius_for_cosine(cos, width, recall)
            assert simindex.match_probability(cos, k, width) >= recall
            if k:
                assert simindex.match_probability(cos, k - 1, width) < recall
            low = simindex.cosine_for_radius(k, width, recall)
            assert low <= cos + 1e-12
            assert simindex.match_probability(low, k, width) >= recall - 1e-9
    assert simindex.cosine_for_radius(width, width) == -1.0


def test_cosine_helper_errors():
    with pytest.raises(simindex.ParameterError, match="cosine must be a number in"):
        simindex.radius_for_cosine(1.5, 64)
    with pytest.raises(simindex.ParameterError, match="recall must be a number in"):
        simindex.radius_for_cosine(0.9, 64, recall=1.0)
    with pytest.raises(simindex.ParameterError, match="k must be in"):
        simindex.cosine_for_radius(65, 64)


@pytest.mark.parametrize("width", [128, 256])
def test_a_row_of_the_signature_array_is_a_fingerprint_in_every_call(tmp_path, width):
    """Hyperplanes.fingerprints gives an (n, words) array; one of its rows is a fingerprint
    for add, query and add_unique, as the int of its words would be."""
    h = simindex.Hyperplanes(dim=8, width=width, seed=1)
    fps = h.fingerprints(np.random.default_rng(0).normal(size=(6, 8)))
    as_int = [int.from_bytes(r.astype(">u8").tobytes(), "big") for r in fps]
    with simindex.Index(tmp_path / "i", width=width, k=8) as idx:
        idx.add_many([str(i) for i in range(5)], fps[:5])
        assert [m.id for m in idx.query(fps[3])] == [m.id for m in idx.query(as_int[3])]
        idx.add("row", fps[5])
        assert idx.get("row").fingerprint == as_int[5]
        assert [m.id for m in idx.add_unique("again", fps[5])] == ["row"]
        with pytest.raises(simindex.InputTypeError, match="row of .* uint64 words"):
            idx.query(fps[3].astype(np.int64))
        with pytest.raises(simindex.InputTypeError, match="row of .* uint64 words"):
            idx.query(fps[3][:1])
