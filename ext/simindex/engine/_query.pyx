# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The query engine: for each query and table, the prefix range of its permuted key (and of
every probe of a plan with flips) is scanned in every run of the shard that holds it, candidates are popcount-filtered, then
de-duplicated, checked against their records and sorted. All of it in C on LMDB's memory
map with the GIL released; a Python object is made per match only.

A ReadContext holds read transactions on the records and on every shard, renewed per call
and reset after it (an idle reader pins no pages). scan_shard is the same scan for one
shard of a distributed index (its candidates are resolved by the ledger's ReadContext).
"""

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
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
    Env, Txn, Handle, Gate, error, process_id, page_size, val_in_pages, CORRUPT_SLAB, CORRUPT_KEY,
    CORRUPT_RECORD, CORRUPT_STATE, NO_MEMORY,
)
from simindex.engine._permute cimport Permuter, WidePermuter, Tables, permute, prefix_range
from simindex.engine._slabs cimport (
    Slab, RunList, open_slab, open_value, key_at, seq_at, low_at, read_state, free_state,
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


# ---------------------------------------------------------------- module state
# The scan's tunables (key_order() and tail_tables() change them for tests and tools) and the
# registered result type, read by the parts included below.

# A big batch over big tables scans in key order instead of query by query, table by table
# (the paper's batch plan; ReadContext._scan_in_key_order): every probe of every query is
# sorted by (table, range start), so the slabs of a table are read in order, each about
# once, in windows of the same passes, and the memory system streams them instead of missing
# on four random slabs per query. Hits carry their query and are grouped by it afterwards.
# Measured (10k queries, k=3, 4 tables): 10M fingerprints (40M table entries) 209-213k ->
# 264k q/s; 3M (12M entries) 505-541k -> 476-494k and 1M 540k -> 474-513k, where the tables
# stay mostly in cache.
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


# A run's filter of its keys' prefixes: a probe of a prefix the run does not hold reads
# none of its slabs. Under a MinHash band search almost every probe is one (a band key
# met before is the rare near copy), and every table holds several runs. At least
# FILTER_BITS bits an entry (a power of two of words: under 32; ~1% false positives); a
# run above FILTER_MAX entries has none: as each older run of a table holds more than the
# newer ones together, its filtered runs hold under 2 * FILTER_MAX entries, so the filters
# of a shard's table take under 8 MB however large the index grows. A run's entries never
# change, so its filter is made once and kept while the run is listed, even where its
# directory is built again (a value in a leaf page, a map resized).
cdef enum:
    FILTER_BITS = 16
    FILTER_MAX = 1048576

cdef size_t _filter_max = FILTER_MAX                    # (tests and tools: run_filters())


def run_filters(max_entries=None):
    """The most entries a run may hold to have a prefix filter; a given value replaces it
    (0: no filters, for tests that compare the scans with and without them)."""
    global _filter_max
    old = _filter_max
    if max_entries is not None:
        _filter_max = max_entries
    return old


# A read context's kept unapplied records: from how many it may build tables over them
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


# The Python layer's result type and meta decoder (set_match_type): with them the core builds
# the final Match objects itself, so a query makes no intermediate Python object per match.
cdef object _MATCH = None
cdef object _UNPACK = None


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


# ---------------------------------------------------------------- the parts
# Cython textual includes: one module, one C file, so inline functions stay inline across
# them. Each part uses the module state above, the parts before it and _rows (below).
include "_query_hits.pxi"       # hit buffers: push, de-duplication, grouping, record check
include "_query_scan.pxi"       # the nogil scan: slabs, run directories, probe passes
include "_query_tail.pxi"       # the records not yet applied to every shard
include "_query_results.pxi"    # resolved hits into Match objects or tuples
include "_query_context.pxi"    # ReadContext: snapshots, query() and resolve()
include "_query_shard.pxi"      # scan_shard, for the Ray shard servers


# ---------------------------------------------------------------- the single query
cdef class SingleQuery:
    """Index.query's hot path on a 64-bit index in one compiled call: the checks, resize gate
    and context pool of TxnRunner.read, then the query.

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


# ---------------------------------------------------------------- query arrays
cdef object _rows(queries):
    """Queries as an (n, words) uint64 array: a flat (n,) one as (n, 1), a view."""
    if queries.ndim == 1:
        return queries.reshape(queries.shape[0], 1)
    if queries.ndim != 2 or queries.shape[1] not in (1, 2, 4, 8, 12, 16):
        raise ValueError(f"queries must be an (n,) or (n, words) array, got shape "
                         f"{queries.shape}")
    return queries
