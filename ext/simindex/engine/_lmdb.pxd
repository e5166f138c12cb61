# The LMDB binding of the core: environments, transactions, the resize gate and the one
# translation of return codes into simindex errors (ext/simindex/_lmdb.pyx).
from libc.stdint cimport uint8_t
from simindex.engine.clmdb cimport MDB_env, MDB_txn, MDB_dbi, MDB_val
cimport simindex.bits as bits
cimport simindex.engine.layout as layout

# Return codes of the core's nogil loops, beside LMDB's own (error() names them).
cdef enum:
    CORRUPT_SLAB = -1001
    CORRUPT_STATE = -1002
    NO_MEMORY = -1003
    CORRUPT_RECORD = -1004
    CORRUPT_KEY = -1005

cdef object error(int rc, str what)
cdef long process_id() noexcept nogil
cdef size_t page_size(MDB_env *env) noexcept


cdef inline bint val_in_pages(const MDB_val *v, size_t psize) noexcept nogil:
    """Whether a value LMDB returned lies inside its leaf page, or inside the overflow pages
    whose header precedes it. LMDB trusts a node's size: a damaged one would make a read
    run past the end of the file (SIGBUS). `psize` 0 checks nothing (see page_size)."""
    cdef size_t off
    cdef const uint8_t *hdr
    if psize == 0:
        return True
    off = (<size_t>v.mv_data) & (psize - 1)
    if off + v.mv_size <= psize:
        return True
    if off != layout.LMDB_PAGE_HEADER:   # spans pages, so it must start an overflow run
        return False
    hdr = <const uint8_t *>v.mv_data - layout.LMDB_PAGE_HEADER
    return ((hdr[layout.LMDB_PAGE_FLAGS_AT] | hdr[layout.LMDB_PAGE_FLAGS_AT + 1] << 8) &
            layout.LMDB_P_OVERFLOW) != 0 and v.mv_size + layout.LMDB_PAGE_HEADER <= \
        <size_t>bits.load32(hdr + layout.LMDB_PAGE_PAGES_AT) * psize


cdef class Handle:
    """Something that holds LMDB handles of an Env: closing the Env invalidates it."""
    cdef void invalidate(self) noexcept


cdef class Env:
    cdef MDB_env *env
    cdef readonly str path
    cdef readonly bint readonly
    cdef long pid
    cdef set deps
    cdef dict dbis
    cdef readonly size_t psize
    cdef public bint sums     # records/ of a format 3 index: every record ends in its checksum
    cdef size_t mapgen        # bumped by every set_mapsize: the map may have moved
    cdef int check(self) except -1
    cdef MDB_dbi dbi(self, name) except? 0


cdef class Txn(Handle):
    cdef MDB_txn *txn
    cdef readonly Env env
    cdef readonly bint write
    cdef int check(self) except -1


cdef class Gate:
    cdef int inside
    cdef bint resizing
    cpdef void enter(self) except *
    cpdef void exit(self)
