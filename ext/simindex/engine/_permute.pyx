# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The permuted keys of the block-permutation tables (the C form of simindex.engine.plan.Plan).

A table's permuted key puts its chosen blocks first, in their original order, then the
rest; its prefix is the chosen blocks' bits. simindex/engine/plan.py decides the blocks and
tables; this module computes keys and prefix ranges for Python callers, and the scan loops
use the same inline functions from _permute.pxd.
"""

from itertools import combinations

import numpy as np

from libc.stdint cimport int8_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free

cimport simindex.bits as bits
cimport simindex.engine.layout as layout


cdef enum:
    GATHER_TILE = 2048       # records gather_shards takes table after table (32 KiB)


cdef class Permuter:
    """The tables of a plan: per table, where each block goes (see simindex.engine.plan.Plan)."""

    def __cinit__(self, list widths, list orders, list prefix_bits, int shard_bits,
                  int flips=0):
        cdef int m = len(widths), T = len(orders), t, j, b, start, cum, dst
        cdef list src = []
        cdef list masks
        self.c.rot = NULL
        self.c.rmask = NULL
        self.c.nrot = NULL
        self.c.shard_shift = NULL
        self.c.pmask = NULL
        self.c.probe = NULL
        self.c.probe_start = NULL
        self.c.omask = NULL
        self.c.owords = 0
        self.c.guarantee = -1
        if m < 1 or m > layout.WIDTH or sum(widths) != layout.WIDTH or T < 1 or \
                not 0 <= shard_bits <= 8 or len(prefix_bits) != T or flips < 0:
            raise ValueError("invalid permutation plan")
        self.c.nblocks = self.nblocks = m
        self.c.ntables = self.ntables = T
        self.c.shard_bits = self.shard_bits = shard_bits
        self.c.pmask = <uint64_t *>malloc(T * sizeof(uint64_t))
        self.c.rot = <uint8_t *>malloc(T * m)
        self.c.rmask = <uint64_t *>malloc(T * m * sizeof(uint64_t))
        self.c.nrot = <uint8_t *>malloc(T)
        self.c.shard_shift = <int8_t *>malloc(T)
        if not (self.c.pmask and self.c.rot and self.c.rmask and self.c.nrot and
                self.c.shard_shift):
            raise MemoryError()
        start = 0
        for b in range(m):
            src.append(64 - start - widths[b])      # where block b's bits sit in a fingerprint
            start += widths[b]
        for t in range(T):
            if sorted(orders[t]) != list(range(m)):
                raise ValueError("table order must be a permutation of the blocks")
            moves = {}              # rotation -> the destination bits it fills
            cum = 0
            for b in orders[t]:
                dst = 64 - cum - widths[b]
                r = (64 + dst - src[b]) % 64
                moves[r] = moves.get(r, 0) | (((1 << widths[b]) - 1) << dst)
                cum += widths[b]
            self.c.nrot[t] = len(moves)
            for j, r in enumerate(sorted(moves)):
                self.c.rot[t * m + j] = r
                self.c.rmask[t * m + j] = moves[r]
            b = orders[t][0]
            self.c.shard_shift[t] = src[b] + widths[b] - shard_bits \
                if widths[b] >= shard_bits else -1
            self.c.pmask[t] = 0 if prefix_bits[t] == 0 else \
                (0xFFFFFFFFFFFFFFFF << (64 - prefix_bits[t])) & 0xFFFFFFFFFFFFFFFF
        # the probes: XOR masks of at most `flips` bits among each table's prefix bits,
        # the query's own prefix (mask 0) first
        self.c.flips = self.flips = flips
        masks = []
        self.c.probe_start = <uint32_t *>malloc((T + 1) * sizeof(uint32_t))
        if not self.c.probe_start:
            raise MemoryError()
        for t in range(T):
            self.c.probe_start[t] = len(masks)
            for j in range(min(flips, prefix_bits[t]) + 1):
                for pos in combinations(range(64 - prefix_bits[t], 64), j):
                    masks.append(sum(1 << x for x in pos))
        self.c.probe_start[T] = len(masks)
        self.c.probe = <uint64_t *>malloc(len(masks) * sizeof(uint64_t) + 8)
        if not self.c.probe:
            raise MemoryError()
        for j in range(len(masks)):
            self.c.probe[j] = masks[j]

    def __dealloc__(self):
        free(self.c.rot)
        free(self.c.rmask)
        free(self.c.nrot)
        free(self.c.shard_shift)
        free(self.c.pmask)
        free(self.c.probe)
        free(self.c.probe_start)

    def _table(self, int t):
        if not 0 <= t < self.ntables:
            raise IndexError(f"table {t} out of range 0..{self.ntables - 1}")

    def key(self, int t, uint64_t fp):
        """The permuted key of `fp` in table `t`."""
        self._table(t)
        return permute(&self.c, t, fp)

    def keys(self, int t, const uint64_t[::1] fps):
        """Permuted keys of an array of fingerprints in table `t`, as a new uint64 array."""
        cdef Py_ssize_t i, n = fps.shape[0]
        self._table(t)
        out = np.empty(n, dtype=np.uint64)
        cdef uint64_t[::1] o = out
        with nogil:
            for i in range(n):
                o[i] = permute(&self.c, t, fps[i])
        return out

    def prefix_mask(self, int t):
        """Table `t`'s prefix as a mask over its permuted keys."""
        self._table(t)
        return self.c.pmask[t]

    def shard_ids(self, const uint64_t[::1] fps):
        """(ids, counts): a (tables, n) uint8 array, the shard holding fingerprint i's key in
        table t, and a (tables, shards) int64 array counting them (a bulk load permutes
        every record once, then gathers each group of shards' entries by these ids)."""
        cdef Py_ssize_t i, n = fps.shape[0]
        cdef int t, sb = self.c.shard_bits
        cdef uint8_t s
        out = np.zeros((self.c.ntables, n), dtype=np.uint8)
        counts = np.zeros((self.c.ntables, 1 << sb), dtype=np.int64)
        cdef uint8_t[:, ::1] o = out
        cdef int64_t[:, ::1] c = counts
        cdef int sh
        cdef uint64_t mask = (<uint64_t>1 << sb) - 1
        with nogil:
            for t in range(self.c.ntables):
                if sb == 0:
                    c[t, 0] = n
                    continue
                # the shard bits lead the key, so they are the top bits of its first block:
                # one shift, not a whole permutation, when that block is wide enough
                sh = self.c.shard_shift[t]
                if sh >= 0:
                    for i in range(n):
                        s = <uint8_t>((fps[i] >> sh) & mask)
                        o[t, i] = s
                        c[t, s] += 1
                else:
                    for i in range(n):
                        s = <uint8_t>(permute(&self.c, t, fps[i]) >> (64 - sb))
                        o[t, i] = s
                        c[t, s] += 1
        return out, counts

    def gather_shards(self, const uint64_t[::1] fps, const uint64_t[::1] seqs,
                      const uint8_t[:, ::1] ids, int s0, int s1, uint64_t[::1] out_k,
                      uint64_t[::1] out_s, const int64_t[::1] starts):
        """The entries of shards s0..s1-1 in every table, in one pass over the records
        (`ids`: shard_ids' first array): table t's permuted keys and their seqs, in input
        order, go to out_k/out_s from starts[t], and their counts are returned. Records go
        a tile of GATHER_TILE at a time, every table in turn.

        Table t's region ends at starts[t + 1] (the last at the arrays' end) and needs one
        slot more than its count: every record is written, and only a table's own advance
        (no branch per record and table: 100M records, 10 tables, 8 shards take 24 s as a
        pass per table and shard). A region too small raises ValueError."""
        cdef Py_ssize_t i, n = fps.shape[0], m, cap = out_k.shape[0]
        cdef int t, T = self.c.ntables
        cdef uint8_t width = <uint8_t>(s1 - s0), lo = <uint8_t>s0
        cdef uint64_t x
        if seqs.shape[0] != n or ids.shape[0] != T or ids.shape[1] != n:
            raise ValueError("fps, seqs and ids differ in shape")
        if self.c.shard_bits == 0 or not 0 <= s0 < s1 <= (1 << self.c.shard_bits):
            raise ValueError(f"shards {s0}..{s1} out of range 0..{1 << self.c.shard_bits}")
        if out_s.shape[0] != cap or starts.shape[0] != T:
            raise ValueError("out_k, out_s and starts do not match the tables")
        for t in range(T):
            if not 0 <= starts[t] < (starts[t + 1] if t + 1 < T else cap):
                raise ValueError(f"table {t}'s region is empty or out of order")
        counts = np.zeros(T, dtype=np.int64)
        cdef int64_t[::1] c = counts
        # per table: where its next entry goes (key, seq), its spare slot, its ids row
        # (pointers, not offsets: a store of a uint64 key cannot alias them, so they stay
        # in registers and cache)
        cdef uint64_t **kp = <uint64_t **>malloc(3 * T * sizeof(uint64_t *))
        cdef uint64_t **sp = kp + T
        cdef uint64_t **spare = kp + 2 * T
        cdef const uint8_t **row = <const uint8_t **>malloc(T * sizeof(uint8_t *))
        cdef uint64_t d, at, full = 0
        cdef uint64_t *k
        cdef uint64_t *q
        cdef uint64_t *last
        cdef const uint8_t *r
        cdef Py_ssize_t b, e
        if kp == NULL or row == NULL:
            free(kp)
            free(row)
            raise MemoryError()
        with nogil:
            for t in range(T):
                kp[t] = &out_k[starts[t]]
                sp[t] = &out_s[starts[t]]
                spare[t] = &out_k[(starts[t + 1] if t + 1 < T else cap) - 1]
                row[t] = &ids[t, 0] if n else NULL
            b = 0
            while b < n:
                e = b + GATHER_TILE if n - b > GATHER_TILE else n
                for t in range(T):              # the tile's records stay in cache
                    k = kp[t]
                    q = sp[t]
                    last = spare[t]
                    r = row[t]
                    if last - k >= e - b:       # the tile cannot fill the region
                        for i in range(b, e):
                            k[0] = fps[i]
                            q[0] = seqs[i]
                            d = <uint8_t>(r[i] - lo) < width
                            k += d
                            q += d
                    else:
                        for i in range(b, e):
                            k[0] = fps[i]
                            q[0] = seqs[i]
                            d = <uint8_t>(r[i] - lo) < width
                            at = k == last
                            full |= d & at      # a region too small: stay on its spare
                            d &= at ^ 1
                            k += d
                            q += d
                    kp[t] = k
                    sp[t] = q
                b = e
            for t in range(T):
                c[t] = kp[t] - &out_k[starts[t]]
                for m in range(starts[t], starts[t] + c[t]):
                    x = out_k[m]
                    out_k[m] = permute(&self.c, t, x)
        free(kp)
        free(row)
        if full:
            raise ValueError("a table's region is too small for its entries")
        return counts

    def shard_reach(self, const uint64_t[::1] fps):
        """A (shards, n) bool array: shard s holds part of some table's prefix range of
        fingerprint i (where a query of it must look)."""
        cdef Py_ssize_t i, n = fps.shape[0]
        cdef int t, s, s0, s1
        cdef uint32_t j
        cdef uint64_t lo, hi, pk
        out = np.zeros((1 << self.shard_bits, n), dtype=np.bool_)
        cdef uint8_t[:, ::1] o = out.view(np.uint8)
        with nogil:
            for i in range(n):
                for t in range(self.c.ntables):
                    pk = permute(&self.c, t, fps[i])
                    for j in range(self.c.probe_start[t], self.c.probe_start[t + 1]):
                        prefix_range(&self.c, t, pk ^ self.c.probe[j], &lo, &hi, &s0, &s1)
                        for s in range(s0, s1 + 1):
                            o[s, i] = 1
        return out

    def probe_masks(self, int t):
        """The XOR masks a query's permuted key of table `t` is probed with (0 first)."""
        self._table(t)
        return np.array([self.c.probe[j] for j in range(self.c.probe_start[t],
                                                         self.c.probe_start[t + 1])],
                        dtype=np.uint64)

    def shard_owners(self, const uint64_t[::1] fps):
        """A (shards, n) bool array: shard s holds an entry of fingerprint i in some table
        (where a write of it must go)."""
        cdef Py_ssize_t i, n = fps.shape[0]
        cdef int t, sb = self.c.shard_bits
        out = np.zeros((1 << sb, n), dtype=np.bool_)
        cdef uint8_t[:, ::1] o = out.view(np.uint8)
        with nogil:
            for i in range(n):
                for t in range(self.c.ntables):
                    o[(permute(&self.c, t, fps[i]) >> (64 - sb)) if sb else 0, i] = 1
        return out


# ---------------------------------------------------------------- wide fingerprints
cdef class WidePermuter:
    """The tables of a plan over `words` 64-bit words (128 to 1024 bits), most significant
    word first: each block is copied from its place in the fingerprint to its place in
    the permuted key as segments that cross no word boundary. A table's range scans use
    the key's first word: its prefix there is the first min(prefix bits, 64) bits."""

    def __cinit__(self, int words, list widths, list orders, list prefix_bits, int shard_bits,
                  int flips=0, int k=-1):
        cdef int m = len(widths), T = len(orders), t, j, b, n, src, dst, cum, take
        cdef list segs = [], masks = [], starts = [], own = []
        cdef int width = 64 * words, start, eff
        self.seg = NULL
        self.seg_start = NULL
        self.pmask = NULL
        self.omask = NULL
        self.probe = NULL
        self.probe_start = NULL
        if words not in (2, 4, 8, 12, 16) or m < 1 or m > width or sum(widths) != width or T < 1 or \
                not 0 <= shard_bits <= 8 or len(prefix_bits) != T or flips < 0:
            raise ValueError("invalid permutation plan")
        self.words = words
        self.ntables = T
        self.nblocks = m
        self.shard_bits = shard_bits
        self.flips = flips
        start = 0
        for b in range(m):
            starts.append(start)
            start += widths[b]
        self.seg_start = <uint32_t *>malloc((T + 1) * sizeof(uint32_t))
        self.pmask = <uint64_t *>malloc(T * sizeof(uint64_t))
        self.probe_start = <uint32_t *>malloc((T + 1) * sizeof(uint32_t))
        if not (self.seg_start and self.pmask and self.probe_start):
            raise MemoryError()
        for t in range(T):
            if sorted(orders[t]) != list(range(m)):
                raise ValueError("table order must be a permutation of the blocks")
            self.seg_start[t] = len(segs) // 3
            dst = 0
            for j in range(m):
                b = orders[t][j]
                src = starts[b]
                n = widths[b]
                while n > 0:            # cut where either side crosses a word boundary
                    take = min(n, 64 - src % 64, 64 - dst % 64)
                    segs += [src, dst, take]
                    src += take
                    dst += take
                    n -= take
            eff = min(prefix_bits[t], 64)
            self.pmask[t] = 0 if eff == 0 else \
                (0xFFFFFFFFFFFFFFFF << (64 - eff)) & 0xFFFFFFFFFFFFFFFF
            mask = 0                    # the prefix's bits where the fingerprint has them
            for j in range(self.seg_start[t], len(segs) // 3):
                src, dst, n = segs[3 * j], segs[3 * j + 1], segs[3 * j + 2]
                if dst < eff:
                    take = min(n, eff - dst)
                    mask |= ((1 << <object>take) - 1) << <object>(width - src - take)
            own += [(mask >> (64 * (words - 1 - j))) & 0xFFFFFFFFFFFFFFFF
                    for j in range(words)]
            self.probe_start[t] = len(masks)
            for j in range(min(flips, eff) + 1):
                for pos in combinations(range(64 - eff, 64), j):
                    masks.append(sum(1 << x for x in pos))
        self.seg_start[T] = len(segs) // 3
        self.probe_start[T] = len(masks)
        self.seg = <uint16_t *>malloc(len(segs) * sizeof(uint16_t) + 2)
        self.probe = <uint64_t *>malloc(len(masks) * sizeof(uint64_t) + 8)
        self.omask = <uint64_t *>malloc(len(own) * sizeof(uint64_t))
        if not (self.seg and self.probe and self.omask):
            raise MemoryError()
        for j in range(len(own)):
            self.omask[j] = own[j]
        for j in range(len(segs)):
            self.seg[j] = segs[j]
        for j in range(len(masks)):
            self.probe[j] = masks[j]
        # the probe loop reads these through a Tables, as for 64-bit plans (not owned)
        self.c.ntables = T
        self.c.nblocks = m
        self.c.shard_bits = shard_bits
        self.c.flips = flips
        self.c.pmask = self.pmask
        self.c.probe = self.probe
        self.c.probe_start = self.probe_start
        self.c.rot = NULL
        self.c.rmask = NULL
        self.c.nrot = NULL
        self.c.shard_shift = NULL
        self.c.omask = self.omask
        self.c.owords = words
        self.c.guarantee = k

    def __dealloc__(self):
        free(self.omask)
        free(self.seg)
        free(self.seg_start)
        free(self.pmask)
        free(self.probe)
        free(self.probe_start)

    cdef void permute(self, int t, const uint64_t *fp, uint64_t *out) noexcept nogil:
        cdef uint32_t s
        cdef int w, src, dst, n
        cdef uint64_t v
        for w in range(self.words):
            out[w] = 0
        for s in range(self.seg_start[t], self.seg_start[t + 1]):
            src = self.seg[3 * s]
            dst = self.seg[3 * s + 1]
            n = self.seg[3 * s + 2]
            v = fp[src >> 6] >> (64 - (src & 63) - n)
            if n < 64:
                v &= (<uint64_t>1 << n) - 1
            out[dst >> 6] |= v << (64 - (dst & 63) - n)

    def _table(self, int t):
        if not 0 <= t < self.ntables:
            raise IndexError(f"table {t} out of range 0..{self.ntables - 1}")

    def keys(self, int t, const uint64_t[:, ::1] fps):
        """Permuted keys of an (n, words) array of fingerprints in table `t`, as a new
        (n, words) array."""
        cdef Py_ssize_t i, n = fps.shape[0]
        self._table(t)
        if fps.shape[1] != self.words:
            raise ValueError(f"fingerprints have {fps.shape[1]} words, not {self.words}")
        out = np.empty((n, self.words), dtype=np.uint64)
        cdef uint64_t[:, ::1] o = out
        with nogil:
            for i in range(n):
                self.permute(t, &fps[i, 0], &o[i, 0])
        return out

    def key(self, int t, fp):
        """The permuted key of one fingerprint (an int) in table `t`, as an int."""
        cdef uint64_t a[bits.MAX_WORDS]
        cdef uint64_t r[bits.MAX_WORDS]
        cdef int w
        self._table(t)
        for w in range(self.words):
            a[w] = (fp >> (64 * (self.words - 1 - w))) & 0xFFFFFFFFFFFFFFFF
        self.permute(t, a, r)
        v = 0
        for w in range(self.words):
            v = (v << 64) | r[w]
        return v

    def prefix_mask(self, int t):
        """Table `t`'s (effective) prefix as a mask over its keys' first word."""
        self._table(t)
        return self.pmask[t]

    def probe_masks(self, int t):
        """The XOR masks a query's first key word of table `t` is probed with (0 first)."""
        self._table(t)
        return np.array([self.probe[j] for j in range(self.probe_start[t],
                                                         self.probe_start[t + 1])],
                        dtype=np.uint64)

    def shard_reach(self, const uint64_t[:, ::1] fps):
        """A (shards, n) bool array: shard s holds part of some table's probed ranges of
        fingerprint i (an (n, words) array; see Permuter.shard_reach)."""
        cdef Py_ssize_t i, n = fps.shape[0]
        cdef int t, s, s0, s1
        cdef uint32_t j
        cdef uint64_t lo, hi
        cdef uint64_t key[bits.MAX_WORDS]
        out = np.zeros((1 << self.shard_bits, n), dtype=np.bool_)
        cdef uint8_t[:, ::1] o = out.view(np.uint8)
        if n and fps.shape[1] != self.words:
            raise ValueError(f"fingerprints have {fps.shape[1]} words, not {self.words}")
        with nogil:
            for i in range(n):
                for t in range(self.ntables):
                    self.permute(t, &fps[i, 0], key)
                    for j in range(self.probe_start[t], self.probe_start[t + 1]):
                        prefix_range(&self.c, t, key[0] ^ self.probe[j], &lo, &hi, &s0, &s1)
                        for s in range(s0, s1 + 1):
                            o[s, i] = 1
        return out

    def shard_owners(self, const uint64_t[:, ::1] fps):
        """A (shards, n) bool array: shard s holds an entry of fingerprint i in some table."""
        cdef Py_ssize_t i, n = fps.shape[0]
        cdef int t, sb = self.shard_bits
        cdef uint64_t key[bits.MAX_WORDS]
        out = np.zeros((1 << sb, n), dtype=np.bool_)
        cdef uint8_t[:, ::1] o = out.view(np.uint8)
        if n and fps.shape[1] != self.words:
            raise ValueError(f"fingerprints have {fps.shape[1]} words, not {self.words}")
        with nogil:
            for i in range(n):
                for t in range(self.ntables):
                    self.permute(t, &fps[i, 0], key)
                    o[(key[0] >> (64 - sb)) if sb else 0, i] = 1
        return out
