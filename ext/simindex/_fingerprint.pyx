# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled part of fingerprinting: token hashing (xxh3) and the simhash bit vote.

Python (simindex/fingerprints.py) normalizes and tokenizes text with the regex engine, joins
the tokens with single spaces and hands the bytes here once per document: this module cuts
them into shingles, hashes each, and accumulates the votes, so no Python object is made
per token.
"""

import numpy as np

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport (
    PyUnicode_KIND, PyUnicode_DATA, PyUnicode_READ, Py_UNICODE_ISALNUM,
)

cdef extern from *:
    """
    #define XXH_INLINE_ALL
    #include <xxhash.h>
    #include <stdint.h>
    #define OPENSSL_SUPPRESS_DEPRECATED
    #include <openssl/md5.h>
    static inline uint64_t si_xxh3(const void *p, size_t n) { return (uint64_t)XXH3_64bits(p, n); }
    static inline uint64_t si_be64(const unsigned char *d) {
        uint64_t v = 0;
        for (int i = 0; i < 8; i++) v = (v << 8) | d[i];
        return v;
    }
    /* hash kinds: 0 xxh3, 1 md5 last 8 bytes (PyPI simhash), 2 md5 first 8 (simhash-py) */
    static inline uint64_t si_hash(int kind, const void *p, size_t n) {
        unsigned char d[MD5_DIGEST_LENGTH];
        if (kind == 0) return (uint64_t)XXH3_64bits(p, n);
        MD5((const unsigned char *)p, n, d);
        return kind == 1 ? si_be64(d + 8) : si_be64(d);
    }
    """
    uint64_t si_xxh3(const void *p, size_t n) nogil
    uint64_t si_hash(int kind, const void *p, size_t n) nogil

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


cdef int _shingle_vote_buf(const char *p, Py_ssize_t n, int width, uint64_t *out,
                           Py_ssize_t *windows, int kind=0) noexcept nogil:
    """The vote over the hash of every `width`-token window of space-separated tokens."""
    cdef Py_ssize_t i, t, ntok = 0
    cdef Py_ssize_t *start = <Py_ssize_t *>malloc((n // 2 + 2) * sizeof(Py_ssize_t))
    cdef Py_ssize_t *end = <Py_ssize_t *>malloc((n // 2 + 2) * sizeof(Py_ssize_t))
    cdef int64_t v[WIDTH]
    cdef int k
    if start == NULL or end == NULL:
        free(start)
        free(end)
        return -1
    for k in range(WIDTH):
        v[k] = 0
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
    windows[0] = 0
    if ntok > 0 and ntok < width:
        _add(v, si_hash(kind, p + start[0], end[ntok - 1] - start[0]), 1)
        windows[0] = 1
    else:
        for t in range(ntok - width + 1):
            _add(v, si_hash(kind, p + start[t], end[t + width - 1] - start[t]), 1)
            windows[0] += 1
    out[0] = _vote(v)
    free(start)
    free(end)
    return 0


def shingle_vote(bytes joined not None, int width, int kind=0):
    """simhash of the xxh3-64 hashes of every `width`-token window of `joined`.

    `joined` is the tokens (none containing a space) joined by single spaces, so a window
    is the bytes from its first token's start to its last token's end, exactly what
    " ".join(window) would give. Fewer tokens than `width` make one window of them all.
    Returns (fingerprint, number of windows); 0 windows when there are no tokens.
    """
    cdef uint64_t r = 0
    cdef Py_ssize_t windows = 0
    cdef int rc
    cdef const char *p = PyBytes_AS_STRING(joined)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(joined)
    if width < 1:
        raise ValueError("width must be at least 1")
    with nogil:
        rc = _shingle_vote_buf(p, n, width, &r, &windows, kind)
    if rc:
        raise MemoryError()
    return r, windows


def char_gram_vote(bytes utf8 not None, int width, int kind=1):
    """The vote over the hash of every `width`-character window of UTF-8 text, one per
    occurrence (so a gram seen n times weighs n). Fewer characters: one window of all.
    Returns (fingerprint, windows)."""
    cdef const char *p = PyBytes_AS_STRING(utf8)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(utf8), i, nc = 0, t
    cdef Py_ssize_t *off = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
    cdef int64_t v[WIDTH]
    cdef Py_ssize_t windows = 0
    cdef uint64_t r = 0
    cdef int k
    if width < 1:
        free(off)
        raise ValueError("width must be at least 1")
    if off == NULL:
        raise MemoryError()
    for k in range(WIDTH):
        v[k] = 0
    with nogil:
        for i in range(n):
            if (<unsigned char>p[i] & 0xC0) != 0x80:      # a character starts here
                off[nc] = i
                nc += 1
        off[nc] = n
        if 0 < nc < width:
            _add(v, si_hash(kind, p, n), 1)
            windows = 1
        else:
            for t in range(nc - width + 1):
                _add(v, si_hash(kind, p + off[t], off[t + width] - off[t]), 1)
                windows += 1
        r = _vote(v)
    free(off)
    return r, windows


cdef inline bint _is_cjk(uint32_t c) noexcept nogil:
    return (0x3040 <= c <= 0x30FF or 0x3400 <= c <= 0x4DBF or 0x4E00 <= c <= 0x9FFF or
            0xF900 <= c <= 0xFAFF or 0x20000 <= c <= 0x2FA1F)


cdef inline Py_ssize_t _utf8(uint32_t c, char *o) noexcept nogil:
    if c < 0x80:
        o[0] = <char>c
        return 1
    if c < 0x800:
        o[0] = <char>(0xC0 | (c >> 6))
        o[1] = <char>(0x80 | (c & 0x3F))
        return 2
    if c < 0x10000:
        o[0] = <char>(0xE0 | (c >> 12))
        o[1] = <char>(0x80 | ((c >> 6) & 0x3F))
        o[2] = <char>(0x80 | (c & 0x3F))
        return 3
    o[0] = <char>(0xF0 | (c >> 18))
    o[1] = <char>(0x80 | ((c >> 12) & 0x3F))
    o[2] = <char>(0x80 | ((c >> 6) & 0x3F))
    o[3] = <char>(0x80 | (c & 0x3F))
    return 4


def word_vote(str text not None, int width):
    """simindex-v1's tokenize + shingle + hash + vote in one pass over normalized text.

    Tokens are runs of word characters (what regex \\w matches: str.isalnum() or "_"),
    and each character of the Han/Kana ranges a token of its own, word character or not; they are written as UTF-8 joined by
    single spaces and voted on as in shingle_vote(). Returns (fingerprint, windows).
    """
    cdef Py_ssize_t n = len(text), i, o = 0
    cdef int kind = PyUnicode_KIND(text)
    cdef const void *data = PyUnicode_DATA(text)
    cdef char *buf = <char *>malloc(4 * n + n + 1)
    cdef uint32_t c
    cdef bint in_word = False, word
    cdef uint64_t r = 0
    cdef Py_ssize_t windows = 0
    cdef int rc
    if buf == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            c = PyUnicode_READ(kind, data, i)
            word = Py_UNICODE_ISALNUM(c) or c == 0x5F
            if _is_cjk(c):                       # every character of these ranges
                if o:
                    buf[o] = b' '
                    o += 1
                o += _utf8(c, buf + o)
                in_word = False
            elif word:
                if not in_word and o:
                    buf[o] = b' '
                    o += 1
                o += _utf8(c, buf + o)
                in_word = True
            else:
                in_word = False
        with nogil:
            rc = _shingle_vote_buf(buf, o, width, &r, &windows)
        if rc:
            raise MemoryError()
        return r, windows
    finally:
        free(buf)
