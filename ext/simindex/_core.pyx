# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled core of simindex: LMDB through its C API, permutations, and the scan loops.

Python code above it (simindex/) owns parameters, layout and records; this module owns every
LMDB handle and runs the hot loops (block writes, range scans, Hamming filters, pair joins)
over plain C memory with the GIL released.
"""

import os

import numpy as np

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, calloc, realloc, free, qsort
from libc.string cimport memcmp, memcpy, memset
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeUTF8

cdef extern from "Python.h":
    const char *PyUnicode_AsUTF8AndSize(object s, Py_ssize_t *size) except NULL

from clmdb cimport *
from posix.unistd cimport getpid, usleep
from simindex.errors import (
    StorageError, MapFullError, MapResizedError, CorruptError, ReadOnlyError, ClosedError,
)

cdef extern from "pthread.h" nogil:
    int pthread_atfork(void (*prepare)() noexcept nogil, void (*parent)() noexcept nogil,
                       void (*child)() noexcept nogil)

# This process's id, kept current by a fork handler: every call checks that a handle is not
# a parent's (getpid() is a system call; this is a load).
cdef int _pid = getpid()


cdef void _forked() noexcept nogil:
    global _pid
    _pid = getpid()


pthread_atfork(NULL, NULL, _forked)


def process_id():
    """os.getpid() without the system call."""
    return _pid


cdef extern from "zlib.h" nogil:
    unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int len)

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    static inline uint64_t si_load64(const void *p) {
        uint64_t v; memcpy(&v, p, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        return v;
    }
    static inline void si_store64(void *p, uint64_t v) {
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        memcpy(p, &v, 8);
    }
    static inline uint32_t si_load32(const void *p) {
        uint32_t v; memcpy(&v, p, 4);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap32(v);
    #endif
        return v;
    }
    static inline void si_store32(void *p, uint32_t v) {
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap32(v);
    #endif
        memcpy(p, &v, 4);
    }
    static inline uint64_t si_load_be64(const void *p) {
        const uint8_t *b = (const uint8_t *)p; uint64_t v = 0;
        for (int i = 0; i < 8; i++) v = (v << 8) | b[i];
        return v;
    }
    static inline void si_store_be64(void *p, uint64_t v) {
        uint8_t *b = (uint8_t *)p;
        for (int i = 7; i >= 0; i--) { b[i] = (uint8_t)v; v >>= 8; }
    }
    static inline uint32_t si_load_be32(const void *p) {
        const uint8_t *b = (const uint8_t *)p;
        return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
    }
    static inline void si_store_be32(void *p, uint32_t v) {
        uint8_t *b = (uint8_t *)p;
        b[0] = (uint8_t)(v >> 24); b[1] = (uint8_t)(v >> 16); b[2] = (uint8_t)(v >> 8); b[3] = (uint8_t)v;
    }
    static inline int si_popcount(uint64_t x) { return __builtin_popcountll(x); }
    static inline int si_clz64(uint64_t x) { return __builtin_clzll(x); }
    """
    uint64_t si_load64(const void *p) nogil
    void si_store64(void *p, uint64_t v) nogil
    uint32_t si_load32(const void *p) nogil
    void si_store32(void *p, uint32_t v) nogil
    uint64_t si_load_be64(const void *p) nogil
    void si_store_be64(void *p, uint64_t v) nogil
    uint32_t si_load_be32(const void *p) nogil
    void si_store_be32(void *p, uint32_t v) nogil
    int si_popcount(uint64_t x) nogil
    int si_clz64(uint64_t x) nogil


# ---------------------------------------------------------------- on-disk constants
# A block is one LMDB value holding `count` entries (permuted key, seq) of a run, sorted by key.
# v2 (written): a 32-byte header (magic, count, crc32 of everything after it but the padding,
# key width, seq width, 2 zero bytes, key base u64, seq base u64), `count` keys as kw-byte offsets from the key base,
# `count` seqs as sw-byte offsets from the seq base (little-endian), then 8 zero bytes so every
# entry can be read with one 8-byte load. Widths are the fewest bytes that span the block's
# keys and seqs: 7 + 3 bytes per entry at 1M random fingerprints, 6 + 4 at 100M.
# v1 (still read): a 16-byte header (magic, count, crc32, 0) and 8-byte keys and seqs.
# A full block is 16368 bytes: with LMDB's 16-byte page header, four 4 KiB overflow pages.
DEF BLOCK_HEADER = 16
DEF BLOCK_MAGIC = 0x31424953     # b"SIB1" read little-endian
DEF V2_HEADER = 32
DEF V2_MAGIC = 0x32424953        # b"SIB2"
DEF V2_PAD = 8
DEF BLOCK_BYTES = 16368
DEF C_BLOCK_ENTRIES = 1022       # v1 entries per block
DEF V2_MAX_ENTRIES = BLOCK_BYTES - V2_HEADER - V2_PAD
# Entries in a block at full width (16 bytes): runs smaller than this share a block's cost.
BLOCK_ENTRIES = (BLOCK_BYTES - V2_HEADER - V2_PAD) // 16
# A block's LMDB key: run id (u64 BE), last permuted key of the block (u64 BE), block number
# in the run (u32 BE). Seeking (run, lo, 0) lands on the first block that can hold keys >= lo.
DEF BLOCK_KEY = 20
# A record's value in records/seqs: fp (u64 LE), id length (u16 LE), id key, msgpack(meta).
DEF RECORD_HEADER = 10

# A shard's state "runs" value: per run (run id u64, entry count u64, table u32, 0 u32), LE.
DEF RUN_ENTRY = 24
# Keys of a shard's state database read by the scan loop.
cdef const char *KEY_APPLIED = b"applied"
cdef const char *KEY_RUNS = b"runs"

# Error codes of the nogil loops, beside LMDB's own.
DEF SI_CORRUPT_BLOCK = -1001
DEF SI_CORRUPT_STATE = -1002
DEF SI_NOMEM = -1003
DEF SI_CORRUPT_RECORD = -1004
DEF SI_CORRUPT_KEY = -1005


def lmdb_version():
    """The version string of the LMDB library this core is linked against."""
    return mdb_version(NULL, NULL, NULL).decode()


cdef object _error(int rc, str what):
    """Turn an LMDB or core return code into the matching simindex exception."""
    if rc == MDB_MAP_FULL:
        return MapFullError(f"{what}: the LMDB map is full")
    if rc == MDB_MAP_RESIZED:
        return MapResizedError(f"{what}: another process grew the LMDB map")
    if rc in (MDB_CORRUPTED, MDB_PAGE_NOTFOUND, MDB_INVALID, MDB_VERSION_MISMATCH, MDB_PANIC):
        return CorruptError(f"{what}: {mdb_strerror(rc).decode(errors='replace')}")
    if rc == SI_CORRUPT_BLOCK:
        return CorruptError(f"{what}: a table block is damaged (bad header, size or order)")
    if rc == SI_CORRUPT_STATE:
        return CorruptError(f"{what}: a shard's state record is damaged")
    if rc == SI_CORRUPT_RECORD:
        return CorruptError(f"{what}: a stored record is damaged")
    if rc == SI_CORRUPT_KEY:
        return CorruptError(f"{what}: a table key has the wrong size")
    if rc == SI_NOMEM:
        return MemoryError(what)
    if rc > 0:
        return StorageError(rc, f"{what}: {os.strerror(rc)}")
    return StorageError(f"{what}: {mdb_strerror(rc).decode(errors='replace')} (LMDB {rc})")


cdef inline MDB_val _val(bytes b):
    cdef MDB_val v
    v.mv_size = PyBytes_GET_SIZE(b)
    v.mv_data = <void *>PyBytes_AS_STRING(b)
    return v


cdef inline bytes _bytes(MDB_val v):
    return PyBytes_FromStringAndSize(<char *>v.mv_data, v.mv_size)


cdef extern from "unistd.h":
    int getpagesize()


cdef size_t _page_size(MDB_env *env) noexcept:
    """The environment's page size when its pages are aligned in memory (it is not above
    the OS page size), else 0: then values are not checked against page bounds."""
    cdef MDB_stat st
    if mdb_env_stat(env, &st) or st.ms_psize == 0 or st.ms_psize > <unsigned int>getpagesize() \
            or st.ms_psize & (st.ms_psize - 1):
        return 0
    return st.ms_psize


cdef inline bint _val_in_pages(const MDB_val *v, size_t psize) noexcept nogil:
    """Whether a value LMDB returned lies inside its leaf page, or inside the overflow pages
    whose header precedes it. LMDB trusts a node's size: a damaged one would make a read
    run past the end of the file (SIGBUS)."""
    cdef size_t off
    cdef const uint8_t *hdr
    if psize == 0:
        return True
    off = (<size_t>v.mv_data) & (psize - 1)
    if off + v.mv_size <= psize:
        return True
    if off != 16:                        # spans pages, so it must start an overflow run
        return False
    hdr = <const uint8_t *>v.mv_data - 16
    return ((hdr[10] | hdr[11] << 8) & 0x04) != 0 and \
        v.mv_size + 16 <= <size_t>si_load32(hdr + 12) * psize


# ---------------------------------------------------------------- environments
# ---------------------------------------------------------------- the resize gate
cdef extern from *:
    """
    /* The gates this thread is inside, innermost last (calls nest at most a few deep). */
    #define SI_GATE_MAX 32
    static __thread void *si_gates[SI_GATE_MAX];
    static __thread int si_ngates = 0;
    static int si_gate_push(void *g) {
        if (si_ngates == SI_GATE_MAX) return -1;
        si_gates[si_ngates++] = g;
        return 0;
    }
    static void si_gate_pop(void) { if (si_ngates) si_ngates--; }
    static int si_gate_held(void *g) {
        for (int i = 0; i < si_ngates; i++) if (si_gates[i] == g) return 1;
        return 0;
    }
    """
    int si_gate_push(void *g)
    void si_gate_pop()
    int si_gate_held(void *g)


cdef class Gate:
    """Many calls inside at once, or one map resize alone (LMDB needs no live transaction
    of this process while it resizes).

    Re-entrant per thread: a call already inside (add_unique queries inside its write)
    never waits for a resize, which itself waits for that call to leave. Every method runs
    under the GIL without releasing it, so the counters need no lock: entering is a few
    loads and stores, not the two lock round trips of a threading.Condition.
    """

    def __cinit__(self):
        self.inside = 0
        self.resizing = False

    def enter(self):
        """Enter as one of many; waits while a resize runs (unless already inside)."""
        if not si_gate_held(<void *>self):
            while self.resizing:
                with nogil:
                    usleep(200)
        if si_gate_push(<void *>self):
            raise RuntimeError("calls nested too deep inside one thread")
        self.inside += 1

    def exit(self):
        self.inside -= 1
        si_gate_pop()

    def nested(self):
        """Whether this thread is inside (a resize must then wait for its outer call)."""
        return bool(si_gate_held(<void *>self))

    def shared(self):
        return _Inside(self)

    def begin_exclusive(self):
        """Wait for other resizes and for every call to leave, then hold the gate alone."""
        if si_gate_held(<void *>self):
            raise RuntimeError("a map resize was attempted from inside a gated call")
        while self.resizing:
            with nogil:
                usleep(200)
        self.resizing = True
        while self.inside:
            with nogil:
                usleep(200)

    def end_exclusive(self):
        self.resizing = False


cdef class _Inside:
    """`with gate.shared():` (a plain object, not a generator: every query passes here)."""
    cdef Gate gate

    def __cinit__(self, Gate gate):
        self.gate = gate

    def __enter__(self):
        self.gate.enter()

    def __exit__(self, *exc):
        self.gate.exit()
        return False


cdef class Env:
    """One LMDB environment (a directory). Closing it invalidates its transactions."""

    def __cinit__(self):
        self.env = NULL

    def __init__(self, path, *, bint readonly=False, bint sync=True, bint metasync=True,
                 size_t mapsize=1 << 30, unsigned int maxdbs=4, unsigned int maxreaders=1024):
        cdef int rc
        cdef unsigned int flags = MDB_NOTLS
        cdef bytes bpath = os.fsencode(path)
        cdef const char *cpath = bpath
        self.path = os.fsdecode(path)
        self.readonly = readonly
        self.deps = set()
        self.dbis = {}
        self.pid = os.getpid()
        if readonly:
            flags |= MDB_RDONLY
        if not sync:
            flags |= MDB_NOSYNC
        elif not metasync:
            flags |= MDB_NOMETASYNC
        rc = mdb_env_create(&self.env)
        if rc:
            self.env = NULL
            raise _error(rc, f"cannot create an LMDB environment for {self.path}")
        mdb_env_set_maxdbs(self.env, maxdbs)
        mdb_env_set_maxreaders(self.env, maxreaders)
        mdb_env_set_mapsize(self.env, mapsize)
        with nogil:
            rc = mdb_env_open(self.env, cpath, flags, 0o644)
        if rc:
            mdb_env_close(self.env)
            self.env = NULL
            raise _error(rc, f"cannot open LMDB environment {self.path}")
        self.psize = _page_size(self.env)

    def __dealloc__(self):
        # Never close in a forked child: the handle belongs to the parent.
        if self.env is not NULL and self.pid == os.getpid():
            mdb_env_close(self.env)
        self.env = NULL

    cdef int check(self) except -1:
        if self.env is NULL:
            raise ClosedError(f"LMDB environment {self.path} is closed")
        if self.pid != _pid:
            raise ClosedError(
                f"LMDB environment {self.path} was opened in process {self.pid} and cannot be "
                f"used after fork(); open the index again in this process")
        return 0

    @property
    def closed(self):
        return self.env is NULL

    def close(self):
        """Invalidate every transaction and read context on this environment, then close it."""
        for dep in list(self.deps):
            if isinstance(dep, Txn):
                (<Txn>dep)._invalidate()
            elif isinstance(dep, ReadContext):
                (<ReadContext>dep)._invalidate()
        self.deps.clear()
        if self.env is not NULL:
            if self.pid == os.getpid():
                mdb_env_close(self.env)
            self.env = NULL

    def open_db(self, name, bint create=False):
        """Open (or create) the named database once; later calls reuse the handle."""
        cdef MDB_txn *txn
        cdef MDB_dbi dbi
        cdef int rc
        cdef bytes bname = name.encode()
        self.check()
        if name in self.dbis:
            return
        rc = mdb_txn_begin(self.env, NULL, 0 if create else MDB_RDONLY, &txn)
        if rc:
            raise _error(rc, f"{self.path}: cannot begin a transaction")
        rc = mdb_dbi_open(txn, bname, MDB_CREATE if create else 0, &dbi)
        if rc:
            mdb_txn_abort(txn)
            if rc == MDB_NOTFOUND:
                raise CorruptError(f"{self.path}: database {name!r} is missing")
            raise _error(rc, f"{self.path}: cannot open database {name!r}")
        rc = mdb_txn_commit(txn)
        if rc:
            raise _error(rc, f"{self.path}: cannot open database {name!r}")
        self.dbis[name] = dbi

    cdef MDB_dbi dbi(self, name) except? 0:
        try:
            return self.dbis[name]
        except KeyError:
            raise CorruptError(f"{self.path}: database {name!r} is not open") from None

    def sync(self, bint force=True):
        """Flush the environment to disk (needed with sync=False before a clean stop)."""
        cdef int rc
        self.check()
        if self.readonly:
            return
        with nogil:
            rc = mdb_env_sync(self.env, force)
        if rc:
            raise _error(rc, f"{self.path}: sync failed")

    def info(self):
        """Map size, last page, last transaction id and reader counts."""
        cdef MDB_envinfo i
        self.check()
        mdb_env_info(self.env, &i)
        return {"mapsize": i.me_mapsize, "last_pgno": i.me_last_pgno,
                "last_txnid": i.me_last_txnid, "maxreaders": i.me_maxreaders,
                "numreaders": i.me_numreaders}

    def set_mapsize(self, size_t size):
        """Grow the map (0 adopts the size another process set). No transaction may be live."""
        cdef int rc
        self.check()
        rc = mdb_env_set_mapsize(self.env, size)
        if rc:
            raise _error(rc, f"{self.path}: cannot set the map size")

    def reader_check(self):
        """Clear reader slots left by dead processes; returns how many were cleared."""
        cdef int dead = 0
        self.check()
        mdb_reader_check(self.env, &dead)
        return dead

# ---------------------------------------------------------------- transactions
cdef class Txn:
    """A read or write transaction; a `with` block commits on success and aborts on error."""

    def __cinit__(self, Env env, bint write=False):
        cdef int rc
        self.txn = NULL
        env.check()
        if write and env.readonly:
            raise ReadOnlyError(f"{env.path} is open read-only")
        self.env = env
        self.write = write
        with nogil:
            rc = mdb_txn_begin(env.env, NULL, 0 if write else MDB_RDONLY, &self.txn)
        if rc:
            self.txn = NULL
            raise _error(rc, f"{env.path}: cannot begin a transaction")
        env.deps.add(self)

    def __dealloc__(self):
        self._invalidate()

    cdef void _invalidate(self) noexcept:
        # In a forked child the handle is the parent's: aborting would free the parent's
        # reader slot in the shared lock file, so the pointer is only dropped.
        if self.txn is not NULL and self.env is not None and self.env.env is not NULL \
                and self.env.pid == getpid():
            mdb_txn_abort(self.txn)
        self.txn = NULL

    cdef int check(self) except -1:
        if self.txn is NULL:
            raise ClosedError(f"{self.env.path}: the transaction is finished")
        return 0

    def __enter__(self):
        return self

    def __exit__(self, etype, evalue, tb):
        if etype is None:
            self.commit()
        else:
            self.abort()
        return False

    @property
    def id(self):
        self.check()
        return mdb_txn_id(self.txn)

    def commit(self):
        cdef int rc
        self.check()
        with nogil:
            rc = mdb_txn_commit(self.txn)
        self.txn = NULL
        self.env.deps.discard(self)
        if rc:
            raise _error(rc, f"{self.env.path}: commit failed")

    def abort(self):
        self._invalidate()
        self.env.deps.discard(self)

    def get(self, db, bytes key not None):
        cdef MDB_val k = _val(key), v
        cdef int rc
        self.check()
        rc = mdb_get(self.txn, self.env.dbi(db), &k, &v)
        if rc == MDB_NOTFOUND:
            return None
        if rc:
            raise _error(rc, f"{self.env.path}: read from {db!r} failed")
        if not self.write and not _val_in_pages(&v, self.env.psize):
            raise CorruptError(f"{self.env.path}: a value in {db!r} is damaged (its size runs "
                               f"past its page)")
        return _bytes(v)

    def put(self, db, bytes key not None, bytes value not None, bint append=False):
        cdef MDB_val k = _val(key), v = _val(value)
        cdef int rc
        self.check()
        rc = mdb_put(self.txn, self.env.dbi(db), &k, &v, MDB_APPEND if append else 0)
        if rc:
            raise _error(rc, f"{self.env.path}: write to {db!r} failed")

    def delete(self, db, bytes key not None):
        """Delete `key`; returns whether it was there."""
        cdef MDB_val k = _val(key)
        cdef int rc
        self.check()
        rc = mdb_del(self.txn, self.env.dbi(db), &k, NULL)
        if rc == MDB_NOTFOUND:
            return False
        if rc:
            raise _error(rc, f"{self.env.path}: delete from {db!r} failed")
        return True

    def prefixed(self, db, bytes prefix not None):
        """[(key, value), ...] of every key of the named database that starts with `prefix`,
        in key order."""
        cdef MDB_val k = _val(prefix), v
        cdef MDB_cursor *cur = NULL
        cdef int rc
        cdef Py_ssize_t n = len(prefix)
        self.check()
        out = []
        rc = mdb_cursor_open(self.txn, self.env.dbi(db), &cur)
        if rc:
            raise _error(rc, f"{self.env.path}: read from {db!r} failed")
        try:
            rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE)
            while rc == 0:
                if <Py_ssize_t>k.mv_size < n or memcmp(k.mv_data, <const char *>prefix, n):
                    break
                if not self.write and not (_val_in_pages(&k, self.env.psize) and
                                           _val_in_pages(&v, self.env.psize)):
                    raise CorruptError(f"{self.env.path}: a value in {db!r} is damaged (its "
                                       f"size runs past its page)")
                out.append((_bytes(k), _bytes(v)))
                rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)
            if rc and rc != MDB_NOTFOUND:
                raise _error(rc, f"{self.env.path}: read from {db!r} failed")
        finally:
            mdb_cursor_close(cur)
        return out

    def entries(self, db):
        """How many keys the named database holds."""
        cdef MDB_stat st
        cdef int rc
        self.check()
        rc = mdb_stat(self.txn, self.env.dbi(db), &st)
        if rc:
            raise _error(rc, f"{self.env.path}: stat of {db!r} failed")
        return st.ms_entries

# ---------------------------------------------------------------- permutation plan
cdef class Plan:
    """The block-permutation tables in C form: per table, where each block goes."""

    def __cinit__(self, list widths, list orders, list prefix_bits, int shard_bits):
        cdef int m = len(widths), T = len(orders), t, j, b, start
        cdef list src = []
        cdef int cum
        if m < 1 or m > 64 or sum(widths) != 64 or T < 1 or not 0 <= shard_bits <= 8:
            raise ValueError("invalid permutation plan")
        self.nblocks = m
        self.ntables = T
        self.shard_bits = shard_bits
        self.src_shift = <uint8_t *>malloc(T * m)
        self.dst_shift = <uint8_t *>malloc(T * m)
        self.bmask = <uint64_t *>malloc(T * m * sizeof(uint64_t))
        self.pmask = <uint64_t *>malloc(T * sizeof(uint64_t))
        if not (self.src_shift and self.dst_shift and self.bmask and self.pmask):
            raise MemoryError()
        start = 0
        for b in range(m):
            src.append(64 - start - widths[b])
            start += widths[b]
        for t in range(T):
            if sorted(orders[t]) != list(range(m)):
                raise ValueError("table order must be a permutation of the blocks")
            cum = 0
            for j in range(m):
                b = orders[t][j]
                self.src_shift[t * m + j] = src[b]
                self.dst_shift[t * m + j] = 64 - cum - widths[b]
                self.bmask[t * m + j] = 0xFFFFFFFFFFFFFFFF if widths[b] == 64 \
                    else ((<uint64_t>1 << widths[b]) - 1)
                cum += widths[b]
            self.pmask[t] = 0 if prefix_bits[t] == 0 else \
                (0xFFFFFFFFFFFFFFFF << (64 - prefix_bits[t])) & 0xFFFFFFFFFFFFFFFF

    def __dealloc__(self):
        free(self.src_shift)
        free(self.dst_shift)
        free(self.bmask)
        free(self.pmask)

    cdef inline uint64_t permute(self, int t, uint64_t fp) noexcept nogil:
        cdef uint64_t r = 0
        cdef int j, base = t * self.nblocks
        for j in range(self.nblocks):
            r |= ((fp >> self.src_shift[base + j]) & self.bmask[base + j]) << self.dst_shift[base + j]
        return r

    def key(self, int t, uint64_t fp):
        """The permuted key of `fp` in table `t`."""
        if not 0 <= t < self.ntables:
            raise IndexError(t)
        return self.permute(t, fp)

    def keys(self, int t, const uint64_t[::1] fps):
        """Permuted keys of an array of fingerprints in table `t`, as a new uint64 array."""
        cdef Py_ssize_t i, n = fps.shape[0]
        out = np.empty(n, dtype=np.uint64)
        cdef uint64_t[::1] o = out
        if not 0 <= t < self.ntables:
            raise IndexError(t)
        with nogil:
            for i in range(n):
                o[i] = self.permute(t, fps[i])
        return out

    def prefix_mask(self, int t):
        if not 0 <= t < self.ntables:
            raise IndexError(t)
        return self.pmask[t]


# ---------------------------------------------------------------- runs of blocks
cdef inline int _width(uint64_t span) noexcept nogil:
    """Bytes needed to store offsets up to `span`."""
    return 0 if span == 0 else (71 - si_clz64(span)) >> 3


cdef inline uint64_t _mask(int w) noexcept nogil:
    return <uint64_t>-1 if w >= 8 else ((<uint64_t>1 << (8 * w)) - 1)


cdef int _block_widths(const uint64_t *keys, const uint64_t *seqs, size_t c,
                       uint64_t *smin) noexcept nogil:
    """kw + sw of a v2 block holding these entries (keys sorted); sets the least seq."""
    cdef uint64_t lo = seqs[0], hi = seqs[0]
    cdef size_t i
    for i in range(1, c):
        if seqs[i] < lo:
            lo = seqs[i]
        elif seqs[i] > hi:
            hi = seqs[i]
    smin[0] = lo
    return _width(keys[c - 1] - keys[0]) + _width(hi - lo)


cdef size_t _block_count(const uint64_t *keys, const uint64_t *seqs, size_t rem) noexcept nogil:
    """How many of the next `rem` entries fill one v2 block: the most whose widths fit."""
    cdef size_t cap = BLOCK_BYTES - V2_HEADER - V2_PAD
    cdef size_t c = rem if rem < cap // 16 else cap // 16        # fits at any width
    cdef size_t nc
    cdef uint64_t smin
    cdef int w, tries
    for tries in range(6):
        w = _block_widths(keys, seqs, c, &smin)
        nc = rem if w == 0 else cap // <size_t>w
        if nc > rem:
            nc = rem
        if nc > V2_MAX_ENTRIES:
            nc = V2_MAX_ENTRIES
        if nc <= c:
            break
        w = _block_widths(keys, seqs, nc, &smin)
        if nc * <size_t>w > cap:
            break
        c = nc
    return c


def write_run(Txn txn, str db, uint64_t run_id, const uint64_t[::1] keys,
              const uint64_t[::1] seqs):
    """Append sorted (key, seq) entries as run `run_id` in v2 blocks; returns the block count.

    Keys must be sorted and the run id larger than any run already stored, so every block
    goes in with MDB_APPEND (no page splits, full pages).
    """
    cdef Py_ssize_t n = keys.shape[0], i, c, off = 0
    cdef uint32_t blockno = 0
    cdef uint8_t kbuf[BLOCK_KEY]
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
    with nogil:
        while off < n:
            c = _block_count(&keys[off], &seqs[off], n - off)
            kbase = keys[off]
            kw = _width(keys[off + c - 1] - kbase)
            sw = _block_widths(&keys[off], &seqs[off], c, &sbase) - kw
            si_store_be64(kbuf, run_id)
            si_store_be64(kbuf + 8, keys[off + c - 1])
            si_store_be32(kbuf + 16, blockno)
            k.mv_size = BLOCK_KEY
            k.mv_data = kbuf
            v.mv_size = V2_HEADER + c * (kw + sw) + V2_PAD
            v.mv_data = NULL
            rc = mdb_put(txn.txn, dbi, &k, &v, MDB_APPEND | MDB_RESERVE)
            if rc:
                break
            p = <uint8_t *>v.mv_data
            memset(p, 0, v.mv_size)
            si_store32(p, V2_MAGIC)
            si_store32(p + 4, <uint32_t>c)
            p[12] = <uint8_t>kw
            p[13] = <uint8_t>sw
            si_store64(p + 16, kbase)
            si_store64(p + 24, sbase)
            ko = p + V2_HEADER
            so = ko + c * kw
            for i in range(c):
                si_store64(tmp, keys[off + i] - kbase)
                memcpy(ko + i * kw, tmp, kw)
                si_store64(tmp, seqs[off + i] - sbase)
                memcpy(so + i * sw, tmp, sw)
            si_store32(p + 8, <uint32_t>crc32(0, p + 12, <unsigned int>(v.mv_size - 12 - V2_PAD)))
            off += c
            blockno += 1
    if rc == MDB_KEYEXIST:
        raise CorruptError(f"{txn.env.path}: run {run_id} is not newer than the runs stored")
    if rc:
        raise _error(rc, f"{txn.env.path}: writing run {run_id} failed")
    return blockno


cdef struct Block:
    const uint8_t *keys      # kw-byte key offsets
    const uint8_t *seqs      # sw-byte seq offsets
    const uint8_t *checked   # what the crc covers
    size_t checked_size
    size_t c
    uint64_t kbase, kmask, sbase, smask
    size_t kw, sw
    uint32_t crc


cdef inline uint64_t _key_at(const Block *b, size_t i) noexcept nogil:
    return b.kbase + (si_load64(b.keys + i * b.kw) & b.kmask)


cdef inline uint64_t _seq_at(const Block *b, size_t i) noexcept nogil:
    return b.sbase + (si_load64(b.seqs + i * b.sw) & b.smask)


cdef int _open_block(MDB_val *k, MDB_val *v, Block *b) noexcept nogil:
    """Decode a block's header (v1 or v2) after checking it against the key and value sizes;
    0, or an error code for damage."""
    cdef const uint8_t *p = <const uint8_t *>v.mv_data
    cdef uint32_t magic
    if k.mv_size != BLOCK_KEY:
        return SI_CORRUPT_KEY
    if v.mv_size < BLOCK_HEADER + 16:
        return SI_CORRUPT_BLOCK
    magic = si_load32(p)
    b.c = si_load32(p + 4)
    b.crc = si_load32(p + 8)
    if magic == V2_MAGIC:
        if v.mv_size < V2_HEADER + V2_PAD or b.c == 0 or b.c > V2_MAX_ENTRIES:
            return SI_CORRUPT_BLOCK
        b.kw = p[12]
        b.sw = p[13]
        if b.kw > 8 or b.sw > 8 or (b.kw + b.sw == 0 and b.c > 1) or \
                V2_HEADER + b.c * (b.kw + b.sw) + V2_PAD != v.mv_size:
            return SI_CORRUPT_BLOCK
        b.kbase = si_load64(p + 16)
        b.sbase = si_load64(p + 24)
        b.keys = p + V2_HEADER
        b.checked = p + 12
        b.checked_size = v.mv_size - 12 - V2_PAD
    elif magic == BLOCK_MAGIC:
        if b.c == 0 or b.c > C_BLOCK_ENTRIES or BLOCK_HEADER + 16 * b.c != v.mv_size:
            return SI_CORRUPT_BLOCK
        b.kw = b.sw = 8
        b.kbase = b.sbase = 0
        b.keys = b.checked = p + BLOCK_HEADER
        b.checked_size = 16 * b.c
    else:
        return SI_CORRUPT_BLOCK
    b.kmask = _mask(<int>b.kw)
    b.smask = _mask(<int>b.sw)
    b.seqs = b.keys + b.c * b.kw
    return 0


def read_run(Txn txn, str db, uint64_t run_id, size_t count, bint check=False):
    """All (keys, seqs) of run `run_id` as uint64 arrays, checking structure (and crc if asked).

    `count` is the entry count the shard state records for the run; a mismatch is damage.
    """
    cdef MDB_cursor *cur
    cdef MDB_val k, v
    cdef uint8_t kbuf[BLOCK_KEY]
    cdef int rc
    cdef size_t got = 0, i
    cdef uint32_t blockno = 0
    cdef uint64_t prev = 0, key
    cdef Block b
    cdef str reason = None
    txn.check()
    keys = np.empty(count, dtype=np.uint64)
    seqs = np.empty(count, dtype=np.uint64)
    cdef uint64_t[::1] ko = keys
    cdef uint64_t[::1] so = seqs
    rc = mdb_cursor_open(txn.txn, txn.env.dbi(db), &cur)
    if rc:
        raise _error(rc, f"{txn.env.path}: cursor failed")
    memset(kbuf, 0, BLOCK_KEY)
    si_store_be64(kbuf, run_id)
    k.mv_size = BLOCK_KEY
    k.mv_data = kbuf
    try:
        rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE)
        while rc == 0:
            if k.mv_size != BLOCK_KEY:
                reason = "a block key has the wrong size"
                break
            if si_load_be64(k.mv_data) != run_id:
                break
            if _open_block(&k, &v, &b):
                reason = f"block {blockno} has a bad header or size"
                break
            if si_load_be32(<uint8_t *>k.mv_data + 16) != blockno:
                reason = f"block {blockno} is missing"
                break
            if check and b.crc != <uint32_t>crc32(0, b.checked, <unsigned int>b.checked_size):
                reason = f"block {blockno} fails its checksum"
                break
            if got + b.c > count:
                reason = f"the run holds more than the {count} entries recorded"
                break
            for i in range(b.c):
                key = _key_at(&b, i)
                if key < prev:
                    reason = f"block {blockno} is out of order"
                    break
                prev = key
                ko[got + i] = key
                so[got + i] = _seq_at(&b, i)
            if reason is not None:
                break
            if si_load_be64(<uint8_t *>k.mv_data + 8) != prev:
                reason = f"block {blockno}'s key does not match its last entry"
                break
            got += b.c
            blockno += 1
            rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)
    finally:
        mdb_cursor_close(cur)
    if rc and rc != MDB_NOTFOUND:
        raise _error(rc, f"{txn.env.path}: reading run {run_id} failed")
    if reason is None and got != count:
        reason = f"the run holds {got} entries, {count} recorded"
    if reason is not None:
        raise CorruptError(f"{txn.env.path}: run {run_id}: {reason}")
    return keys, seqs


def delete_run(Txn txn, str db, uint64_t run_id):
    """Delete every block of run `run_id`; returns how many were deleted."""
    cdef MDB_cursor *cur
    cdef MDB_val k, v
    cdef uint8_t kbuf[BLOCK_KEY]
    cdef int rc
    cdef size_t n = 0
    txn.check()
    rc = mdb_cursor_open(txn.txn, txn.env.dbi(db), &cur)
    if rc:
        raise _error(rc, f"{txn.env.path}: cursor failed")
    memset(kbuf, 0, BLOCK_KEY)
    si_store_be64(kbuf, run_id)
    k.mv_size = BLOCK_KEY
    k.mv_data = kbuf
    with nogil:
        # Re-seek after each delete: the first remaining block of the run, or the next run.
        while True:
            k.mv_size = BLOCK_KEY
            k.mv_data = kbuf
            rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE)
            if rc or k.mv_size < 8 or si_load_be64(k.mv_data) != run_id:
                break
            rc = mdb_cursor_del(cur, 0)
            if rc:
                break
            n += 1
        mdb_cursor_close(cur)
    if rc and rc != MDB_NOTFOUND:
        raise _error(rc, f"{txn.env.path}: deleting run {run_id} failed")
    return n


# ---------------------------------------------------------------- records
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


def records_put(Txn txn, str ids_db, str seqs_db, list idkeys not None,
                const uint64_t[::1] fps, list metas not None, uint64_t next_seq):
    """Store records under fresh seqs, replacing an id's earlier record.

    Returns (next_seq, replaced). `metas[i]` is the msgpack encoding of the meta value.
    Records are appended in seq order; ids are then written in key order, which LMDB
    does with far fewer page visits than in input order, and simply appended when every
    key is new and above the stored ones (ascending int ids, a fresh index).
    """
    cdef Py_ssize_t i, n = len(idkeys)
    cdef MDB_dbi ids = txn.env.dbi(ids_db), sq = txn.env.dbi(seqs_db)
    cdef MDB_val k, v, sk
    cdef uint8_t seqbuf[8]
    cdef uint8_t oldbuf[8]
    cdef bytes idk, mb
    cdef size_t idlen, mlen, j
    cdef uint8_t *p
    cdef int rc
    cdef size_t replaced = 0
    cdef IdRef *refs = NULL
    cdef MDB_cursor *cur = NULL
    cdef bint append
    txn.check()
    if fps.shape[0] != n or len(metas) != n:
        raise ValueError("ids, fingerprints and metas differ in length")
    for i in range(n):
        if not isinstance(idkeys[i], bytes) or not isinstance(metas[i], bytes):
            raise TypeError("id keys and metas must be bytes")
    if n == 0:
        return next_seq, 0
    refs = <IdRef *>malloc(n * sizeof(IdRef))
    if refs == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            idk = idkeys[i]
            mb = metas[i]
            idlen = PyBytes_GET_SIZE(idk)
            mlen = PyBytes_GET_SIZE(mb)
            refs[i].p = PyBytes_AS_STRING(idk)
            refs[i].n = idlen
            refs[i].i = i
            si_store_be64(seqbuf, next_seq + i)
            sk.mv_size = 8
            sk.mv_data = seqbuf
            v.mv_size = RECORD_HEADER + idlen + mlen
            v.mv_data = NULL
            rc = mdb_put(txn.txn, sq, &sk, &v, MDB_APPEND | MDB_RESERVE)
            if rc == MDB_KEYEXIST:
                raise CorruptError(f"{txn.env.path}: record sequence {next_seq + i} already used")
            if rc:
                raise _error(rc, f"{txn.env.path}: writing a record failed")
            p = <uint8_t *>v.mv_data
            si_store64(p, fps[i])
            p[8] = <uint8_t>(idlen & 0xFF)
            p[9] = <uint8_t>(idlen >> 8)
            memcpy(p + RECORD_HEADER, refs[i].p, idlen)
            memcpy(p + RECORD_HEADER + idlen, PyBytes_AS_STRING(mb), mlen)
        qsort(refs, n, sizeof(IdRef), _cmp_idref)
        # every key new and above the stored ones: append without looking anything up
        append = True
        for j in range(1, n):
            if refs[j - 1].n == refs[j].n and memcmp(refs[j - 1].p, refs[j].p, refs[j].n) == 0:
                append = False
                break
        if append:
            rc = mdb_cursor_open(txn.txn, ids, &cur)
            if rc:
                raise _error(rc, f"{txn.env.path}: reading the ids failed")
            rc = mdb_cursor_get(cur, &k, &v, MDB_LAST)
            mdb_cursor_close(cur)
            if rc == 0:
                append = _cmp_last(&k, &refs[0]) < 0
            elif rc != MDB_NOTFOUND:
                raise _error(rc, f"{txn.env.path}: reading the ids failed")
        for j in range(n):
            k.mv_size = refs[j].n
            k.mv_data = <void *>refs[j].p
            if not append:
                rc = mdb_get(txn.txn, ids, &k, &v)
                if rc == 0:
                    if v.mv_size != 8:
                        raise CorruptError(f"{txn.env.path}: id entry has a bad size")
                    memcpy(oldbuf, v.mv_data, 8)
                    sk.mv_size = 8
                    sk.mv_data = oldbuf
                    rc = mdb_del(txn.txn, sq, &sk, NULL)
                    if rc and rc != MDB_NOTFOUND:
                        raise _error(rc, f"{txn.env.path}: replacing a record failed")
                    replaced += 1
                elif rc != MDB_NOTFOUND:
                    raise _error(rc, f"{txn.env.path}: reading an id failed")
            si_store_be64(seqbuf, next_seq + refs[j].i)
            sk.mv_size = 8
            sk.mv_data = seqbuf
            rc = mdb_put(txn.txn, ids, &k, &sk, MDB_APPEND if append else 0)
            if rc:
                raise _error(rc, f"{txn.env.path}: writing an id failed")
    finally:
        free(refs)
    return next_seq + n, replaced


cdef int _cmp_last(MDB_val *last, IdRef *first) noexcept nogil:
    """Order of the stored last id key against the smallest new one (LMDB's key order).

    Equal keys compare equal: the input-order tie break of _cmp_idref must not make the
    stored key look smaller, or an id already stored would be appended a second time."""
    cdef IdRef x
    x.p = <const char *>last.mv_data
    x.n = last.mv_size
    x.i = first.i
    return _cmp_idref(&x, first)


cdef tuple _record_id_meta(const uint8_t *p, size_t n):
    """(id, meta bytes or None) of a stored record value, the id decoded to its type.

    A record's meta of msgpack nil comes back as None, so most matches need no decoding.
    """
    cdef size_t idlen
    cdef const uint8_t *key
    cdef object id_, meta
    if n < RECORD_HEADER:
        raise CorruptError("a stored record is shorter than its header")
    idlen = p[8] | (<size_t>p[9] << 8)
    if idlen < 1 or RECORD_HEADER + idlen > n:
        raise CorruptError("a stored record's id runs past its end")
    key = p + RECORD_HEADER
    if key[0] == b's':
        try:
            id_ = PyUnicode_DecodeUTF8(<const char *>key + 1, idlen - 1, "strict")
        except UnicodeDecodeError:
            raise CorruptError("a stored text id is not valid UTF-8") from None
    elif key[0] == b'b':
        id_ = PyBytes_FromStringAndSize(<const char *>key + 1, idlen - 1)
    elif key[0] == b'i' and idlen == 9:
        id_ = si_load_be64(key + 1)
    else:
        raise CorruptError(f"a stored id has an unknown type tag {key[0]!r}")
    if n - RECORD_HEADER - idlen == 1 and p[RECORD_HEADER + idlen] == 0xC0:
        meta = None
    else:
        meta = PyBytes_FromStringAndSize(<const char *>p + RECORD_HEADER + idlen,
                                         n - RECORD_HEADER - idlen)
    return id_, meta


def split_record(bytes value not None):
    """(fingerprint, id key, meta bytes) of a stored record value, checking its sizes."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(value)
    cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(value)
    cdef size_t idlen
    if n < RECORD_HEADER:
        raise CorruptError("a stored record is shorter than its header")
    idlen = p[8] | (<size_t>p[9] << 8)
    if RECORD_HEADER + idlen > <size_t>n:
        raise CorruptError("a stored record's id runs past its end")
    return si_load64(p), value[RECORD_HEADER:RECORD_HEADER + idlen], value[RECORD_HEADER + idlen:]


def read_tail(Txn txn, str seqs_db, uint64_t start, size_t limit=0):
    """(seqs, fps) of the records with seq >= start, in seq order, at most `limit` (0: all)."""
    cdef MDB_cursor *cur
    cdef MDB_val k, v
    cdef uint8_t kbuf[8]
    cdef int rc
    cdef size_t n = 0, cap = 1024
    cdef uint64_t *s = NULL
    cdef uint64_t *f = NULL
    cdef uint64_t *tmp
    txn.check()
    rc = mdb_cursor_open(txn.txn, txn.env.dbi(seqs_db), &cur)
    if rc:
        raise _error(rc, f"{txn.env.path}: cursor failed")
    si_store_be64(kbuf, start)
    k.mv_size = 8
    k.mv_data = kbuf
    s = <uint64_t *>malloc(cap * 8)
    f = <uint64_t *>malloc(cap * 8)
    try:
        if s == NULL or f == NULL:
            raise MemoryError()
        with nogil:
            rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE)
            while rc == 0:
                if k.mv_size != 8 or v.mv_size < RECORD_HEADER:
                    rc = SI_CORRUPT_RECORD
                    break
                if n == cap:
                    cap *= 2
                    tmp = <uint64_t *>realloc(s, cap * 8)
                    if tmp == NULL:
                        rc = SI_NOMEM
                        break
                    s = tmp
                    tmp = <uint64_t *>realloc(f, cap * 8)
                    if tmp == NULL:
                        rc = SI_NOMEM
                        break
                    f = tmp
                s[n] = si_load_be64(k.mv_data)
                f[n] = si_load64(v.mv_data)
                n += 1
                if limit and n >= limit:
                    break
                rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)
        if rc and rc != MDB_NOTFOUND:
            raise _error(rc, f"{txn.env.path}: reading records failed")
        seqs = np.empty(n, dtype=np.uint64)
        fpa = np.empty(n, dtype=np.uint64)
        if n:
            memcpy(<void *>np_ptr(seqs), s, n * 8)
            memcpy(<void *>np_ptr(fpa), f, n * 8)
        return seqs, fpa
    finally:
        mdb_cursor_close(cur)
        free(s)
        free(f)


cdef uint64_t *np_ptr(arr) except NULL:
    cdef uint64_t[::1] m = arr
    if m.shape[0] == 0:
        raise ValueError("empty array")
    return &m[0]


# ---------------------------------------------------------------- Hamming kernels
def hamming(uint64_t a, uint64_t b):
    """Number of differing bits of two 64-bit fingerprints."""
    return si_popcount(a ^ b)


cdef size_t _within(const uint64_t *fps, size_t n, uint64_t q, int k, uint32_t *pos,
                    uint8_t *dist) noexcept nogil:
    """Write the position and distance of every fps[i] within k bits of q; returns how many."""
    cdef size_t i, m = 0
    cdef int d
    for i in range(n):
        d = si_popcount(fps[i] ^ q)
        if d <= k:
            pos[m] = <uint32_t>i
            dist[m] = <uint8_t>d
            m += 1
    return m


def within(const uint64_t[::1] fps, Py_ssize_t n, uint64_t q, int k):
    """[(position, distance), ...] of the first `n` fingerprints of `fps` within k bits of q,
    in position order: the popcount filter of a write buffer, one Python object per hit."""
    cdef uint32_t *pos
    cdef uint8_t *dist
    cdef size_t m, i
    if n < 0 or n > fps.shape[0]:
        raise ValueError(f"within: n ({n}) must be between 0 and the array's length "
                         f"({fps.shape[0]})")
    if n > 0xFFFFFFFF:
        raise ValueError(f"within: n ({n}) must fit 32 bits")
    if n == 0:
        return []
    pos = <uint32_t *>malloc(n * sizeof(uint32_t))
    dist = <uint8_t *>malloc(n)
    if pos == NULL or dist == NULL:
        free(pos)
        free(dist)
        raise MemoryError()
    try:
        with nogil:
            m = _within(&fps[0], <size_t>n, q, k, pos, dist)
        return [(pos[i], dist[i]) for i in range(m)]
    finally:
        free(pos)
        free(dist)


cdef struct PairBuf:
    uint64_t *a
    uint64_t *b
    uint8_t *d
    size_t n
    size_t cap


cdef int _pair_push(PairBuf *p, uint64_t a, uint64_t b, uint8_t d) noexcept nogil:
    cdef size_t cap
    cdef void *t
    if p.n == p.cap:
        cap = p.cap * 2 if p.cap else 4096
        t = realloc(p.a, cap * 8)
        if t == NULL:
            return SI_NOMEM
        p.a = <uint64_t *>t
        t = realloc(p.b, cap * 8)
        if t == NULL:
            return SI_NOMEM
        p.b = <uint64_t *>t
        t = realloc(p.d, cap)
        if t == NULL:
            return SI_NOMEM
        p.d = <uint8_t *>t
        p.cap = cap
    p.a[p.n] = a
    p.b[p.n] = b
    p.d[p.n] = d
    p.n += 1
    return 0


# A prefix group larger than this is joined through sub-blocks of its remaining bits.
DEF SUB_MIN = 32
DEF SUB_MAX_BITS = 16        # buckets per sub-block: at most 2^16


cdef inline int _pair_check(PairBuf *p, uint64_t x, uint64_t a, uint64_t b,
                            const uint64_t *earlier, Py_ssize_t ne, int k) noexcept nogil:
    """Push the pair (a, b) whose keys differ in `x` if that is within k bits and the keys
    agree on no earlier table's prefix."""
    cdef int d = si_popcount(x)
    cdef Py_ssize_t e
    if d > k:
        return 0
    for e in range(ne):
        if (x & earlier[e]) == 0:
            return 0
    if a > b:
        a, b = b, a
    return _pair_push(p, a, b, <uint8_t>d)


cdef int _group_sub(PairBuf *p, const uint64_t *keys, const uint64_t *ids, Py_ssize_t g0,
                    Py_ssize_t g1, int rest, const uint64_t *earlier, Py_ssize_t ne, int k,
                    Py_ssize_t *counts, Py_ssize_t *perm) noexcept nogil:
    """The pairs of one prefix group through k+1 sub-blocks of its `rest` low bits.

    Two keys within k bits of each other differ in at most k of those bits, so they agree
    on at least one whole sub-block; a pair is checked in the bucket of each sub-block it
    agrees on and reported in the first, so each comes out once. Buckets hold the top bits
    of a sub-block (about as many buckets as entries) and are counting-sorted into `perm`.
    """
    cdef Py_ssize_t g = g1 - g0, i, j, r0, r1, nb, c
    cdef int s, u, t, lo = 0, bb, gbits = 64 - si_clz64(<uint64_t>g), rc
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
                    rc = _pair_check(p, x, ids[perm[i]], ids[perm[j]], earlier, ne, k)
                    if rc:
                        return rc
            r0 = r1
    return 0


def pairs_sorted(const uint64_t[::1] keys, const uint64_t[::1] ids, uint64_t pmask,
                 const uint64_t[::1] earlier, int k):
    """Every pair within `k` bits among entries sharing the prefix `pmask`; the keys come
    grouped by that prefix (sorted by it, in any order within a group).

    A pair whose keys also agree on one of the `earlier` masks (the prefixes of tables
    already joined, in this table's bit order) was reported there and is skipped, so each
    pair comes out once over all tables. Returns (a, b, d) arrays with a < b, in no
    particular order. Groups larger than SUB_MIN are joined through sub-blocks (_group_sub)
    instead of comparing all their pairs.
    """
    cdef Py_ssize_t n = keys.shape[0], g0 = 0, g1, i, j, ne = earlier.shape[0], cap = 0
    cdef uint64_t rest_mask = ~pmask
    cdef int rc = 0, rest = si_popcount(rest_mask)
    cdef const uint64_t *kp = &keys[0] if n else NULL
    cdef const uint64_t *ip = &ids[0] if n else NULL
    cdef const uint64_t *ep = &earlier[0] if ne else NULL
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
                    rc = SI_NOMEM
            while g0 < n and rc == 0:
                g1 = g0 + 1
                while g1 < n and (kp[g1] & pmask) == (kp[g0] & pmask):
                    g1 += 1
                if sub and g1 - g0 > SUB_MIN:
                    if g1 - g0 > cap:
                        tmp = realloc(perm, (g1 - g0) * sizeof(Py_ssize_t))
                        if tmp == NULL:
                            rc = SI_NOMEM
                            break
                        perm = <Py_ssize_t *>tmp
                        cap = g1 - g0
                    rc = _group_sub(&p, kp, ip, g0, g1, rest, ep, ne, k, counts, perm)
                else:
                    for i in range(g0, g1):
                        for j in range(i + 1, g1):
                            rc = _pair_check(&p, kp[i] ^ kp[j], ip[i], ip[j], ep, ne, k)
                            if rc:
                                break
                        if rc:
                            break
                g0 = g1
        if rc:
            raise MemoryError("pair buffer")
        return _pair_arrays(&p)
    finally:
        free(counts)
        free(perm)
        free(p.a)
        free(p.b)
        free(p.d)


cdef tuple _pair_arrays(PairBuf *p):
    """The (a, b, d) columns of a pair buffer as numpy arrays (u64, u64, u8)."""
    A = np.empty(p.n, dtype=np.uint64)
    B = np.empty(p.n, dtype=np.uint64)
    D = np.empty(p.n, dtype=np.uint8)
    if p.n:
        memcpy(<void *>np_ptr(A), p.a, p.n * 8)
        memcpy(<void *>np_ptr(B), p.b, p.n * 8)
        _copy_u8(D, p.d, p.n)
    return A, B, D


cdef void _copy_u8(arr, const uint8_t *src, size_t n):
    cdef uint8_t[::1] m = arr
    memcpy(&m[0], src, n)


# ---------------------------------------------------------------- batch queries
cdef int _hit_push(HitBuf *b, uint64_t seq, uint32_t dist) noexcept nogil:
    cdef size_t cap
    cdef void *t
    if b.n == b.cap:
        cap = b.cap * 2 if b.cap else 256
        t = realloc(b.h, cap * sizeof(Hit))
        if t == NULL:
            return SI_NOMEM
        b.h = <Hit *>t
        b.cap = cap
    b.h[b.n].seq = seq
    b.h[b.n].dist = dist
    b.h[b.n].val = NULL
    b.h[b.n].vlen = 0
    b.h[b.n].fp = 0
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


cdef int _scan_run(MDB_cursor *cur, uint64_t run_id, uint64_t lo, uint64_t hi,
                   uint64_t pk, int k, HitBuf *hits) noexcept nogil:
    """Push (seq, distance) of every entry of run `run_id` with key in [lo, hi] within k of pk."""
    cdef uint8_t kbuf[BLOCK_KEY]
    cdef MDB_val key, val
    cdef int rc
    cdef bint first = True
    cdef size_t a, b, mid, i
    cdef Block blk
    cdef uint64_t x
    cdef int d
    si_store_be64(kbuf, run_id)
    si_store_be64(kbuf + 8, lo)
    si_store_be32(kbuf + 16, 0)
    key.mv_size = BLOCK_KEY
    key.mv_data = kbuf
    rc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE)
    while rc == 0:
        if key.mv_size != BLOCK_KEY:
            return SI_CORRUPT_KEY
        if si_load_be64(key.mv_data) != run_id:
            return 0
        rc = _open_block(&key, &val, &blk)
        if rc:
            return rc
        if first:
            # binary search: its first probes land on the same keys for every query, so
            # they stay in cache (interpolation probes were measured 20% slower here)
            a = 0
            b = blk.c
            while a < b:
                mid = (a + b) >> 1
                if _key_at(&blk, mid) < lo:
                    a = mid + 1
                else:
                    b = mid
            i = a
            first = False
        else:
            i = 0
        while i < blk.c:
            x = _key_at(&blk, i)
            if x > hi:
                return 0
            d = si_popcount(x ^ pk)
            if d <= k:
                rc = _hit_push(hits, _seq_at(&blk, i), d)
                if rc:
                    return rc
            i += 1
        rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)
    if rc == MDB_NOTFOUND:
        return 0
    return rc


cdef struct Tail:
    uint64_t *seq
    uint64_t *fp
    size_t n
    size_t cap


cdef int _load_tail(MDB_cursor *cur, uint64_t start, Tail *tail) noexcept nogil:
    """Load (seq, fp) of every record with seq >= start: those not yet in every table."""
    cdef MDB_val key, val
    cdef uint8_t kbuf[8]
    cdef void *tmp
    cdef int rc
    si_store_be64(kbuf, start)
    key.mv_size = 8
    key.mv_data = kbuf
    rc = mdb_cursor_get(cur, &key, &val, MDB_SET_RANGE)
    while rc == 0:
        if key.mv_size != 8 or val.mv_size < RECORD_HEADER:
            return SI_CORRUPT_RECORD
        if tail.n == tail.cap:
            tail.cap = tail.cap * 2 if tail.cap else 1024
            tmp = realloc(tail.seq, tail.cap * 8)
            if tmp == NULL:
                return SI_NOMEM
            tail.seq = <uint64_t *>tmp
            tmp = realloc(tail.fp, tail.cap * 8)
            if tmp == NULL:
                return SI_NOMEM
            tail.fp = <uint64_t *>tmp
        tail.seq[tail.n] = si_load_be64(key.mv_data)
        tail.fp[tail.n] = si_load64(val.mv_data)
        tail.n += 1
        rc = mdb_cursor_get(cur, &key, &val, MDB_NEXT)
    return 0 if rc == MDB_NOTFOUND else rc


cdef int _tail_hits(Tail *tail, uint64_t applied, uint64_t q, int k, HitBuf *hits) noexcept nogil:
    """Check the tail records above `applied` (missing from some table) against q directly."""
    cdef size_t j
    cdef int d, rc
    for j in range(tail.n):
        if tail.seq[j] > applied:
            d = si_popcount(tail.fp[j] ^ q)
            if d <= k:
                rc = _hit_push(hits, tail.seq[j], d)
                if rc:
                    return rc
    return 0


# The Python layer's result type and meta decoder (set_match_type): with them the core builds
# the final Match objects itself, so a query makes no intermediate Python object per match.
cdef object _MATCH = None
cdef object _UNPACK = None


def set_match_type(cls, unpack):
    """Register the namedtuple (id, fingerprint, distance, meta) the queries return, and the
    function that decodes a stored meta value."""
    global _MATCH, _UNPACK
    if not (isinstance(cls, type) and issubclass(cls, tuple)):
        raise TypeError("set_match_type needs a tuple subclass")
    _MATCH, _UNPACK = cls, unpack


cdef list _hit_lists(HitBuf *hits, size_t *qstart, Py_ssize_t n, bint matches=False):
    """Per query, [(distance, fingerprint, seq, id, meta bytes or None), ...] of resolved
    hits; with `matches`, [Match(id, fingerprint, distance, meta), ...] instead."""
    cdef Py_ssize_t qi
    cdef size_t r
    cdef Hit *hh
    cdef object cls = _MATCH
    if matches and cls is None:
        raise RuntimeError("no match type registered (set_match_type)")
    out = []
    for qi in range(n):
        lst = []
        for r in range(qstart[qi], qstart[qi + 1]):
            hh = &hits.h[r]
            id_, meta = _record_id_meta(hh.val, hh.vlen)
            if matches:
                if meta is not None:
                    meta = _UNPACK(meta, "meta value")
                lst.append(tuple.__new__(cls, (id_, hh.fp, hh.dist, meta)))
            else:
                lst.append((hh.dist, hh.fp, hh.seq, id_, meta))
        out.append(lst)
    return out


cdef class ReadContext:
    """Read transactions on the records and on every shard, renewed per call.

    One context serves one caller at a time; the index keeps a pool of them so threads can
    query at once. Queries run without the GIL and see one snapshot per environment; every
    candidate is checked against the records snapshot, so the answer is exact for it.
    """

    def __cinit__(self, Env records, list shards):
        cdef int s
        self.views = NULL
        self.shard_envs = NULL
        self.blocks_dbi = NULL
        self.state_dbi = NULL
        self.rec_txn = NULL
        self.rec_cur = NULL
        self.nshards = len(shards)
        self.records = records
        self.envs = list(shards)
        records.check()
        self.rec_env = records.env
        # (at least one slot: a records-only context, used by resolve(), has no shards)
        self.shard_envs = <MDB_env **>calloc(self.nshards or 1, sizeof(MDB_env *))
        self.views = <ShardView *>calloc(self.nshards or 1, sizeof(ShardView))
        self.blocks_dbi = <MDB_dbi *>calloc(self.nshards or 1, sizeof(MDB_dbi))
        self.state_dbi = <MDB_dbi *>calloc(self.nshards or 1, sizeof(MDB_dbi))
        if self.shard_envs == NULL or self.views == NULL or self.blocks_dbi == NULL or self.state_dbi == NULL:
            raise MemoryError()
        self.seqs_dbi = records.dbi("seqs")
        self.psize = _page_size(records.env)
        for s in range(self.nshards):
            env = <Env>self.envs[s]
            env.check()
            self.shard_envs[s] = env.env
            self.blocks_dbi[s] = env.dbi("blocks")
            self.state_dbi[s] = env.dbi("state")
            env.deps.add(self)
        records.deps.add(self)

    def __dealloc__(self):
        self._invalidate()
        free(self.views)
        free(self.shard_envs)
        free(self.blocks_dbi)
        free(self.state_dbi)

    cdef void _invalidate(self) noexcept:
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
                free(self.views[s].run_ids)
                free(self.views[s].table_start)
                self.views[s].run_ids = NULL
                self.views[s].table_start = NULL
                self.views[s].state = 0
                self.views[s].parsed = 0
        if self.rec_cur != NULL:
            if mine:
                mdb_cursor_close(self.rec_cur)
            self.rec_cur = NULL
        if self.rec_txn != NULL:
            if mine:
                mdb_txn_abort(self.rec_txn)
            self.rec_txn = NULL
        self.rec_state = 0

    def close(self):
        self._invalidate()
        self.records.deps.discard(self)
        for env in self.envs:
            (<Env>env).deps.discard(self)

    cdef int _begin_records(self) noexcept nogil:
        cdef int rc = 0
        if self.rec_state == 0:
            rc = mdb_txn_begin(self.rec_env, NULL, MDB_RDONLY, &self.rec_txn)
            if rc:
                self.rec_txn = NULL
                return rc
        elif self.rec_state == 1:
            rc = mdb_txn_renew(self.rec_txn)
            if rc:
                return rc
        self.rec_state = 2
        if self.rec_cur == NULL:
            rc = mdb_cursor_open(self.rec_txn, self.seqs_dbi, &self.rec_cur)
            if rc:
                self.rec_cur = NULL
        else:
            rc = mdb_cursor_renew(self.rec_txn, self.rec_cur)
        return rc

    cdef int _activate(self, int s, int ntables) noexcept nogil:
        """Begin (or renew) shard s's read txn and parse its state: applied seq and runs.

        The cursor is kept across calls (renewed with the txn) and the state is parsed again
        only when the snapshot changed: a shard that took no write since costs a renew."""
        cdef ShardView *sv = &self.views[s]
        cdef MDB_val k, v
        cdef int rc, t
        cdef size_t nruns, i
        cdef uint32_t table
        cdef const uint8_t *p
        cdef void *tmp
        if sv.state == 2:
            return 0
        if sv.state == 0:
            rc = mdb_txn_begin(self.shard_envs[s], NULL, MDB_RDONLY, &sv.txn)
            if rc:
                sv.txn = NULL
                return rc
        else:
            rc = mdb_txn_renew(sv.txn)
            if rc:
                return rc
        sv.state = 2
        if sv.cur == NULL:
            rc = mdb_cursor_open(sv.txn, self.blocks_dbi[s], &sv.cur)
            if rc:
                sv.cur = NULL
                return rc
        else:
            rc = mdb_cursor_renew(sv.txn, sv.cur)
            if rc:
                return rc
        if sv.parsed and sv.parsed == mdb_txn_id(sv.txn):
            return 0
        sv.parsed = 0
        k.mv_size = 7
        k.mv_data = <void *>KEY_APPLIED
        rc = mdb_get(sv.txn, self.state_dbi[s], &k, &v)
        if rc == MDB_NOTFOUND:
            sv.applied = 0
        elif rc:
            return rc
        elif v.mv_size != 8:
            return SI_CORRUPT_STATE
        else:
            sv.applied = si_load64(v.mv_data)
        k.mv_size = 4
        k.mv_data = <void *>KEY_RUNS
        rc = mdb_get(sv.txn, self.state_dbi[s], &k, &v)
        if rc == MDB_NOTFOUND:
            v.mv_size = 0
            v.mv_data = NULL
        elif rc:
            return rc
        if v.mv_size % RUN_ENTRY:
            return SI_CORRUPT_STATE
        nruns = v.mv_size // RUN_ENTRY
        if sv.table_start == NULL:
            sv.table_start = <uint32_t *>calloc(ntables + 1, sizeof(uint32_t))
            if sv.table_start == NULL:
                return SI_NOMEM
        if nruns > sv.run_cap or sv.run_ids == NULL:
            tmp = realloc(sv.run_ids, (nruns + 1) * sizeof(uint64_t))
            if tmp == NULL:
                return SI_NOMEM
            sv.run_ids = <uint64_t *>tmp
            sv.run_cap = nruns + 1
        memset(sv.table_start, 0, (ntables + 1) * sizeof(uint32_t))
        p = <const uint8_t *>v.mv_data
        # entries are (run u64, count u64, table u32, reserved u32), sorted by table then run
        for i in range(nruns):
            table = si_load32(p + RUN_ENTRY * i + 16)
            if table >= <uint32_t>ntables or \
                    (i and table < si_load32(p + RUN_ENTRY * (i - 1) + 16)):
                return SI_CORRUPT_STATE
            sv.table_start[table + 1] += 1
            sv.run_ids[i] = si_load64(p + RUN_ENTRY * i)
        for t in range(ntables):
            sv.table_start[t + 1] += sv.table_start[t]
        sv.parsed = mdb_txn_id(sv.txn)
        return 0

    cdef void _release(self) noexcept nogil:
        cdef int s
        for s in range(self.nshards):
            if self.views[s].state == 2:
                mdb_txn_reset(self.views[s].txn)     # its cursor stays, to be renewed
                self.views[s].state = 1
        if self.rec_state == 2:
            mdb_txn_reset(self.rec_txn)
            self.rec_state = 1

    cdef int _finish(self, MDB_txn *rtxn, uint64_t q, HitBuf *hits, size_t start,
                     size_t psize) noexcept nogil:
        """De-duplicate one query's hits by seq, resolve them in the records, sort them.

        `psize`: check values against their pages (0 for a write txn, whose dirty pages are
        not in the map)."""
        cdef size_t n = hits.n - start, i, w = 0
        cdef Hit *h = hits.h + start
        cdef MDB_val key, val
        cdef uint8_t kbuf[8]
        cdef int rc
        cdef uint64_t fp
        if n == 0:
            return 0
        qsort(h, n, sizeof(Hit), _cmp_seq)
        for i in range(n):
            if w and h[w - 1].seq == h[i].seq:
                continue
            si_store_be64(kbuf, h[i].seq)
            key.mv_size = 8
            key.mv_data = kbuf
            rc = mdb_get(rtxn, self.seqs_dbi, &key, &val)
            if rc == MDB_NOTFOUND:
                continue        # removed or replaced since the table entry was written
            if rc:
                return rc
            if val.mv_size < RECORD_HEADER or not _val_in_pages(&val, psize):
                return SI_CORRUPT_RECORD
            fp = si_load64(val.mv_data)
            if <uint32_t>si_popcount(fp ^ q) != h[i].dist:
                self.anomalies += 1     # a table entry disagrees with its record
                continue
            h[w] = h[i]
            h[w].fp = fp
            h[w].val = <const uint8_t *>val.mv_data
            h[w].vlen = val.mv_size
            w += 1
        hits.n = start + w
        qsort(h, w, sizeof(Hit), _cmp_dist_seq)
        return 0

    def applied(self, int ntables):
        """The applied seq of every shard in this context's snapshot."""
        cdef int s, rc
        out = []
        try:
            for s in range(self.nshards):
                rc = self._activate(s, ntables)
                if rc:
                    raise _error(rc, f"{(<Env>self.envs[s]).path}: cannot read the shard state")
                out.append(self.views[s].applied)
        finally:
            self._release()
        return out

    def resolve(self, const uint64_t[::1] queries, const uint64_t[::1] qidx,
                const uint64_t[::1] seqs, const uint8_t[::1] dists,
                const uint64_t[::1] applied, int k, Txn txn=None):
        """query() for candidates found elsewhere (a distributed query's shard scans).

        Candidate i is (query qidx[i], record seq seqs[i], distance dists[i]), qidx ascending;
        applied[q] is the lowest applied seq of the shard snapshots that scanned query q.
        The shard snapshots must be older than this call's records snapshot (or `txn`, a
        records write transaction held since before them). Records above applied[q] are
        checked directly, every candidate against its record, as in query().
        """
        cdef Py_ssize_t n = queries.shape[0], qi, c = 0, nc = qidx.shape[0]
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
                if rc == 0 and n:
                    rc = _load_tail(rc_cur, lowest + 1, &tail)
                c = 0
                qi = 0
                while qi < n and rc == 0:
                    qstart[qi] = hits.n
                    while c < nc and qidx[c] == <uint64_t>qi and rc == 0:
                        if dists[c] <= k:
                            rc = _hit_push(&hits, seqs[c], dists[c])
                        c += 1
                    if rc == 0:
                        rc = _tail_hits(&tail, applied[qi], queries[qi], k, &hits)
                    if rc == 0:
                        rc = self._finish(rtxn, queries[qi], &hits, qstart[qi], vpsize)
                    qi += 1
                qstart[n] = hits.n
            if rc:
                raise _error(rc, f"resolving candidates on {self.records.path}")
            return _hit_lists(&hits, qstart, n)
        finally:
            if rc_cur != NULL and rc_cur != self.rec_cur:
                mdb_cursor_close(rc_cur)
            self._release()
            free(qstart)
            free(hits.h)
            free(tail.seq)
            free(tail.fp)

    def query(self, Plan plan, const uint64_t[::1] queries, int k, Txn txn=None,
              bint matches=False):
        """For each query, [(distance, fingerprint, seq, id, meta bytes or None), ...] sorted by
        (distance, seq): every record of the snapshot within `k` bits, each once. With
        `matches`, the registered Match objects instead (see set_match_type).

        `txn`, when given, is the records transaction to answer from (a writer's, for
        add_unique); otherwise this context's own records snapshot is used.
        """
        cdef Py_ssize_t n = queries.shape[0]
        return self._query(plan, &queries[0] if n else NULL, n, k, txn, matches)

    def query_one(self, Plan plan, uint64_t fingerprint, int k):
        """The Match list of one fingerprint given as an int: no array in or out."""
        return self._query(plan, &fingerprint, 1, k, None, True)[0]

    cdef list _query(self, Plan plan, const uint64_t *queries, Py_ssize_t n, int k, Txn txn,
                     bint matches):
        cdef Py_ssize_t qi
        cdef int T = plan.ntables, t, s, s0, s1, rc = 0, sb = plan.shard_bits
        cdef uint64_t q, pk, lo, hi, last = 0, minA, minAll
        cdef HitBuf hits
        cdef size_t *qstart = NULL
        cdef size_t r
        cdef Tail tail
        cdef bint tail_loaded = False
        cdef MDB_txn *rtxn
        cdef MDB_cursor *rc_cur = NULL
        cdef MDB_val key, val
        cdef ShardView *sv
        cdef str where = self.records.path
        cdef bint own = txn is None
        cdef size_t vpsize = 0 if txn is not None and txn.write else self.psize
        cdef int active
        cdef MDB_txn *given = NULL
        memset(&hits, 0, sizeof(HitBuf))
        memset(&tail, 0, sizeof(Tail))
        if txn is not None:
            txn.check()
            if txn.env is not self.records:
                raise ValueError("txn is not on this index's records")
            given = txn.txn
        self.records.check()
        qstart = <size_t *>malloc((n + 1) * sizeof(size_t))
        if qstart == NULL:
            raise MemoryError()
        try:
            with nogil:
                # Shard snapshots first, the records snapshot after: anything a shard
                # snapshot lacks is then either in the records' unapplied tail or gone
                # from the records too (compaction only drops what was already removed).
                active = 0
                qi = 0
                while qi < n and rc == 0 and active < self.nshards:
                    q = queries[qi]
                    for t in range(T):
                        lo = plan.permute(t, q) & plan.pmask[t]
                        hi = lo | ~plan.pmask[t]
                        s0 = <int>(lo >> (64 - sb)) if sb else 0
                        s1 = <int>(hi >> (64 - sb)) if sb else 0
                        for s in range(s0, s1 + 1):
                            if self.views[s].state != 2:
                                rc = self._activate(s, T)
                                if rc:
                                    break
                                active += 1
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
                            rc = SI_CORRUPT_RECORD
                        else:
                            last = si_load_be64(key.mv_data)
                    elif rc == MDB_NOTFOUND:
                        rc = 0
                qi = 0
                while qi < n and rc == 0:
                    q = queries[qi]
                    qstart[qi] = hits.n
                    minA = 0xFFFFFFFFFFFFFFFF
                    for t in range(T):
                        pk = plan.permute(t, q)
                        lo = pk & plan.pmask[t]
                        hi = lo | ~plan.pmask[t]
                        if sb:
                            s0 = <int>(lo >> (64 - sb))
                            s1 = <int>(hi >> (64 - sb))
                        else:
                            s0 = 0
                            s1 = 0
                        for s in range(s0, s1 + 1):
                            rc = self._activate(s, T)
                            if rc:
                                break
                            sv = &self.views[s]
                            if sv.applied < minA:
                                minA = sv.applied
                            for r in range(sv.table_start[t], sv.table_start[t + 1]):
                                rc = _scan_run(sv.cur, sv.run_ids[r], lo, hi, pk, k, &hits)
                                if rc:
                                    break
                            if rc:
                                break
                        if rc:
                            break
                    if rc:
                        break
                    if last > minA:
                        # Records committed but not yet in every table: check them directly.
                        if not tail_loaded:
                            minAll = minA
                            for s in range(self.nshards):
                                rc = self._activate(s, T)
                                if rc:
                                    break
                                if self.views[s].applied < minAll:
                                    minAll = self.views[s].applied
                            if rc:
                                break
                            rc = _load_tail(rc_cur, minAll + 1, &tail)
                            if rc:
                                break
                            tail_loaded = True
                        rc = _tail_hits(&tail, minA, q, k, &hits)
                        if rc:
                            break
                    rc = self._finish(rtxn, q, &hits, qstart[qi], vpsize)
                    qi += 1
                qstart[n] = hits.n
            if rc:
                raise _error(rc, f"query on {where}")
            return _hit_lists(&hits, qstart, n, matches)
        finally:
            if rc_cur != NULL and rc_cur != self.rec_cur:
                mdb_cursor_close(rc_cur)
            self._release()
            free(qstart)
            free(hits.h)
            free(tail.seq)
            free(tail.fp)


def scan_shard(Txn txn, Plan plan, int shard, const uint64_t[::1] queries, int k,
               const uint64_t[::1] run_ids, const uint32_t[::1] table_start):
    """Candidates of one shard for each query: (qidx, seq, distance) arrays, qidx ascending.

    `txn` reads the shard; its runs of table t are run_ids[table_start[t]:table_start[t+1]]
    (from the shard state of the same snapshot). Only key ranges inside this shard are
    scanned, so a distributed query sends each shard just the queries that reach it.
    """
    cdef Py_ssize_t n = queries.shape[0], qi
    cdef int T = plan.ntables, t, s0, s1, rc = 0, sb = plan.shard_bits
    cdef uint64_t q, pk, lo, hi
    cdef size_t r, i, before
    cdef HitBuf hits
    cdef PairBuf out
    cdef MDB_cursor *cur = NULL
    txn.check()
    if table_start.shape[0] != T + 1 or table_start[T] != <uint32_t>run_ids.shape[0]:
        raise ValueError("scan_shard: table_start does not match the runs")
    cdef MDB_dbi dbi = txn.env.dbi("blocks")
    memset(&hits, 0, sizeof(HitBuf))
    memset(&out, 0, sizeof(PairBuf))
    try:
        with nogil:
            rc = mdb_cursor_open(txn.txn, dbi, &cur)
            qi = 0
            while qi < n and rc == 0:
                q = queries[qi]
                before = hits.n
                for t in range(T):
                    pk = plan.permute(t, q)
                    lo = pk & plan.pmask[t]
                    hi = lo | ~plan.pmask[t]
                    s0 = <int>(lo >> (64 - sb)) if sb else 0
                    s1 = <int>(hi >> (64 - sb)) if sb else 0
                    if shard < s0 or shard > s1:
                        continue
                    for r in range(table_start[t], table_start[t + 1]):
                        rc = _scan_run(cur, run_ids[r], lo, hi, pk, k, &hits)
                        if rc:
                            break
                    if rc:
                        break
                # one (qidx, seq, distance) per candidate; `a` carries the query index
                i = before
                while i < hits.n and rc == 0:
                    rc = _pair_push(&out, <uint64_t>qi, hits.h[i].seq, <uint8_t>hits.h[i].dist)
                    i += 1
                hits.n = 0
                qi += 1
        if rc:
            raise _error(rc, f"scan of shard {shard} in {txn.env.path}")
        return _pair_arrays(&out)
    finally:
        if cur != NULL:
            mdb_cursor_close(cur)
        free(hits.h)
        free(out.a)
        free(out.b)
        free(out.d)


def encode_ids(list ids not None, fallback, Py_ssize_t max_bytes):
    """Records keys of many ids, as simindex.codec.encode_id makes them (type tag, then the
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
            p[0] = 105                          # b"i"
            si_store_be64(p + 1, v)
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
            p[0] = 115                          # b"s"
            memcpy(p + 1, u, size)
            out[i] = b
        else:
            out[i] = fallback(x)
    return out


def records_lookup(Txn txn, str seqs_db, const uint64_t[::1] seqs):
    """(fingerprints, ids) of the records of ascending `seqs`, looked up in one pass; a
    record removed since (no such seq) gives fingerprint 0 and id None."""
    cdef Py_ssize_t i, n = seqs.shape[0]
    cdef MDB_dbi dbi = txn.env.dbi(seqs_db)
    cdef MDB_cursor *cur = NULL
    cdef MDB_val k, v
    cdef uint8_t kbuf[8]
    cdef int rc
    txn.check()
    fps = np.zeros(n, dtype=np.uint64)
    cdef uint64_t[::1] fo = fps
    ids = [None] * n
    rc = mdb_cursor_open(txn.txn, dbi, &cur)
    if rc:
        raise _error(rc, f"{txn.env.path}: reading records failed")
    try:
        for i in range(n):
            si_store_be64(kbuf, seqs[i])
            k.mv_size = 8
            k.mv_data = kbuf
            rc = mdb_cursor_get(cur, &k, &v, MDB_SET_KEY)
            if rc == MDB_NOTFOUND:
                continue
            if rc:
                raise _error(rc, f"{txn.env.path}: reading records failed")
            if v.mv_size < RECORD_HEADER or \
                    (not txn.write and not _val_in_pages(&v, txn.env.psize)):
                raise CorruptError(f"{txn.env.path}: a stored record is damaged (its size "
                                   f"runs past its page or is below its header)")
            fo[i] = si_load64(v.mv_data)
            ids[i] = _record_id_meta(<const uint8_t *>v.mv_data, v.mv_size)[0]
    finally:
        mdb_cursor_close(cur)
    return fps, ids
