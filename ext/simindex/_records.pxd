# The record codec (ext/simindex/_records.pyx): records/ keeps each record under its seq
# (format: layout.pxd) and each id key under ids. The query engine reads them through these.
from libc.stdint cimport uint8_t, uint64_t
from simindex.clmdb cimport MDB_cursor


cdef struct Tail:
    uint64_t *seq            # the seqs and fingerprints of a run of records, in seq order
    uint64_t *fp
    size_t n
    size_t cap


cdef int load_tail(MDB_cursor *cur, uint64_t start, Tail *tail) noexcept nogil
cdef void free_tail(Tail *tail) noexcept nogil
cdef tuple record_id_meta(const uint8_t *p, size_t n)
