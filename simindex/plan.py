"""Index parameters: k, blocks, shards, and the block-permutation tables they imply.

Bits are cut into `blocks` contiguous blocks, most significant first (the first 64 % m
blocks get one bit more). A table is a choice of `blocks - k` blocks; its permuted key puts
the chosen blocks first, in their original order, then the rest. Two fingerprints within k
bits differ in at most k blocks, so they agree on all chosen blocks of at least one table.
"""

from __future__ import annotations

import os
from itertools import combinations
from math import comb
from typing import Optional

import numpy as np

from ._layout import WIDTH
from ._permute import Permuter
from .errors import ParameterError, ParameterTypeError

DEFAULT_K = 3            # the largest distance a new index guarantees, unless told
MAX_TABLES = 1024


# Query cost model of the planner, measured on this project's machines (1M-10M, k=3): a
# table costs one seek (LMDB branch pages, a block header, a binary search: ~0.4 us of cache
# misses) plus ~3 ns per candidate scanned in its prefix range.
SEEK_NS, SCAN_NS = 400.0, 3.0
PLANNED_TABLES = 64          # the planner never picks more tables than this
# Bytes per fingerprint: 10.1 per table entry and ~67 per record (block layout v2, after
# compact(), measured at 1M and 10M). An index larger than the page cache can hold answers
# from disk: each seek then costs a random read.
ENTRY_BYTES, RECORD_BYTES = 10.1, 67.0
DISK_SEEK_NS = 100_000.0
CACHE_SHARE = 0.6            # of physical memory an index may count on for its pages


# Fingerprints per shard the planner aims at when told the expected size. Each batch of
# records commits every shard it touches, one fsync each, so a small index wants few shards;
# shards are also the unit of parallel writes (`jobs`) and of distribution (Ray). Measured
# here (k=3, 4 tables, batches of 1,000 with sync; 1M / 10M): 1 shard 267k / 333k rec/s,
# 4 shards 156k / 125k, 16 shards 55k / 44k; queries and bulk builds alike in all three.
SHARD_FPS = 1 << 24
DEFAULT_SHARDS = 16


def default_shards(expected: Optional[int] = None) -> int:
    """shards=None picks 16, or with `expected` the fewest shards (a power of two, at most
    256) that keep each at or below SHARD_FPS (16.8M) fingerprints."""
    if expected is None:
        return DEFAULT_SHARDS
    shards = 1
    while shards < 256 and expected > shards * SHARD_FPS:
        shards *= 2
    return shards


def physical_memory() -> Optional[int]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_blocks(k: int, expected: Optional[int] = None,
                   memory: Optional[int] = None) -> int:
    """blocks=None picks k + 1 (the fewest tables, k + 1, and the longest prefix that works),
    or with `expected` (the number of fingerprints the index will hold) the plan of least
    estimated query time: more blocks give more, longer prefixes, so fewer candidates per
    table, which pays once a table's prefix range holds hundreds of entries (~30M at k=3) -
    unless the bigger index no longer fits in `memory` (default: this machine's RAM).
    """
    if expected is None:
        return k + 1
    memory = physical_memory() if memory is None else memory
    best = None
    for m in range(k + 1, WIDTH + 1):
        tables = comb(m, k)
        if tables > PLANNED_TABLES:
            break
        cost = query_cost(k, m, expected, memory)
        if best is None or cost < best[0] * 0.9:        # more tables must pay clearly
            best = (cost, m)
    assert best is not None                             # m = k + 1 always qualifies
    return best[1]


def index_bytes(k: int, blocks: int, expected: int) -> float:
    """Estimated bytes on disk of a plan holding `expected` fingerprints."""
    return expected * (ENTRY_BYTES * comb(blocks, k) + RECORD_BYTES)


def query_cost(k: int, blocks: int, expected: int, memory: Optional[int] = None) -> float:
    """Estimated nanoseconds per query of a plan over `expected` fingerprints; with
    `memory` (bytes), seeks of a plan too big for CACHE_SHARE of it are disk reads."""
    base, extra = divmod(WIDTH, blocks)
    widths = [base + 1 if b < extra else base for b in range(blocks)]
    seek = SEEK_NS
    if memory and index_bytes(k, blocks, expected) > CACHE_SHARE * memory:
        seek = DISK_SEEK_NS
    total = 0.0
    for c in combinations(range(blocks), blocks - k):
        total += seek + SCAN_NS * expected / 2 ** sum(widths[b] for b in c)
    return total


def _check_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParameterTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return value


class Plan:
    """The checked parameters of an index and its permutation tables (`permuter` computes
    their keys in C)."""

    def __init__(self, k: int = DEFAULT_K, blocks: Optional[int] = None,
                 shards: int = DEFAULT_SHARDS) -> None:
        k = _check_int("k", k)
        if not 0 <= k < WIDTH:
            raise ParameterError(f"k ({k}) must be between 0 and {WIDTH - 1}")
        if blocks is None:
            blocks = default_blocks(k)
        blocks = _check_int("blocks", blocks)
        if blocks <= k:
            raise ParameterError(f"blocks ({blocks}) must be greater than k ({k})")
        if blocks > WIDTH:
            raise ParameterError(f"blocks ({blocks}) must be at most {WIDTH}")
        ntables = comb(blocks, k)
        if ntables > MAX_TABLES:
            raise ParameterError(
                f"blocks={blocks} with k={k} needs {ntables} tables; the limit is {MAX_TABLES} "
                f"(use fewer blocks, blocks={k + 1} needs {k + 1})")
        shards = _check_int("shards", shards)
        if not 1 <= shards <= 256 or 256 % shards:
            raise ParameterError(f"shards ({shards}) must divide 256 (1, 2, 4, ... 256)")
        self.k = k
        self.blocks = blocks
        self.shards = shards
        self.shard_bits = shards.bit_length() - 1
        base, extra = divmod(WIDTH, blocks)
        self.widths = [base + 1 if b < extra else base for b in range(blocks)]
        self.chosen = [list(c) for c in combinations(range(blocks), blocks - k)]
        self.orders = [c + [b for b in range(blocks) if b not in c] for c in self.chosen]
        self.prefix_bits = [sum(self.widths[b] for b in c) for c in self.chosen]
        self.permuter = Permuter(self.widths, self.orders, self.prefix_bits, self.shard_bits)
        starts = [sum(self.widths[:b]) for b in range(blocks)]
        # each table's prefix as a mask over the original (unpermuted) bits
        self.orig_masks = []
        for c in self.chosen:
            m = 0
            for b in c:
                m |= ((1 << self.widths[b]) - 1) << (WIDTH - starts[b] - self.widths[b])
            self.orig_masks.append(m)

    @property
    def ntables(self) -> int:
        return len(self.chosen)

    def earlier_masks(self, table: int) -> np.ndarray:
        """Prefix masks of tables before `table`, in `table`'s permuted bit order.

        A pair that agrees on one of them was already found by that earlier table.
        """
        return np.array([self.permuter.key(table, m) for m in self.orig_masks[:table]],
                        dtype=np.uint64)

    def shard_of_keys(self, keys: np.ndarray) -> np.ndarray:
        """The shard holding each permuted key (its leading shard bits), as uint64."""
        if not self.shard_bits:
            return np.zeros(len(keys), dtype=np.uint64)
        return keys >> np.uint64(WIDTH - self.shard_bits)

    def describe(self) -> dict:
        return {"k": self.k, "blocks": self.blocks, "shards": self.shards,
                "tables": self.ntables, "block_widths": self.widths,
                "prefix_bits": self.prefix_bits}
