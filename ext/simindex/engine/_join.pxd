# The Hamming kernels and the pair join (ext/simindex/_join.pyx), and the growable buffer of
# (a, b, distance) triples they fill; the distributed shard scan fills one too.
from libc.stdint cimport uint8_t, uint16_t, uint64_t


cdef struct PairBuf:
    uint64_t *a
    uint64_t *b
    uint16_t *d
    size_t n
    size_t cap


cdef int pair_push(PairBuf *p, uint64_t a, uint64_t b, uint16_t d) noexcept nogil
cdef tuple pair_arrays(PairBuf *p)
cdef void free_pairs(PairBuf *p) noexcept nogil
