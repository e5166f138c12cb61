"""Index parameters: k, blocks, shards, and the block-permutation tables they imply.

Bits are cut into `blocks` (m) contiguous blocks, most significant first (the first 64 % m
blocks get one bit more). A table is a choice of `prefix_blocks` (p) blocks; its permuted
key puts the chosen blocks first, in their original order, then the rest, and its prefix
is the chosen blocks' bits. A query probes each table at every prefix within `flips` (r)
bits of its own, r the least that keeps the answer exact: two fingerprints within k bits
spread at most k differing bits over m blocks, so some p blocks hold at most
p*(k // m) + max(0, p - m + k % m) of them (spread evenly is the worst case). With
p = m - k that is 0: the paper's tables, one probe each. With p = 1 it is k // m: one table
per block probed with flips (multi-index hashing). p = 0 is one table scanned whole.
"""

from __future__ import annotations

import os
from functools import lru_cache
from itertools import combinations
from math import comb
from typing import Optional

import numpy as np

from ._layout import WIDTH
from ._permute import Permuter, WidePermuter
from ..errors import ParameterError, ParameterTypeError

WIDTHS = (64, 128, 256, 512, 768, 1024)     # bits of the fingerprints an index holds

DEFAULT_K = 3            # the largest distance a new index guarantees, unless told
MAX_TABLES = 1024
MAX_PROBES = 1 << 16     # prefixes probed per query over all tables
NOMINAL_SIZE = 1 << 20   # the size the planner assumes for k >= FLIP_K without `expected`
FLIP_K = 8               # from here k + 1 blocks leave prefixes too short to pay


# Query cost model of the planner, measured on a 2-core VM (1M-10M, k=3; see
# docs/benchmarks.md): a table costs one seek (LMDB branch pages, a slab header, a binary
# search: ~0.4 us of cache misses) plus ~3 ns per candidate scanned in its prefix range.
SEEK_NS, SCAN_NS = 400.0, 3.0
PLANNED_TABLES = 64          # the planner never picks more tables than this
# Bytes per fingerprint: 10.1 per table entry and ~67 per record (slab layout v2, after
# compact(), measured at 1M and 10M). An index larger than the page cache can hold answers
# from disk: each seek then costs a random read.
ENTRY_BYTES, RECORD_BYTES = 10.1, 67.0
DISK_SEEK_NS = 100_000.0
CACHE_SHARE = 0.6            # of physical memory an index may count on for its pages


# Fingerprints per shard the planner aims at when told the expected size. Each batch of
# records commits every shard it touches, one fsync each, so a small index wants few shards;
# shards are also the unit of parallel writes (`jobs`) and of distribution (Ray). On the
# same VM (k=3, 4 tables, batches of 1,000 with sync; 1M / 10M): 1 shard 267k / 333k rec/s,
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


def flips_needed(k: int, blocks: int, prefix_blocks: int) -> int:
    """The flip radius r that makes a plan exact: the most differing bits the least
    differing `prefix_blocks` of `blocks` blocks can hold when k bits differ."""
    q, rem = divmod(k, blocks)
    return prefix_blocks * q + max(0, prefix_blocks - blocks + rem)


@lru_cache(maxsize=4096)
def probe_count(prefix_bits: int, flips: int) -> int:
    """Prefixes within `flips` bits of one prefix of `prefix_bits` bits (of which a range
    scan uses the first 64)."""
    prefix_bits = min(prefix_bits, 64)
    return sum(comb(prefix_bits, i) for i in range(min(flips, prefix_bits) + 1))


def block_widths(blocks: int, width: int = WIDTH) -> list:
    base, extra = divmod(width, blocks)
    return [base + 1 if b < extra else base for b in range(blocks)]


def _probes(m: int, p: int, r: int, width: int) -> int:
    """Probes of all C(m, p) tables at flip radius r: a table's prefix has p * base + j
    bits when j of its blocks are the wider ones, and C(extra, j) * C(m - extra, p - j)
    tables do."""
    base, extra = divmod(width, m)
    total = 0
    for j in range(max(0, p - (m - extra)), min(extra, p) + 1):
        total += comb(extra, j) * comb(m - extra, p - j) * probe_count(p * base + j, r)
        if total > MAX_PROBES:
            break
    return total


@lru_cache(maxsize=256)
def candidate_plans(k: int, width: int = WIDTH):
    """Every (blocks, prefix_blocks) the planner weighs for k: at most PLANNED_TABLES
    tables and MAX_PROBES probes, fewest tables then probes first."""
    out = []
    for m in range(1, width + 1):
        # comb(m, p) rises to p = m / 2 and falls after: only the ends can be small
        low = []
        for p in range(0, m // 2 + 1):
            if comb(m, p) > PLANNED_TABLES:
                break
            low.append(p)
        for p in sorted(set(low) | {m - p for p in low}):
            probes = _probes(m, p, flips_needed(k, m, p), width)
            if probes <= MAX_PROBES:
                out.append((comb(m, p), probes, m, p))
    out.sort()
    plans, scan = [], False
    for tables, probes, m, p in out:
        if p == 0:                  # every p = 0 plan is the same one scan
            if scan:
                continue
            scan = True
        plans.append((m, p))
    return tuple(plans)


def default_plan(k: int, expected: Optional[int] = None,
                 memory: Optional[int] = None, width: int = WIDTH) -> tuple:
    """(blocks, prefix_blocks) of a new index. Without `expected`: k + 1 blocks, k + 1
    tables of one probe (below FLIP_K), or the plan of least estimated query time for
    NOMINAL_SIZE fingerprints (from FLIP_K, where k + 1 blocks leave prefixes of 7 bits or
    less). With `expected` (fingerprints the index will hold): the plan of least estimated
    query time, more tables only when they pay clearly (10%), unless the bigger index no
    longer fits in `memory` (default: this machine's RAM).
    """
    if expected is None:
        if k < FLIP_K and width == WIDTH:
            return k + 1, 1
        expected = NOMINAL_SIZE
    memory = physical_memory() if memory is None else memory
    best = None
    for m, p in candidate_plans(k, width):
        cost = query_cost(k, m, expected, memory, p, width)
        if best is None or cost < best[0] * 0.9:
            best = (cost, m, p)
    assert best is not None                             # p = 0 always qualifies
    return best[1], best[2]


def default_blocks(k: int, expected: Optional[int] = None,
                   memory: Optional[int] = None) -> int:
    """The blocks of default_plan()."""
    return default_plan(k, expected, memory)[0]


def index_bytes(k: int, blocks: int, expected: int, prefix_blocks: Optional[int] = None,
                width: int = WIDTH) -> float:
    """Estimated bytes on disk of a plan holding `expected` fingerprints (a wide key
    stores its words after the first whole)."""
    p = blocks - k if prefix_blocks is None else prefix_blocks
    extra = (width - WIDTH) // 8
    return expected * ((ENTRY_BYTES + extra) * comb(blocks, p) + RECORD_BYTES + extra)


def query_cost(k: int, blocks: int, expected: int, memory: Optional[int] = None,
               prefix_blocks: Optional[int] = None, width: int = WIDTH) -> float:
    """Estimated nanoseconds per query of a plan over `expected` fingerprints: per probe a
    seek and the candidates of its prefix range; with `memory` (bytes), seeks of a plan too
    big for CACHE_SHARE of it are disk reads."""
    p = blocks - k if prefix_blocks is None else prefix_blocks
    r = flips_needed(k, blocks, p)
    seek = SEEK_NS
    if memory and index_bytes(k, blocks, expected, p, width) > CACHE_SHARE * memory:
        seek = DISK_SEEK_NS
    # C(extra, j) * C(blocks - extra, p - j) tables have j of the wider blocks
    base, extra = divmod(width, blocks)
    total = 0.0
    for j in range(max(0, p - (blocks - extra)), min(extra, p) + 1):
        bits = min(p * base + j, 64)
        tables = comb(extra, j) * comb(blocks - extra, p - j)
        total += tables * probe_count(bits, r) * (seek + SCAN_NS * expected / 2 ** bits)
    return total


def _check_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParameterTypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return value


class Plan:
    """The checked parameters of an index and its permutation tables (`permuter` computes
    their keys and probes in C)."""

    def __init__(self, k: int = DEFAULT_K, blocks: Optional[int] = None,
                 shards: int = DEFAULT_SHARDS, prefix_blocks: Optional[int] = None,
                 width: int = WIDTH) -> None:
        width = _check_int("width", width)
        if width not in WIDTHS:
            raise ParameterError(f"width ({width}) must be one of {', '.join(map(str, WIDTHS))}")
        k = _check_int("k", k)
        if not 0 <= k < width:
            raise ParameterError(f"k ({k}) must be between 0 and {width - 1}")
        if blocks is None:
            blocks, p = default_plan(k, width=width)
            if prefix_blocks is None:
                prefix_blocks = p
        blocks = _check_int("blocks", blocks)
        if not 1 <= blocks <= width:
            raise ParameterError(f"blocks ({blocks}) must be between 1 and {width}")
        if prefix_blocks is None:
            if blocks <= k:
                raise ParameterError(
                    f"blocks ({blocks}) must be greater than k ({k}), or give prefix_blocks "
                    f"for a plan with flips")
            prefix_blocks = blocks - k
        prefix_blocks = _check_int("prefix_blocks", prefix_blocks)
        if not 0 <= prefix_blocks <= blocks:
            raise ParameterError(f"prefix_blocks ({prefix_blocks}) must be between 0 and "
                                 f"blocks ({blocks})")
        ntables = comb(blocks, prefix_blocks)
        if ntables > MAX_TABLES:
            raise ParameterError(
                f"blocks={blocks} with prefix_blocks={prefix_blocks} needs {ntables} tables; "
                f"the limit is {MAX_TABLES} (use fewer blocks, or fewer prefix blocks with "
                f"flips)")
        shards = _check_int("shards", shards)
        if not 1 <= shards <= 256 or 256 % shards:
            raise ParameterError(f"shards ({shards}) must divide 256 (1, 2, 4, ... 256)")
        self.width = width
        self.words = width // 64
        self.k = k
        self.blocks = blocks
        self.prefix_blocks = prefix_blocks
        self.flips = flips_needed(k, blocks, prefix_blocks)
        self.shards = shards
        self.shard_bits = shards.bit_length() - 1
        self.widths = block_widths(blocks, width)
        self.chosen = [list(c) for c in combinations(range(blocks), prefix_blocks)]
        self.orders = [c + [b for b in range(blocks) if b not in c] for c in self.chosen]
        self.prefix_bits = [sum(self.widths[b] for b in c) for c in self.chosen]
        self.probes = [probe_count(b, self.flips) for b in self.prefix_bits]
        if sum(self.probes) > MAX_PROBES:
            raise ParameterError(
                f"blocks={blocks} with prefix_blocks={prefix_blocks} and k={k} probes "
                f"{sum(self.probes)} prefixes per query (flips={self.flips}); the limit is "
                f"{MAX_PROBES} (see `simindex plan`)")
        self.permuter = Permuter(self.widths, self.orders, self.prefix_bits, self.shard_bits,
                                 self.flips) if width == WIDTH else \
            WidePermuter(self.words, self.widths, self.orders, self.prefix_bits,
                         self.shard_bits, self.flips, k)
        starts = [sum(self.widths[:b]) for b in range(blocks)]
        # each table's prefix as a mask over the original (unpermuted) bits: its chosen
        # blocks, as far as a range scan reads them (the first 64 bits of the key)
        self.orig_masks = []
        for c in self.chosen:
            m, left = 0, 64
            for b in c:
                take = min(self.widths[b], left)
                left -= take
                m |= ((1 << take) - 1) << (width - starts[b] - take)
            self.orig_masks.append(m)

    @property
    def ntables(self) -> int:
        return len(self.chosen)

    @property
    def classic(self) -> bool:
        """True for the paper's plan (prefix_blocks = blocks - k: no flips), which older
        versions read too."""
        return self.blocks > self.k and self.prefix_blocks == self.blocks - self.k

    def earlier_masks(self, table: int) -> np.ndarray:
        """Prefix masks of tables before `table`, in `table`'s permuted bit order ((e,)
        uint64 at width 64, (e, words) above).

        A pair within `flips` bits on one of them was already found by that earlier table.
        """
        keys = [self.permuter.key(table, m) for m in self.orig_masks[:table]]
        if self.width == WIDTH:
            return np.array(keys, dtype=np.uint64)
        raw = b"".join(x.to_bytes(self.width // 8, "big") for x in keys)
        return np.frombuffer(raw, dtype=">u8").astype(np.uint64).reshape(len(keys),
                                                                          self.words)

    def shard_of_keys(self, keys: np.ndarray) -> np.ndarray:
        """The shard holding each permuted key (its leading shard bits), as uint64."""
        if not self.shard_bits:
            return np.zeros(len(keys), dtype=np.uint64)
        first = keys if keys.ndim == 1 else keys[:, 0]
        return first >> np.uint64(64 - self.shard_bits)

    def describe(self) -> dict:
        return {"width": self.width, "k": self.k, "blocks": self.blocks,
                "prefix_blocks": self.prefix_blocks, "flips": self.flips,
                "shards": self.shards, "tables": self.ntables, "block_widths": self.widths,
                "prefix_bits": self.prefix_bits, "probes": sum(self.probes)}
