# The record codec (ext/simindex/_records.pyx): records/ keeps each record under its seq
# (format: layout.pxd) and each id key under ids. The query engine reads them through these.
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from simindex.engine.clmdb cimport MDB_cursor
cimport simindex.bits as bits
cimport simindex.engine.layout as layout

cdef extern from *:
    """
    #define XXH_INLINE_ALL
    #include <xxhash.h>
    """
    unsigned long long XXH3_64bits_withSeed(const void *p, size_t n,
                                            unsigned long long seed) nogil


cdef struct Tail:
    uint64_t *seq            # the seqs and fingerprints of a run of records, in seq order
    uint64_t *fp             # (the first word of each, for wide fingerprints...
    uint64_t *rest           # ...and its other words, words - 1 per record)
    size_t n
    size_t cap
    int words                # 64-bit words per fingerprint (0 counts as 1)
    bint sums                # the records end in their checksums (Env.sums)


cdef inline size_t record_header(int words) noexcept nogil:
    """Bytes before a record's id key: fp word 0 (u64 LE), id key length (u16 LE), then
    (wide fingerprints) the other words, u64 LE each, most significant first."""
    return 10 + 8 * (words - 1 if words > 1 else 0)


cdef inline uint32_t record_sum(uint64_t seq, const uint8_t *p, size_t n) noexcept nogil:
    """The checksum of a record's `n` bytes before its sum (layout.pxd: RECORD_SUM)."""
    return <uint32_t>XXH3_64bits_withSeed(p, n, seq)


cdef inline bint record_body(uint64_t seq, const uint8_t *p, size_t n, bint sums,
                             size_t *body) noexcept nogil:
    """Whether the stored record of `seq` (its value, `n` bytes) is whole, its length
    without the checksum in `body`: with `sums`, its checksum matches; always, it holds a
    header (the fingerprint and the id key's length) for `words` = 1."""
    if not sums:
        body[0] = n
        return n >= layout.RECORD_HEADER
    if n < layout.RECORD_HEADER + layout.RECORD_SUM:
        return False
    body[0] = n - layout.RECORD_SUM
    return bits.load32(p + body[0]) == record_sum(seq, p, body[0])


cdef inline bint record_plain_int(const uint8_t *p, size_t n, int words,
                                  uint64_t *id) noexcept nogil:
    """True for a 64-bit record of an integer id and a None meta (a dataset's usual record),
    its id in `id`: found while the query holds no GIL, so its match is made from the hit
    (which holds a 64-bit fingerprint whole) without reading the record again. Anything
    else, wide or malformed, is False: record_id_meta decodes it."""
    cdef size_t hdr = record_header(words)
    if words != 1 or n != hdr + 10 or p[8] != 9 or p[9] != 0 or p[hdr] != layout.ID_TAG_INT or \
            p[hdr + 9] != layout.MSGPACK_NIL:
        return False
    id[0] = bits.load_be64(p + hdr + 1)
    return True


cdef int load_tail(MDB_cursor *cur, uint64_t start, Tail *tail) noexcept nogil
cdef void drop_tail_below(Tail *tail, uint64_t start) noexcept nogil
cdef void free_tail(Tail *tail) noexcept nogil
cdef object damaged_record(str where, uint64_t seq)
cdef tuple record_id_meta(const uint8_t *p, size_t n, int words=*)
cdef object record_fp(const uint8_t *p, int words)
