# The unapplied records (included by _query.pyx): those not yet in every shard's tables, checked
# by a pass or by tables over a context's kept tail; apart as the one path beside the runs.


cdef int _tail_hits64(const uint64_t *seq, const uint64_t *fp, size_t n, uint64_t applied,
                      uint64_t x, int k, HitBuf *hits) noexcept nogil:
    """_tail_hits of 64-bit fingerprints: four independent popcounts a step, and a branch
    only where one is within k (~0.5 ns a record)."""
    cdef size_t j = 0, i
    cdef unsigned m
    cdef int rc
    while j + 4 <= n:
        m = (<unsigned>(bits.popcount(fp[j] ^ x) <= k)) | \
            (<unsigned>(bits.popcount(fp[j + 1] ^ x) <= k) << 1) | \
            (<unsigned>(bits.popcount(fp[j + 2] ^ x) <= k) << 2) | \
            (<unsigned>(bits.popcount(fp[j + 3] ^ x) <= k) << 3)
        if m:
            for i in range(4):
                if m >> i & 1 and seq[j + i] > applied:
                    rc = _hit_push(hits, seq[j + i], bits.popcount(fp[j + i] ^ x))
                    if rc:
                        return rc
        j += 4
    while j < n:
        if bits.popcount(fp[j] ^ x) <= k and seq[j] > applied:
            rc = _hit_push(hits, seq[j], bits.popcount(fp[j] ^ x))
            if rc:
                return rc
        j += 1
    return 0


cdef void _free_tail_tables(TailTables *tt) noexcept nogil:
    free(tt.keys)
    free(tt.seqs)
    memset(tt, 0, sizeof(TailTables))


cdef int _build_tail_tables(TailTables *tt, const Tables *tb, Tail *tail) noexcept nogil:
    """Each table's permuted keys of the kept tail's records, sorted with their seqs."""
    cdef size_t n = tail.n, i
    cdef int t, rc
    cdef uint64_t *k
    cdef uint64_t *q
    _free_tail_tables(tt)
    tt.keys = <uint64_t *>malloc(<size_t>tb.ntables * n * sizeof(uint64_t))
    tt.seqs = <uint64_t *>malloc(<size_t>tb.ntables * n * sizeof(uint64_t))
    if tt.keys == NULL or tt.seqs == NULL:
        _free_tail_tables(tt)
        return NO_MEMORY
    for t in range(tb.ntables):
        k = tt.keys + <size_t>t * n
        q = tt.seqs + <size_t>t * n
        for i in range(n):
            k[i] = permute(tb, t, tail.fp[i])
            q[i] = tail.seq[i]
        rc = sort_pairs(k, q, n)
        if rc:
            _free_tail_tables(tt)
            return rc
    tt.n = n
    tt.tb = tb
    tt.ok = True
    return 0


cdef int _probe_tail_tables(TailTables *tt, const Tables *tb, uint64_t applied, uint64_t x,
                            int k, HitBuf *hits) noexcept nogil:
    """The tail's records above `applied` within k of x, found as in runs: every probe's
    prefix range by binary search in each table, its keys checked by popcount (a record
    within k shares a probed prefix in some table, so this is exact as the index is)."""
    cdef size_t n = tt.n, a, b, m
    cdef int t, s0, s1, d, rc
    cdef uint32_t j
    cdef uint64_t pk, lo, hi
    cdef const uint64_t *keys
    cdef const uint64_t *seqs
    for t in range(tb.ntables):
        pk = permute(tb, t, x)
        keys = tt.keys + <size_t>t * n
        seqs = tt.seqs + <size_t>t * n
        for j in range(tb.probe_start[t], tb.probe_start[t + 1]):
            prefix_range(tb, t, pk ^ tb.probe[j], &lo, &hi, &s0, &s1)
            a = 0
            b = n
            while a < b:
                m = (a + b) >> 1
                if keys[m] < lo:
                    a = m + 1
                else:
                    b = m
            while a < n and keys[a] <= hi:
                d = bits.popcount(keys[a] ^ pk)
                if d <= k and seqs[a] > applied:
                    rc = _hit_push(hits, seqs[a], d)
                    if rc:
                        return rc
                a += 1
    return 0


cdef int _tail_hits_held(Tail *tail, uint64_t applied, const uint64_t *q, int k,
                         const Tables *tb, HitBuf *hits) noexcept nogil:
    """_tail_hits of a search beyond the plan's k (tb.guarantee): the records within k that
    share some table's prefix with q within its flips, as the tables would hold them."""
    cdef size_t j, w, rest = tail.words - 1
    cdef int d, t, c, rc
    cdef const uint64_t *om
    cdef uint64_t x
    for j in range(tail.n):
        if tail.seq[j] <= applied:
            continue
        d = bits.popcount(tail.fp[j] ^ q[0])
        for w in range(rest):
            d += bits.popcount(tail.rest[j * rest + w] ^ q[w + 1])
        if d > k:
            continue
        if d > tb.guarantee:
            for t in range(tb.ntables):
                om = tb.omask + <size_t>t * tail.words
                c = bits.popcount((tail.fp[j] ^ q[0]) & om[0])
                for w in range(rest):
                    c += bits.popcount((tail.rest[j * rest + w] ^ q[w + 1]) & om[w + 1])
                if c <= tb.flips:
                    break
            else:
                continue
        rc = _hit_push(hits, tail.seq[j], d)
        if rc:
            return rc
    return 0


cdef int _tail_hits(Tail *tail, uint64_t applied, const uint64_t *q, int k,
                    HitBuf *hits) noexcept nogil:
    """Check the tail records above `applied` (missing from some table) against q directly
    (q: the fingerprint's words, tail.words of them)."""
    cdef size_t j, w, rest = tail.words - 1 if tail.words > 1 else 0
    cdef int d, rc
    if rest == 0:
        return _tail_hits64(tail.seq, tail.fp, tail.n, applied, q[0], k, hits)
    for j in range(tail.n):
        if tail.seq[j] > applied:
            d = bits.popcount(tail.fp[j] ^ q[0])
            for w in range(rest):
                d += bits.popcount(tail.rest[j * rest + w] ^ q[w + 1])
            if d <= k:
                rc = _hit_push(hits, tail.seq[j], d)
                if rc:
                    return rc
    return 0
