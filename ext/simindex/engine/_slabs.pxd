# The slab codec (ext/simindex/engine/_slabs.pyx): a table's sorted (permuted key, seq)
# entries stored as runs of packed slabs (format: layout.pxd), and a shard's state, the list
# of its runs. Decoding a slab is inline here, so the scan loops compile it in.
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from simindex.engine.clmdb cimport MDB_txn, MDB_dbi, MDB_val
cimport simindex.bits as bits
cimport simindex.engine.layout as layout
from simindex.engine._lmdb cimport CORRUPT_SLAB, CORRUPT_KEY


cdef struct Slab:
    const uint8_t *keys      # kw-byte key offsets
    const uint8_t *seqs      # sw-byte seq offsets
    const uint8_t *lows     # lw u64 LE words per entry (wide fingerprints)
    const uint8_t *checked   # what the crc covers
    size_t checked_size
    size_t c                 # entries
    uint64_t kbase, kmask, sbase, smask
    size_t kw, sw, lw
    uint32_t crc


cdef inline uint64_t width_mask(size_t w) noexcept nogil:
    return <uint64_t>-1 if w >= 8 else ((<uint64_t>1 << (8 * w)) - 1)


cdef inline uint64_t key_at(const Slab *b, size_t i) noexcept nogil:
    return b.kbase + (bits.load64(b.keys + i * b.kw) & b.kmask)


cdef inline uint64_t seq_at(const Slab *b, size_t i) noexcept nogil:
    return b.sbase + (bits.load64(b.seqs + i * b.sw) & b.smask)


cdef inline int open_slab(const MDB_val *k, const MDB_val *v, Slab *b) noexcept nogil:
    """Decode a slab's header (v1 or v2) after checking it against the key and value sizes;
    0, or an error code for damage."""
    if k.mv_size != layout.SLAB_KEY:
        return CORRUPT_KEY
    return open_value(<const uint8_t *>v.mv_data, v.mv_size, b)


cdef inline int open_value(const uint8_t *p, size_t size, Slab *b) noexcept nogil:
    """Decode a slab's header (v1 or v2) from its value, checked against its size; 0, or
    CORRUPT_SLAB."""
    cdef uint32_t magic
    if size < layout.V1_HEADER + 16:
        return CORRUPT_SLAB
    magic = bits.load32(p)
    b.c = bits.load32(p + 4)
    b.crc = bits.load32(p + 8)
    if magic == layout.V2_MAGIC:
        if size < layout.V2_HEADER + layout.V2_PAD or b.c == 0 or \
                b.c > layout.V2_MAX_ENTRIES:
            return CORRUPT_SLAB
        b.kw = p[12]
        b.sw = p[13]
        b.lw = p[14]
        if b.kw > 8 or b.sw > 8 or b.lw > layout.MAX_LOW_WORDS or \
                (b.kw + b.sw == 0 and b.c > 1) or \
                layout.V2_HEADER + b.c * (b.kw + b.sw + 8 * b.lw) + layout.V2_PAD != size:
            return CORRUPT_SLAB
        b.kbase = bits.load64(p + 16)
        b.sbase = bits.load64(p + 24)
        b.keys = p + layout.V2_HEADER
        b.checked = p + 12
        b.checked_size = size - 12 - layout.V2_PAD
    elif magic == layout.V1_MAGIC:
        if b.c == 0 or b.c > layout.V1_MAX_ENTRIES or \
                layout.V1_HEADER + 16 * b.c != size:
            return CORRUPT_SLAB
        b.kw = b.sw = 8
        b.lw = 0
        b.kbase = b.sbase = 0
        b.keys = b.checked = p + layout.V1_HEADER
        b.checked_size = 16 * b.c
    else:
        return CORRUPT_SLAB
    b.kmask = width_mask(b.kw)
    b.smask = width_mask(b.sw)
    b.seqs = b.keys + b.c * b.kw
    b.lows = b.seqs + b.c * b.sw
    return 0


cdef inline uint64_t low_at(const Slab *b, size_t i, size_t w) noexcept nogil:
    """Word w + 1 of entry i's permuted key (wide fingerprints)."""
    return bits.load64(b.lows + (i * b.lw + w) * 8)


cdef struct RunList:
    uint64_t applied         # every record up to this seq is in the shard's tables
    size_t nruns
    uint64_t *run_ids        # sorted by (table, run)
    uint32_t *table_start    # ntables + 1 offsets into run_ids: table t's runs
    size_t cap
    MDB_val raw              # the state's runs value itself (valid while its txn lives)


cdef int read_state(MDB_txn *txn, MDB_dbi state_dbi, int ntables,
                    RunList *out) noexcept nogil
cdef void free_state(RunList *out) noexcept nogil

cdef int sort_pairs(uint64_t *keys, uint64_t *seqs, size_t n) noexcept nogil
