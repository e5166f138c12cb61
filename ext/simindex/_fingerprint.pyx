# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled part of fingerprinting: token hashing (xxh3) and the simhash bit vote.

Python (simindex/fingerprints.py) normalizes and tokenizes text with the regex engine, joins
the tokens with single spaces and hands the bytes here once per document: this module cuts
them into shingles, hashes each, and accumulates the votes, so no Python object is made
per token.
"""

import numpy as np

from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport malloc, free
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

cdef extern from *:
    """
    #define XXH_INLINE_ALL
    #include <xxhash.h>
    #include <stdint.h>
    static inline uint64_t si_xxh3(const void *p, size_t n) { return (uint64_t)XXH3_64bits(p, n); }
    """
    uint64_t si_xxh3(const void *p, size_t n) nogil

DEF WIDTH = 64


cdef inline uint64_t _vote(const int64_t *v) noexcept nogil:
    """Bit i is set when its vote is strictly positive; a tie leaves it clear."""
    cdef uint64_t r = 0
    cdef int i
    for i in range(WIDTH):
        if v[i] > 0:
            r |= (<uint64_t>1) << i
    return r


cdef inline void _add(int64_t *v, uint64_t h, int64_t w) noexcept nogil:
    cdef int i
    for i in range(WIDTH):
        if (h >> i) & 1:
            v[i] += w
        else:
            v[i] -= w


def xxh3(bytes data):
    """The xxh3-64 hash (seed 0) of `data`, as an unsigned int."""
    return si_xxh3(PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


def xxh3_many(list items):
    """xxh3-64 of each bytes object in `items`, as a uint64 array."""
    cdef Py_ssize_t i, n = len(items)
    cdef bytes b
    out = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    for i in range(n):
        b = items[i]
        o[i] = si_xxh3(PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))
    return out


def vote(const uint64_t[::1] hashes, weights=None):
    """The simhash of token hashes: bit i set when sum(+w if bit i of h else -w) > 0.

    `weights` is None (1 each), an int64 array (exact), or a float64 array.
    """
    cdef Py_ssize_t j, n = hashes.shape[0]
    cdef int64_t v[WIDTH]
    cdef double f[WIDTH]
    cdef const int64_t[::1] wi
    cdef const double[::1] wf
    cdef int i
    cdef uint64_t r = 0, h
    cdef double w
    if weights is None:
        for i in range(WIDTH):
            v[i] = 0
        with nogil:
            for j in range(n):
                _add(v, hashes[j], 1)
            r = _vote(v)
        return r
    if weights.dtype == np.int64:
        wi = weights
        if wi.shape[0] != n:
            raise ValueError("hashes and weights differ in length")
        for i in range(WIDTH):
            v[i] = 0
        with nogil:
            for j in range(n):
                _add(v, hashes[j], wi[j])
            r = _vote(v)
        return r
    wf = weights
    if wf.shape[0] != n:
        raise ValueError("hashes and weights differ in length")
    for i in range(WIDTH):
        f[i] = 0.0
    with nogil:
        for j in range(n):
            h = hashes[j]
            w = wf[j]
            for i in range(WIDTH):
                if (h >> i) & 1:
                    f[i] += w
                else:
                    f[i] -= w
        for i in range(WIDTH):
            if f[i] > 0:
                r |= (<uint64_t>1) << i
    return r


def shingle_vote(bytes joined, int width):
    """simhash of the xxh3-64 hashes of every `width`-token window of `joined`.

    `joined` is the tokens (none containing a space) joined by single spaces, so a window
    is the bytes from its first token's start to its last token's end, exactly what
    " ".join(window) would give. Fewer tokens than `width` make one window of them all.
    Returns (fingerprint, number of windows); 0 windows when there are no tokens.
    """
    cdef const char *p = PyBytes_AS_STRING(joined)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(joined), i, t = 0, ntok = 0
    cdef Py_ssize_t *start
    cdef Py_ssize_t *end
    cdef int64_t v[WIDTH]
    cdef Py_ssize_t windows = 0
    cdef uint64_t r = 0
    cdef int k
    if width < 1:
        raise ValueError("width must be at least 1")
    for k in range(WIDTH):
        v[k] = 0
    start = <Py_ssize_t *>malloc((n // 2 + 2) * sizeof(Py_ssize_t))
    end = <Py_ssize_t *>malloc((n // 2 + 2) * sizeof(Py_ssize_t))
    if start == NULL or end == NULL:
        free(start)
        free(end)
        raise MemoryError()
    try:
        with nogil:
            i = 0
            while i < n:
                while i < n and p[i] == b' ':
                    i += 1
                if i >= n:
                    break
                start[ntok] = i
                while i < n and p[i] != b' ':
                    i += 1
                end[ntok] = i
                ntok += 1
            if ntok > 0 and ntok < width:
                _add(v, si_xxh3(p + start[0], end[ntok - 1] - start[0]), 1)
                windows = 1
            else:
                for t in range(ntok - width + 1):
                    _add(v, si_xxh3(p + start[t], end[t + width - 1] - start[t]), 1)
                    windows += 1
            r = _vote(v)
    finally:
        free(start)
        free(end)
    return r, windows
