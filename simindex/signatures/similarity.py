"""Jaccard similarity of a scheme's shingles, exact and from a compact sketch: the check
`simindex dedup --min-similarity` applies to candidates the bit distance finds.

A text's shingles are its scheme's tokens in windows of the scheme's shingle width, each
window's tokens joined by single spaces and hashed with xxh3 (64 bits). The sketch of a
text is the SKETCH smallest distinct high 32-bit halves of those hashes, as big-endian
u32 (at most 4 * SKETCH bytes, the whole set for a short text); the Jaccard estimate of
two sketches is the bottom-k estimator: of the SKETCH smallest values of their union, the
share found in both. Its standard error is about sqrt(J (1 - J) / SKETCH): 0.04 at
J = 0.5 with SKETCH = 128.
"""

from __future__ import annotations

from typing import Optional, Union

import numpy as np

from . import _fingerprint, _text
from ..errors import InputError
from .fingerprints import (
    HASHES, WORD_SCHEMES, Scheme, _scheme, _text_arg, fingerprint, pass_args, scheme_width,
    shingles, tokenize,
)

SKETCH = 128                # values kept per sketch: 512 bytes at most
_XXH3 = HASHES["xxh3"][0]  # the compiled hash kind of xxh3-64


def shingle_set(text: str, scheme: Union[str, Scheme]) -> np.ndarray:
    """The sorted distinct 64-bit hashes of a text's shingles under a scheme: xxh3 of each
    shingle's tokens joined by single spaces (no scheme's tokens hold a space)."""
    s = _scheme(scheme)
    if s.name in WORD_SCHEMES:            # compiled: the pass that makes their codes
        hashes = _text.signature(_text_arg(text), s.shingle_width, shingles=True)[2]
        assert hashes is not None
        return _text.sorted_set(hashes)
    items = [" ".join(sh).encode("utf-8", "surrogatepass")
             for sh in shingles(tokenize(text, scheme=s), s.shingle_width)]
    if not items:
        return np.empty(0, dtype=np.uint64)
    return np.unique(_fingerprint.hash_many(items, _XXH3, 1).reshape(-1))


def fingerprint_and_set(text: str, scheme: Union[str, Scheme], width: int) -> tuple:
    """(fingerprint, shingle set) of a text, from one pass for the compiled schemes."""
    s = _scheme(scheme)
    if s.name not in WORD_SCHEMES:
        return fingerprint(text, scheme=s, width=width), shingle_set(text, s)
    fp, windows, hashes = _text.signature(_text_arg(text), s.shingle_width, shingles=True,
                                          **pass_args(s.name, scheme_width(s, width)))
    if not windows:
        raise InputError(f"text has no tokens under scheme {s.name!r} (empty, or no word "
                         f"characters): it has no fingerprint")
    assert hashes is not None
    return fp, _text.sorted_set(hashes)


def estimate(measure: str, a_sketch: bytes, a_size: int, b_sketch: bytes,
             b_size: Optional[int], symmetric: bool = False) -> float:
    """A text's similarity to a stored one from their sketches: Jaccard, or ("containment")
    the share of the text's shingles found in the other (of the smaller set's, symmetric),
    derived from the Jaccard estimate and the set sizes (b_size None: taken as a_size)."""
    j = sketch_jaccard(a_sketch, b_sketch)
    if measure == "jaccard":
        return j
    nb = a_size if b_size is None else b_size
    inter = j * (a_size + nb) / (1 + j)
    return min(1.0, inter / max(min(a_size, nb) if symmetric else a_size, 1))


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard similarity of two shingle sets (sorted distinct arrays)."""
    if not len(a) and not len(b):
        return 1.0
    inter = _text.intersection_size(a, b)
    return inter / (len(a) + len(b) - inter)


def sketch(shingles_: np.ndarray) -> bytes:
    """The bottom-SKETCH sketch of a shingle set (see the module's docstring)."""
    top = np.unique((shingles_ >> np.uint64(32)).astype(np.uint32))[:SKETCH]
    return top.astype(">u4").tobytes()


def sketch_jaccard(a: bytes, b: bytes) -> float:
    """The Jaccard estimate of two sketches (exact when both hold whole sets)."""
    x = np.frombuffer(a, dtype=">u4")
    y = np.frombuffer(b, dtype=">u4")
    if not len(x) and not len(y):
        return 1.0
    union = np.union1d(x, y)
    whole = len(x) < SKETCH and len(y) < SKETCH   # both sets whole: count them all
    bottom = union if whole else union[:SKETCH]
    both = np.intersect1d(x, y, assume_unique=True)
    return len(np.intersect1d(bottom, both, assume_unique=True)) / len(bottom)
