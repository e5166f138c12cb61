"""Fingerprints from vectors and the arithmetic between cosine and radius.

Two ways to sign a document vector with `width` bits, both in batch:
- `Hyperplanes`: bit i is the sign of the vector's dot product with random hyperplane i
  (Hyperplanes), for dense arrays and SciPy sparse matrices, by one matrix product (BLAS).
- `simhash_rows`: each word of a documents x words matrix votes with its own pseudo-random
  +-1 vector, a hash of the word, times its weight (simhash_rows): the row's simhash.
For Gaussian hyperplanes the distance between two signatures is Binomial(width, theta/pi),
theta the angle between the vectors; `radius_for_cosine` and `cosine_for_radius` turn a
cosine threshold into the radius k that finds such pairs with a given recall, and back.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional, Sequence

import numpy as np

from . import _fingerprint
from ..errors import InputError, InputTypeError, ParameterError, ParameterTypeError
from .fingerprints import HashArg, check_width, token_hashes

DISTRIBUTIONS = ("normal", "sign")
_BATCH = 8192


def _int_param(name, v, low, high=None):
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ParameterTypeError(f"{name} must be an int, got {type(v).__name__} {v!r:.40}")
    v = int(v)
    if v < low or (high is not None and v > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ParameterError(f"{name} must be {bound}, got {v}")
    return v


def _is_sparse(x):
    try:
        import scipy.sparse as sp
    except ImportError:
        return False
    return sp.issparse(x)


def _pack(positive, width):
    """Bit i (value 2**i) of each row from column i of a boolean (n, width) array, as an
    (n,) uint64 array at width 64 and (n, width/64) most significant word first above."""
    raw = np.packbits(positive[:, ::-1], axis=1)      # column width-1 is the first bit
    words = raw.view(">u8").astype(np.uint64)
    return words[:, 0] if width == 64 else words


def _check_rows(x, start):
    """InputError naming the first row that is not finite or is all zeros."""
    if _is_sparse(x):
        csr = x.tocsr()
        bad = ~np.isfinite(csr.data)
        if bad.any():
            row = int(np.searchsorted(csr.indptr, int(np.argmax(bad)), side="right")) - 1
            raise InputError(f"row {start + row} has a value that is not finite")
        mass = np.asarray(abs(csr).sum(axis=1)).ravel()
    else:
        finite = np.isfinite(x).all(axis=1)
        if not finite.all():
            raise InputError(f"row {start + int(np.argmin(finite))} has a value that is "
                             f"not finite")
        mass = np.abs(x).sum(axis=1)
    if mass.size and not mass.all():
        raise InputError(f"row {start + int(np.argmin(mass != 0))} is all zeros: a zero "
                         f"vector has no direction, so no signature")


def _matrix(X, dim_name, dim):
    """X as a 2-d float64 array or a SciPy sparse matrix, its column count checked."""
    if _is_sparse(X):
        if X.ndim != 2:
            raise InputError(f"a sparse matrix of documents must be 2-d, got {X.ndim}-d")
        X = X.tocsr()
    else:
        try:
            X = np.asarray(X, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise InputTypeError(f"vectors must be a numeric array or a SciPy sparse "
                                 f"matrix: {e}") from None
        if X.ndim == 1:
            X = X.reshape(1, -1)
        if X.ndim != 2:
            raise InputError(f"vectors must be a 2-d array (documents x {dim_name}), got "
                             f"shape {X.shape}")
    if dim is not None and X.shape[1] != dim:
        raise InputError(f"vectors have {X.shape[1]} columns; this projector has "
                         f"{dim_name} = {dim}")
    return X


class Hyperplanes:
    """A deterministic set of `width` random hyperplanes in `dim` dimensions:
    fingerprint bit i is set when the vector's dot product with hyperplane i is
    positive (zero leaves it clear).

    The hyperplanes are a pure function of (dim, width, seed, distribution): element
    e = row * width + column is drawn from splitmix64's output function of mix(seed) + 2e
    (and + 2e + 1), "sign" as +1 or -1 from the first draw's top bit (exact everywhere),
    "normal" by Box-Muller from the two (the C library's log and cos; equal across
    machines up to the last bit of a few values). "normal" gives the exact law
    distance ~ Binomial(width, angle/pi) that `radius_for_cosine` uses; "sign" is seed
    004's choice and close to it for vectors with many nonzero entries. The matrix takes
    8 * dim * width bytes, made on first use.
    """

    def __init__(self, dim: int, *, width: int = 64, seed: int = 0,
                 distribution: str = "normal") -> None:
        self.dim = _int_param("dim", dim, 1)
        check_width(width)
        self.width = width
        self.seed = _int_param("seed", seed, 0, (1 << 64) - 1)
        if distribution not in DISTRIBUTIONS:
            raise ParameterError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, "
                                 f"got {distribution!r}")
        self.distribution = distribution
        self._matrix: Optional[np.ndarray] = None

    def __repr__(self) -> str:
        return (f"Hyperplanes(dim={self.dim}, width={self.width}, seed={self.seed}, "
                f"distribution={self.distribution!r})")

    @property
    def matrix(self) -> np.ndarray:
        """The (dim, width) float64 hyperplanes, column i the normal of hyperplane i."""
        if self._matrix is None:
            self._matrix = _fingerprint.hyperplanes(self.dim, self.width, self.seed,
                                                    self.distribution == "normal")
            self._matrix.flags.writeable = False
        return self._matrix

    def fingerprints(self, X: Any) -> np.ndarray:
        """The fingerprints of the rows of X (a (n, dim) array or SciPy sparse matrix):
        an (n,) uint64 array at width 64, (n, width/64) most significant word first above,
        ready for Index.add_many. A row that is all zeros or not finite is an InputError."""
        X = _matrix(X, "dim", self.dim)
        R = self.matrix
        parts = []
        for start in range(0, X.shape[0], _BATCH):
            x = X[start:start + _BATCH]
            _check_rows(x, start)
            parts.append(_pack(np.asarray(x @ R) > 0, self.width))
        if not parts:
            return np.zeros((0,) if self.width == 64 else (0, self.width // 64), np.uint64)
        return np.concatenate(parts)

    def fingerprint(self, x: Any) -> int:
        """The fingerprint of one vector, as an int."""
        X = _matrix(x, "dim", self.dim)
        if X.shape[0] != 1:
            raise InputError(f"fingerprint() takes one vector, got {X.shape[0]} rows; use "
                             f"fingerprints()")
        return _words_int(self.fingerprints(X))


def _words_int(fps):
    row = fps.reshape(1, -1)[0]
    v = 0
    for w in row.tolist():
        v = (v << 64) | w
    return v


def simhash_rows(X: Any, vocabulary: Optional[Sequence[Any]] = None, *, width: int = 64,
                 hash: HashArg = None) -> np.ndarray:
    """The simhash of each row of a documents x words matrix: word j
    votes with the bits of its token hash (a +-1 vector) times the row's value, any finite
    weight (1, tf, tf-idf ...; negative ones too). For weights >= 0, row r equals
    simhash(dict of vocabulary[j] -> X[r, j] over its nonzero entries, width=width,
    hash=hash) up to float rounding at exact ties (simhash refuses negative weights).

    `vocabulary[j]` is the word (str or bytes) of column j, so a word has the same vector
    in every corpus; None names column j by str(j). Returns what Hyperplanes.fingerprints
    returns. A row with no nonzero value is an InputError.
    """
    check_width(width)
    X = _matrix(X, "words", None)
    if vocabulary is None:
        vocabulary = [str(j) for j in range(X.shape[1])]
    elif isinstance(vocabulary, (str, bytes)) or len(vocabulary) != X.shape[1]:
        n = "a string" if isinstance(vocabulary, (str, bytes)) else f"{len(vocabulary)} words"
        raise InputError(f"vocabulary is {n}; the matrix has {X.shape[1]} columns")
    for j, w in enumerate(vocabulary):
        if not isinstance(w, (str, bytes)):
            raise InputTypeError(f"vocabulary entry {j} must be str or bytes, got "
                                 f"{type(w).__name__} {w!r:.40}")
    from .fingerprints import DEFAULT_HASH
    hashes = token_hashes(list(vocabulary), DEFAULT_HASH[width] if hash is None else hash,
                           width)
    parts = []
    for start in range(0, X.shape[0], _BATCH):
        x = X[start:start + _BATCH]
        _check_rows(x, start)
        if _is_sparse(x):
            csr = x.tocsr()
            csr.sort_indices()
            indptr, indices, data = csr.indptr, csr.indices, csr.data
        else:
            rows, cols = np.nonzero(x)
            indptr = np.searchsorted(rows, np.arange(x.shape[0] + 1))
            indices, data = cols, x[rows, cols]
        out = _fingerprint.vote_rows(np.ascontiguousarray(indptr, np.int64),
                                     np.ascontiguousarray(indices, np.int64),
                                     np.ascontiguousarray(data, np.float64), hashes)
        parts.append(out[:, 0] if width == 64 else out)
    if not parts:
        return np.zeros((0,) if width == 64 else (0, width // 64), np.uint64)
    return np.concatenate(parts)


# ---------------------------------------------------------------- cosine and radius


def _probability(p, k, width):
    """P[Binomial(width, p) <= k]."""
    if p <= 0:
        return 1.0
    if p >= 1:
        return 1.0 if k >= width else 0.0
    return min(1.0, sum(math.comb(width, i) * p ** i * (1 - p) ** (width - i)
                        for i in range(k + 1)))


def _cosine(c):
    if isinstance(c, bool) or not isinstance(c, numbers.Real) or not -1 <= c <= 1:
        raise ParameterError(f"cosine must be a number in [-1, 1], got {c!r}")
    return float(c)


def _recall(r):
    if isinstance(r, bool) or not isinstance(r, numbers.Real) or not 0 < r < 1:
        raise ParameterError(f"recall must be a number in (0, 1), got {r!r}")
    return float(r)


def match_probability(cosine: float, k: int, width: int) -> float:
    """The probability that two vectors at this cosine get Gaussian-hyperplane signatures
    within k bits: P[Binomial(width, arccos(cosine)/pi) <= k]."""
    check_width(width)
    k = _int_param("k", k, 0, width)
    return _probability(math.acos(_cosine(cosine)) / math.pi, k, width)


def radius_for_cosine(cosine: float, width: int, recall: float = 0.99) -> int:
    """The smallest k that finds a pair at `cosine` (so any pair at least as close) with
    probability >= recall, for `width`-bit Gaussian-hyperplane signatures."""
    check_width(width)
    p, r = math.acos(_cosine(cosine)) / math.pi, _recall(recall)
    for k in range(width + 1):
        if _probability(p, k, width) >= r:
            return k
    return width


def cosine_for_radius(k: int, width: int, recall: float = 0.99) -> float:
    """The lowest cosine at which a pair is found within k bits with probability >=
    recall (the inverse of radius_for_cosine), for `width`-bit Gaussian signatures."""
    check_width(width)
    k, r = _int_param("k", k, 0, width), _recall(recall)
    lo, hi = 0.0, 1.0                 # angle/pi: found at lo, maybe not at hi
    if _probability(hi, k, width) >= r:
        return -1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if _probability(mid, k, width) >= r:
            lo = mid
        else:
            hi = mid
    return math.cos(lo * math.pi)
