# Declarations of the compiled core: LMDB environments and transactions, the permutation
# plan, and the read context that runs batch queries without the GIL.
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from clmdb cimport MDB_env, MDB_txn, MDB_cursor, MDB_dbi


cdef class Env:
    cdef MDB_env *env
    cdef readonly str path
    cdef readonly bint readonly
    cdef long pid
    cdef set deps
    cdef dict dbis
    cdef size_t psize
    cdef int check(self) except -1
    cdef MDB_dbi dbi(self, name) except? 0


cdef class Txn:
    cdef MDB_txn *txn
    cdef readonly Env env
    cdef readonly bint write
    cdef int check(self) except -1
    cdef void _invalidate(self) noexcept


cdef class Plan:
    cdef readonly int ntables
    cdef readonly int nblocks
    cdef readonly int shard_bits
    cdef uint8_t *src_shift
    cdef uint8_t *dst_shift
    cdef uint64_t *bmask
    cdef uint64_t *pmask
    cdef inline uint64_t permute(self, int t, uint64_t fp) noexcept nogil


cdef struct ShardView:
    MDB_txn *txn
    MDB_cursor *cur
    int state              # 0 never begun, 1 reset, 2 active (runs parsed)
    size_t parsed          # id of the snapshot whose state applied/run_ids hold (0: none)
    uint64_t applied
    uint64_t *run_ids
    uint32_t *table_start  # ntables + 1 offsets into run_ids
    size_t run_cap


cdef struct Hit:
    uint64_t seq
    uint64_t fp
    const uint8_t *val
    size_t vlen
    uint32_t dist


cdef struct HitBuf:
    Hit *h
    size_t n
    size_t cap


cdef class ReadContext:
    cdef list envs
    cdef Env records
    cdef int nshards
    cdef MDB_env *rec_env
    cdef MDB_env **shard_envs
    cdef ShardView *views
    cdef MDB_dbi *blocks_dbi
    cdef MDB_dbi *state_dbi
    cdef MDB_txn *rec_txn
    cdef MDB_cursor *rec_cur    # on seqs, kept across calls and renewed with rec_txn
    cdef int rec_state
    cdef MDB_dbi seqs_dbi
    cdef size_t psize
    cdef readonly size_t anomalies
    cdef void _invalidate(self) noexcept
    cdef int _begin_records(self) noexcept nogil
    cdef int _activate(self, int s, int ntables) noexcept nogil
    cdef void _release(self) noexcept nogil
    cdef int _finish(self, MDB_txn *rtxn, uint64_t q, HitBuf *hits, size_t start,
                     size_t psize) noexcept nogil
    cdef list _query(self, Plan plan, const uint64_t *queries, Py_ssize_t n, int k, Txn txn,
                     bint matches)


cdef class Gate:
    cdef int inside
    cdef bint resizing
