# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The record codec: records/ stores each record under a fresh seq and each id key under ids.

A record is `fp | id key length | id key | msgpack(meta) | checksum` (layout.pxd; format 3,
the checksum seeded with the seq). Writing assigns seqs in input order and replaces an id's
older record; reading checks the checksum and decodes ids back to their type.
Python's simindex/engine/records.py runs these inside the write protocol's transactions.
"""

import numpy as np

from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport malloc, realloc, free, qsort
from libc.string cimport memcmp, memcpy, memmove, memset
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL

cdef extern from "zlib.h" nogil:
    unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int len)

from simindex.engine.clmdb cimport (
    si_guard_install,
    MDB_txn, MDB_cursor, MDB_dbi, MDB_val, MDB_APPEND, MDB_RESERVE, MDB_SET_RANGE, MDB_SET_KEY,
    MDB_NEXT, MDB_LAST, MDB_NOTFOUND, MDB_KEYEXIST, mdb_put, mdb_get, mdb_del,
    mdb_cursor_open, mdb_cursor_close, mdb_cursor_get, mdb_cursor_put,
)
cimport simindex.bits as bits
cimport simindex.engine.layout as layout
from simindex.engine._lmdb cimport Txn, error, val_in_pages, CORRUPT_RECORD, NO_MEMORY
from simindex.errors import CorruptError

if si_guard_install():           # LMDB calls return an error on a damaged page (guard.h)
    raise OSError("cannot install the page-fault handlers")


def checksum(bytes data not None, unsigned long start=0):
    """zlib's CRC-32 of `data`, continuing from `start` (the write buffer's log frames its
    entries with it, as the slabs do theirs). Bytes only: no buffer protocol to set up,
    since a log entry is a few dozen bytes and this runs once per single add."""
    return crc32(start, <const unsigned char *>PyBytes_AS_STRING(data),
                 <unsigned int>PyBytes_GET_SIZE(data))


# ---------------------------------------------------------------- writing records
cdef enum:
    INT_KEY = 9                  # an int id's records key: its type tag, then 8 bytes BE


cdef struct IdRef:
    const char *p
    size_t n
    size_t i


cdef int _cmp_idref(const void *a, const void *b) noexcept nogil:
    """LMDB's default key order (bytes, then length), then input order: a stable sort."""
    cdef const IdRef *x = <const IdRef *>a
    cdef const IdRef *y = <const IdRef *>b
    cdef size_t m = x.n if x.n < y.n else y.n
    cdef int c = memcmp(x.p, y.p, m)
    if c:
        return c
    if x.n != y.n:
        return -1 if x.n < y.n else 1
    return -1 if x.i < y.i else (1 if x.i > y.i else 0)


cdef int _cmp_last(MDB_val *last, IdRef *first) noexcept nogil:
    """Order of the stored last id key against the smallest new one (LMDB's key order).

    Equal keys compare equal: the input-order tie break of _cmp_idref must not make the
    stored key look smaller, or an id already stored would be appended a second time."""
    cdef IdRef x
    x.p = <const char *>last.mv_data
    x.n = last.mv_size
    x.i = first.i
    return _cmp_idref(&x, first)


cdef enum:
    # where _put_records stopped (with an LMDB code or the stored size that was wrong)
    PUT_RECORD = 1, PUT_SEQ_USED, PUT_READ_IDS, PUT_ID_SIZE, PUT_REPLACE, PUT_READ_ID, PUT_ID


cdef int _put_records(MDB_txn *t, MDB_dbi ids, MDB_dbi sq, IdRef *refs,
                      const char **mp, const size_t *ml, const uint64_t[:, ::1] fw,
                      Py_ssize_t n, uint64_t next_seq, bint sums, size_t *replaced,
                      int *rc_out, uint64_t *at) noexcept nogil:
    """records_put's writes, without the GIL (a bulk load sorts its table entries on the
    other core meanwhile): 0, or the PUT_ stage that failed with its LMDB code in rc_out."""
    cdef Py_ssize_t i
    cdef size_t idlen, mlen, j, hdr
    cdef int words = <int>fw.shape[1], w, rc
    cdef MDB_val k, v, sk
    cdef uint8_t seqbuf[8]
    cdef uint8_t oldbuf[8]
    cdef uint8_t *p
    cdef MDB_cursor *cur = NULL
    cdef bint append
    hdr = record_header(words)
    # one cursor for all the appends: a put through mdb_put descends from the root each
    # time, a cursor's append stays on the last page
    rc = mdb_cursor_open(t, sq, &cur)
    if rc:
        rc_out[0] = rc
        return PUT_RECORD
    for i in range(n):
        idlen = refs[i].n
        mlen = ml[i]
        bits.store_be64(seqbuf, next_seq + i)
        sk.mv_size = 8
        sk.mv_data = seqbuf
        v.mv_size = hdr + idlen + mlen + (layout.RECORD_SUM if sums else 0)
        v.mv_data = NULL
        rc = mdb_cursor_put(cur, &sk, &v, MDB_APPEND | MDB_RESERVE)
        if rc:
            mdb_cursor_close(cur)
            rc_out[0] = rc
            at[0] = next_seq + i
            return PUT_SEQ_USED if rc == MDB_KEYEXIST else PUT_RECORD
        p = <uint8_t *>v.mv_data
        bits.store64(p, fw[i, 0])
        p[8] = <uint8_t>(idlen & 0xFF)
        p[9] = <uint8_t>(idlen >> 8)
        for w in range(1, words):
            bits.store64(p + layout.RECORD_HEADER + 8 * (w - 1), fw[i, w])
        memcpy(p + hdr, refs[i].p, idlen)
        memcpy(p + hdr + idlen, mp[i], mlen)
        if sums:
            bits.store32(p + hdr + idlen + mlen, record_sum(next_seq + i, p, hdr + idlen + mlen))
    mdb_cursor_close(cur)
    cur = NULL
    # ids often come in key order (ascending int ids, a range): then there is nothing to
    # sort (qsort takes ~45 ms per 262,144 sorted ids, 17 s of a 100M build)
    for j in range(1, <size_t>n):
        if _cmp_idref(&refs[j - 1], &refs[j]) > 0:
            qsort(refs, n, sizeof(IdRef), _cmp_idref)
            break
    # every key new and above the stored ones: append without looking anything up
    append = True
    for j in range(1, <size_t>n):
        if refs[j - 1].n == refs[j].n and memcmp(refs[j - 1].p, refs[j].p, refs[j].n) == 0:
            append = False
            break
    if append:
        rc = mdb_cursor_open(t, ids, &cur)
        if rc:
            rc_out[0] = rc
            return PUT_READ_IDS
        rc = mdb_cursor_get(cur, &k, &v, MDB_LAST)
        if rc == 0:
            append = _cmp_last(&k, &refs[0]) < 0
        elif rc != MDB_NOTFOUND:
            mdb_cursor_close(cur)
            rc_out[0] = rc
            return PUT_READ_IDS
    for j in range(<size_t>n):
        k.mv_size = refs[j].n
        k.mv_data = <void *>refs[j].p
        if not append:
            rc = mdb_get(t, ids, &k, &v)
            if rc == 0:
                if v.mv_size != 8:
                    rc_out[0] = 0
                    rc = PUT_ID_SIZE
                    break
                memcpy(oldbuf, v.mv_data, 8)
                sk.mv_size = 8
                sk.mv_data = oldbuf
                rc = mdb_del(t, sq, &sk, NULL)
                if rc and rc != MDB_NOTFOUND:
                    rc_out[0] = rc
                    rc = PUT_REPLACE
                    break
                replaced[0] += 1
            elif rc != MDB_NOTFOUND:
                rc_out[0] = rc
                rc = PUT_READ_ID
                break
        bits.store_be64(seqbuf, next_seq + refs[j].i)
        sk.mv_size = 8
        sk.mv_data = seqbuf
        if append:
            rc = mdb_cursor_put(cur, &k, &sk, MDB_APPEND)
        else:
            rc = mdb_put(t, ids, &k, &sk, 0)
        if rc:
            rc_out[0] = rc
            rc = PUT_ID
            break
        rc = 0
    if cur != NULL:
        mdb_cursor_close(cur)
    return rc


def records_put(Txn txn, str ids_db, str seqs_db, idkeys not None,
                fps not None, list metas not None, uint64_t next_seq):
    """Store records under fresh seqs, replacing an id's earlier record.

    Returns (next_seq, replaced). `idkeys`: a list of records keys (bytes), or a uint64
    array of int ids, whose keys are made here (no Python object per record: a bulk load
    of 100M int ids built 100M bytes objects first). `fps`: an (n,) uint64 array, or
    (n, words) for wide fingerprints. `metas[i]` is the msgpack encoding of the meta
    value.
    Records are appended in seq order; ids are then written in key order, which LMDB
    does with far fewer page visits than in input order, and simply appended when every
    key is new and above the stored ones (ascending int ids, a fresh index). The writes
    run without the GIL.
    """
    cdef Py_ssize_t i, n = len(idkeys)
    cdef MDB_dbi ids = txn.env.dbi(ids_db), sq = txn.env.dbi(seqs_db)
    cdef bytes idk, mb
    cdef size_t replaced = 0
    cdef IdRef *refs = NULL
    cdef const char **mp = NULL
    cdef size_t *ml = NULL
    cdef const uint64_t[:, ::1] fw
    cdef int words, stage = 0, rc = 0
    cdef uint64_t at = 0
    cdef const uint64_t[::1] int_ids
    cdef char *keybuf = NULL
    cdef bint listed = isinstance(idkeys, list)
    cdef MDB_txn *t
    cdef bint sums = txn.env.sums
    txn.check()
    t = txn.txn
    fw = fps.reshape(-1, 1) if fps.ndim == 1 else fps
    words = <int>fw.shape[1]
    if words not in (1, 2, 4, 8, 12, 16):
        raise ValueError("fingerprints have 1, 2, 4, 8, 12 or 16 words")
    if fw.shape[0] != n or len(metas) != n:
        raise ValueError("ids, fingerprints and metas differ in length")
    if not listed:
        int_ids = idkeys             # raises for anything but a 1-d uint64 array
    for i in range(n):
        if (listed and not isinstance(idkeys[i], bytes)) or not isinstance(metas[i], bytes):
            raise TypeError("id keys and metas must be bytes")
    if n == 0:
        return next_seq, 0
    refs = <IdRef *>malloc(n * sizeof(IdRef))
    mp = <const char **>malloc(n * sizeof(char *))
    ml = <size_t *>malloc(n * sizeof(size_t))
    if not listed:
        keybuf = <char *>malloc(n * INT_KEY)
    try:
        if refs == NULL or mp == NULL or ml == NULL or (not listed and keybuf == NULL):
            raise MemoryError()
        for i in range(n):
            refs[i].i = i
            if listed:
                idk = idkeys[i]
                refs[i].p = PyBytes_AS_STRING(idk)
                refs[i].n = PyBytes_GET_SIZE(idk)
            else:
                keybuf[i * INT_KEY] = <char>layout.ID_TAG_INT
                bits.store_be64(keybuf + i * INT_KEY + 1, int_ids[i])
                refs[i].p = keybuf + i * INT_KEY
                refs[i].n = INT_KEY
            mb = metas[i]
            mp[i] = PyBytes_AS_STRING(mb)
            ml[i] = <size_t>PyBytes_GET_SIZE(mb)
        # (idkeys and metas hold the bytes the pointers point into until this returns)
        with nogil:
            stage = _put_records(t, ids, sq, refs, mp, ml, fw, n, next_seq, sums,
                                 &replaced, &rc, &at)
    finally:
        free(refs)
        free(mp)
        free(ml)
        free(keybuf)
    where = txn.env.path
    if stage == PUT_SEQ_USED:
        raise CorruptError(f"{where}: record sequence {at} already used")
    if stage == PUT_ID_SIZE:
        raise CorruptError(f"{where}: id entry has a bad size")
    if stage:
        raise error(rc, f"{where}: " + {
            PUT_RECORD: "writing a record failed", PUT_READ_IDS: "reading the ids failed",
            PUT_REPLACE: "replacing a record failed", PUT_READ_ID: "reading an id failed",
            PUT_ID: "writing an id failed"}[stage])
    return next_seq + n, replaced


def encode_ids(list ids not None, fallback, Py_ssize_t max_bytes):
    """Records keys of many ids, as simindex.engine.codec.encode_id makes them (type tag, then the
    8-byte big-endian int or the UTF-8 text), in one compiled pass.

    An id that is not a plain int in [0, 2**64) or a str of at most `max_bytes` UTF-8 bytes
    goes through `fallback` (encode_id), which encodes it or raises the error that names it.
    """
    cdef Py_ssize_t i, n = len(ids), size
    cdef list out = [None] * n
    cdef object x
    cdef bytes b
    cdef char *p
    cdef const char *u
    cdef unsigned long long v
    for i in range(n):
        x = ids[i]
        if type(x) is int and x >= 0 and x <= 0xFFFFFFFFFFFFFFFF:
            v = x
            b = PyBytes_FromStringAndSize(NULL, 9)
            p = PyBytes_AS_STRING(b)
            p[0] = layout.ID_TAG_INT
            bits.store_be64(p + 1, v)
            out[i] = b
        elif type(x) is str:
            try:
                u = PyUnicode_AsUTF8AndSize(x, &size)
            except UnicodeEncodeError:
                out[i] = fallback(x)            # a lone surrogate: the fallback says so
                continue
            if size > max_bytes:
                out[i] = fallback(x)
                continue
            b = PyBytes_FromStringAndSize(NULL, size + 1)
            p = PyBytes_AS_STRING(b)
            p[0] = layout.ID_TAG_STR
            memcpy(p + 1, u, size)
            out[i] = b
        else:
            out[i] = fallback(x)
    return out


# ---------------------------------------------------------------- reading records
cdef tuple record_id_meta(const uint8_t *p, size_t n, int words=1):
    """(id, meta bytes or None) of a stored record value, the id decoded to its type.

    A record's meta of msgpack nil comes back as None, so most matches need no decoding.
    """
    cdef size_t idlen, hdr = record_header(words)
    cdef const uint8_t *key
    cdef object id_, meta
    if n < hdr:
        raise CorruptError("a stored record is shorter than its header")
    idlen = p[8] | (<size_t>p[9] << 8)
    if idlen < 1 or hdr + idlen > n:
        raise CorruptError("a stored record's id runs past its end")
    key = p + hdr
    if key[0] == layout.ID_TAG_STR:
        try:
            id_ = PyUnicode_DecodeUTF8(<const char *>key + 1, idlen - 1, "strict")
        except UnicodeDecodeError:
            raise CorruptError("a stored text id is not valid UTF-8") from None
    elif key[0] == layout.ID_TAG_BYTES:
        id_ = PyBytes_FromStringAndSize(<const char *>key + 1, idlen - 1)
    elif key[0] == layout.ID_TAG_INT and idlen == 9:
        id_ = bits.load_be64(key + 1)
    else:
        raise CorruptError(f"a stored id has an unknown type tag {key[0]!r}")
    if n - hdr - idlen == 1 and p[hdr + idlen] == layout.MSGPACK_NIL:
        meta = None
    else:
        meta = PyBytes_FromStringAndSize(<const char *>p + hdr + idlen, n - hdr - idlen)
    return id_, meta


cdef object record_fp(const uint8_t *p, int words):
    """The fingerprint of a stored record value (its header checked by the caller), an int."""
    cdef int w
    if words <= 1:
        return bits.load64(p)
    v = bits.load64(p)
    for w in range(1, words):
        v = (v << 64) | bits.load64(p + layout.RECORD_HEADER + 8 * (w - 1))
    return v


def split_record(bytes value not None, int words=1):
    """(fingerprint, id key, meta bytes) of a stored record value, checking its sizes."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(value)
    cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(value)
    cdef size_t idlen, hdr = record_header(words)
    if n < <Py_ssize_t>hdr:
        raise CorruptError("a stored record is shorter than its header")
    idlen = p[8] | (<size_t>p[9] << 8)
    if hdr + idlen > <size_t>n:
        raise CorruptError("a stored record's id runs past its end")
    return record_fp(p, words), value[hdr:hdr + idlen], value[hdr + idlen:]


cdef int _tail_push(Tail *tail, uint64_t seq, const uint8_t *val) noexcept nogil:
    """Append a record's seq and fingerprint words (its value holds the header)."""
    cdef void *tmp
    cdef size_t rest = tail.words - 1 if tail.words > 1 else 0, w
    if tail.n == tail.cap:
        tail.cap = tail.cap * 2 if tail.cap else 1024
        tmp = realloc(tail.seq, tail.cap * 8)
        if tmp == NULL:
            return NO_MEMORY
        tail.seq = <uint64_t *>tmp
        tmp = realloc(tail.fp, tail.cap * 8)
        if tmp == NULL:
            return NO_MEMORY
        tail.fp = <uint64_t *>tmp
        if rest:
            tmp = realloc(tail.rest, tail.cap * 8 * rest)
            if tmp == NULL:
                return NO_MEMORY
            tail.rest = <uint64_t *>tmp
    tail.seq[tail.n] = seq
    tail.fp[tail.n] = bits.load64(val)
    for w in range(rest):
        tail.rest[tail.n * rest + w] = bits.load64(val + layout.RECORD_HEADER + 8 * w)
    tail.n += 1
    return 0


cdef int _read_tail(MDB_cursor *cur, uint64_t start, size_t limit, Tail *tail) noexcept nogil:
    """Append (seq, fp) of every record with seq >= start, at most `limit` (0: all)."""
    cdef MDB_val key, val
    cdef uint8_t kbuf[8]
    cdef int rc
    cdef size_t body
    bits.store_be64(kbuf, start)
    key.mv_size = 8
    key.mv_data = kbuf
    rc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE)
    while rc == 0:
        if key.mv_size != 8 or not record_body(bits.load_be64(key.mv_data),
                                               <const uint8_t *>val.mv_data, val.mv_size,
                                               tail.sums, &body) or \
                body < record_header(tail.words):
            return CORRUPT_RECORD
        rc = _tail_push(tail, bits.load_be64(key.mv_data), <const uint8_t *>val.mv_data)
        if rc:
            return rc
        if limit and tail.n >= limit:
            return 0
        rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)
    return 0 if rc == MDB_NOTFOUND else rc


cdef int load_tail(MDB_cursor *cur, uint64_t start, Tail *tail) noexcept nogil:
    """Load (seq, fp) of every record with seq >= start: those not yet in every table."""
    return _read_tail(cur, start, 0, tail)


cdef void drop_tail_below(Tail *tail, uint64_t start) noexcept nogil:
    """Drop the records below seq `start` from the front of a tail (seq order)."""
    cdef size_t lo = 0, hi = tail.n, mid, rest = tail.words - 1 if tail.words > 1 else 0
    while lo < hi:
        mid = (lo + hi) // 2
        if tail.seq[mid] < start:
            lo = mid + 1
        else:
            hi = mid
    if lo == 0:
        return
    tail.n -= lo
    memmove(tail.seq, tail.seq + lo, tail.n * 8)
    memmove(tail.fp, tail.fp + lo, tail.n * 8)
    if rest:
        memmove(tail.rest, tail.rest + lo * rest, tail.n * rest * 8)


cdef void free_tail(Tail *tail) noexcept nogil:
    free(tail.seq)
    free(tail.fp)
    free(tail.rest)
    tail.seq = NULL
    tail.fp = NULL
    tail.rest = NULL
    tail.n = tail.cap = 0


def read_tail(Txn txn, str seqs_db, uint64_t start, size_t limit=0, int words=1):
    """(seqs, fps) of the records with seq >= start, in seq order, at most `limit` (0: all);
    fps an (n,) array, or (n, words) for wide fingerprints."""
    cdef MDB_cursor *cur
    cdef int rc
    cdef Tail tail
    cdef size_t i
    cdef int w
    txn.check()
    if words not in (1, 2, 4, 8, 12, 16):
        raise ValueError("fingerprints have 1, 2, 4, 8, 12 or 16 words")
    rc = mdb_cursor_open(txn.txn, txn.env.dbi(seqs_db), &cur)
    if rc:
        raise error(rc, f"{txn.env.path}: cursor failed")
    memset(&tail, 0, sizeof(Tail))
    tail.words = words
    tail.sums = txn.env.sums
    try:
        with nogil:
            rc = _read_tail(cur, start, limit, &tail)
        if rc:
            raise error(rc, f"{txn.env.path}: reading records failed")
        seqs = np.empty(tail.n, dtype=np.uint64)
        _copy_u64(seqs, tail.seq, tail.n)
        if words == 1:
            fps = np.empty(tail.n, dtype=np.uint64)
            _copy_u64(fps, tail.fp, tail.n)
            return seqs, fps
        fps = np.empty((tail.n, words), dtype=np.uint64)
        for i in range(tail.n):
            fps[i, 0] = tail.fp[i]
            for w in range(1, words):
                fps[i, w] = tail.rest[i * (words - 1) + w - 1]
        return seqs, fps
    finally:
        mdb_cursor_close(cur)
        free_tail(&tail)


cdef void _copy_u64(arr, const uint64_t *src, size_t n):
    cdef uint64_t[::1] m = arr
    if n:
        memcpy(&m[0], src, n * 8)


def records_lookup(Txn txn, str seqs_db, const uint64_t[::1] seqs, int words=1):
    """(fingerprints, ids) of the records of ascending `seqs`, looked up in one pass; a
    record removed since (no such seq) gives fingerprint 0 and id None. Fingerprints: an
    (n,) array, or (n, words) for wide ones."""
    cdef Py_ssize_t i, n = seqs.shape[0]
    cdef size_t hdr = record_header(words)
    cdef int w
    cdef MDB_dbi dbi = txn.env.dbi(seqs_db)
    cdef MDB_cursor *cur = NULL
    cdef MDB_val k, v
    cdef uint8_t kbuf[8]
    cdef int rc
    cdef size_t body
    txn.check()
    if words not in (1, 2, 4, 8, 12, 16):
        raise ValueError("fingerprints have 1, 2, 4, 8, 12 or 16 words")
    fps = np.zeros((n, words), dtype=np.uint64)
    cdef uint64_t[:, ::1] fo = fps
    ids = [None] * n
    rc = mdb_cursor_open(txn.txn, dbi, &cur)
    if rc:
        raise error(rc, f"{txn.env.path}: reading records failed")
    try:
        for i in range(n):
            bits.store_be64(kbuf, seqs[i])
            k.mv_size = 8
            k.mv_data = kbuf
            rc = mdb_cursor_get(cur, &k, &v, MDB_SET_KEY)
            if rc == MDB_NOTFOUND:
                continue
            if rc:
                raise error(rc, f"{txn.env.path}: reading records failed")
            if not txn.write and not val_in_pages(&v, txn.env.psize):
                raise CorruptError(f"{txn.env.path}: the stored record of seq {seqs[i]} is "
                                   f"damaged (its size runs past its page)")
            if not record_body(seqs[i], <const uint8_t *>v.mv_data, v.mv_size,
                               txn.env.sums, &body) or body < hdr:
                raise damaged_record(txn.env.path, seqs[i])
            fo[i, 0] = bits.load64(v.mv_data)
            for w in range(1, words):
                fo[i, w] = bits.load64(<const uint8_t *>v.mv_data + layout.RECORD_HEADER +
                                       8 * (w - 1))
            ids[i] = record_id_meta(<const uint8_t *>v.mv_data, body, words)[0]
    finally:
        mdb_cursor_close(cur)
    return (fps[:, 0].copy() if words == 1 else fps), ids


cdef object damaged_record(str where, uint64_t seq):
    """The error of a stored record whose checksum or size is wrong."""
    return CorruptError(f"{where}: the stored record of seq {seq} is damaged (its checksum "
                        f"or size is wrong)", code=CORRUPT_RECORD)


def record_get(Txn txn, str ids_db, str seqs_db, bytes idkey not None, int words=1):
    """The stored record of an id key without its checksum, or None: both lookups and every
    check in one call. A record that is damaged raises CorruptError; an id entry that is
    not a seq, leads to no record, or to a record of another id key gives (why, seq), why
    one of "size", "missing", "other id", for the caller to name the id."""
    cdef MDB_val k, v
    cdef uint8_t kbuf[8]
    cdef uint64_t seq
    cdef size_t body, idlen, hdr = record_header(words)
    cdef const uint8_t *p
    cdef int rc
    txn.check()
    k.mv_size = <size_t>PyBytes_GET_SIZE(idkey)
    k.mv_data = <void *>PyBytes_AS_STRING(idkey)
    rc = mdb_get(txn.txn, txn.env.dbi(ids_db), &k, &v)
    if rc == MDB_NOTFOUND:
        return None
    if rc:
        raise error(rc, f"{txn.env.path}: reading an id failed")
    if v.mv_size != 8:
        return ("size", 0)
    memcpy(kbuf, v.mv_data, 8)
    seq = bits.load_be64(kbuf)
    k.mv_size = 8
    k.mv_data = kbuf
    rc = mdb_get(txn.txn, txn.env.dbi(seqs_db), &k, &v)
    if rc == MDB_NOTFOUND:
        return ("missing", seq)
    if rc:
        raise error(rc, f"{txn.env.path}: reading a record failed")
    p = <const uint8_t *>v.mv_data
    if (not txn.write and not val_in_pages(&v, txn.env.psize)) or \
            not record_body(seq, p, v.mv_size, txn.env.sums, &body) or body < hdr:
        raise damaged_record(txn.env.path, seq)
    idlen = p[8] | (<size_t>p[9] << 8)
    if idlen != <size_t>PyBytes_GET_SIZE(idkey) or hdr + idlen > body or \
            memcmp(p + hdr, PyBytes_AS_STRING(idkey), idlen):
        return ("other id", seq)
    return PyBytes_FromStringAndSize(<const char *>p, body)


cdef enum:
    FOUND_NO_RECORD = 1, FOUND_OTHER_ID, FOUND_BAD_RECORD, FOUND_BAD_ENTRY


cdef int _check_ids(MDB_cursor *ic, MDB_cursor *sc, int words, bint sums, uint64_t *seq,
                    MDB_val *idk, int *rc_out) noexcept nogil:
    """Walk every id entry from `ic`'s position on: its seq's record must exist, be whole
    and hold that id key. 0 when all do, else a FOUND_ code (the entry in idk, its seq in
    `seq`), or -1 with LMDB's code in rc_out."""
    cdef MDB_val k, v, sk
    cdef uint8_t kbuf[8]
    cdef size_t body, idlen, hdr = record_header(words)
    cdef const uint8_t *p
    cdef int rc = mdb_cursor_get(ic, &k, &v, MDB_NEXT)
    while rc == 0:
        idk[0] = k
        if v.mv_size != 8:
            seq[0] = 0
            return FOUND_BAD_ENTRY
        seq[0] = bits.load_be64(v.mv_data)
        memcpy(kbuf, v.mv_data, 8)
        sk.mv_size = 8
        sk.mv_data = kbuf
        rc = mdb_cursor_get(sc, &sk, &v, MDB_SET_KEY)
        if rc == MDB_NOTFOUND:
            return FOUND_NO_RECORD
        if rc:
            break
        if not record_body(seq[0], <const uint8_t *>v.mv_data, v.mv_size, sums, &body) or \
                body < hdr:
            return FOUND_BAD_RECORD
        p = <const uint8_t *>v.mv_data
        idlen = p[8] | (<size_t>p[9] << 8)
        if hdr + idlen > body or idlen != k.mv_size or memcmp(p + hdr, k.mv_data, idlen):
            return FOUND_OTHER_ID
        rc = mdb_cursor_get(ic, &k, &v, MDB_NEXT)
    if rc == MDB_NOTFOUND:
        return 0
    rc_out[0] = rc
    return -1


def records_problems(Txn txn, str ids_db, str seqs_db, int words=1, int limit=10):
    """What is wrong between records/'s two databases (a list of str, [] when sound):
    every record must be whole (its checksum, in format 3), and every id entry must lead
    to a record holding that id key. With as many ids as records (verify() compares the
    counts), that makes ids and records one-to-one, so no get() or query answer is wrong."""
    cdef MDB_cursor *ic = NULL
    cdef MDB_cursor *sc = NULL
    cdef MDB_val k, v, idk
    cdef uint64_t seq = 0
    cdef int rc = 0, found
    cdef size_t body
    cdef list out = []
    txn.check()
    where = txn.env.path
    rc = mdb_cursor_open(txn.txn, txn.env.dbi(seqs_db), &sc)
    if rc:
        raise error(rc, f"{where}: reading records failed")
    try:
        rc = mdb_cursor_get(sc, &k, &v, MDB_NEXT)
        while rc == 0 and len(out) < limit:
            if k.mv_size != 8:
                out.append(f"records: a record's seq key has {k.mv_size} bytes, not 8")
            elif not record_body(bits.load_be64(k.mv_data), <const uint8_t *>v.mv_data,
                                 v.mv_size, txn.env.sums, &body) or \
                    body < record_header(words):
                out.append(f"records: the record of seq {bits.load_be64(k.mv_data)} is "
                           f"damaged (its checksum or size is wrong)")
            rc = mdb_cursor_get(sc, &k, &v, MDB_NEXT)
        if rc and rc != MDB_NOTFOUND:
            raise error(rc, f"{where}: reading records failed")
        rc = mdb_cursor_open(txn.txn, txn.env.dbi(ids_db), &ic)
        if rc:
            raise error(rc, f"{where}: reading ids failed")
        while len(out) < limit:
            with nogil:
                found = _check_ids(ic, sc, words, txn.env.sums, &seq, &idk, &rc)
            if found == 0:
                break
            if found < 0:
                raise error(rc, f"{where}: reading ids failed")
            name = PyBytes_FromStringAndSize(<const char *>idk.mv_data, idk.mv_size)
            out.append("records: the id entry " + repr(name)[:80] + " " + {
                FOUND_NO_RECORD: f"leads to seq {seq}, which holds no record",
                FOUND_OTHER_ID: f"leads to the record of seq {seq}, which holds another id",
                FOUND_BAD_RECORD: f"leads to the damaged record of seq {seq}",
                FOUND_BAD_ENTRY: "holds no 8-byte seq"}[found])
    finally:
        if ic != NULL:
            mdb_cursor_close(ic)
        mdb_cursor_close(sc)
    return out
