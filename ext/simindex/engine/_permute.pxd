# The block-permutation tables in C form (ext/simindex/_permute.pyx): per table, where each
# block of a fingerprint goes in its permuted key, and the mask of the key's prefix. The
# key and shard-range functions are inline here so every scan loop compiles them in.
from libc.stdint cimport int8_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef struct Tables:
    int ntables
    int nblocks
    int shard_bits          # a shard is a range of keys sharing these leading bits
    uint8_t *rot            # ntables x nblocks: the key as rotations of the fingerprint,
    uint64_t *rmask         # each masked to the bits it places (blocks moving by the same
    uint8_t *nrot           # rotation share one); ntables: how many each table takes
    int8_t *shard_shift     # ntables: the shard is (fp >> this) & its mask, -1: permute
    uint64_t *pmask         # ntables: the table's prefix as a mask over the permuted key
    int flips               # a query probes every prefix within this many bits of its own
    uint64_t *probe         # the XOR masks of those prefixes, table after table...
    uint32_t *probe_start   # ...table t's from probe_start[t] to probe_start[t + 1]
    uint64_t *omask         # wide plans: ntables x owords, each table's prefix as a mask
    int owords              # over the fingerprint's own words (NULL, 0 at 64 bits)
    int guarantee           # the plan's k (-1: unknown): a search beyond it finds the
                            # records sharing a probed prefix, the unapplied ones alike


cdef inline uint64_t rotl64(uint64_t x, unsigned int r) noexcept nogil:
    return (x << r) | (x >> ((64 - r) & 63))     # one rol instruction


cdef inline uint64_t permute(const Tables *p, int t, uint64_t fp) noexcept nogil:
    """The permuted key of `fp` in table `t`: the chosen blocks first, then the rest (a
    rotate and a mask per distinct move: a third of the shift-mask-shift per block)."""
    cdef uint64_t r = 0
    cdef int j, base = t * p.nblocks
    for j in range(p.nrot[t]):
        r |= rotl64(fp, p.rot[base + j]) & p.rmask[base + j]
    return r


cdef inline void prefix_range(const Tables *p, int t, uint64_t key, uint64_t *lo,
                              uint64_t *hi, int *s0, int *s1) noexcept nogil:
    """The keys [lo, hi] of table `t` sharing the prefix of permuted `key`, and the shards
    [s0, s1] that hold them (one when the prefix is at least as long as the shard bits)."""
    lo[0] = key & p.pmask[t]
    hi[0] = lo[0] | ~p.pmask[t]
    if p.shard_bits:
        s0[0] = <int>(lo[0] >> (64 - p.shard_bits))
        s1[0] = <int>(hi[0] >> (64 - p.shard_bits))
    else:
        s0[0] = 0
        s1[0] = 0


cdef class Permuter:
    cdef Tables c
    cdef readonly int ntables
    cdef readonly int nblocks
    cdef readonly int shard_bits
    cdef readonly int flips


cdef class WidePermuter:
    cdef Tables c                # the probe loop's view: ntables, shard_bits, pmask, probes
    cdef readonly int words
    cdef readonly int ntables
    cdef readonly int nblocks
    cdef readonly int shard_bits
    cdef readonly int flips
    cdef uint16_t *seg           # (source bit, destination bit, bits) per segment...
    cdef uint32_t *seg_start     # ...table t's from seg_start[t] to seg_start[t + 1]
    cdef uint64_t *pmask         # the effective prefix of each table over the first word
    cdef uint64_t *omask         # the same, over the fingerprint's own words (Tables.omask)
    cdef uint64_t *probe
    cdef uint32_t *probe_start
    cdef void permute(self, int t, const uint64_t *fp, uint64_t *out) noexcept nogil
