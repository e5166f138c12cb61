# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The permuted keys of the block-permutation tables (the C form of simindex.plan.Plan).

A table's permuted key puts its chosen blocks first, in their original order, then the
rest; its prefix is the chosen blocks' bits. simindex/plan.py decides the blocks and
tables; this module computes keys and prefix ranges for Python callers, and the scan loops
use the same inline functions from _permute.pxd.
"""

from itertools import combinations

import numpy as np

from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free

cimport simindex.layout as layout


cdef class Permuter:
    """The tables of a plan: per table, where each block goes (see simindex.plan.Plan)."""

    def __cinit__(self, list widths, list orders, list prefix_bits, int shard_bits,
                  int flips=0):
        cdef int m = len(widths), T = len(orders), t, j, b, start, cum
        cdef list src = []
        cdef list masks
        self.c.src_shift = NULL
        self.c.dst_shift = NULL
        self.c.bmask = NULL
        self.c.pmask = NULL
        self.c.probe = NULL
        self.c.probe_start = NULL
        if m < 1 or m > layout.WIDTH or sum(widths) != layout.WIDTH or T < 1 or \
                not 0 <= shard_bits <= 8 or len(prefix_bits) != T or flips < 0:
            raise ValueError("invalid permutation plan")
        self.c.nblocks = self.nblocks = m
        self.c.ntables = self.ntables = T
        self.c.shard_bits = self.shard_bits = shard_bits
        self.c.src_shift = <uint8_t *>malloc(T * m)
        self.c.dst_shift = <uint8_t *>malloc(T * m)
        self.c.bmask = <uint64_t *>malloc(T * m * sizeof(uint64_t))
        self.c.pmask = <uint64_t *>malloc(T * sizeof(uint64_t))
        if not (self.c.src_shift and self.c.dst_shift and self.c.bmask and self.c.pmask):
            raise MemoryError()
        start = 0
        for b in range(m):
            src.append(64 - start - widths[b])
            start += widths[b]
        for t in range(T):
            if sorted(orders[t]) != list(range(m)):
                raise ValueError("table order must be a permutation of the blocks")
            cum = 0
            for j in range(m):
                b = orders[t][j]
                self.c.src_shift[t * m + j] = src[b]
                self.c.dst_shift[t * m + j] = 64 - cum - widths[b]
                self.c.bmask[t * m + j] = 0xFFFFFFFFFFFFFFFF if widths[b] == 64 \
                    else ((<uint64_t>1 << widths[b]) - 1)
                cum += widths[b]
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
        free(self.c.src_shift)
        free(self.c.dst_shift)
        free(self.c.bmask)
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
