# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The slab codec: a table's sorted entries (permuted key, record seq) stored as runs of
packed slabs in a shard's slab database (`blocks` on disk), and the shard's state that lists
the runs.

The format is in layout.pxd. Runs are written once, sorted, with MDB_APPEND (full pages, no
splits) and never changed: a merge writes a new run and deletes the old ones
(simindex/engine/shard.py decides which). Decoding is inline in _slabs.pxd for the scan loops.
"""

import numpy as np

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, malloc, realloc, free, qsort
from libc.string cimport memcpy, memset, strlen

from simindex.engine.clmdb cimport (
    si_guard_install,
    MDB_txn, MDB_cursor, MDB_dbi, MDB_val, MDB_APPEND, MDB_RESERVE, MDB_SET_RANGE, MDB_NEXT,
    MDB_NOTFOUND, MDB_KEYEXIST, MDB_RDONLY, mdb_put, mdb_get, mdb_cursor_open,
    mdb_cursor_close, mdb_cursor_get, mdb_cursor_del, mdb_txn_begin, mdb_txn_abort,
)
cimport simindex.bits as bits
cimport simindex.engine.layout as layout
from cpython.bytes cimport PyBytes_FromStringAndSize
from simindex.engine._lmdb cimport Env, Txn, error, val_in_pages, CORRUPT_STATE, NO_MEMORY
from simindex.errors import CorruptError

if si_guard_install():           # LMDB calls return an error on a damaged page (guard.h)
    raise OSError("cannot install the page-fault handlers")


cdef extern from "zlib.h" nogil:
    unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int len)

# A shard's runs as numpy reads and writes them (layout.pxd, RUN_ENTRY).
RUN_DTYPE = np.dtype({
    "names": ["run", "count", "table", "pad"],
    "formats": ["<u8", "<u8", "<u4", "<u4"],
    "offsets": [layout.RUN_ID_AT, layout.RUN_COUNT_AT, layout.RUN_TABLE_AT,
                layout.RUN_TABLE_AT + 4],
    "itemsize": layout.RUN_ENTRY,
})


# ---------------------------------------------------------------- writing runs
cdef inline int _width(uint64_t span) noexcept nogil:
    """Bytes needed to store offsets up to `span`."""
    return 0 if span == 0 else (71 - bits.clz64(span)) >> 3


cdef int _slab_widths(const uint64_t *keys, const uint64_t *seqs, size_t c,
                      uint64_t *smin) noexcept nogil:
    """kw + sw of a v2 slab holding these entries (keys sorted); sets the least seq."""
    cdef uint64_t lo = seqs[0], hi = seqs[0]
    cdef size_t i
    for i in range(1, c):
        if seqs[i] < lo:
            lo = seqs[i]
        elif seqs[i] > hi:
            hi = seqs[i]
    smin[0] = lo
    return _width(keys[c - 1] - keys[0]) + _width(hi - lo)


cdef enum:
    PAGE = 4096            # LMDB stores a slab in whole pages of the OS's size...
    PAGE_HEADER = 16       # ...after a header in the first


cdef size_t _slab_count(const uint64_t *keys, const uint64_t *seqs, size_t rem,
                        size_t extra) noexcept nogil:
    """How many of the next `rem` entries make one v2 slab (`extra`: the low-word bytes of
    every entry): all of them if they fit, else of the largest counts that fit in 2, 3 or
    4 pages, the one with the most entries per page. Widths grow with the count, and a
    slab just past a page boundary would waste the rest of its last page (100M keys in
    8 shards: slabs of 1,020 entries at 6 + 4 bytes filled 10,240 of 12,288 bytes). One
    page is never chosen: its value could be small enough for a leaf page, which run
    directories do not keep."""
    cdef size_t i, c = 0, size, p, best = 0, n = rem
    cdef size_t fit[5]
    cdef uint64_t lo = seqs[0], hi = seqs[0]
    if n > layout.V2_MAX_ENTRIES:
        n = layout.V2_MAX_ENTRIES
    memset(fit, 0, sizeof(fit))
    for i in range(n):
        if seqs[i] < lo:
            lo = seqs[i]
        elif seqs[i] > hi:
            hi = seqs[i]
        size = layout.V2_HEADER + (i + 1) * (<size_t>(_width(keys[i] - keys[0]) +
                                                      _width(hi - lo)) + extra) + \
            layout.V2_PAD
        if size > layout.SLAB_BYTES:
            break
        c = i + 1
        p = (size + PAGE_HEADER + PAGE - 1) // PAGE
        fit[p if p <= 4 else 4] = c
    if c == rem or c == 0:           # the rest fits in one slab (or one entry is all)
        return c if c else 1
    for p in range(4, 1, -1):
        if fit[p] and (best == 0 or fit[p] * best > fit[best] * p):
            best = p
    return fit[best] if best else c


# ---------------------------------------------------------------- sorting a run's entries
cdef struct Entry:
    uint64_t key
    uint64_t seq


cdef int _cmp_entry(const void *a, const void *b) noexcept nogil:
    cdef const Entry *x = <const Entry *>a
    cdef const Entry *y = <const Entry *>b
    if x.key != y.key:
        return -1 if x.key < y.key else 1
    return (x.seq > y.seq) - (x.seq < y.seq)


cdef int _sort_bucket(uint64_t *k, uint64_t *q, size_t m) noexcept nogil:
    """Sort a bucket of parallel (key, seq) arrays by (key, seq): insertion sort when small
    (the usual case), qsort otherwise; 0 or NO_MEMORY."""
    cdef size_t i, j
    cdef uint64_t xk, xq
    cdef Entry *e
    if m > 32:
        e = <Entry *>malloc(m * sizeof(Entry))
        if e == NULL:
            return NO_MEMORY
        for i in range(m):
            e[i].key = k[i]
            e[i].seq = q[i]
        qsort(e, m, sizeof(Entry), _cmp_entry)
        for i in range(m):
            k[i] = e[i].key
            q[i] = e[i].seq
        free(e)
        return 0
    for i in range(1, m):
        xk = k[i]
        xq = q[i]
        j = i
        while j > 0 and (xk < k[j - 1] or (xk == k[j - 1] and xq < q[j - 1])):
            k[j] = k[j - 1]
            q[j] = q[j - 1]
            j -= 1
        k[j] = xk
        q[j] = xq
    return 0


cdef enum:
    # entries one bucket sort takes whole (its counts, 256 KiB, stay in cache); larger
    # inputs are first split by their leading bits into 2**PARTITION_BITS parts
    SORT_IN_CACHE = 1 << 18
    PARTITION_BITS = 8


cdef int _bucket_bits(size_t n) noexcept nogil:
    """Bucket bits giving about 8 entries per bucket (1 to 24)."""
    cdef int b = 1
    while b < 24 and (<size_t>1 << (b + 1)) * 8 <= n:
        b += 1
    return b


cdef void _scatter(const uint64_t *ik, const uint64_t *iq, uint64_t *ok, uint64_t *oq,
                   size_t n, int shift, uint64_t mask, size_t *counts) noexcept nogil:
    """Stable scatter of n entries into buckets by (key >> shift) & mask. `counts` has
    mask + 2 zeroed slots; afterwards counts[c] is where bucket c ends."""
    cdef size_t i, c
    for i in range(n):
        counts[((ik[i] >> shift) & mask) + 1] += 1
    for c in range(mask + 1):
        counts[c + 1] += counts[c]
    for i in range(n):
        c = (ik[i] >> shift) & mask
        ok[counts[c]] = ik[i]
        oq[counts[c]] = iq[i]
        counts[c] += 1


cdef int _sort_part(const uint64_t *ik, const uint64_t *iq, uint64_t *ok, uint64_t *oq,
                    size_t n, int top, size_t *counts) noexcept nogil:
    """Sort n entries whose keys agree above bit `top` from (ik, iq) into (ok, oq): a bucket
    sort by the bits just below `top`, then each bucket by (key, seq). `counts` holds
    2**_bucket_bits(n) + 1 slots. 0 or NO_MEMORY."""
    cdef int b = _bucket_bits(n)
    cdef size_t c, start = 0, end
    cdef int rc = 0
    if b > top:
        b = top
    memset(counts, 0, ((<size_t>1 << b) + 1) * sizeof(size_t))
    _scatter(ik, iq, ok, oq, n, top - b, (<uint64_t>1 << b) - 1, counts)
    for c in range(<size_t>1 << b):
        end = counts[c]
        if end - start > 1 and rc == 0:
            rc = _sort_bucket(&ok[start], &oq[start], end - start)
        start = end
    return rc


cdef int sort_pairs(uint64_t *keys, uint64_t *seqs, size_t n) noexcept nogil:
    """Sort n (key, seq) pairs in place by (key, seq), as runs store them (a query's table
    of unapplied records): one bucket sort through a scratch copy. 0 or NO_MEMORY."""
    cdef uint64_t *sk = <uint64_t *>malloc(2 * n * sizeof(uint64_t) + 1)
    cdef size_t *counts = <size_t *>malloc(((<size_t>1 << _bucket_bits(n)) + 1) *
                                           sizeof(size_t))
    cdef int rc = NO_MEMORY
    if sk != NULL and counts != NULL:
        memcpy(sk, keys, n * sizeof(uint64_t))
        memcpy(sk + n, seqs, n * sizeof(uint64_t))
        rc = _sort_part(sk, sk + n, keys, seqs, n, 64, counts)
    free(sk)
    free(counts)
    return rc


cdef int _sort_parts(const uint64_t *keys, const uint64_t *seqs, uint64_t *ok, uint64_t *oq,
                     size_t n, int top) noexcept nogil:
    """Split n entries by the PARTITION_BITS bits below `top` into (ok, oq), then sort each
    part in place through one scratch buffer that stays in cache. 0 or NO_MEMORY."""
    cdef size_t parts = <size_t>1 << PARTITION_BITS, p, start = 0, end, m, cap = 0
    cdef size_t *pcounts = <size_t *>calloc(parts + 1, sizeof(size_t))
    cdef size_t *counts = NULL
    cdef uint64_t *sk = NULL
    cdef uint64_t *sq = NULL
    cdef int rc = 0
    if pcounts == NULL:
        return NO_MEMORY
    _scatter(keys, seqs, ok, oq, n, top - PARTITION_BITS, parts - 1, pcounts)
    for p in range(parts):
        end = pcounts[p]
        m = end - start
        if m > 1:
            if m > cap:
                cap = m if m > 2 * cap else 2 * cap
                free(sk)
                free(sq)
                free(counts)
                sk = <uint64_t *>malloc(cap * sizeof(uint64_t))
                sq = <uint64_t *>malloc(cap * sizeof(uint64_t))
                counts = <size_t *>malloc(((<size_t>1 << _bucket_bits(cap)) + 1) *
                                          sizeof(size_t))
                if sk == NULL or sq == NULL or counts == NULL:
                    rc = NO_MEMORY
                    break
            memcpy(sk, &ok[start], m * sizeof(uint64_t))
            memcpy(sq, &oq[start], m * sizeof(uint64_t))
            rc = _sort_part(sk, sq, &ok[start], &oq[start], m, top - PARTITION_BITS, counts)
            if rc:
                break
        start = end
    free(pcounts)
    free(counts)
    free(sk)
    free(sq)
    return rc


def sort_entries(const uint64_t[::1] keys not None, const uint64_t[::1] seqs not None,
                 out_k=None, out_s=None):
    """(keys, seqs) of a table's entries sorted by (key, seq), as runs store them.

    A bucket sort by the bits below the keys' common prefix (about 8 entries per bucket:
    permuted simhash keys spread evenly), then a sort within each bucket, in C without the
    GIL; crowded buckets (skewed keys) fall back to qsort, so it is never worse than
    O(n log n). Above SORT_IN_CACHE entries the keys are first split into 256 parts by
    their leading bits and each part is bucket-sorted within the cache: one scatter into
    millions of buckets misses the cache and TLB at every write (12.5M keys: 40 ns per
    entry in one level, 24 in two).

    With `out_k` and `out_s` (uint64 arrays of at least as many entries, sharing no memory
    with the input), the sorted entries go to their front, returned as views: a bulk load
    sorts group after group into the same pages, which the kernel then zeroes only once."""
    cdef size_t n = keys.shape[0], i
    cdef int top, rc = 0
    cdef uint64_t diff = 0
    cdef size_t *counts = NULL
    if seqs.shape[0] != <Py_ssize_t>n:
        raise ValueError("keys and seqs differ in length")
    if out_k is None and out_s is None:
        out_k = np.empty(n, dtype=np.uint64)
        out_s = np.empty(n, dtype=np.uint64)
    else:
        if out_k is None or out_s is None or len(out_k) < <Py_ssize_t>n or \
                len(out_s) < <Py_ssize_t>n:
            raise ValueError("out_k and out_s must both hold at least as many entries")
        out_k = out_k[:n]
        out_s = out_s[:n]
        ins = (np.asarray(keys), np.asarray(seqs))
        if np.may_share_memory(out_k, out_s) or \
                any(np.may_share_memory(a, b) for a in (out_k, out_s) for b in ins):
            raise ValueError("out_k and out_s must not share memory with the input or "
                             "each other")
    if n == 0:
        return out_k, out_s
    cdef uint64_t[::1] ok = out_k
    cdef uint64_t[::1] oq = out_s
    with nogil:
        for i in range(n):
            diff |= keys[i] ^ keys[0]
        top = 0 if diff == 0 else 64 - bits.clz64(diff)     # the low bits that vary
        if n > SORT_IN_CACHE and top > PARTITION_BITS:
            rc = _sort_parts(&keys[0], &seqs[0], &ok[0], &oq[0], n, top)
        else:
            counts = <size_t *>malloc(((<size_t>1 << _bucket_bits(n)) + 1) * sizeof(size_t))
            if counts == NULL:
                rc = NO_MEMORY
            else:
                rc = _sort_part(&keys[0], &seqs[0], &ok[0], &oq[0], n, top, counts)
                free(counts)
    if rc:
        raise MemoryError()
    return out_k, out_s


def write_run(Txn txn, str db, uint64_t run_id, const uint64_t[::1] keys,
              const uint64_t[::1] seqs, lows=None):
    """Append sorted (key, seq) entries as run `run_id` in v2 slabs; returns the slab count.

    Keys must be sorted and the run id larger than any run already stored, so every slab
    goes in with MDB_APPEND (no page splits, full pages). `lows`, for wide fingerprints:
    an (n, low words) uint64 array, the permuted keys' words after the first.
    """
    cdef Py_ssize_t n = keys.shape[0], i, c, off = 0, j
    cdef const uint64_t[:, ::1] tl
    cdef size_t lw = 0
    cdef const uint64_t *tp = NULL
    cdef uint32_t slabno = 0
    cdef uint8_t kbuf[layout.SLAB_KEY]
    cdef MDB_val k, v
    cdef uint8_t *p
    cdef uint8_t *ko
    cdef uint8_t *so
    cdef uint8_t tmp[8]
    cdef int rc = 0, kw, sw
    cdef uint64_t kbase, sbase
    cdef MDB_dbi dbi
    txn.check()
    dbi = txn.env.dbi(db)
    if seqs.shape[0] != n:
        raise ValueError("keys and seqs differ in length")
    if lows is not None:
        tl = lows
        lw = tl.shape[1]
        if tl.shape[0] != n or not 1 <= lw <= layout.MAX_LOW_WORDS:
            raise ValueError(f"lows must be an (n, 1..{layout.MAX_LOW_WORDS}) array")
        if n:
            tp = &tl[0, 0]
    with nogil:
        while off < n:
            c = _slab_count(&keys[off], &seqs[off], n - off, 8 * lw)
            kbase = keys[off]
            kw = _width(keys[off + c - 1] - kbase)
            sw = _slab_widths(&keys[off], &seqs[off], c, &sbase) - kw
            bits.store_be64(kbuf, run_id)
            bits.store_be64(kbuf + 8, keys[off + c - 1])
            bits.store_be32(kbuf + 16, slabno)
            k.mv_size = layout.SLAB_KEY
            k.mv_data = kbuf
            v.mv_size = layout.V2_HEADER + c * (kw + sw + 8 * lw) + layout.V2_PAD
            v.mv_data = NULL
            rc = mdb_put(txn.txn, dbi, &k, &v, MDB_APPEND | MDB_RESERVE)
            if rc:
                break
            p = <uint8_t *>v.mv_data
            memset(p, 0, v.mv_size)
            bits.store32(p, layout.V2_MAGIC)
            bits.store32(p + 4, <uint32_t>c)
            p[12] = <uint8_t>kw
            p[13] = <uint8_t>sw
            p[14] = <uint8_t>lw
            bits.store64(p + 16, kbase)
            bits.store64(p + 24, sbase)
            ko = p + layout.V2_HEADER
            so = ko + c * kw
            for i in range(c):
                bits.store64(tmp, keys[off + i] - kbase)
                memcpy(ko + i * kw, tmp, kw)
                bits.store64(tmp, seqs[off + i] - sbase)
                memcpy(so + i * sw, tmp, sw)
            so += c * sw                      # the lows follow the seqs
            for i in range(c * <Py_ssize_t>lw):
                bits.store64(so + 8 * i, tp[off * lw + i])
            bits.store32(p + 8, <uint32_t>crc32(
                0, p + 12, <unsigned int>(v.mv_size - 12 - layout.V2_PAD)))
            off += c
            slabno += 1
    if rc == MDB_KEYEXIST:
        raise CorruptError(f"{txn.env.path}: run {run_id} is not newer than the runs stored")
    if rc:
        raise error(rc, f"{txn.env.path}: writing run {run_id} failed")
    return slabno


# ---------------------------------------------------------------- reading and deleting runs
def read_run(Txn txn, str db, uint64_t run_id, size_t count, bint check=False,
             size_t low_words=0):
    """All (keys, seqs) of run `run_id` as uint64 arrays, checking structure (and crc if asked);
    with `low_words` (wide fingerprints), (keys, seqs, lows), lows an (n, low_words)
    array: every slab must hold that many.

    `count` is the entry count the shard state records for the run; a mismatch is damage.
    """
    cdef MDB_cursor *cur
    cdef MDB_val k, v
    cdef uint8_t kbuf[layout.SLAB_KEY]
    cdef int rc
    cdef size_t got = 0, i
    cdef uint32_t slabno = 0
    cdef uint64_t prev = 0, key
    cdef Slab b
    cdef str reason = None
    txn.check()
    keys = np.empty(count, dtype=np.uint64)
    seqs = np.empty(count, dtype=np.uint64)
    lows = np.empty((count, low_words), dtype=np.uint64)
    cdef uint64_t[::1] ko = keys
    cdef uint64_t[::1] so = seqs
    cdef uint64_t[:, ::1] to = lows
    cdef size_t w
    rc = mdb_cursor_open(txn.txn, txn.env.dbi(db), &cur)
    if rc:
        raise error(rc, f"{txn.env.path}: cursor failed")
    memset(kbuf, 0, layout.SLAB_KEY)
    bits.store_be64(kbuf, run_id)
    k.mv_size = layout.SLAB_KEY
    k.mv_data = kbuf
    try:
        rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE)
        while rc == 0:
            if k.mv_size != layout.SLAB_KEY:
                reason = "a slab key has the wrong size"
                break
            if bits.load_be64(k.mv_data) != run_id:
                break
            if open_slab(&k, &v, &b):
                reason = f"slab {slabno} has a bad header or size"
                break
            if bits.load_be32(<uint8_t *>k.mv_data + 16) != slabno:
                reason = f"slab {slabno} is missing"
                break
            if check and b.crc != <uint32_t>crc32(0, b.checked, <unsigned int>b.checked_size):
                reason = f"slab {slabno} fails its checksum"
                break
            if got + b.c > count:
                reason = f"the run holds more than the {count} entries recorded"
                break
            if b.lw != low_words:
                reason = f"slab {slabno} holds {b.lw} low words per entry, not {low_words}"
                break
            for i in range(b.c):
                key = key_at(&b, i)
                if key < prev:
                    reason = f"slab {slabno} is out of order"
                    break
                prev = key
                ko[got + i] = key
                so[got + i] = seq_at(&b, i)
                for w in range(low_words):
                    to[got + i, w] = low_at(&b, i, w)
            if reason is not None:
                break
            if bits.load_be64(<uint8_t *>k.mv_data + 8) != prev:
                reason = f"slab {slabno}'s key does not match its last entry"
                break
            got += b.c
            slabno += 1
            rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)
    finally:
        mdb_cursor_close(cur)
    if rc and rc != MDB_NOTFOUND:
        raise error(rc, f"{txn.env.path}: reading run {run_id} failed")
    if reason is None and got != count:
        reason = f"the run holds {got} entries, {count} recorded"
    if reason is not None:
        raise CorruptError(f"{txn.env.path}: run {run_id}: {reason}")
    return (keys, seqs) if low_words == 0 else (keys, seqs, lows)


def delete_run(Txn txn, str db, uint64_t run_id):
    """Delete every slab of run `run_id`; returns how many were deleted."""
    cdef MDB_cursor *cur
    cdef MDB_val k, v
    cdef uint8_t kbuf[layout.SLAB_KEY]
    cdef int rc
    cdef size_t n = 0
    txn.check()
    rc = mdb_cursor_open(txn.txn, txn.env.dbi(db), &cur)
    if rc:
        raise error(rc, f"{txn.env.path}: cursor failed")
    memset(kbuf, 0, layout.SLAB_KEY)
    bits.store_be64(kbuf, run_id)
    with nogil:
        # Re-seek after each delete: the first remaining slab of the run, or the next run.
        while True:
            k.mv_size = layout.SLAB_KEY
            k.mv_data = kbuf
            rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE)
            if rc or k.mv_size < 8 or bits.load_be64(k.mv_data) != run_id:
                break
            rc = mdb_cursor_del(cur, 0)
            if rc:
                break
            n += 1
        mdb_cursor_close(cur)
    if rc and rc != MDB_NOTFOUND:
        raise error(rc, f"{txn.env.path}: deleting run {run_id} failed")
    return n


# ---------------------------------------------------------------- a shard's state
cdef int read_state(MDB_txn *txn, MDB_dbi state_dbi, int ntables,
                    RunList *out) noexcept nogil:
    """Read a shard's applied seq and runs into `out` (its arrays grow as needed and belong
    to it: free_state). 0, or an error code; runs must be sorted by table."""
    cdef MDB_val k, v
    cdef int rc, t
    cdef size_t nruns, i
    cdef uint32_t table
    cdef const uint8_t *p
    cdef void *tmp
    k.mv_size = strlen(layout.STATE_APPLIED)
    k.mv_data = <void *>layout.STATE_APPLIED
    rc = mdb_get(txn, state_dbi, &k, &v)
    if rc == MDB_NOTFOUND:
        out.applied = 0
    elif rc:
        return rc
    elif v.mv_size != 8:
        return CORRUPT_STATE
    else:
        out.applied = bits.load64(v.mv_data)
    k.mv_size = strlen(layout.STATE_RUNS)
    k.mv_data = <void *>layout.STATE_RUNS
    rc = mdb_get(txn, state_dbi, &k, &v)
    if rc == MDB_NOTFOUND:
        v.mv_size = 0
        v.mv_data = NULL
    elif rc:
        return rc
    if v.mv_size % layout.RUN_ENTRY:
        return CORRUPT_STATE
    out.raw = v
    nruns = v.mv_size // layout.RUN_ENTRY
    if out.table_start == NULL:
        out.table_start = <uint32_t *>calloc(ntables + 1, sizeof(uint32_t))
        if out.table_start == NULL:
            return NO_MEMORY
    if nruns > out.cap or out.run_ids == NULL:
        tmp = realloc(out.run_ids, (nruns + 1) * sizeof(uint64_t))
        if tmp == NULL:
            return NO_MEMORY
        out.run_ids = <uint64_t *>tmp
        out.cap = nruns + 1
    memset(out.table_start, 0, (ntables + 1) * sizeof(uint32_t))
    p = <const uint8_t *>v.mv_data
    for i in range(nruns):
        table = bits.load32(p + layout.RUN_ENTRY * i + layout.RUN_TABLE_AT)
        if table >= <uint32_t>ntables or \
                (i and table < bits.load32(p + layout.RUN_ENTRY * (i - 1) + layout.RUN_TABLE_AT)):
            return CORRUPT_STATE
        out.table_start[table + 1] += 1
        out.run_ids[i] = bits.load64(p + layout.RUN_ENTRY * i + layout.RUN_ID_AT)
    for t in range(ntables):
        out.table_start[t + 1] += out.table_start[t]
    out.nruns = nruns
    return 0


cdef void free_state(RunList *out) noexcept nogil:
    free(out.run_ids)
    free(out.table_start)
    out.run_ids = NULL
    out.table_start = NULL
    out.cap = 0
    out.nruns = 0


def load_state(Txn txn, int ntables):
    """(applied seq, runs as a RUN_DTYPE array sorted by (table, run), next run id) of the
    shard that `txn` reads; the same checks as the scan loop's (CorruptError on damage)."""
    cdef RunList rl
    cdef int rc
    cdef MDB_dbi dbi
    txn.check()
    dbi = txn.env.dbi(layout.DB_STATE.decode())
    memset(&rl, 0, sizeof(RunList))
    try:
        rc = read_state(txn.txn, dbi, ntables, &rl)
        if rc:
            raise error(rc, f"{txn.env.path}: cannot read the shard state")
        if not txn.write and not val_in_pages(&rl.raw, txn.env.psize):
            raise CorruptError(f"{txn.env.path}: a shard's state record is damaged (its size "
                               f"runs past its page)")
        applied = rl.applied
        # the runs value read_state checked, copied out (no second lookup)
        runs = np.frombuffer(PyBytes_FromStringAndSize(<const char *>rl.raw.mv_data,
                                                       rl.raw.mv_size), dtype=RUN_DTYPE).copy()
    finally:
        free_state(&rl)
    nr = txn.get(layout.DB_STATE.decode(), layout.STATE_NEXT_RUN)
    if nr is not None and len(nr) != 8:
        raise CorruptError(f"{txn.env.path}: a shard's state record is damaged")
    next_run = int.from_bytes(nr, "little") if nr is not None else 1
    return applied, runs, next_run


def read_applied(list envs, int ntables):
    """The applied seq of each shard environment in `envs`, each read in a read transaction
    of its own with load_state's checks: the write protocol's read of the shard state, apart
    from the read contexts queries keep (one call for all shards: it runs on every add)."""
    cdef Env env
    cdef MDB_txn *txn
    cdef MDB_dbi dbi
    cdef RunList rl
    cdef size_t psize
    cdef int rc
    cdef bint inside
    cdef str name = layout.DB_STATE.decode()
    out = []
    memset(&rl, 0, sizeof(RunList))
    try:
        for e in envs:
            env = <Env?>e
            env.check()
            dbi = env.dbi(name)
            psize = env.psize
            inside = True
            with nogil:
                rc = mdb_txn_begin(env.env, NULL, MDB_RDONLY, &txn)
                if rc == 0:
                    rc = read_state(txn, dbi, ntables, &rl)
                    inside = rc != 0 or val_in_pages(&rl.raw, psize)
                    mdb_txn_abort(txn)
            if rc:
                raise error(rc, f"{env.path}: cannot read the shard state")
            if not inside:
                raise CorruptError(f"{env.path}: a shard's state record is damaged (its size "
                                   f"runs past its page)")
            out.append(rl.applied)
    finally:
        free_state(&rl)
    return out
