# The nogil scan (included by _query.pyx): a run's slabs over a prefix range, run directories,
# a query's probes in passes; apart as the hot loops, which touch no Python object.


# ---------------------------------------------------------------- the scan
cdef inline size_t _guess(const Slab *slab, uint64_t lo, uint64_t last) noexcept nogil:
    """Where in a slab whose keys span [kbase, last] the first key >= lo should be, by
    interpolation (permuted simhash keys spread evenly)."""
    cdef size_t c = slab.c, g
    cdef uint64_t first = slab.kbase
    if lo <= first:
        return 0
    if lo > last or last <= first:
        return c - 1
    g = <size_t>(<double>(lo - first) / <double>(last - first) * <double>(c - 1))
    return g if g < c else c - 1


cdef inline size_t _lower_bound(const Slab *slab, uint64_t lo, uint64_t last,
                                size_t g) noexcept nogil:
    """The first entry of a slab with key >= lo, found by galloping from the guess g (see
    _guess), so a slab not in cache costs one or two cache lines of keys, not a binary
    search's nine. Any guess below the count gives the right answer; only the speed
    depends on it."""
    cdef size_t c = slab.c, a, b, mid, step = 1
    if lo <= slab.kbase:
        return 0
    if key_at(slab, g) < lo:
        a = g + 1                          # every key before a is < lo
        while a + step <= c and key_at(slab, a + step - 1) < lo:
            a += step
            step *= 2
        b = a + step - 1 if a + step - 1 < c else c
    else:
        b = g                              # key b is >= lo (or b == c)
        while b >= step and key_at(slab, b - step) >= lo:
            b -= step
            step *= 2
        a = b - step + 1 if b >= step else 0
    while a < b:
        mid = (a + b) >> 1
        if key_at(slab, mid) < lo:
            a = mid + 1
        else:
            b = mid
    return a


cdef inline int _slab_at(MDB_cursor *cur, MDB_cursor_op op, uint64_t run_id, uint64_t lo,
                        MDB_val *key, MDB_val *val, bint *found) noexcept nogil:
    """Move `cur` to run `run_id`'s first slab whose last key reaches lo (MDB_SET_RANGE)
    or to the next slab (MDB_NEXT); `found` says whether it is a slab of that run. 0, or
    an error."""
    cdef uint8_t kbuf[layout.SLAB_KEY]
    cdef int rc
    if op == MDB_SET_RANGE:
        bits.store_be64(kbuf, run_id)
        bits.store_be64(kbuf + 8, lo)
        bits.store_be32(kbuf + 16, 0)
        key.mv_size = layout.SLAB_KEY
        key.mv_data = kbuf
    found[0] = False
    rc = mdb_cursor_get(cur, key, val, op)
    if rc == MDB_NOTFOUND:
        return 0
    if rc:
        return rc
    if key.mv_size != layout.SLAB_KEY:
        return CORRUPT_KEY
    found[0] = bits.load_be64(key.mv_data) == run_id
    return 0


cdef inline int _scan_slab(const Slab *slab, size_t i, uint64_t hi, uint64_t pk, int k,
                           HitBuf *hits, const uint64_t *pkt, size_t lw,
                           bint *past) noexcept nogil:
    """Push (seq, distance) of the slab's entries from i on with key <= hi within k of pk
    (and of the `lw` low words `pkt`); `past` says whether a key above hi ended it."""
    cdef size_t w
    cdef uint64_t x
    cdef int d, rc
    past[0] = False
    while i < slab.c:
        x = key_at(slab, i)
        if x > hi:
            past[0] = True
            return 0
        d = bits.popcount(x ^ pk)
        if d <= k:
            for w in range(lw):
                d += bits.popcount(low_at(slab, i, w) ^ pkt[w])
            if d <= k:
                rc = _hit_push(hits, seq_at(slab, i), d)
                if rc:
                    return rc
        i += 1
    return 0


cdef int _scan_run(MDB_cursor *cur, uint64_t run_id, uint64_t lo, uint64_t hi,
                   uint64_t pk, int k, HitBuf *hits, const uint64_t *pkt=NULL,
                   size_t lw=0) noexcept nogil:
    """Push (seq, distance) of every entry of run `run_id` with key in [lo, hi] within k of pk
    (and, for wide fingerprints, of its `lw` low words `pkt`: every slab must hold lw)."""
    cdef MDB_val key, val
    cdef bint found, past, first = True
    cdef Slab slab
    cdef uint64_t last
    cdef size_t i
    cdef int rc = _slab_at(cur, MDB_SET_RANGE, run_id, lo, &key, &val, &found)
    while rc == 0 and found:
        rc = open_slab(&key, &val, &slab)
        if rc:
            return rc
        if slab.lw != lw:
            return CORRUPT_SLAB
        i = 0
        if first:
            last = bits.load_be64(<const uint8_t *>key.mv_data + 8)
            i = _lower_bound(&slab, lo, last, _guess(&slab, lo, last))
            first = False
        rc = _scan_slab(&slab, i, hi, pk, k, hits, pkt, lw, &past)
        if rc or past:
            return rc
        rc = _slab_at(cur, MDB_NEXT, run_id, lo, &key, &val, &found)
    return rc


# ---------------------------------------------------------------- run directories
cdef void _free_dir(RunDir *d) noexcept nogil:
    free(d.last)
    free(d.top)
    free(<void *>d.data)
    free(d.size)
    free(d.filt)
    d.last = NULL
    d.top = NULL
    d.data = NULL
    d.size = NULL
    d.filt = NULL
    d.fwords = 0
    d.n = 0
    d.built = False


cdef void _free_dirs(ShardView *sv) noexcept nogil:
    cdef size_t r
    if sv.dirs != NULL:
        for r in range(sv.ndirs):
            _free_dir(&sv.dirs[r])
        free(sv.dirs)
    sv.dirs = NULL
    sv.ndirs = 0


cdef inline bint _before(const RunDir *a, const RunDir *b) noexcept nogil:
    return a.table < b.table or (a.table == b.table and a.run < b.run)


cdef int _sync_dirs(ShardView *sv, size_t mapgen, int ntables) noexcept nogil:
    """After the shard's state was read again: one directory per listed run, keeping the
    built ones that stay valid (see RunDir: kept, and the map has not moved), the others
    to be built at their first probe."""
    cdef size_t nr = sv.runs.nruns, r, o = 0
    cdef int t
    cdef RunDir *nd = <RunDir *>calloc(nr or 1, sizeof(RunDir))
    if nd == NULL:
        return NO_MEMORY
    for t in range(ntables):
        for r in range(sv.runs.table_start[t], sv.runs.table_start[t + 1]):
            nd[r].table = <uint32_t>t
            nd[r].run = sv.runs.run_ids[r]
    r = 0
    while r < nr and o < sv.ndirs:              # both in (table, run) order
        if _before(&sv.dirs[o], &nd[r]):
            o += 1
        elif _before(&nd[r], &sv.dirs[o]):
            r += 1
        else:
            if sv.mapgen == mapgen and sv.dirs[o].built and sv.dirs[o].kept:
                nd[r] = sv.dirs[o]
                memset(&sv.dirs[o], 0, sizeof(RunDir))
            elif sv.dirs[o].filt != NULL:       # a run's entries never change: its
                nd[r].filt = sv.dirs[o].filt    # filter holds whatever its directory
                nd[r].fwords = sv.dirs[o].fwords
                nd[r].pmask = sv.dirs[o].pmask
                sv.dirs[o].filt = NULL
                sv.dirs[o].fwords = 0
            o += 1
            r += 1
    _free_dirs(sv)
    sv.dirs = nd
    sv.ndirs = nr
    sv.mapgen = mapgen
    return 0


cdef int _build_dir(RunDir *d, MDB_cursor *cur, size_t psize, uint64_t pmask) noexcept nogil:
    """Walk run d.run's slabs once (their keys: no slab is read) into its directory, then,
    unless an earlier snapshot's directory of the run made it, its slabs' keys into its
    filter of prefixes under `pmask`."""
    cdef MDB_val key, val
    cdef bint found
    cdef size_t cap = 0, n = 0, g
    cdef uint64_t last
    cdef void *t
    cdef uint64_t *filt = d.filt            # a filter made at an earlier snapshot stays
    cdef size_t fwords = d.fwords
    cdef uint64_t fmask = d.pmask
    cdef int rc = _slab_at(cur, MDB_SET_RANGE, d.run, 0, &key, &val, &found)
    d.filt = NULL
    _free_dir(d)
    d.filt, d.fwords, d.pmask = filt, fwords, fmask
    d.kept = psize != 0
    while rc == 0 and found:
        if n == cap:
            cap = cap * 2 if cap else 16
            t = realloc(d.last, cap * sizeof(uint64_t))
            if t == NULL:
                return NO_MEMORY
            d.last = <uint64_t *>t
            t = realloc(<void *>d.data, cap * sizeof(uint8_t *))
            if t == NULL:
                return NO_MEMORY
            d.data = <const uint8_t **>t
            t = realloc(d.size, cap * sizeof(uint32_t))
            if t == NULL:
                return NO_MEMORY
            d.size = <uint32_t *>t
        last = bits.load_be64(<const uint8_t *>key.mv_data + 8)
        if bits.load_be32(<const uint8_t *>key.mv_data + 16) != n or \
                (n > 0 and last < d.last[n - 1]) or (val.mv_size >> 32) != 0:
            return CORRUPT_KEY
        d.last[n] = last
        d.data[n] = <const uint8_t *>val.mv_data
        d.size[n] = <uint32_t>val.mv_size
        # only a value that starts right after a page header is in overflow pages
        if psize and ((<size_t>val.mv_data) & (psize - 1)) != layout.LMDB_PAGE_HEADER:
            d.kept = False
        n += 1
        rc = _slab_at(cur, MDB_NEXT, d.run, 0, &key, &val, &found)
    if rc:
        return rc
    d.top = <uint64_t *>malloc(((n + DIR_GROUP - 1) // DIR_GROUP or 1) * sizeof(uint64_t))
    if d.top == NULL:
        return NO_MEMORY
    g = 0
    while g < n:
        d.top[g // DIR_GROUP] = d.last[g + DIR_GROUP - 1 if g + DIR_GROUP <= n else n - 1]
        g += DIR_GROUP
    d.n = n
    d.built = True
    if d.filt != NULL and d.pmask != pmask:     # made under another plan's mask
        free(d.filt)
        d.filt = NULL
        d.fwords = 0
    if d.filt == NULL and _filter_max:
        return _build_filter(d, psize, pmask)
    return 0


# ---------------------------------------------------------------- prefix filters
# A blocked Bloom filter: a prefix sets three bits of one 64-bit word, so a test reads one
# cache line. A prefix is the key's bits under the table's mask (its leading bits).
cdef inline uint64_t _mix(uint64_t x) noexcept nogil:
    """A 64-bit finalizer (MurmurHash3's fmix64): every input bit moves every output bit."""
    x ^= x >> 33
    x *= 0xff51afd7ed558ccdULL
    x ^= x >> 33
    x *= 0xc4ceb9fe1a85ec53ULL
    x ^= x >> 33
    return x


cdef inline uint64_t _filter_bits(uint64_t h) noexcept nogil:
    return ((<uint64_t>1) << (h & 63)) | ((<uint64_t>1) << ((h >> 6) & 63)) | \
        ((<uint64_t>1) << ((h >> 12) & 63))


cdef inline bint _filter_has(const RunDir *d, uint64_t prefix) noexcept nogil:
    cdef uint64_t h = _mix(prefix)
    cdef uint64_t b = _filter_bits(h)
    return (d.filt[(h >> 18) & (d.fwords - 1)] & b) == b


cdef int _open_slab_of(const RunDir *d, size_t i, size_t psize, Slab *slab) noexcept nogil:
    """Decode slab i of a directory's run, checked against its pages."""
    cdef MDB_val v
    v.mv_data = <void *>d.data[i]
    v.mv_size = d.size[i]
    if not val_in_pages(&v, psize):
        return CORRUPT_SLAB
    return open_value(d.data[i], d.size[i], slab)


cdef int _build_filter(RunDir *d, size_t psize, uint64_t pmask) noexcept nogil:
    """The filter of the prefixes (key & pmask) of every entry of a built directory's run:
    none for a run above _filter_max entries, a mask that is not leading bits (no prefix
    range), a run
    holding half the prefixes there are (most probes would pass), a slab that does not
    open (the scan that reads it reports it), or when memory is short (a filter only
    spares reads)."""
    cdef size_t i, j, total = 0, words = 1, distinct = 0
    cdef int pbits = bits.popcount(pmask)
    cdef uint64_t p, h, last = 0
    cdef bint seen = False
    cdef Slab slab
    if pmask == 0 or ((~pmask) & ((~pmask) + 1)) != 0:
        return 0
    for i in range(d.n):
        if _open_slab_of(d, i, psize, &slab):
            return 0
        total += slab.c
        if total > _filter_max:
            return 0
    while words * 64 < total * FILTER_BITS:
        words <<= 1
    d.filt = <uint64_t *>calloc(words, sizeof(uint64_t))
    if d.filt == NULL:
        return 0
    for i in range(d.n):
        if _open_slab_of(d, i, psize, &slab):
            free(d.filt)
            d.filt = NULL
            return 0
        for j in range(slab.c):
            p = key_at(&slab, j) & pmask
            if seen and p == last:       # keys ascend: a prefix's entries are together
                continue
            h = _mix(p)
            d.filt[(h >> 18) & (words - 1)] |= _filter_bits(h)
            last = p
            seen = True
            distinct += 1
    if pbits < 40 and distinct > ((<size_t>1) << pbits) // 2:
        free(d.filt)
        d.filt = NULL
        return 0
    d.fwords = words
    d.pmask = pmask
    return 0


# A directory is searched in two steps: a binary search in `top` (one key per DIR_GROUP
# slabs, ~1 KiB per million table entries, so the tops of every run a query reads stay in
# cache), then one group of `last` (a cache line, or two) and its `data` pointers, fetched
# for every probe of a query before any is read. At 100M fingerprints in 10 tables a binary
# search of `last` missed the cache ~5 times per probe, one probe after another: 46% of a
# single query's time (perf).
cdef inline size_t _dir_group(const RunDir *d, uint64_t lo) noexcept nogil:
    """The first group of slabs whose last key is >= lo (the group count: none)."""
    cdef size_t a = 0, b = (d.n + DIR_GROUP - 1) // DIR_GROUP, mid
    while a < b:
        mid = (a + b) >> 1
        if d.top[mid] < lo:
            a = mid + 1
        else:
            b = mid
    return a


cdef inline int _dir_slab(const RunDir *d, size_t i, size_t psize, size_t lw,
                          Slab *slab) noexcept nogil:
    """Decode slab i of a directory's run, checked against its pages and the key width."""
    cdef MDB_val v
    cdef int rc
    v.mv_data = <void *>d.data[i]
    v.mv_size = d.size[i]
    if not val_in_pages(&v, psize):
        return CORRUPT_SLAB
    rc = open_value(d.data[i], d.size[i], slab)
    if rc == 0 and slab.lw != lw:
        return CORRUPT_SLAB
    return rc


# A query's probes run in passes so that the memory they read is fetched in parallel, not
# one miss after another: (1) find every run's group of slabs for every probe in the
# directories' tops and prefetch the group; (2) find the slab in its group and prefetch
# its header; (3) decode each header, guess where the range starts (interpolation) and
# prefetch those keys and low words; (4) scan. At 256 bits and k=31 a query reads ~190
# slabs that are rarely in cache; the passes measured 1.6x one probe at a time.
cdef int _probe_push(ProbeBuf *b, RunDir *d, MDB_cursor *cur, size_t psize, uint64_t lo,
                     uint64_t hi, uint64_t pk, const uint64_t *pkt,
                     uint64_t pmask) noexcept nogil:
    """Pass 1: find the run's group of slabs whose keys reach lo in its directory (built on
    the run's first probe; `pmask`: the table's prefix mask), queue it with the range and
    prefetch the group's keys and slab addresses; 0 (queued, or nothing in the run at or
    above lo, or the run's filter says it holds no key of the range's prefix), or an
    error."""
    cdef size_t cap, g, e
    cdef void *t
    cdef Probe *pr
    cdef int rc
    if not d.built:
        rc = _build_dir(d, cur, psize, pmask)
        if rc:
            return rc
    # every key in [lo, hi] has lo's prefix when lo and hi share it (leading bits)
    if d.filt != NULL and ((lo ^ hi) & d.pmask) == 0 and not _filter_has(d, lo & d.pmask):
        return 0
    g = _dir_group(d, lo) * DIR_GROUP
    if g >= d.n:
        return 0
    e = g + DIR_GROUP - 1 if g + DIR_GROUP <= d.n else d.n - 1
    bits.prefetch(&d.last[g])
    bits.prefetch(&d.last[e])
    bits.prefetch(&d.data[g])
    bits.prefetch(&d.data[e])
    bits.prefetch(&d.size[e])
    if b.n == b.cap:
        cap = b.cap * 2 if b.cap else 64
        t = realloc(b.p, cap * sizeof(Probe))
        if t == NULL:
            return NO_MEMORY
        b.p = <Probe *>t
        b.cap = cap
    pr = &b.p[b.n]
    pr.dir = d
    pr.si = g
    pr.lo = lo
    pr.hi = hi
    pr.pk = pk
    pr.pkt = pkt
    pr.q = 0
    b.n += 1
    return 0


cdef inline void _probe_find(Probe *pr) noexcept nogil:
    """Pass 2: the first slab of the probe's group whose last key is >= lo (the group's
    last key is), and a prefetch of its header."""
    cdef const RunDir *d = pr.dir
    while d.last[pr.si] < pr.lo:
        pr.si += 1
    bits.prefetch(d.data[pr.si])


cdef int _probe_guess(Probe *pr, size_t lw, size_t psize) noexcept nogil:
    """Pass 3: decode the slab's header, guess where the range starts, prefetch there."""
    cdef int rc = _dir_slab(pr.dir, pr.si, psize, lw, &pr.slab)
    cdef size_t g, e
    cdef uint64_t last
    if rc:
        return rc
    last = pr.dir.last[pr.si]
    g = _guess(&pr.slab, pr.lo, last)
    pr.guess = g
    # the entries the range should hold, as the keys spread (a few lines at most)
    e = 2
    if last > pr.slab.kbase and pr.hi > pr.lo:
        e += <size_t>(<double>(pr.hi - pr.lo) / <double>(last - pr.slab.kbase) *
                      <double>pr.slab.c)
    if g + e > pr.slab.c:
        e = pr.slab.c - g
    _prefetch_span(pr.slab.keys + g * pr.slab.kw, e * pr.slab.kw)
    _prefetch_span(pr.slab.seqs + g * pr.slab.sw, e * pr.slab.sw)   # read by a hit
    if lw:
        _prefetch_span(pr.slab.lows + g * lw * 8, e * lw * 8)
    return 0


cdef inline void _prefetch_span(const uint8_t *p, size_t n) noexcept nogil:
    """Prefetch the cache lines of [p, p + n), 16 of them at most."""
    cdef size_t off = 0
    if n > 16 * 64:
        n = 16 * 64
    while off < n:
        bits.prefetch(p + off)
        off += 64
    if n:
        bits.prefetch(p + n - 1)


cdef int _probe_scan(Probe *pr, int k, HitBuf *hits, size_t lw, size_t psize) noexcept nogil:
    """Pass 4: push (seq, distance) of the slab's entries in the probe's range within k,
    going on into the run's next slabs while the range does (equal keys may span slabs)."""
    cdef bint past
    cdef Slab slab
    cdef size_t si = pr.si + 1, start = hits.n
    cdef size_t i = _lower_bound(&pr.slab, pr.lo, pr.dir.last[pr.si], pr.guess)
    cdef int rc = _scan_slab(&pr.slab, i, pr.hi, pr.pk, k, hits, pr.pkt, lw, &past)
    while rc == 0 and not past and si < pr.dir.n:
        rc = _dir_slab(pr.dir, si, psize, lw, &slab)
        if rc == 0:
            rc = _scan_slab(&slab, 0, pr.hi, pr.pk, k, hits, pr.pkt, lw, &past)
        si += 1
    for i in range(start, hits.n):
        hits.h[i].q = pr.q
    return rc


cdef int _run_probes(ProbeBuf *probes, int k, HitBuf *hits, size_t lw,
                     size_t psize, RunDir **failed) noexcept nogil:
    """Passes 2 to 4 over the queued probes, each pass over all of them before the next;
    on an error, `failed` is the run of the probe that met it (its shard names the place)."""
    cdef size_t r
    cdef int rc = 0
    for r in range(probes.n):
        _probe_find(&probes.p[r])
    r = 0
    while r < probes.n and rc == 0:
        rc = _probe_guess(&probes.p[r], lw, psize)
        r += 1
    if rc == 0:
        r = 0
        while r < probes.n and rc == 0:
            rc = _probe_scan(&probes.p[r], k, hits, lw, psize)
            r += 1
    if rc and r:
        failed[0] = probes.p[r - 1].dir
    return rc


# A batch's probe in the key-order scan (ReadContext._scan_in_key_order), sorted by _cmp_item
cdef struct ProbeItem:
    uint64_t lo, hi, pk
    const uint64_t *pkt        # the table key's further words (wide)
    size_t qi
    int t, s0, s1


cdef int _cmp_item(const void *a, const void *b) noexcept nogil:
    cdef const ProbeItem *x = <const ProbeItem *>a
    cdef const ProbeItem *y = <const ProbeItem *>b
    if x.t != y.t:
        return x.t - y.t
    if x.lo != y.lo:
        return -1 if x.lo < y.lo else 1
    return (x.qi > y.qi) - (x.qi < y.qi)


cdef inline uint64_t _key(const Tables *tb, WidePermuter wp, int t, const uint64_t *q,
                          int words, uint64_t *pkw) noexcept nogil:
    """The first word of q's permuted key in table t (all of it in pkw when wide)."""
    if words == 1:
        return permute(tb, t, q[0])
    wp.permute(t, q, pkw)
    return pkw[0]
