# The query engine (ext/simindex/_query.pyx): read transactions on an index's records and
# shards, the nogil scan of every table's prefix ranges, and the resolution of candidates.
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from simindex.engine.clmdb cimport MDB_env, MDB_txn, MDB_cursor, MDB_dbi, MDB_val
from simindex.engine._lmdb cimport Env, Txn, Handle
from simindex.engine._permute cimport Permuter, WidePermuter, Tables
from simindex.engine._slabs cimport Slab, RunList
from simindex.engine._records cimport Tail


cdef enum ViewState:
    VIEW_NEW = 0        # no read transaction yet
    VIEW_RESET = 1      # a transaction and cursor kept across calls, reset between them
    VIEW_ACTIVE = 2     # renewed for this call, its state parsed


cdef enum:
    DIR_GROUP = 8          # slabs per key of a directory's top (one cache line of keys)


cdef struct RunDir:
    # A run's slab directory: each slab's last key and value, so a query finds its slab
    # with a binary search here instead of an LMDB descent. Runs are never changed once
    # written (a merge writes a new run id and deletes the old run), so while a run is listed
    # in the shard's state its slabs stay where they are: a directory whose slabs are all
    # in overflow pages is kept across snapshots; one holding a value inside a leaf page
    # (which a later write may copy elsewhere) only for the snapshot it was built in.
    uint32_t table
    uint64_t run
    size_t n               # slabs (once built: at the first probe of the run)
    bint built
    uint64_t *last         # each slab's last permuted key (non-decreasing)
    uint64_t *top          # the last key of each group of DIR_GROUP slabs: searched first
    const uint8_t **data   # each slab's value in the map
    uint32_t *size         # its size
    bint kept              # every value is in overflow pages
    uint64_t *filt         # a filter of the run's keys' prefixes (_build_filter; kept
                           # while the run is listed, its directory or not), or
    size_t fwords          # NULL; its 64-bit words (a power of two)
    uint64_t pmask         # the table's prefix mask it was built under


cdef struct ShardView:
    MDB_txn *txn
    MDB_cursor *cur
    ViewState state
    size_t parsed          # id of the snapshot whose state `runs` holds (0: none)
    RunList runs           # the shard's applied seq and its runs per table
    RunDir *dirs           # one per run of `runs` (same order)
    size_t ndirs
    size_t mapgen          # the env's map generation the directories point into


cdef struct Hit:
    uint64_t seq
    uint64_t fp
    const uint8_t *val
    size_t vlen
    uint32_t dist
    size_t q               # its query (a key-ordered batch scan, before grouping)
    uint64_t id            # with `plain`: its record's integer id (the meta is None)
    bint plain             # set at resolution, see _records.record_plain_int


cdef struct Probe:
    # one run's part of one probe of a query: the slab the directory found, and the range
    RunDir *dir            # the run's directory (for a range that runs past the slab)
    size_t si              # the slab's number in the run
    uint64_t lo, hi, pk
    const uint64_t *pkt    # the table key's further words (wide)
    Slab slab              # its decoded header (pass 2)
    size_t guess           # where its range is guessed to start (pass 2)
    size_t q               # its query (a key-ordered batch)


cdef struct ProbeBuf:
    Probe *p
    size_t n
    size_t cap


cdef struct HitBuf:
    Hit *h
    size_t n
    size_t cap


cdef struct TailTables:
    # the kept unapplied records of a 64-bit index as tables of their own: each table's
    # permuted keys and seqs sorted, so a query probes them as it probes a run
    uint64_t *keys           # ntables x n
    uint64_t *seqs
    size_t n
    const Tables *tb         # the tables they were built for
    bint ok


cdef class ReadContext(Handle):
    cdef list envs
    cdef Env records
    cdef int nshards
    cdef MDB_env *rec_env
    cdef MDB_env **shard_envs
    cdef size_t **mapgens      # each shard Env's map generation (the Envs live in envs)
    cdef ShardView *views
    cdef MDB_dbi *slabs_dbi
    cdef MDB_dbi *state_dbi
    cdef MDB_txn *rec_txn
    cdef MDB_cursor *rec_cur    # on seqs, kept across calls and renewed with rec_txn
    cdef ViewState rec_state
    cdef MDB_dbi seqs_dbi
    cdef size_t psize
    cdef bint sums             # the records end in their checksums (Env.sums)
    cdef readonly size_t anomalies
    # the unapplied records of this context's last own records snapshot, kept across calls:
    # every record of seq ctail_from..ctail_upto that snapshot held (or held since removed)
    cdef Tail ctail
    cdef uint64_t ctail_from, ctail_upto
    cdef bint ctail_ok
    cdef readonly size_t tail_loads   # records read from LMDB into ctail (tests, tools)
    cdef TailTables ttab
    cdef size_t tail_work              # records passed over on ctail since it changed
    cdef readonly size_t tail_builds   # tail tables built (tests, tools)
    cdef RunDir *failed_dir            # the run whose slab a failed probe was reading
    cdef uint64_t bad_seq              # the seq of the damaged record a call met (0: none)
    cdef int _tail(self, MDB_cursor *cur, uint64_t start, uint64_t last, int words,
                   Tail **out) noexcept nogil
    cdef int _waiting(self, MDB_cursor *cur, uint64_t last, int words, int ntables, bint own,
                      Tail *local, Tail **out) noexcept nogil
    cdef int _tail_check(self, const Tables *tb, Tail *tail, uint64_t applied,
                         const uint64_t *q, int words, int k, size_t nq,
                         HitBuf *hits) noexcept nogil
    cdef object _error(self, int rc, str what)
    cdef int _begin_records(self) noexcept nogil
    cdef int _activate(self, int s, int ntables) noexcept nogil
    cdef void _release(self) noexcept nogil
    cdef size_t _entries(self) noexcept nogil
    cdef int _scan_in_key_order(self, const Tables *tb, WidePermuter wp,
                                const uint64_t *queries, Py_ssize_t n, int words, int k,
                                HitBuf *hits) noexcept nogil
    cdef int _resolve_batch(self, MDB_cursor *cur, const uint64_t *queries, int words,
                            HitBuf *hits, size_t *qstart, Py_ssize_t n,
                            size_t psize) noexcept nogil
    cdef int _finish(self, MDB_txn *rtxn, const uint64_t *q, HitBuf *hits, size_t start,
                     size_t psize, int words=*) noexcept nogil
    cdef void _end_call(self, MDB_cursor *rc_cur, size_t *qstart, HitBuf *hits,
                        Tail *tail) noexcept
    cdef list _query(self, object perm, const uint64_t *queries, Py_ssize_t n, int k,
                     Txn txn, bint matches, int words=*)
