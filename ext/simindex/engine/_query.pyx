# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The query engine: for each query and table, the prefix range of its permuted key (and of
every probe of a plan with flips) is scanned in every run of the shard that holds it, candidates are popcount-filtered, then
de-duplicated, checked against their records and sorted. All of it in C on LMDB's memory
map with the GIL released; a Python object is made per match only.

A ReadContext holds read transactions on the records and on every shard, renewed per call
and reset after it (an idle reader pins no pages). scan_shard is the same scan for one
shard of a distributed index (its candidates are resolved by the ledger's ReadContext).
"""

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, calloc, realloc, free, qsort
from libc.string cimport memcpy, memmove, memset

from simindex.engine.clmdb cimport (
    si_guard_install,
    MDB_env, MDB_txn, MDB_cursor, MDB_cursor_op, MDB_dbi, MDB_val, MDB_RDONLY, MDB_SET_RANGE,
    MDB_NEXT, MDB_LAST, MDB_SET_KEY, MDB_NOTFOUND, mdb_txn_begin, mdb_txn_renew, mdb_txn_reset, mdb_txn_abort,
    mdb_txn_id, mdb_cursor_open, mdb_cursor_renew, mdb_cursor_close, mdb_cursor_get, mdb_get,
)
from posix.unistd cimport getpid
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
cimport simindex.bits as bits
cimport simindex.engine.layout as layout
from simindex.engine._lmdb cimport (
    Env, Txn, Handle, Gate, error, process_id, page_size, val_in_pages, CORRUPT_BLOCK, CORRUPT_KEY,
    CORRUPT_RECORD, CORRUPT_STATE, NO_MEMORY,
)
from simindex.engine._permute cimport Permuter, WidePermuter, Tables, permute, prefix_range
from simindex.engine._blocks cimport (
    Block, RunList, open_block, open_value, key_at, seq_at, tail_at, read_state, free_state,
    sort_pairs)
from simindex.engine._records cimport (
    Tail, load_tail, drop_tail_below, free_tail, record_id_meta, record_fp, record_header,
    record_plain_int, record_body, damaged_record,
)
from simindex.engine._join cimport PairBuf, pair_push, pair_arrays, free_pairs
import os.path

from simindex.errors import MapResizedError

if si_guard_install():           # LMDB calls return an error on a damaged page (guard.h)
    raise OSError("cannot install the page-fault handlers")


# ---------------------------------------------------------------- hits
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


# ---------------------------------------------------------------- the scan
cdef inline size_t _guess(const Block *blk, uint64_t lo, uint64_t last) noexcept nogil:
    """Where in a block whose keys span [kbase, last] the first key >= lo should be, by
    interpolation (permuted simhash keys spread evenly)."""
    cdef size_t c = blk.c, g
    cdef uint64_t first = blk.kbase
    if lo <= first:
        return 0
    if lo > last or last <= first:
        return c - 1
    g = <size_t>(<double>(lo - first) / <double>(last - first) * <double>(c - 1))
    return g if g < c else c - 1


cdef inline size_t _lower_bound(const Block *blk, uint64_t lo, uint64_t last,
                                size_t g) noexcept nogil:
    """The first entry of a block with key >= lo, found by galloping from the guess g (see
    _guess), so a block not in cache costs one or two cache lines of keys, not a binary
    search's nine. Any guess below the count gives the right answer; only the speed
    depends on it."""
    cdef size_t c = blk.c, a, b, mid, step = 1
    if lo <= blk.kbase:
        return 0
    if key_at(blk, g) < lo:
        a = g + 1                          # every key before a is < lo
        while a + step <= c and key_at(blk, a + step - 1) < lo:
            a += step
            step *= 2
        b = a + step - 1 if a + step - 1 < c else c
    else:
        b = g                              # key b is >= lo (or b == c)
        while b >= step and key_at(blk, b - step) >= lo:
            b -= step
            step *= 2
        a = b - step + 1 if b >= step else 0
    while a < b:
        mid = (a + b) >> 1
        if key_at(blk, mid) < lo:
            a = mid + 1
        else:
            b = mid
    return a


cdef inline int _block_at(MDB_cursor *cur, MDB_cursor_op op, uint64_t run_id, uint64_t lo,
                         MDB_val *key, MDB_val *val, bint *found) noexcept nogil:
    """Move `cur` to run `run_id`'s first block whose last key reaches lo (MDB_SET_RANGE)
    or to the next block (MDB_NEXT); `found` says whether it is a block of that run. 0, or
    an error."""
    cdef uint8_t kbuf[layout.BLOCK_KEY]
    cdef int rc
    if op == MDB_SET_RANGE:
        bits.store_be64(kbuf, run_id)
        bits.store_be64(kbuf + 8, lo)
        bits.store_be32(kbuf + 16, 0)
        key.mv_size = layout.BLOCK_KEY
        key.mv_data = kbuf
    found[0] = False
    rc = mdb_cursor_get(cur, key, val, op)
    if rc == MDB_NOTFOUND:
        return 0
    if rc:
        return rc
    if key.mv_size != layout.BLOCK_KEY:
        return CORRUPT_KEY
    found[0] = bits.load_be64(key.mv_data) == run_id
    return 0


cdef inline int _scan_block(const Block *blk, size_t i, uint64_t hi, uint64_t pk, int k,
                            HitBuf *hits, const uint64_t *pkt, size_t tw,
                            bint *past) noexcept nogil:
    """Push (seq, distance) of the block's entries from i on with key <= hi within k of pk
    (and of the `tw` tail words `pkt`); `past` says whether a key above hi ended it."""
    cdef size_t w
    cdef uint64_t x
    cdef int d, rc
    past[0] = False
    while i < blk.c:
        x = key_at(blk, i)
        if x > hi:
            past[0] = True
            return 0
        d = bits.popcount(x ^ pk)
        if d <= k:
            for w in range(tw):
                d += bits.popcount(tail_at(blk, i, w) ^ pkt[w])
            if d <= k:
                rc = _hit_push(hits, seq_at(blk, i), d)
                if rc:
                    return rc
        i += 1
    return 0


cdef int _scan_run(MDB_cursor *cur, uint64_t run_id, uint64_t lo, uint64_t hi,
                   uint64_t pk, int k, HitBuf *hits, const uint64_t *pkt=NULL,
                   size_t tw=0) noexcept nogil:
    """Push (seq, distance) of every entry of run `run_id` with key in [lo, hi] within k of pk
    (and, for wide fingerprints, of its `tw` tail words `pkt`: every block must hold tw)."""
    cdef MDB_val key, val
    cdef bint found, past, first = True
    cdef Block blk
    cdef uint64_t last
    cdef size_t i
    cdef int rc = _block_at(cur, MDB_SET_RANGE, run_id, lo, &key, &val, &found)
    while rc == 0 and found:
        rc = open_block(&key, &val, &blk)
        if rc:
            return rc
        if blk.tw != tw:
            return CORRUPT_BLOCK
        i = 0
        if first:
            last = bits.load_be64(<const uint8_t *>key.mv_data + 8)
            i = _lower_bound(&blk, lo, last, _guess(&blk, lo, last))
            first = False
        rc = _scan_block(&blk, i, hi, pk, k, hits, pkt, tw, &past)
        if rc or past:
            return rc
        rc = _block_at(cur, MDB_NEXT, run_id, lo, &key, &val, &found)
    return rc


# ---------------------------------------------------------------- run directories
cdef void _free_dir(RunDir *d) noexcept nogil:
    free(d.last)
    free(d.top)
    free(<void *>d.data)
    free(d.size)
    d.last = NULL
    d.top = NULL
    d.data = NULL
    d.size = NULL
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
    if sv.mapgen == mapgen:
        r = 0
        while r < nr and o < sv.ndirs:          # both in (table, run) order
            if _before(&sv.dirs[o], &nd[r]):
                o += 1
            elif _before(&nd[r], &sv.dirs[o]):
                r += 1
            else:
                if sv.dirs[o].built and sv.dirs[o].kept:
                    nd[r] = sv.dirs[o]
                    memset(&sv.dirs[o], 0, sizeof(RunDir))
                o += 1
                r += 1
    _free_dirs(sv)
    sv.dirs = nd
    sv.ndirs = nr
    sv.mapgen = mapgen
    return 0


cdef int _build_dir(RunDir *d, MDB_cursor *cur, size_t psize) noexcept nogil:
    """Walk run d.run's blocks once (their keys: no block is read) into its directory."""
    cdef MDB_val key, val
    cdef bint found
    cdef size_t cap = 0, n = 0, g
    cdef uint64_t last
    cdef void *t
    cdef int rc = _block_at(cur, MDB_SET_RANGE, d.run, 0, &key, &val, &found)
    _free_dir(d)
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
        rc = _block_at(cur, MDB_NEXT, d.run, 0, &key, &val, &found)
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
    return 0


# A directory is searched in two steps: a binary search in `top` (one key per DIR_GROUP
# blocks, ~1 KiB per million table entries, so the tops of every run a query reads stay in
# cache), then one group of `last` (a cache line, or two) and its `data` pointers, fetched
# for every probe of a query before any is read. At 100M fingerprints in 10 tables a binary
# search of `last` missed the cache ~5 times per probe, one probe after another: 46% of a
# single query's time (perf).
cdef inline size_t _dir_group(const RunDir *d, uint64_t lo) noexcept nogil:
    """The first group of blocks whose last key is >= lo (the group count: none)."""
    cdef size_t a = 0, b = (d.n + DIR_GROUP - 1) // DIR_GROUP, mid
    while a < b:
        mid = (a + b) >> 1
        if d.top[mid] < lo:
            a = mid + 1
        else:
            b = mid
    return a


cdef inline int _dir_block(const RunDir *d, size_t i, size_t psize, size_t tw,
                           Block *blk) noexcept nogil:
    """Decode block i of a directory's run, checked against its pages and the key width."""
    cdef MDB_val v
    cdef int rc
    v.mv_data = <void *>d.data[i]
    v.mv_size = d.size[i]
    if not val_in_pages(&v, psize):
        return CORRUPT_BLOCK
    rc = open_value(d.data[i], d.size[i], blk)
    if rc == 0 and blk.tw != tw:
        return CORRUPT_BLOCK
    return rc


# A query's probes run in passes so that the memory they read is fetched in parallel, not
# one miss after another: (1) find every run's group of blocks for every probe in the
# directories' tops and prefetch the group; (2) find the block in its group and prefetch
# its header; (3) decode each header, guess where the range starts (interpolation) and
# prefetch those keys and tail words; (4) scan. At 256 bits and k=31 a query reads ~190
# blocks that are rarely in cache; the passes measured 1.6x one probe at a time.
cdef int _probe_push(ProbeBuf *b, RunDir *d, MDB_cursor *cur, size_t psize, uint64_t lo,
                     uint64_t hi, uint64_t pk, const uint64_t *pkt) noexcept nogil:
    """Pass 1: find the run's group of blocks whose keys reach lo in its directory (built on
    the run's first probe), queue it with the range and prefetch the group's keys and block
    addresses; 0 (queued, or nothing in the run at or above lo), or an error."""
    cdef size_t cap, g, e
    cdef void *t
    cdef Probe *pr
    cdef int rc
    if not d.built:
        rc = _build_dir(d, cur, psize)
        if rc:
            return rc
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
    pr.bi = g
    pr.lo = lo
    pr.hi = hi
    pr.pk = pk
    pr.pkt = pkt
    pr.q = 0
    b.n += 1
    return 0


cdef inline void _probe_find(Probe *pr) noexcept nogil:
    """Pass 2: the first block of the probe's group whose last key is >= lo (the group's
    last key is), and a prefetch of its header."""
    cdef const RunDir *d = pr.dir
    while d.last[pr.bi] < pr.lo:
        pr.bi += 1
    bits.prefetch(d.data[pr.bi])


cdef int _probe_guess(Probe *pr, size_t tw, size_t psize) noexcept nogil:
    """Pass 3: decode the block's header, guess where the range starts, prefetch there."""
    cdef int rc = _dir_block(pr.dir, pr.bi, psize, tw, &pr.blk)
    cdef size_t g, e
    cdef uint64_t last
    if rc:
        return rc
    last = pr.dir.last[pr.bi]
    g = _guess(&pr.blk, pr.lo, last)
    pr.guess = g
    # the entries the range should hold, as the keys spread (a few lines at most)
    e = 2
    if last > pr.blk.kbase and pr.hi > pr.lo:
        e += <size_t>(<double>(pr.hi - pr.lo) / <double>(last - pr.blk.kbase) *
                      <double>pr.blk.c)
    if g + e > pr.blk.c:
        e = pr.blk.c - g
    _prefetch_span(pr.blk.keys + g * pr.blk.kw, e * pr.blk.kw)
    _prefetch_span(pr.blk.seqs + g * pr.blk.sw, e * pr.blk.sw)   # read by a hit
    if tw:
        _prefetch_span(pr.blk.tails + g * tw * 8, e * tw * 8)
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


cdef int _probe_scan(Probe *pr, int k, HitBuf *hits, size_t tw, size_t psize) noexcept nogil:
    """Pass 4: push (seq, distance) of the block's entries in the probe's range within k,
    going on into the run's next blocks while the range does (equal keys may span blocks)."""
    cdef bint past
    cdef Block blk
    cdef size_t bi = pr.bi + 1, start = hits.n
    cdef size_t i = _lower_bound(&pr.blk, pr.lo, pr.dir.last[pr.bi], pr.guess)
    cdef int rc = _scan_block(&pr.blk, i, pr.hi, pr.pk, k, hits, pr.pkt, tw, &past)
    while rc == 0 and not past and bi < pr.dir.n:
        rc = _dir_block(pr.dir, bi, psize, tw, &blk)
        if rc == 0:
            rc = _scan_block(&blk, 0, pr.hi, pr.pk, k, hits, pr.pkt, tw, &past)
        bi += 1
    for i in range(start, hits.n):
        hits.h[i].q = pr.q
    return rc


cdef int _run_probes(ProbeBuf *probes, int k, HitBuf *hits, size_t tw,
                     size_t psize, RunDir **failed) noexcept nogil:
    """Passes 2 to 4 over the queued probes, each pass over all of them before the next;
    on an error, `failed` is the run of the probe that met it (its shard names the place)."""
    cdef size_t r
    cdef int rc = 0
    for r in range(probes.n):
        _probe_find(&probes.p[r])
    r = 0
    while r < probes.n and rc == 0:
        rc = _probe_guess(&probes.p[r], tw, psize)
        r += 1
    if rc == 0:
        r = 0
        while r < probes.n and rc == 0:
            rc = _probe_scan(&probes.p[r], k, hits, tw, psize)
            r += 1
    if rc and r:
        failed[0] = probes.p[r - 1].dir
    return rc


# A big batch over big tables scans in key order instead, table by table (the paper's
# batch plan): every probe of every query is sorted by (table, range start), so the blocks
# of a table are read in order, each about once, in windows of the same passes, and
# the memory system streams them instead of missing on four random blocks per query. Hits
# carry their query and are grouped by it afterwards. Measured (10k queries, k=3, 4
# tables): 10M fingerprints (40M table entries) 209-213k -> 264k q/s; 3M (12M entries)
# 505-541k -> 476-494k and 1M 540k -> 474-513k, where the tables stay mostly in cache.
cdef enum:
    KEY_ORDER_MIN = 256        # queries in a batch from which it may scan in key order
    KEY_ORDER_WINDOW = 16      # probes taken through the passes together
    KEY_ORDER_ENTRIES = 24000000   # ...and table entries (~240 MB) of the shards it reads

cdef size_t _key_order_min = KEY_ORDER_MIN           # (tests lower both: key_order())
cdef size_t _key_order_entries = KEY_ORDER_ENTRIES


def key_order(min_queries=None, min_entries=None):
    """The batch size and table entries from which a batch scans in key order, as a tuple;
    given values replace them (tests make small batches take that path)."""
    global _key_order_min, _key_order_entries
    old = (_key_order_min, _key_order_entries)
    if min_queries is not None:
        _key_order_min = min_queries
    if min_entries is not None:
        _key_order_entries = min_entries
    return old


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


cdef enum:
    TAIL_TABLES_MIN = 256    # unapplied records below which a pass is all a query needs
    TAIL_BUILD_COST = 32     # a table entry's build (permute, sort) against a pass's record

cdef size_t _tail_tables_min = TAIL_TABLES_MIN          # (tests and tools: tail_tables())


def tail_tables(min_records=None):
    """The kept unapplied records from which a read context may build tables over them;
    a given value replaces it (0: from any number; a huge one: always a pass)."""
    global _tail_tables_min
    old = _tail_tables_min
    if min_records is not None:
        _tail_tables_min = min_records
    return old


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


cdef inline uint64_t _key(const Tables *tb, WidePermuter wp, int t, const uint64_t *q,
                          int words, uint64_t *pkw) noexcept nogil:
    """The first word of q's permuted key in table t (all of it in pkw when wide)."""
    if words == 1:
        return permute(tb, t, q[0])
    wp.permute(t, q, pkw)
    return pkw[0]


# ---------------------------------------------------------------- results
# The Python layer's result type and meta decoder (set_match_type): with them the core builds
# the final Match objects itself, so a query makes no intermediate Python object per match.
cdef object _MATCH = None
cdef object _UNPACK = None

cdef extern from *:
    """
    /* A 4-tuple of a tuple subclass without fields of its own (the Match namedtuple): what
       tuple.__new__(cls, (a, b, c, d)) makes, without the method lookup and the tuple in
       between. tp_alloc returns it zeroed and tracked; its items are set before any use. */
    static PyObject *si_tuple4(PyObject *cls, PyObject *a, PyObject *b, PyObject *c,
                               PyObject *d) {
        PyTypeObject *t = (PyTypeObject *)cls;
        PyObject *o = t->tp_alloc(t, 4);
        if (o == NULL) return NULL;
        Py_INCREF(a); PyTuple_SET_ITEM(o, 0, a);
        Py_INCREF(b); PyTuple_SET_ITEM(o, 1, b);
        Py_INCREF(c); PyTuple_SET_ITEM(o, 2, c);
        Py_INCREF(d); PyTuple_SET_ITEM(o, 3, d);
        /* of atomic items only (an int or str id, a None meta) it can hold no cycle: the
           collector would untrack it at its first pass; untracked now, the collections
           that a big batch's matches trigger need not traverse it */
        if (!PyObject_GC_IsTracked(a) && !PyObject_GC_IsTracked(b) &&
                !PyObject_GC_IsTracked(c) && !PyObject_GC_IsTracked(d))
            PyObject_GC_UnTrack(o);
        return o;
    }

    /* The Match of a plain hit (an integer id, a None meta; see record_plain_int), made
       from the values the query found without the GIL: the record is not read again. */
    static PyObject *si_match_plain(PyObject *cls, unsigned long long id,
                                    unsigned long long fp, long dist) {
        PyTypeObject *t = (PyTypeObject *)cls;
        PyObject *a, *b, *c, *o;
        a = PyLong_FromUnsignedLongLong(id);
        if (a == NULL) return NULL;
        b = PyLong_FromUnsignedLongLong(fp);
        if (b == NULL) { Py_DECREF(a); return NULL; }
        c = PyLong_FromLong(dist);
        if (c == NULL) { Py_DECREF(a); Py_DECREF(b); return NULL; }
        o = t->tp_alloc(t, 4);
        if (o == NULL) { Py_DECREF(a); Py_DECREF(b); Py_DECREF(c); return NULL; }
        PyTuple_SET_ITEM(o, 0, a);
        PyTuple_SET_ITEM(o, 1, b);
        PyTuple_SET_ITEM(o, 2, c);
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(o, 3, Py_None);
        PyObject_GC_UnTrack(o);      /* of atomic items only: see si_tuple4 */
        return o;
    }
    """
    object si_tuple4(object cls, object a, object b, object c, object d)
    object si_match_plain(object cls, unsigned long long id, unsigned long long fp, long dist)
    int PyGC_Disable()
    int PyGC_Enable()


def set_match_type(cls, unpack):
    """Register the namedtuple (id, fingerprint, distance, meta) the queries return, and the
    function that decodes a stored meta value."""
    global _MATCH, _UNPACK
    if not (isinstance(cls, type) and issubclass(cls, tuple)) or \
            cls.__basicsize__ != tuple.__basicsize__ or cls.__dictoffset__:
        raise TypeError("set_match_type needs a tuple subclass without fields of its own")
    _MATCH, _UNPACK = cls, unpack


# Batches building their results at once (their threads take turns on the GIL while one
# runs the unpacker): the collector stays paused until the last of them is done.
cdef int _gc_paused = 0
cdef bint _gc_was_on = False


cdef list _hit_lists(HitBuf *hits, size_t *qstart, Py_ssize_t n, bint matches=False,
                     int words=1):
    """Per query, [(distance, fingerprint, seq, id, meta bytes or None), ...] of resolved
    hits; with `matches`, [Match(id, fingerprint, distance, meta), ...] instead."""
    global _gc_paused, _gc_was_on
    cdef object cls = _MATCH
    if matches and cls is None:
        raise RuntimeError("no match type registered (set_match_type)")
    if n > 1:
        # The lists and tuples made here hold no cycles, yet their allocations would run
        # the collector every 700 of them: 13% of a 40k batch's time, all under the GIL.
        if _gc_paused == 0:
            _gc_was_on = PyGC_Disable()
        _gc_paused += 1
        try:
            return _hit_lists_of(hits, qstart, n, matches, words, cls)
        finally:
            _gc_paused -= 1
            if _gc_paused == 0 and _gc_was_on:
                PyGC_Enable()
    return _hit_lists_of(hits, qstart, n, matches, words, cls)


cdef list _hit_lists_of(HitBuf *hits, size_t *qstart, Py_ssize_t n, bint matches, int words,
                        object cls):
    cdef Py_ssize_t qi, j
    cdef size_t r
    cdef Hit *hh
    cdef list out = PyList_New(n), lst
    cdef object m
    for qi in range(n):
        lst = PyList_New(<Py_ssize_t>(qstart[qi + 1] - qstart[qi]))
        Py_INCREF(lst)
        PyList_SET_ITEM(out, qi, lst)        # (steals the reference taken above)
        j = 0
        for r in range(qstart[qi], qstart[qi + 1]):
            hh = &hits.h[r]
            if matches and hh.plain:
                m = si_match_plain(cls, hh.id, hh.fp, hh.dist)
            else:
                id_, meta = record_id_meta(hh.val, hh.vlen, words)
                fp = hh.fp if words == 1 else record_fp(hh.val, words)
                if matches:
                    if meta is not None:
                        meta = _UNPACK(meta, "meta value")
                    m = si_tuple4(cls, id_, fp, hh.dist, meta)
                else:
                    m = (hh.dist, fp, hh.seq, id_, meta)
            Py_INCREF(m)
            PyList_SET_ITEM(lst, j, m)
            j += 1
    return out


# ---------------------------------------------------------------- the read context
cdef class ReadContext(Handle):
    """Read transactions on the records and on every shard, renewed per call.

    One context serves one caller at a time; the index keeps a pool of them so threads can
    query at once. Queries run without the GIL and see one snapshot per environment; every
    candidate is checked against the records snapshot, so the answer is exact for it.
    """

    def __cinit__(self, Env records, list shards):
        cdef int s
        cdef Env env
        self.views = NULL
        self.shard_envs = NULL
        self.mapgens = NULL
        self.blocks_dbi = NULL
        self.state_dbi = NULL
        self.rec_txn = NULL
        self.rec_cur = NULL
        self.rec_state = VIEW_NEW
        self.nshards = len(shards)
        self.records = records
        self.envs = list(shards)
        records.check()
        self.rec_env = records.env
        # (at least one slot: a records-only context, used by resolve(), has no shards)
        self.shard_envs = <MDB_env **>calloc(self.nshards or 1, sizeof(MDB_env *))
        self.mapgens = <size_t **>calloc(self.nshards or 1, sizeof(size_t *))
        self.views = <ShardView *>calloc(self.nshards or 1, sizeof(ShardView))
        self.blocks_dbi = <MDB_dbi *>calloc(self.nshards or 1, sizeof(MDB_dbi))
        self.state_dbi = <MDB_dbi *>calloc(self.nshards or 1, sizeof(MDB_dbi))
        if self.shard_envs == NULL or self.views == NULL or self.blocks_dbi == NULL or \
                self.state_dbi == NULL or self.mapgens == NULL:
            raise MemoryError()
        self.seqs_dbi = records.dbi(layout.DB_SEQS.decode())
        self.psize = page_size(records.env)
        self.sums = records.sums
        for s in range(self.nshards):
            env = <Env>self.envs[s]
            env.check()
            self.shard_envs[s] = env.env
            self.mapgens[s] = &env.mapgen
            self.blocks_dbi[s] = env.dbi(layout.DB_BLOCKS.decode())
            self.state_dbi[s] = env.dbi(layout.DB_STATE.decode())
            env.deps.add(self)
        records.deps.add(self)

    def __dealloc__(self):
        self.invalidate()
        free(self.views)
        free(self.shard_envs)
        free(<void *>self.mapgens)
        free(self.blocks_dbi)
        free(self.state_dbi)

    cdef void invalidate(self) noexcept:
        cdef int s
        cdef bint mine = self.records is not None and self.records.pid == getpid()
        if self.views != NULL:
            for s in range(self.nshards):
                if self.views[s].cur != NULL:
                    if mine:
                        mdb_cursor_close(self.views[s].cur)
                    self.views[s].cur = NULL
                if self.views[s].txn != NULL:
                    if mine:
                        mdb_txn_abort(self.views[s].txn)
                    self.views[s].txn = NULL
                free_state(&self.views[s].runs)
                _free_dirs(&self.views[s])
                self.views[s].state = VIEW_NEW
                self.views[s].parsed = 0
        if self.rec_cur != NULL:
            if mine:
                mdb_cursor_close(self.rec_cur)
            self.rec_cur = NULL
        if self.rec_txn != NULL:
            if mine:
                mdb_txn_abort(self.rec_txn)
            self.rec_txn = NULL
        self.rec_state = VIEW_NEW
        free_tail(&self.ctail)
        self.ctail_ok = False
        _free_tail_tables(&self.ttab)

    cdef object _error(self, int rc, str what):
        """The error of a call that failed with `rc`, naming the damaged record it met."""
        if rc == CORRUPT_RECORD and self.bad_seq:
            return damaged_record(what, self.bad_seq)
        return error(rc, what)

    def close(self):
        self.invalidate()
        self.records.deps.discard(self)
        for env in self.envs:
            (<Env>env).deps.discard(self)

    cdef int _begin_records(self) noexcept nogil:
        cdef int rc = 0
        if self.rec_state == VIEW_NEW:
            rc = mdb_txn_begin(self.rec_env, NULL, MDB_RDONLY, &self.rec_txn)
            if rc:
                self.rec_txn = NULL
                return rc
        elif self.rec_state == VIEW_RESET:
            rc = mdb_txn_renew(self.rec_txn)
            if rc:
                return rc
        self.rec_state = VIEW_ACTIVE
        if self.rec_cur == NULL:
            rc = mdb_cursor_open(self.rec_txn, self.seqs_dbi, &self.rec_cur)
            if rc:
                self.rec_cur = NULL
        else:
            rc = mdb_cursor_renew(self.rec_txn, self.rec_cur)
        return rc

    cdef int _tail(self, MDB_cursor *cur, uint64_t start, uint64_t last, int words,
                   Tail **out) noexcept nogil:
        """The records of seq >= start in this call's own records snapshot (newest seq
        `last`; `cur` on its seqs), kept across calls: a later snapshot reads only the
        records committed since, and drops those every shard has applied since.

        Own snapshots only: they only move forward and committed seqs are never handed out
        again, so a kept record is either still there or removed (a hit on it is dropped
        when its record is resolved; a newest seq below the kept ones means they were
        removed). A given transaction may hold uncommitted records and loads its own."""
        cdef Tail *c = &self.ctail
        cdef size_t had
        cdef bint changed = False
        cdef int rc = 0
        if not self.ctail_ok or c.words != words or start < self.ctail_from:
            free_tail(c)                     # a first load (or, never seen, a lower start)
            c.words = words
            c.sums = self.sums
            self.ctail_from = start
            self.ctail_upto = start - 1
            changed = True
        if start > self.ctail_from:
            had = c.n
            drop_tail_below(c, start)
            self.ctail_from = start
            changed |= c.n != had
        if last > self.ctail_upto:
            had = c.n
            rc = load_tail(cur, self.ctail_upto + 1, c)
            if rc:
                self.ctail_ok = False
                self.ttab.ok = False
                return rc
            self.tail_loads += c.n - had
            self.ctail_upto = last
            changed |= c.n != had
        if changed:                          # its tables are stale
            self.ttab.ok = False
            self.tail_work = 0
        self.ctail_ok = True
        out[0] = c
        return 0

    cdef int _waiting(self, MDB_cursor *cur, uint64_t last, int words, int ntables, bint own,
                      Tail *local, Tail **out) noexcept nogil:
        """The committed records not yet in every shard (above the lowest applied seq of
        all of them, so single queries and batches share one kept list): the context's kept
        list for its own snapshots, else loaded into `local`."""
        cdef uint64_t low = 0xFFFFFFFFFFFFFFFF
        cdef int s, rc
        for s in range(self.nshards):
            rc = self._activate(s, ntables)
            if rc:
                return rc
            if self.views[s].runs.applied < low:
                low = self.views[s].runs.applied
        if own:
            return self._tail(cur, low + 1, last, words, out)
        out[0] = local
        return load_tail(cur, low + 1, local)

    cdef int _tail_check(self, const Tables *tb, Tail *tail, uint64_t applied,
                         const uint64_t *q, int words, int k, size_t nq,
                         HitBuf *hits) noexcept nogil:
        """Check the unapplied records above `applied` against q (`nq`: the queries of the
        call not yet counted). A pass over them; or, on a 64-bit index once the kept tail
        has served enough queries to pay for it, its own tables probed like runs."""
        cdef int rc
        if tail != &self.ctail or words != 1 or tail.n < _tail_tables_min or tail.n == 0:
            return _tail_hits(tail, applied, q, k, hits)
        if not (self.ttab.ok and self.ttab.tb == tb):
            # ski rental: build once the passes have cost what a build costs
            self.tail_work += nq * tail.n
            if self.tail_work < <size_t>TAIL_BUILD_COST * <size_t>tb.ntables * tail.n:
                return _tail_hits(tail, applied, q, k, hits)
            rc = _build_tail_tables(&self.ttab, tb, tail)
            if rc:
                return rc
            self.tail_builds += 1
        return _probe_tail_tables(&self.ttab, tb, applied, q[0], k, hits)

    cdef int _activate(self, int s, int ntables) noexcept nogil:
        """Begin (or renew) shard s's read txn and read its state: applied seq and runs.

        The cursor is kept across calls (renewed with the txn) and the state is read again
        only when the snapshot changed: a shard that took no write since costs a renew."""
        cdef ShardView *sv = &self.views[s]
        cdef int rc
        if sv.state == VIEW_ACTIVE:
            return 0
        if sv.state == VIEW_NEW:
            rc = mdb_txn_begin(self.shard_envs[s], NULL, MDB_RDONLY, &sv.txn)
            if rc:
                sv.txn = NULL
                return rc
        else:
            rc = mdb_txn_renew(sv.txn)
            if rc:
                return rc
        sv.state = VIEW_ACTIVE
        if sv.cur == NULL:
            rc = mdb_cursor_open(sv.txn, self.blocks_dbi[s], &sv.cur)
            if rc:
                sv.cur = NULL
                return rc
        else:
            rc = mdb_cursor_renew(sv.txn, sv.cur)
            if rc:
                return rc
        if sv.parsed and sv.parsed == mdb_txn_id(sv.txn) and sv.mapgen == self.mapgens[s][0]:
            return 0
        sv.parsed = 0
        rc = read_state(sv.txn, self.state_dbi[s], ntables, &sv.runs)
        if rc == 0:
            rc = _sync_dirs(sv, self.mapgens[s][0], ntables)
        if rc:
            return rc
        sv.parsed = mdb_txn_id(sv.txn)
        return 0

    cdef void _release(self) noexcept nogil:
        cdef int s
        for s in range(self.nshards):
            if self.views[s].state == VIEW_ACTIVE:
                mdb_txn_reset(self.views[s].txn)     # its cursor stays, to be renewed
                self.views[s].state = VIEW_RESET
        if self.rec_state == VIEW_ACTIVE:
            mdb_txn_reset(self.rec_txn)
            self.rec_state = VIEW_RESET

    cdef size_t _entries(self) noexcept nogil:
        """Table entries of the shards this call reads (their snapshots' run counts)."""
        cdef size_t total = 0, i
        cdef int s
        for s in range(self.nshards):
            if self.views[s].state == VIEW_ACTIVE:
                for i in range(self.views[s].runs.nruns):
                    total += bits.load64(<const uint8_t *>self.views[s].runs.raw.mv_data +
                                         layout.RUN_ENTRY * i + layout.RUN_COUNT_AT)
        return total

    cdef int _scan_in_key_order(self, const Tables *tb, WidePermuter wp,
                                const uint64_t *queries, Py_ssize_t n, int words, int k,
                                HitBuf *hits) noexcept nogil:
        """Every probe of a batch, sorted by (table, range start), scanned in that order into
        `hits`, each hit tagged with its query (see ProbeItem)."""
        cdef int T = tb.ntables, t, s, rc = 0
        cdef size_t per = 0, ni = 0, i, r
        cdef Py_ssize_t qi
        cdef uint32_t j
        cdef uint64_t pk
        cdef uint64_t *pkw
        cdef ProbeItem *items
        cdef ShardView *sv
        cdef ProbeBuf probes
        cdef size_t w, e
        cdef uint64_t *keys = <uint64_t *>malloc(<size_t>n * T * 4 * sizeof(uint64_t))
        for t in range(T):
            per += tb.probe_start[t + 1] - tb.probe_start[t]
        items = <ProbeItem *>malloc((<size_t>n * per or 1) * sizeof(ProbeItem))
        if keys == NULL or items == NULL:
            free(keys)
            free(items)
            return NO_MEMORY
        for qi in range(n):
            for t in range(T):
                pkw = keys + (<size_t>qi * T + t) * 4
                pk = _key(tb, wp, t, queries + qi * words, words, pkw)
                for j in range(tb.probe_start[t], tb.probe_start[t + 1]):
                    items[ni].pk = pk
                    items[ni].pkt = pkw + 1
                    items[ni].qi = <size_t>qi
                    items[ni].t = t
                    prefix_range(tb, t, pk ^ tb.probe[j], &items[ni].lo, &items[ni].hi,
                                 &items[ni].s0, &items[ni].s1)
                    ni += 1
        qsort(items, ni, sizeof(ProbeItem), _cmp_item)
        memset(&probes, 0, sizeof(ProbeBuf))
        i = 0
        while i < ni and rc == 0:
            # a window of consecutive probes in the passes of a single query's, so
            # the misses of blocks read in order still overlap
            probes.n = 0
            w = i
            while i < ni and i < w + KEY_ORDER_WINDOW and rc == 0:
                for s in range(items[i].s0, items[i].s1 + 1):
                    rc = self._activate(s, T)
                    if rc:
                        break
                    sv = &self.views[s]
                    for r in range(sv.runs.table_start[items[i].t],
                                   sv.runs.table_start[items[i].t + 1]):
                        e = probes.n
                        rc = _probe_push(&probes, &sv.dirs[r], sv.cur, self.psize,
                                         items[i].lo, items[i].hi, items[i].pk, items[i].pkt)
                        if rc:
                            break
                        if probes.n > e:
                            probes.p[e].q = items[i].qi
                    if rc:
                        break
                i += 1
            if rc == 0:
                rc = _run_probes(&probes, k, hits, words - 1, self.psize, &self.failed_dir)
        free(probes.p)
        free(items)
        free(keys)
        return rc

    cdef int _resolve_batch(self, MDB_cursor *cur, const uint64_t *queries, int words,
                            HitBuf *hits, size_t *qstart, Py_ssize_t n,
                            size_t psize) noexcept nogil:
        """Resolve a batch's hits (each query's de-duplicated, see _dedup) in the records by
        ascending seq, through one cursor: the records are read in key order, so a cold
        cache reads them ahead in big chunks and a warm one touches each page once. Then
        drop the hits of removed records, and sort each query's by (distance, seq)."""
        cdef size_t nh = hits.n, i, r, e, w = 0
        cdef Py_ssize_t qi
        # (seq, place) pairs, sorted by the bucket sort of run entries: the seqs shifted up
        # to fill the leading bits it buckets by (a third of a batch's time in qsort)
        cdef uint64_t *order = <uint64_t *>malloc(2 * (nh or 1) * sizeof(uint64_t))
        cdef uint64_t *at = order + nh
        cdef uint64_t any_seq = 0, seq, prev = 0
        cdef int shift = 0
        cdef Hit *h
        cdef MDB_val key, val
        cdef uint8_t kbuf[8]
        cdef int rc = 0, ok = 0
        cdef bint have = False
        cdef uint64_t fp
        cdef size_t body = 0
        if order == NULL:
            return NO_MEMORY
        i = 0
        for qi in range(n):
            for r in range(qstart[qi], qstart[qi + 1]):
                hits.h[r].q = <size_t>qi
                order[i] = hits.h[r].seq
                at[i] = r
                any_seq |= order[i]
                i += 1
        if any_seq:
            shift = bits.clz64(any_seq)
            for i in range(nh):
                order[i] <<= shift
        rc = sort_pairs(order, at, nh)
        if rc:
            free(order)
            return rc
        for i in range(nh):
            h = &hits.h[at[i]]
            seq = order[i] >> shift
            if not have or seq != prev:
                prev = seq
                bits.store_be64(kbuf, seq)
                key.mv_size = 8
                key.mv_data = kbuf
                rc = mdb_cursor_get(cur, &key, &val, MDB_SET_KEY)
                have = True
                if rc == MDB_NOTFOUND:
                    rc = 0
                    val.mv_data = NULL      # removed or replaced since the entry was written
                elif rc:
                    break
            h.val = NULL
            if val.mv_data == NULL:
                continue
            ok = _check_record(&val, seq, self.sums, queries + h.q * words, words, psize,
                               h.dist, &fp, &body)
            if ok < 0:
                rc = ok
                self.bad_seq = seq
                break
            if ok == 0:
                self.anomalies += 1         # a table entry disagrees with its record
                continue
            h.fp = fp
            h.val = <const uint8_t *>val.mv_data
            h.vlen = body
            h.plain = record_plain_int(h.val, h.vlen, words, &h.id)
        free(order)
        if rc:
            return rc
        for qi in range(n):
            r = qstart[qi]
            e = qstart[qi + 1]
            qstart[qi] = w
            while r < e:
                if hits.h[r].val != NULL:
                    hits.h[w] = hits.h[r]
                    w += 1
                r += 1
            qsort(hits.h + qstart[qi], w - qstart[qi], sizeof(Hit), _cmp_dist_seq)
        qstart[n] = w
        hits.n = w
        return 0

    cdef int _finish(self, MDB_txn *rtxn, const uint64_t *q, HitBuf *hits, size_t start,
                     size_t psize, int words=1) noexcept nogil:
        """De-duplicate one query's hits by seq, resolve them in the records, sort them.

        `psize`: check values against their pages (0 for a write txn, whose dirty pages are
        not in the map)."""
        cdef size_t n, i, w = 0
        cdef Hit *h
        cdef MDB_val key, val
        cdef uint8_t kbuf[8]
        cdef int rc
        cdef uint64_t fp
        cdef size_t body = 0
        _dedup(hits, start)
        n = hits.n - start
        h = hits.h + start
        for i in range(n):
            bits.store_be64(kbuf, h[i].seq)
            key.mv_size = 8
            key.mv_data = kbuf
            rc = mdb_get(rtxn, self.seqs_dbi, &key, &val)
            if rc == MDB_NOTFOUND:
                continue        # removed or replaced since the table entry was written
            if rc:
                return rc
            rc = _check_record(&val, h[i].seq, self.sums, q, words, psize, h[i].dist, &fp,
                               &body)
            if rc < 0:
                self.bad_seq = h[i].seq
                return rc
            if rc == 0:
                self.anomalies += 1     # a table entry disagrees with its record
                continue
            h[w] = h[i]
            h[w].fp = fp
            h[w].val = <const uint8_t *>val.mv_data
            h[w].vlen = body
            h[w].plain = record_plain_int(h[w].val, h[w].vlen, words, &h[w].id)
            w += 1
        hits.n = start + w
        qsort(h, w, sizeof(Hit), _cmp_dist_seq)
        return 0

    cdef void _end_call(self, MDB_cursor *rc_cur, size_t *qstart, HitBuf *hits,
                        Tail *tail) noexcept:
        """What every query and resolve call ends with: close a cursor it opened on a given
        transaction, reset the snapshots (kept for the next call), free its buffers."""
        if rc_cur != NULL and rc_cur != self.rec_cur:
            mdb_cursor_close(rc_cur)
        self._release()
        free(qstart)
        free(hits.h)
        free_tail(tail)

    def applied(self, int ntables):
        """The applied seq of every shard in this context's snapshot."""
        cdef int s, rc
        out = []
        try:
            for s in range(self.nshards):
                rc = self._activate(s, ntables)
                if rc:
                    raise error(rc, f"{(<Env>self.envs[s]).path}: cannot read the shard state")
                out.append(self.views[s].runs.applied)
        finally:
            self._release()
        return out

    def resolve(self, queries, const uint64_t[::1] qidx,
                const uint64_t[::1] seqs, const uint8_t[::1] dists,
                const uint64_t[::1] applied, int k, Txn txn=None):
        """query() for candidates found elsewhere (a distributed query's shard scans).

        `queries` is an (n,) uint64 array, or (n, words) for wide fingerprints (most
        significant word first). Candidate i is (query qidx[i], record seq seqs[i], distance
        dists[i]), qidx ascending; applied[q] is the lowest applied seq of the shard
        snapshots that scanned query q. The shard snapshots must be older than this call's
        records snapshot (or `txn`, a records write transaction held since before them).
        Records above applied[q] are checked directly, every candidate against its record,
        as in query().
        """
        cdef const uint64_t[:, ::1] q2 = _rows(queries)
        cdef int words = <int>q2.shape[1]
        cdef Py_ssize_t n = q2.shape[0], qi, c = 0, nc = qidx.shape[0]
        cdef const uint64_t *qp = &q2[0, 0] if n else NULL
        cdef int rc = 0
        cdef uint64_t lowest = 0xFFFFFFFFFFFFFFFF
        cdef HitBuf hits
        cdef Tail tail
        cdef size_t *qstart = NULL
        cdef MDB_cursor *rc_cur = NULL
        cdef MDB_txn *rtxn = NULL
        cdef size_t vpsize = 0 if txn is not None and txn.write else self.psize
        if txn is not None:
            txn.check()
            if txn.env is not self.records:
                raise ValueError("txn is not on this index's records")
            rtxn = txn.txn
        if applied.shape[0] != n or seqs.shape[0] != nc or dists.shape[0] != nc:
            raise ValueError("resolve: array lengths differ")
        for c in range(1, nc):
            if qidx[c] < qidx[c - 1]:
                raise ValueError("resolve: qidx must be ascending")
        if nc and qidx[nc - 1] >= <uint64_t>n:
            raise ValueError("resolve: qidx out of range")
        memset(&hits, 0, sizeof(HitBuf))
        self.bad_seq = 0
        memset(&tail, 0, sizeof(Tail))
        self.records.check()
        qstart = <size_t *>malloc((n + 1) * sizeof(size_t))
        if qstart == NULL:
            raise MemoryError()
        try:
            with nogil:
                for qi in range(n):
                    if applied[qi] < lowest:
                        lowest = applied[qi]
                if rtxn == NULL:
                    rc = self._begin_records()
                    rtxn = self.rec_txn
                    rc_cur = self.rec_cur
                elif rc == 0:
                    rc = mdb_cursor_open(rtxn, self.seqs_dbi, &rc_cur)
                tail.words = words
                tail.sums = self.sums
                if rc == 0 and n:
                    rc = load_tail(rc_cur, lowest + 1, &tail)
                c = 0
                qi = 0
                while qi < n and rc == 0:
                    qstart[qi] = hits.n
                    while c < nc and qidx[c] == <uint64_t>qi and rc == 0:
                        if dists[c] <= k:
                            rc = _hit_push(&hits, seqs[c], dists[c])
                        c += 1
                    if rc == 0:
                        rc = _tail_hits(&tail, applied[qi], qp + qi * words, k, &hits)
                    if rc == 0:
                        rc = self._finish(rtxn, qp + qi * words, &hits, qstart[qi], vpsize,
                                          words)
                    qi += 1
                qstart[n] = hits.n
            if rc:
                raise self._error(rc, f"resolving candidates on {self.records.path}")
            return _hit_lists(&hits, qstart, n, False, words)
        finally:
            self._end_call(rc_cur, qstart, &hits, &tail)

    def query(self, perm, queries, int k, Txn txn=None, bint matches=False):
        """For each query, [(distance, fingerprint, seq, id, meta bytes or None), ...] sorted by
        (distance, seq): every record of the snapshot within `k` bits, each once. With
        `matches`, the registered Match objects instead (see set_match_type).

        `perm` is the plan's Permuter, with `queries` an (n,) uint64 array, or its
        WidePermuter, with an (n, words) array. `txn`, when given, is the records
        transaction to answer from (a writer's, for add_unique); otherwise this context's
        own records snapshot is used.
        """
        cdef const uint64_t[::1] q1
        cdef const uint64_t[:, ::1] q2
        cdef Py_ssize_t n
        if isinstance(perm, Permuter):
            q1 = queries
            n = q1.shape[0]
            return self._query(perm, &q1[0] if n else NULL, n, k, txn, matches, 1)
        if not isinstance(perm, WidePermuter):
            raise TypeError("perm must be a Permuter or a WidePermuter")
        q2 = queries
        n = q2.shape[0]
        if n and q2.shape[1] != (<WidePermuter>perm).words:
            raise ValueError(f"queries have {q2.shape[1]} words, the plan "
                             f"{(<WidePermuter>perm).words}")
        return self._query(perm, &q2[0, 0] if n else NULL, n, k, txn, matches,
                           (<WidePermuter>perm).words)

    def query_one(self, Permuter perm, uint64_t fingerprint, int k):
        """The Match list of one fingerprint given as an int: no array in or out."""
        return self._query(perm, &fingerprint, 1, k, None, True, 1)[0]

    cdef list _query(self, object perm, const uint64_t *queries, Py_ssize_t n, int k,
                     Txn txn, bint matches, int words=1):
        cdef WidePermuter wp = perm if words > 1 else None
        cdef const Tables *tb = &(<Permuter>perm).c if words == 1 else &wp.c
        cdef const uint64_t *qp
        cdef uint64_t pkw[4]
        cdef uint64_t *pkws = NULL     # each table's key words, 4 per table
        cdef uint64_t *pkt              # a table's key words in pkws
        cdef ProbeBuf probes
        cdef Py_ssize_t qi
        cdef int T = tb.ntables, t, s, s0, s1, rc = 0
        cdef uint64_t pk, lo, hi, last = 0, minA
        cdef HitBuf hits
        cdef size_t *qstart = NULL
        cdef size_t r
        cdef Tail tail
        cdef Tail *tp = &tail          # the call's tail: its own, or the context's kept one
        cdef bint tail_loaded = False
        cdef bint counted = False       # the call's queries counted towards the tail
        cdef MDB_txn *rtxn = NULL
        cdef MDB_cursor *rc_cur = NULL
        cdef MDB_val key, val
        cdef ShardView *sv
        cdef str where = self.records.path
        cdef int bad = -1              # the shard whose read failed, when it is known
        self.failed_dir = NULL
        self.bad_seq = 0
        cdef bint own = txn is None
        cdef size_t vpsize = 0 if txn is not None and txn.write else self.psize
        cdef int active
        cdef uint32_t j
        cdef bint keyed = False
        cdef MDB_txn *given = NULL
        memset(&hits, 0, sizeof(HitBuf))
        memset(&tail, 0, sizeof(Tail))
        memset(&probes, 0, sizeof(ProbeBuf))
        if txn is not None:
            txn.check()
            if txn.env is not self.records:
                raise ValueError("txn is not on this index's records")
            given = txn.txn
        self.records.check()
        qstart = <size_t *>malloc((n + 1) * sizeof(size_t))
        pkws = <uint64_t *>malloc(<size_t>T * 4 * sizeof(uint64_t))
        if qstart == NULL or pkws == NULL:
            free(qstart)
            free(pkws)
            raise MemoryError()
        try:
            with nogil:
                # Shard snapshots first, the records snapshot after: anything a shard
                # snapshot lacks is then either in the records' unapplied tail or gone
                # from the records too (compaction only drops what was already removed).
                active = 0
                qi = 0
                while qi < n and rc == 0 and active < self.nshards:
                    qp = queries + qi * words
                    for t in range(T):
                        pk = _key(tb, wp, t, qp, words, pkw)
                        for j in range(tb.probe_start[t], tb.probe_start[t + 1]):
                            prefix_range(tb, t, pk ^ tb.probe[j], &lo, &hi, &s0, &s1)
                            for s in range(s0, s1 + 1):
                                if self.views[s].state != VIEW_ACTIVE:
                                    rc = self._activate(s, T)
                                    if rc:
                                        bad = s
                                        break
                                    active += 1
                            if rc:
                                break
                        if rc:
                            break
                    qi += 1
                if rc == 0 and own:
                    rc = self._begin_records()
                    rtxn = self.rec_txn
                    rc_cur = self.rec_cur
                elif rc == 0:
                    rtxn = given
                    rc = mdb_cursor_open(rtxn, self.seqs_dbi, &rc_cur)
                if rc == 0:
                    rc = mdb_cursor_get(rc_cur, &key, &val, MDB_LAST)
                    if rc == 0:
                        if key.mv_size != 8:
                            rc = CORRUPT_RECORD
                        else:
                            last = bits.load_be64(key.mv_data)
                    elif rc == MDB_NOTFOUND:
                        rc = 0
                qi = 0
                tail.words = words
                tail.sums = self.sums
                keyed = rc == 0 and n > 1 and <size_t>n >= _key_order_min and \
                    self._entries() >= _key_order_entries
                if keyed:
                    rc = self._scan_in_key_order(tb, wp, queries, n, words, k, &hits)
                    # records not yet in every table the batch read: checked directly
                    minA = 0xFFFFFFFFFFFFFFFF
                    for s in range(self.nshards):
                        if self.views[s].state == VIEW_ACTIVE and \
                                self.views[s].runs.applied < minA:
                            minA = self.views[s].runs.applied
                    if rc == 0 and last > minA:
                        rc = self._waiting(rc_cur, last, words, T, own, &tail, &tp)
                        while qi < n and rc == 0:
                            r = hits.n
                            rc = self._tail_check(tb, tp, minA, queries + qi * words, words,
                                                  k, n if qi == 0 else 0, &hits)
                            while r < hits.n:
                                hits.h[r].q = <size_t>qi
                                r += 1
                            qi += 1
                    if rc == 0:
                        rc = _group_hits(&hits, qstart, n)
                    qi = n                  # the per-query loop below has nothing to do
                while qi < n and rc == 0:
                    qp = queries + qi * words
                    qstart[qi] = hits.n
                    minA = 0xFFFFFFFFFFFFFFFF
                    probes.n = 0
                    for t in range(T):
                        pkt = pkws + t * 4
                        pk = _key(tb, wp, t, qp, words, pkt)
                        for j in range(tb.probe_start[t], tb.probe_start[t + 1]):
                            prefix_range(tb, t, pk ^ tb.probe[j], &lo, &hi, &s0, &s1)
                            for s in range(s0, s1 + 1):
                                rc = self._activate(s, T)
                                if rc:
                                    bad = s
                                    break
                                sv = &self.views[s]
                                if sv.runs.applied < minA:
                                    minA = sv.runs.applied
                                for r in range(sv.runs.table_start[t],
                                               sv.runs.table_start[t + 1]):
                                    rc = _probe_push(&probes, &sv.dirs[r], sv.cur,
                                                     self.psize, lo, hi, pk, pkt + 1)
                                    if rc:
                                        bad = s
                                        break
                                if rc:
                                    break
                            if rc:
                                break
                        if rc:
                            break
                    if rc == 0:
                        rc = _run_probes(&probes, k, &hits, words - 1, self.psize,
                                         &self.failed_dir)
                    if rc:
                        break
                    if last > minA:
                        # Records committed but not yet in every table: check them directly.
                        if not tail_loaded:
                            rc = self._waiting(rc_cur, last, words, T, own, &tail, &tp)
                            if rc:
                                break
                            tail_loaded = True
                        # the call's queries from here on count once towards its tables
                        rc = self._tail_check(tb, tp, minA, qp, words, k,
                                              0 if counted else <size_t>(n - qi), &hits)
                        counted = True
                        if rc:
                            break
                    if n == 1:
                        rc = self._finish(rtxn, qp, &hits, qstart[qi], vpsize, words)
                    else:
                        _dedup(&hits, qstart[qi])   # resolved with the batch, in seq order
                    qi += 1
                if not keyed:
                    qstart[n] = hits.n
                if rc == 0 and n > 1:
                    rc = self._resolve_batch(rc_cur, queries, words, &hits, qstart, n, vpsize)
            if rc:
                if bad < 0 and self.failed_dir != NULL:
                    for s in range(self.nshards):
                        if self.views[s].dirs <= self.failed_dir < \
                                self.views[s].dirs + self.views[s].ndirs:
                            bad = s
                if bad >= 0:
                    where = (<Env>self.envs[bad]).path
                elif rc == CORRUPT_BLOCK or rc == CORRUPT_STATE:
                    where = f"a shard of {os.path.dirname(self.records.path)}"
                raise self._error(rc, f"query on {where}")
            return _hit_lists(&hits, qstart, n, matches, words)
        finally:
            free(pkws)
            free(probes.p)
            self._end_call(rc_cur, qstart, &hits, &tail)


# ---------------------------------------------------------------- the single query
cdef class SingleQuery:
    """Index.query's hot path on a 64-bit index in one compiled call: the checks, resize gate
    and context pool of Transactions.read, then the query.

    It answers None for whatever it does not take (a fingerprint or k of another type or out
    of range, a closed or forked handle, a map another process grew): the Python path then
    answers, or raises the documented error. (Python's share of a query was ~0.9 us of 5.)
    """
    cdef object txns
    cdef Gate gate
    cdef list pool
    cdef object make
    cdef Permuter perm
    cdef int kmax
    cdef long pid

    def __cinit__(self, txns, Permuter perm not None, int kmax):
        self.txns = txns
        self.gate = txns.gate
        self.pool = txns._pool
        self.make = txns._context
        self.perm = perm
        self.kmax = kmax
        self.pid = txns.pid

    def query(self, fingerprint, k=None):
        """The Match list of `fingerprint` within k (None: the index's k), or None."""
        cdef uint64_t fp
        cdef int kk = self.kmax
        cdef ReadContext ctx
        if type(fingerprint) is not int or fingerprint < 0:
            return None
        try:
            fp = fingerprint
        except OverflowError:
            return None
        if k is not None:
            if type(k) is not int or k < 0 or k > self.kmax:
                return None
            kk = k
        if self.make is None or process_id() != self.pid:
            return None
        self.gate.enter()
        try:
            if self.txns.closed:
                return None
            ctx = self.pool.pop() if self.pool else self.make()
            try:
                return ctx._query(self.perm, &fp, 1, kk, None, True, 1)[0]
            except MapResizedError:
                return None                 # the Python path adopts the new size
            finally:
                self.pool.append(ctx)
        finally:
            self.gate.exit()


# ---------------------------------------------------------------- one shard (distributed)
def scan_shard(Txn txn, perm, int shard, queries, int k):
    """Candidates of one shard for each query: (qidx, seq, distance) arrays, qidx ascending,
    and the shard's applied seq, all from the snapshot `txn` reads.

    `perm` is the plan's Permuter, with `queries` an (n,) uint64 array, or its
    WidePermuter, with an (n, words) array. Only key ranges inside this shard are scanned,
    so a distributed query sends each shard just the queries that reach it.
    """
    cdef const uint64_t[:, ::1] q2
    cdef int words = 1
    if isinstance(perm, WidePermuter):
        words = (<WidePermuter>perm).words
    elif not isinstance(perm, Permuter):
        raise TypeError("perm must be a Permuter or a WidePermuter")
    q2 = _rows(queries)
    if q2.shape[0] and q2.shape[1] != words:
        raise ValueError(f"queries have {q2.shape[1]} words, the plan {words}")
    return _scan_shard(txn, perm, shard, &q2[0, 0] if q2.shape[0] else NULL, q2.shape[0],
                       words, k)


cdef tuple _scan_shard(Txn txn, object perm, int shard, const uint64_t *queries,
                       Py_ssize_t n, int words, int k):
    cdef WidePermuter wp = perm if words > 1 else None
    cdef const Tables *tb = &(<Permuter>perm).c if words == 1 else &wp.c
    cdef const uint64_t *qp
    cdef uint64_t pkw[4]
    cdef Py_ssize_t qi
    cdef int T = tb.ntables, t, s0, s1, rc = 0
    cdef uint64_t pk, lo, hi
    cdef size_t r, i, before
    cdef uint32_t j
    cdef HitBuf hits
    cdef PairBuf out
    cdef RunList runs
    cdef MDB_cursor *cur = NULL
    txn.check()
    cdef MDB_dbi dbi = txn.env.dbi(layout.DB_BLOCKS.decode())
    cdef MDB_dbi state = txn.env.dbi(layout.DB_STATE.decode())
    memset(&hits, 0, sizeof(HitBuf))
    memset(&out, 0, sizeof(PairBuf))
    memset(&runs, 0, sizeof(RunList))
    try:
        with nogil:
            rc = read_state(txn.txn, state, T, &runs)
            if rc == 0:
                rc = mdb_cursor_open(txn.txn, dbi, &cur)
            qi = 0
            while qi < n and rc == 0:
                qp = queries + qi * words
                before = hits.n
                for t in range(T):
                    pk = _key(tb, wp, t, qp, words, pkw)
                    for j in range(tb.probe_start[t], tb.probe_start[t + 1]):
                        prefix_range(tb, t, pk ^ tb.probe[j], &lo, &hi, &s0, &s1)
                        if shard < s0 or shard > s1:
                            continue
                        for r in range(runs.table_start[t], runs.table_start[t + 1]):
                            rc = _scan_run(cur, runs.run_ids[r], lo, hi, pk, k, &hits,
                                           pkw + 1, words - 1)
                            if rc:
                                break
                        if rc:
                            break
                    if rc:
                        break
                # one (qidx, seq, distance) per candidate; `a` carries the query index
                i = before
                while i < hits.n and rc == 0:
                    rc = pair_push(&out, <uint64_t>qi, hits.h[i].seq, <uint8_t>hits.h[i].dist)
                    i += 1
                hits.n = 0
                qi += 1
        if rc:
            raise error(rc, f"scan of shard {shard} in {txn.env.path}")
        qidx, seqs, dists = pair_arrays(&out)
        return qidx, seqs, dists, runs.applied
    finally:
        if cur != NULL:
            mdb_cursor_close(cur)
        free(hits.h)
        free_pairs(&out)
        free_state(&runs)


cdef object _rows(queries):
    """Queries as an (n, words) uint64 array: a flat (n,) one as (n, 1), a view."""
    if queries.ndim == 1:
        return queries.reshape(queries.shape[0], 1)
    if queries.ndim != 2 or queries.shape[1] not in (1, 2, 4):
        raise ValueError(f"queries must be an (n,) or (n, words) array, got shape "
                         f"{queries.shape}")
    return queries
