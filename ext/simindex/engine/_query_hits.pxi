# Hit buffers (included by _query.pyx): candidates as (seq, distance), de-duplicated, grouped
# by query, checked against their records; apart as what every other part pushes or reads.


cdef int _hit_push(HitBuf *b, uint64_t seq, uint32_t dist) noexcept nogil:
    cdef size_t cap
    cdef void *t
    if b.n == b.cap:
        cap = b.cap * 2 if b.cap else 256
        t = realloc(b.h, cap * sizeof(Hit))
        if t == NULL:
            return NO_MEMORY
        b.h = <Hit *>t
        b.cap = cap
    b.h[b.n].seq = seq
    b.h[b.n].dist = dist
    b.h[b.n].val = NULL
    b.h[b.n].vlen = 0
    b.h[b.n].fp = 0
    b.h[b.n].q = 0
    b.h[b.n].plain = False
    b.n += 1
    return 0


cdef int _cmp_seq(const void *a, const void *b) noexcept nogil:
    cdef const Hit *x = <const Hit *>a
    cdef const Hit *y = <const Hit *>b
    return (x.seq > y.seq) - (x.seq < y.seq)


cdef int _cmp_dist_seq(const void *a, const void *b) noexcept nogil:
    cdef const Hit *x = <const Hit *>a
    cdef const Hit *y = <const Hit *>b
    if x.dist != y.dist:
        return (x.dist > y.dist) - (x.dist < y.dist)
    return (x.seq > y.seq) - (x.seq < y.seq)


cdef size_t _unique_seqs(Hit *h, size_t n) noexcept nogil:
    """Sort n hits by seq in place and keep each seq once, at the front; how many are left."""
    cdef size_t i, w = 0
    if n < 2:
        return n
    qsort(h, n, sizeof(Hit), _cmp_seq)
    for i in range(n):
        if w and h[w - 1].seq == h[i].seq:
            continue
        h[w] = h[i]
        w += 1
    return w


cdef void _dedup(HitBuf *hits, size_t start) noexcept nogil:
    """Keep each seq of one query's hits (from `start` on) once, sorted by seq."""
    hits.n = start + _unique_seqs(hits.h + start, hits.n - start)


cdef int _group_hits(HitBuf *hits, size_t *qstart, Py_ssize_t n) noexcept nogil:
    """Order hits tagged with their query (Hit.q) by query, stably, and set qstart; then
    keep each query's seqs once (see _dedup)."""
    cdef size_t i, w = 0, r, e, cap = hits.cap if hits.cap else 1
    cdef Py_ssize_t qi
    cdef Hit *out = <Hit *>malloc(cap * sizeof(Hit))
    cdef size_t *pos = <size_t *>malloc((n + 1) * sizeof(size_t))
    if out == NULL or pos == NULL:
        free(out)
        free(pos)
        return NO_MEMORY
    memset(qstart, 0, (n + 1) * sizeof(size_t))
    for i in range(hits.n):
        qstart[hits.h[i].q + 1] += 1
    for qi in range(n):
        qstart[qi + 1] += qstart[qi]
    memcpy(pos, qstart, (n + 1) * sizeof(size_t))
    for i in range(hits.n):
        out[pos[hits.h[i].q]] = hits.h[i]
        pos[hits.h[i].q] += 1
    free(pos)
    free(hits.h)
    hits.h = out
    hits.cap = cap
    for qi in range(n):                     # each query's seqs once, compacted forward
        r = qstart[qi]
        e = _unique_seqs(hits.h + r, qstart[qi + 1] - r)
        qstart[qi] = w
        memmove(hits.h + w, hits.h + r, e * sizeof(Hit))
        w += e
    qstart[n] = w
    hits.n = w
    return 0


cdef inline int _check_record(const MDB_val *val, uint64_t seq, bint sums, const uint64_t *q,
                              int words, size_t psize, uint32_t dist, uint64_t *fp,
                              size_t *body) noexcept nogil:
    """1 if a hit's record (its value in records/seqs, stored under `seq`) lies at `dist`
    bits from q, 0 if not (a table entry disagreeing with its record), or CORRUPT_RECORD
    (its checksum or size is wrong); its first word in fp, its length without the checksum
    in body."""
    cdef uint32_t d
    cdef int ww
    if not val_in_pages(val, psize) or \
            not record_body(seq, <const uint8_t *>val.mv_data, val.mv_size, sums, body) or \
            body[0] < record_header(words):
        return CORRUPT_RECORD
    fp[0] = bits.load64(val.mv_data)
    d = <uint32_t>bits.popcount(fp[0] ^ q[0])
    for ww in range(1, words):
        d += <uint32_t>bits.popcount(bits.load64(<const uint8_t *>val.mv_data +
                                                 layout.RECORD_HEADER + 8 * (ww - 1)) ^ q[ww])
    return 1 if d == dist else 0
