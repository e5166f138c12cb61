# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled part of fingerprinting features and of the compatibility schemes
(pypi-simhash, seomoz-simhash and md5-128-notebook; simindex/signatures/fingerprints.py names them):
token hashing and the simhash bit vote at 64, 128 and 256 bits, the vote over the shingles of
space-joined tokens or of characters, and the generator of random hyperplanes. (The schemes
of casefolded words, simindex-v1 and minhash-v1, read their texts in _text.)

A fingerprint of `words` 64-bit words is held most significant word first (word 0 holds bits
64*(words-1) .. 64*words-1); bit i of the fingerprint has the value 2**i.
"""

import numpy as np

cimport simindex.bits as bits

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy
from libc.math cimport sqrt, log, cos
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

cdef extern from *:
    """
    #define XXH_INLINE_ALL
    #include <xxhash.h>
    #include <stdint.h>
    #include <string.h>
    #define OPENSSL_SUPPRESS_DEPRECATED
    #include <openssl/md5.h>
    #include <openssl/sha.h>
    static inline uint64_t si_be64(const unsigned char *d) {
        uint64_t v = 0;
        for (int i = 0; i < 8; i++) v = (v << 8) | d[i];
        return v;
    }
    /* Token hash kinds (simindex/signatures/fingerprints.py names them), each with its natural width:
       0 xxh3-64; 1 md5 (128; pypi-simhash, md5-128-notebook); 2 md5-first8 (64, simhash-py:
       seomoz-simhash); 3 xxh3-128 (high word first);
       4 xxh3-128x2 (256: xxh3-128 with seed 0, then with seed 1); 5 sha256.
       si_hash writes the low `words` words of the hash, most significant first, so a hash
       wider than the signature gives its low bits (PyPI simhash's truncation). */
    static const int si_hash_words[6] = {1, 2, 1, 2, 4, 4};
    static inline void si_hash(int kind, const void *p, size_t n, uint64_t *out, int words) {
        unsigned char d[32];
        uint64_t h[4];
        int nat = si_hash_words[kind];
        XXH128_hash_t x;
        switch (kind) {
        case 0: h[0] = (uint64_t)XXH3_64bits(p, n); break;
        case 1: MD5((const unsigned char *)p, n, d); h[0] = si_be64(d); h[1] = si_be64(d + 8); break;
        case 2: MD5((const unsigned char *)p, n, d); h[0] = si_be64(d); break;
        case 3: x = XXH3_128bits(p, n); h[0] = x.high64; h[1] = x.low64; break;
        case 4: x = XXH3_128bits_withSeed(p, n, 0); h[0] = x.high64; h[1] = x.low64;
                x = XXH3_128bits_withSeed(p, n, 1); h[2] = x.high64; h[3] = x.low64; break;
        default: SHA256((const unsigned char *)p, n, d);
                 for (int i = 0; i < 4; i++) h[i] = si_be64(d + 8 * i);
        }
        memcpy(out, h + (nat - words), (size_t)words * 8);
    }
    /* splitmix64's output function: the generator of the hyperplanes. */
    static inline uint64_t si_mix64(uint64_t x) {
        x += 0x9E3779B97F4A7C15ULL;
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
        x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
        return x ^ (x >> 31);
    }
    """
    void si_hash(int kind, const void *p, size_t n, uint64_t *out, int words) nogil
    uint64_t si_mix64(uint64_t x) nogil
    const int *si_hash_words

DEF MAXW = 4                  # words of the widest fingerprint (256 bits)
DEF MAXBITS = 256


def hash_words(int kind):
    """The natural width, in 64-bit words, of a token hash kind."""
    if not 0 <= kind < 6:
        raise ValueError(f"unknown hash kind {kind}")
    return si_hash_words[kind]


cdef inline void _zero(int64_t *v, int words) noexcept nogil:
    cdef int i
    for i in range(64 * words):
        v[i] = 0


cdef inline void _add(int64_t *v, const uint64_t *h, int words, int64_t w) noexcept nogil:
    """Add +w to the vote of every set bit of the hash and -w to every clear one."""
    cdef int q, i
    cdef uint64_t x
    cdef int64_t *b
    for q in range(words):
        x = h[q]
        b = v + 64 * (words - 1 - q)
        for i in range(64):
            if (x >> i) & 1:
                b[i] += w
            else:
                b[i] -= w


cdef inline void _vote(const int64_t *v, int words, uint64_t *out) noexcept nogil:
    """Bit i is set when its vote is strictly positive; a tie leaves it clear."""
    cdef int q, i
    cdef uint64_t r
    cdef const int64_t *b
    for q in range(words):
        r = 0
        b = v + 64 * (words - 1 - q)
        for i in range(64):
            if b[i] > 0:
                r |= (<uint64_t>1) << i
        out[q] = r


cdef inline object _to_int(const uint64_t *r, int words):
    return bits.words_int(r, words)


cdef int _check_words(int words) except -1:
    if words != 1 and words != 2 and words != 4:
        raise ValueError(f"a fingerprint has 1, 2 or 4 words, not {words}")
    return 0


def hash_many(list items, int kind, int words):
    """The low `words` words of hash `kind` of each bytes object, as an (n, words) array."""
    cdef Py_ssize_t i, n = len(items)
    cdef bytes b
    _check_words(words)
    if not 0 <= kind < 6 or words > si_hash_words[kind]:
        raise ValueError(f"hash kind {kind} has fewer than {words} words")
    out = np.empty((n, words), dtype=np.uint64)
    cdef uint64_t[:, ::1] o = out
    for i in range(n):
        b = items[i]
        si_hash(kind, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b), &o[i, 0], words)
    return out


def vote(const uint64_t[:, ::1] hashes, weights=None):
    """The simhash of token hashes, an (n, words) array most significant word first:
    bit i set when sum(+w if bit i of h else -w) > 0.

    `weights` is None (1 each), an int64 array (exact), or a float64 array (summed in
    order). Returns the fingerprint as an int.
    """
    cdef Py_ssize_t j, n = hashes.shape[0]
    cdef int words = <int>hashes.shape[1]
    cdef int64_t v[MAXBITS]
    cdef double f[MAXBITS]
    cdef uint64_t r[MAXW]
    cdef const int64_t[::1] wi
    cdef const double[::1] wf
    cdef int i, q
    cdef uint64_t x
    cdef double w
    _check_words(words)
    _zero(v, words)
    if weights is None:
        with nogil:
            for j in range(n):
                _add(v, &hashes[j, 0], words, 1)
            _vote(v, words, r)
        return _to_int(r, words)
    if weights.dtype == np.int64:
        wi = weights
        if wi.shape[0] != n:
            raise ValueError("hashes and weights differ in length")
        with nogil:
            for j in range(n):
                _add(v, &hashes[j, 0], words, wi[j])
            _vote(v, words, r)
        return _to_int(r, words)
    wf = weights
    if wf.shape[0] != n:
        raise ValueError("hashes and weights differ in length")
    for i in range(64 * words):
        f[i] = 0.0
    with nogil:
        for j in range(n):
            w = wf[j]
            for q in range(words):
                x = hashes[j, q]
                for i in range(64):
                    if (x >> i) & 1:
                        f[64 * (words - 1 - q) + i] += w
                    else:
                        f[64 * (words - 1 - q) + i] -= w
        for q in range(words):
            r[q] = 0
            for i in range(64):
                if f[64 * (words - 1 - q) + i] > 0:
                    r[q] |= (<uint64_t>1) << i
    return _to_int(r, words)


def vote_rows(const int64_t[::1] indptr, const int64_t[::1] indices, const double[::1] data,
              const uint64_t[:, ::1] hashes):
    """The simhash of each row of a CSR matrix, column j voting with hashes[j] and the
    row's value as its weight (float64 sums in column order), as an (n, words) array."""
    cdef Py_ssize_t n = indptr.shape[0] - 1, row, j, col, ncols = hashes.shape[0]
    cdef int words = <int>hashes.shape[1]
    cdef double f[MAXBITS]
    cdef int i, q
    cdef uint64_t x
    cdef double w
    _check_words(words)
    out = np.zeros((max(n, 0), words), dtype=np.uint64)
    cdef uint64_t[:, ::1] o = out
    for row in range(n):
        for j in range(indptr[row], indptr[row + 1]):
            if not 0 <= indices[j] < ncols:
                raise ValueError(f"column index {indices[j]} is outside the vocabulary")
    with nogil:
        for row in range(n):
            for i in range(64 * words):
                f[i] = 0.0
            for j in range(indptr[row], indptr[row + 1]):
                w = data[j]
                col = indices[j]
                for q in range(words):
                    x = hashes[col, q]
                    for i in range(64):
                        if (x >> i) & 1:
                            f[64 * (words - 1 - q) + i] += w
                        else:
                            f[64 * (words - 1 - q) + i] -= w
            for q in range(words):
                x = 0
                for i in range(64):
                    if f[64 * (words - 1 - q) + i] > 0:
                        x |= (<uint64_t>1) << i
                o[row, q] = x
    return out


def hyperplanes(Py_ssize_t dim, int width, uint64_t seed, bint normal):
    """The (dim, width) matrix of random hyperplanes of a seed (see simindex/signatures/vectors.py):
    element e = row * width + column draws a = mix(key + 2e), b = mix(key + 2e + 1) with
    key = mix(seed) and mix splitmix64's output function; "sign": +1 when a's top bit is
    clear, else -1; "normal": sqrt(-2 ln u1) cos(2 pi u2) with u1 = (a >> 11 + 1) / 2**53,
    u2 = (b >> 11) / 2**53 (Box-Muller)."""
    cdef Py_ssize_t e, total
    cdef uint64_t key = si_mix64(seed), a, b
    cdef double u1, u2
    if dim < 1 or width < 1:
        raise ValueError("dim and width must be positive")
    out = np.empty((dim, width), dtype=np.float64)
    cdef double[:, ::1] o = out
    cdef double *p = &o[0, 0]
    total = dim * width
    with nogil:
        for e in range(total):
            a = si_mix64(key + 2 * <uint64_t>e)
            if normal:
                b = si_mix64(key + 2 * <uint64_t>e + 1)
                u1 = (<double>((a >> 11) + 1)) * (1.0 / 9007199254740992.0)
                u2 = (<double>(b >> 11)) * (1.0 / 9007199254740992.0)
                p[e] = sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)
            else:
                p[e] = -1.0 if (a >> 63) else 1.0
    return out


cdef Py_ssize_t _split(const char *p, Py_ssize_t n, Py_ssize_t *start,
                       Py_ssize_t *end) noexcept nogil:
    """The tokens of space-separated `p`: their [start, end) offsets (room for n // 2 + 1
    each); returns how many."""
    cdef Py_ssize_t i = 0, ntok = 0
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
    return ntok


cdef int _shingle_vote_buf(const char *p, Py_ssize_t n, int width, uint64_t *out,
                           Py_ssize_t *windows, int kind, int words) noexcept nogil:
    """The vote over the hash of every `width`-token window of space-separated tokens."""
    cdef Py_ssize_t t, ntok
    cdef Py_ssize_t *start = <Py_ssize_t *>malloc((n // 2 + 2) * sizeof(Py_ssize_t))
    cdef Py_ssize_t *end = <Py_ssize_t *>malloc((n // 2 + 2) * sizeof(Py_ssize_t))
    cdef int64_t v[MAXBITS]
    cdef uint64_t h[MAXW]
    if start == NULL or end == NULL:
        free(start)
        free(end)
        return -1
    _zero(v, words)
    ntok = _split(p, n, start, end)
    windows[0] = 0
    if ntok > 0 and ntok < width:
        si_hash(kind, p + start[0], end[ntok - 1] - start[0], h, words)
        _add(v, h, words, 1)
        windows[0] = 1
    else:
        for t in range(ntok - width + 1):
            si_hash(kind, p + start[t], end[t + width - 1] - start[t], h, words)
            _add(v, h, words, 1)
            windows[0] += 1
    _vote(v, words, out)
    free(start)
    free(end)
    return 0


cdef int _kind_words(int kind, int words) except -1:
    _check_words(words)
    if not 0 <= kind < 6 or words > si_hash_words[kind]:
        raise ValueError(f"hash kind {kind} is narrower than {words} words")
    return 0


def shingle_vote(bytes joined not None, int width, int kind=0, int words=1):
    """simhash of the hashes of every `width`-token window of `joined`.

    `joined` is the tokens (none containing a space) joined by single spaces, so a window
    is the bytes from its first token's start to its last token's end, exactly what
    " ".join(window) would give. Fewer tokens than `width` make one window of them all.
    Returns (fingerprint, number of windows); 0 windows when there are no tokens.
    """
    cdef uint64_t r[MAXW]
    cdef Py_ssize_t windows = 0
    cdef int rc
    cdef const char *p = PyBytes_AS_STRING(joined)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(joined)
    if width < 1:
        raise ValueError("width must be at least 1")
    _kind_words(kind, words)
    with nogil:
        rc = _shingle_vote_buf(p, n, width, r, &windows, kind, words)
    if rc:
        raise MemoryError()
    return _to_int(r, words), windows


def char_gram_vote(bytes utf8 not None, int width, int kind=1, int words=1):
    """The vote over the hash of every `width`-character window of UTF-8 text, one per
    occurrence (so a gram seen n times weighs n). Fewer characters: one window of all.
    Returns (fingerprint, windows)."""
    cdef const char *p = PyBytes_AS_STRING(utf8)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(utf8), i, nc = 0, t
    cdef Py_ssize_t *off
    cdef int64_t v[MAXBITS]
    cdef uint64_t h[MAXW]
    cdef uint64_t r[MAXW]
    cdef Py_ssize_t windows = 0
    if width < 1:
        raise ValueError("width must be at least 1")
    _kind_words(kind, words)
    off = <Py_ssize_t *>malloc((n + 1) * sizeof(Py_ssize_t))
    if off == NULL:
        raise MemoryError()
    _zero(v, words)
    with nogil:
        for i in range(n):
            if (<unsigned char>p[i] & 0xC0) != 0x80:      # a character starts here
                off[nc] = i
                nc += 1
        off[nc] = n
        if 0 < nc < width:
            si_hash(kind, p, n, h, words)
            _add(v, h, words, 1)
            windows = 1
        else:
            for t in range(nc - width + 1):
                si_hash(kind, p + off[t], off[t + width] - off[t], h, words)
                _add(v, h, words, 1)
                windows += 1
        _vote(v, words, r)
    free(off)
    return _to_int(r, words), windows
