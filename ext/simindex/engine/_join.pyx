# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The Hamming kernels: the popcount filter of an array, and the pair join of pairs() and
find_all (every pair within k bits among keys grouped by a table's prefix, each reported
once over all tables).
"""

import numpy as np

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memset

cimport simindex.bits as bits
from simindex.engine._lmdb cimport NO_MEMORY


def hamming(uint64_t a, uint64_t b):
    """Number of differing bits of two 64-bit fingerprints."""
    return bits.popcount(a ^ b)


cdef size_t _within(const uint64_t *fps, size_t n, size_t words, const uint64_t *q, int k,
                    uint32_t *pos, uint16_t *dist) noexcept nogil:
    """Write the position and distance of every fingerprint of `words` words (rows of fps)
    within k bits of q; returns how many."""
    cdef size_t i, w, m = 0
    cdef int d
    for i in range(n):
        d = bits.popcount(fps[i * words] ^ q[0])
        for w in range(1, words):
            d += bits.popcount(fps[i * words + w] ^ q[w])
        if d <= k:
            pos[m] = <uint32_t>i
            dist[m] = <uint16_t>d
            m += 1
    return m


cdef list _hits(const uint64_t *fps, Py_ssize_t n, Py_ssize_t rows, size_t words,
                const uint64_t *q, int k):
    """within()'s list for the first n of `rows` fingerprints."""
    cdef uint32_t *pos
    cdef uint16_t *dist
    cdef size_t m, i
    if n < 0 or n > rows:
        raise ValueError(f"within: n ({n}) must be between 0 and the array's length ({rows})")
    if n > 0xFFFFFFFF:
        raise ValueError(f"within: n ({n}) must fit 32 bits")
    if n == 0:
        return []
    pos = <uint32_t *>malloc(n * sizeof(uint32_t))
    dist = <uint16_t *>malloc(n * sizeof(uint16_t))
    if pos == NULL or dist == NULL:
        free(pos)
        free(dist)
        raise MemoryError()
    try:
        with nogil:
            m = _within(fps, <size_t>n, words, q, k, pos, dist)
        return [(pos[i], dist[i]) for i in range(m)]
    finally:
        free(pos)
        free(dist)


def within(const uint64_t[::1] fps, Py_ssize_t n, uint64_t q, int k):
    """[(position, distance), ...] of the first `n` fingerprints of `fps` within k bits of q,
    in position order: the popcount filter of a write buffer, one Python object per hit."""
    if fps.shape[0] == 0:
        return _hits(NULL, n, 0, 1, &q, k)
    return _hits(&fps[0], n, fps.shape[0], 1, &q, k)


def within_words(const uint64_t[:, ::1] fps, Py_ssize_t n, const uint64_t[::1] q, int k):
    """within() for wide fingerprints: rows of `fps` and `q` are words, most significant
    first."""
    if q.shape[0] != fps.shape[1] or q.shape[0] == 0:
        raise ValueError(f"within_words: the query has {q.shape[0]} words, the rows "
                         f"{fps.shape[1]}")
    if fps.shape[0] == 0:
        return _hits(NULL, n, 0, q.shape[0], &q[0], k)
    return _hits(&fps[0, 0], n, fps.shape[0], q.shape[0], &q[0], k)


cdef int pair_push(PairBuf *p, uint64_t a, uint64_t b, uint16_t d) noexcept nogil:
    """Append the triple (a, b, d); 0, or NO_MEMORY."""
    cdef size_t cap
    cdef void *t
    if p.n == p.cap:
        cap = p.cap * 2 if p.cap else 4096
        t = realloc(p.a, cap * 8)
        if t == NULL:
            return NO_MEMORY
        p.a = <uint64_t *>t
        t = realloc(p.b, cap * 8)
        if t == NULL:
            return NO_MEMORY
        p.b = <uint64_t *>t
        t = realloc(p.d, cap * 2)
        if t == NULL:
            return NO_MEMORY
        p.d = <uint16_t *>t
        p.cap = cap
    p.a[p.n] = a
    p.b[p.n] = b
    p.d[p.n] = d
    p.n += 1
    return 0


cdef enum:
    SUB_MIN = 32             # a prefix group larger than this is joined by sub-blocks
    SUB_MAX_BITS = 16        # buckets per sub-block: at most 2^16


cdef inline int _pair_check(PairBuf *p, uint64_t x, uint64_t a, uint64_t b,
                            const uint64_t *earlier, Py_ssize_t ne, int k,
                            int flips) noexcept nogil:
    """Push the pair (a, b) whose keys differ in `x` if that is within k bits and the keys
    are not within `flips` bits on an earlier table's prefix (which found them)."""
    cdef int d = bits.popcount(x)
    cdef Py_ssize_t e
    if d > k:
        return 0
    for e in range(ne):
        if bits.popcount(x & earlier[e]) <= flips:
            return 0
    if a > b:
        a, b = b, a
    return pair_push(p, a, b, <uint16_t>d)


cdef int _group_sub(PairBuf *p, const uint64_t *keys, const uint64_t *ids, Py_ssize_t g0,
                    Py_ssize_t g1, int rest, const uint64_t *earlier, Py_ssize_t ne, int k,
                    int flips, Py_ssize_t *counts, Py_ssize_t *perm) noexcept nogil:
    """The pairs of one prefix group through k+1 sub-blocks of its `rest` low bits.

    Two keys within k bits of each other differ in at most k of those bits, so they agree
    on at least one whole sub-block; a pair is checked in the bucket of each sub-block it
    agrees on and reported in the first, so each comes out once. Buckets hold the top bits
    of a sub-block (about as many buckets as entries) and are counting-sorted into `perm`.
    """
    cdef Py_ssize_t g = g1 - g0, i, j, r0, r1, nb, c
    cdef int s, u, t, lo = 0, bb, gbits = 64 - bits.clz64(<uint64_t>g), rc
    cdef int width[64]
    cdef uint64_t sub[64]
    cdef uint64_t bmask, bk, x
    cdef bint skip
    for s in range(k + 1):                      # sub-block s: width[s] bits from bit `lo`
        width[s] = rest // (k + 1) + (1 if s < rest % (k + 1) else 0)
        sub[s] = ((<uint64_t>1 << width[s]) - 1) << lo if width[s] < 64 else ~(<uint64_t>0)
        lo += width[s]
    lo = 0
    for s in range(k + 1):
        bb = min(width[s], gbits, SUB_MAX_BITS)
        nb = <Py_ssize_t>1 << bb
        bmask = <uint64_t>(nb - 1)
        t = lo + width[s] - bb                  # the sub-block's top bb bits
        lo += width[s]
        memset(counts, 0, nb * sizeof(Py_ssize_t))
        for i in range(g0, g1):
            counts[(keys[i] >> t) & bmask] += 1
        r0 = 0
        for bk in range(<uint64_t>nb):          # counts[bk]: where bucket bk starts
            c = counts[bk]
            counts[bk] = r0
            r0 += c
        for i in range(g0, g1):
            bk = (keys[i] >> t) & bmask
            perm[counts[bk]] = i
            counts[bk] += 1
        r0 = 0
        while r0 < g:                           # each run of one bucket in perm
            bk = (keys[perm[r0]] >> t) & bmask
            r1 = r0 + 1
            while r1 < g and ((keys[perm[r1]] >> t) & bmask) == bk:
                r1 += 1
            for i in range(r0, r1):
                for j in range(i + 1, r1):
                    x = keys[perm[i]] ^ keys[perm[j]]
                    if (x & sub[s]) != 0:
                        continue
                    skip = False
                    for u in range(s):           # reported at an earlier sub-block
                        if (x & sub[u]) == 0:
                            skip = True
                            break
                    if skip:
                        continue
                    rc = _pair_check(p, x, ids[perm[i]], ids[perm[j]], earlier, ne, k, flips)
                    if rc:
                        return rc
            r0 = r1
    return 0


cdef Py_ssize_t _group_start(const uint64_t *keys, Py_ssize_t n, uint64_t prefix,
                             uint64_t pmask, int stride=1) noexcept nogil:
    """The first position whose key's prefix is at least `prefix` (keys grouped by prefix
    in ascending order; a key every `stride` words, its first word holding the prefix)."""
    cdef Py_ssize_t a = 0, b = n, mid
    while a < b:
        mid = (a + b) >> 1
        if (keys[mid * stride] & pmask) < prefix:
            a = mid + 1
        else:
            b = mid
    return a


def pairs_sorted(const uint64_t[::1] keys, const uint64_t[::1] ids, uint64_t pmask,
                 const uint64_t[::1] earlier, int k, const uint64_t[::1] probes=None,
                 int flips=0):
    """Every pair within `k` bits among entries whose prefixes (`pmask`) are within
    `flips` bits; the keys come grouped by that prefix (sorted by it, in any order within
    a group). `probes`: the table's XOR masks of at most `flips` prefix bits (mask 0
    first), as Permuter.probe_masks gives them.

    A pair within `flips` bits on one of the `earlier` masks (the prefixes of tables
    already joined, in this table's bit order) was reported there and is skipped, so each
    pair comes out once over all tables. Returns (a, b, d) arrays with a < b, in no
    particular order. Groups larger than SUB_MIN are joined through sub-blocks (_group_sub)
    instead of comparing all their pairs; a group and each group at a probe's prefix
    above its own are joined pair by pair.
    """
    cdef Py_ssize_t n = keys.shape[0], g0 = 0, g1, i, j, ne = earlier.shape[0], cap = 0
    cdef Py_ssize_t h0, h1, f, nf = 0 if probes is None else probes.shape[0]
    cdef uint64_t rest_mask = ~pmask, other
    cdef int rc = 0, rest = bits.popcount(rest_mask)
    cdef const uint64_t *kp = &keys[0] if n else NULL
    cdef const uint64_t *ip = &ids[0] if n else NULL
    cdef const uint64_t *ep = &earlier[0] if ne else NULL
    cdef const uint64_t *fp = &probes[0] if nf else NULL
    cdef Py_ssize_t *counts = NULL
    cdef Py_ssize_t *perm = NULL
    cdef void *tmp
    # sub-blocks need the remaining bits at the bottom (the prefix leads every key) and at
    # least one bit per sub-block
    cdef bint sub = k < 64 and rest >= k + 1 and (rest_mask & (rest_mask + 1)) == 0
    cdef PairBuf p
    memset(&p, 0, sizeof(PairBuf))
    if ids.shape[0] != n:
        raise ValueError("keys and ids differ in length")
    try:
        with nogil:
            if sub:
                counts = <Py_ssize_t *>malloc((1 << SUB_MAX_BITS) * sizeof(Py_ssize_t))
                if counts == NULL:
                    rc = NO_MEMORY
            while g0 < n and rc == 0:
                g1 = g0 + 1
                while g1 < n and (kp[g1] & pmask) == (kp[g0] & pmask):
                    g1 += 1
                if sub and g1 - g0 > SUB_MIN:
                    if g1 - g0 > cap:
                        tmp = realloc(perm, (g1 - g0) * sizeof(Py_ssize_t))
                        if tmp == NULL:
                            rc = NO_MEMORY
                            break
                        perm = <Py_ssize_t *>tmp
                        cap = g1 - g0
                    rc = _group_sub(&p, kp, ip, g0, g1, rest, ep, ne, k, flips, counts, perm)
                else:
                    for i in range(g0, g1):
                        for j in range(i + 1, g1):
                            rc = _pair_check(&p, kp[i] ^ kp[j], ip[i], ip[j], ep, ne, k,
                                             flips)
                            if rc:
                                break
                        if rc:
                            break
                # the groups at the probes' prefixes above this one's, each once per pair
                for f in range(nf):
                    if rc:
                        break
                    other = (kp[g0] ^ fp[f]) & pmask
                    if fp[f] == 0 or other < (kp[g0] & pmask):
                        continue
                    h0 = _group_start(kp, n, other, pmask)
                    h1 = h0
                    while h1 < n and (kp[h1] & pmask) == other:
                        h1 += 1
                    for i in range(g0, g1):
                        for j in range(h0, h1):
                            rc = _pair_check(&p, kp[i] ^ kp[j], ip[i], ip[j], ep, ne, k,
                                             flips)
                            if rc:
                                break
                        if rc:
                            break
                g0 = g1
        if rc:
            raise MemoryError("pair buffer")
        return pair_arrays(&p)
    finally:
        free(counts)
        free(perm)
        free_pairs(&p)


cdef tuple pair_arrays(PairBuf *p):
    """The (a, b, d) columns of a pair buffer as numpy arrays (u64, u64, u16)."""
    A = np.empty(p.n, dtype=np.uint64)
    B = np.empty(p.n, dtype=np.uint64)
    D = np.empty(p.n, dtype=np.uint16)
    cdef uint64_t[::1] av = A
    cdef uint64_t[::1] bv = B
    cdef uint16_t[::1] dv = D
    if p.n:
        memcpy(&av[0], p.a, p.n * 8)
        memcpy(&bv[0], p.b, p.n * 8)
        memcpy(&dv[0], p.d, p.n * 2)
    return A, B, D


cdef void free_pairs(PairBuf *p) noexcept nogil:
    free(p.a)
    free(p.b)
    free(p.d)
    p.a = p.b = NULL
    p.d = NULL
    p.n = p.cap = 0


cdef inline int _wide_check(PairBuf *p, const uint64_t *x, const uint64_t *y, int words,
                            uint64_t a, uint64_t b, const uint64_t *earlier, Py_ssize_t ne,
                            int k, int flips) noexcept nogil:
    """_pair_check over `words`-word keys x and y."""
    cdef int d = 0, w, e_d
    cdef Py_ssize_t e
    for w in range(words):
        d += bits.popcount(x[w] ^ y[w])
        if d > k:
            return 0
    for e in range(ne):
        e_d = 0
        for w in range(words):
            e_d += bits.popcount((x[w] ^ y[w]) & earlier[e * words + w])
        if e_d <= flips:
            return 0
    if a > b:
        a, b = b, a
    return pair_push(p, a, b, <uint16_t>d)


def pairs_wide(const uint64_t[:, ::1] keys, const uint64_t[::1] ids, uint64_t pmask,
               const uint64_t[:, ::1] earlier, int k, const uint64_t[::1] probes, int flips):
    """pairs_sorted() for keys of several words (an (n, words) array grouped by the prefix
    `pmask` of their first word): every pair within k bits whose first-word prefixes lie
    within `flips` bits, once over all tables (`earlier`: an (e, words) array of the
    earlier tables' prefix masks in this table's bit order). Each group is joined pair by
    pair."""
    cdef Py_ssize_t n = keys.shape[0], g0 = 0, g1, h0, h1, i, j, f
    cdef Py_ssize_t ne = earlier.shape[0], nf = probes.shape[0]
    cdef int words = <int>keys.shape[1], rc = 0
    cdef uint64_t other
    cdef PairBuf p
    cdef const uint64_t *kp = &keys[0, 0] if n else NULL
    cdef const uint64_t *ep = &earlier[0, 0] if ne else NULL
    memset(&p, 0, sizeof(PairBuf))
    if ids.shape[0] != n:
        raise ValueError("keys and ids differ in length")
    if ne and earlier.shape[1] != words:
        raise ValueError("earlier masks and keys differ in words")
    try:
        with nogil:
            while g0 < n and rc == 0:
                g1 = g0 + 1
                while g1 < n and (kp[g1 * words] & pmask) == (kp[g0 * words] & pmask):
                    g1 += 1
                for i in range(g0, g1):
                    for j in range(i + 1, g1):
                        rc = _wide_check(&p, kp + i * words, kp + j * words, words, ids[i],
                                         ids[j], ep, ne, k, flips)
                        if rc:
                            break
                    if rc:
                        break
                for f in range(nf):
                    if rc:
                        break
                    other = (kp[g0 * words] ^ probes[f]) & pmask
                    if probes[f] == 0 or other < (kp[g0 * words] & pmask):
                        continue
                    h0 = _group_start(kp, n, other, pmask, words)
                    h1 = h0
                    while h1 < n and (kp[h1 * words] & pmask) == other:
                        h1 += 1
                    for i in range(g0, g1):
                        for j in range(h0, h1):
                            rc = _wide_check(&p, kp + i * words, kp + j * words, words,
                                             ids[i], ids[j], ep, ne, k, flips)
                            if rc:
                                break
                        if rc:
                            break
                g0 = g1
        if rc:
            raise MemoryError("pair buffer")
        return pair_arrays(&p)
    finally:
        free_pairs(&p)


