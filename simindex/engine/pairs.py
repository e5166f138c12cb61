"""All near-duplicate pairs: of a stored index (`stored_pairs`), of fingerprints in memory
(`find_all`), and the connected components they form (`group_pairs`).

Per table, every entry sharing the table's prefix is joined with the others of its group
in C (_join.pairs_sorted); a pair that also shares the prefix of an earlier table was found
there and is skipped, so each is reported once.
"""

from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

from ._slabs import read_run
from ._join import pairs_sorted, pairs_wide
from ._layout import DB_SEQS, DB_SLABS
from ._records import records_lookup
from .records import tail
from ..values import fp_array, words_array
from .plan import DEFAULT_K, Plan, default_plan
from .shard import entry_order, load_state, runs_of


def prefix_order(keys: np.ndarray, pmask: int) -> np.ndarray:
    """A permutation grouping keys by their prefix `pmask` (the leading bits), prefixes
    ascending and positions ascending within a prefix, as pairs_sorted joins them.

    While positions fit below the prefix, one packed array is sorted by value: numpy's
    SIMD sort of 64-bit values is ~8x faster here than its argsort. Otherwise the full
    (key, position) order, which groups the prefixes too.
    """
    low = ~np.uint64(pmask)
    n = len(keys)
    if n and int(low) & (int(low) + 1) == 0 and n - 1 <= int(low):
        packed = (keys & np.uint64(pmask)) | np.arange(n, dtype=np.uint64)
        packed.sort()
        return (packed & low).astype(np.intp)
    return entry_order(keys, np.arange(n, dtype=np.uint64))


def join_table(plan: Plan, table: int, keys: np.ndarray, ids: Optional[np.ndarray],
               k: int) -> tuple:
    """(a, b, d) of the pairs within k of one table's keys (in any order; (n, words) at
    widths above 64, grouped by their first word's prefix and checked over every word),
    named by `ids` (None: by their positions in `keys`)."""
    pmask = plan.permuter.prefix_mask(table)
    wide = keys.ndim == 2
    order = prefix_order(np.ascontiguousarray(keys[:, 0]) if wide else keys, pmask)
    # positions: the order itself (a sequential copy, not a gather through it)
    named = order.astype(np.uint64) if ids is None else ids[order]
    if wide:
        return pairs_wide(np.ascontiguousarray(keys[order]), named, pmask,
                          plan.earlier_masks(table).reshape(-1, plan.words), k,
                          plan.permuter.probe_masks(table), plan.flips)
    return pairs_sorted(keys[order], named, pmask, plan.earlier_masks(table), k,
                        plan.permuter.probe_masks(table), plan.flips)


def find_all(fingerprints, k: int = DEFAULT_K, blocks: Optional[int] = None,
             prefix_blocks: Optional[int] = None, width: int = 64,
             radius: Optional[int] = None) -> list:
    """Every pair of positions (i, j), i < j, whose fingerprints are within k bits, sorted.

    In memory, with the same block-permutation tables as the index (blocks and
    prefix_blocks as Index takes them). Equal fingerprints at different positions are a
    pair. At width 128 or 256 the fingerprints are ints, big-endian bytes or an
    (n, width/64) uint64 array (most significant word first), and a plan not given is
    the planner's for their number. `radius` (default k) above k reports the pairs within
    radius that the plan's tables hold in one prefix group (within its flips) only: with
    a block per table and no flips, the pairs that share a block (bands of MinHash LSH).
    """
    radius = k if radius is None else radius
    if width != 64:
        return _find_all_wide(fingerprints, k, blocks, prefix_blocks, width, radius)
    fps = fp_array(fingerprints)
    plan = Plan(k=k, blocks=blocks, shards=1, prefix_blocks=prefix_blocks)
    parts = [join_table(plan, t, plan.permuter.keys(t, fps), None, radius)
             for t in range(plan.ntables)]
    return _sorted_pairs(parts)


def _find_all_wide(fingerprints, k, blocks, prefix_blocks, width, radius):
    fps = words_array(fingerprints, width)
    if blocks is None:
        blocks, p = default_plan(k, max(len(fps), 1), width=width)
        prefix_blocks = p if prefix_blocks is None else prefix_blocks
    plan = Plan(k=k, blocks=blocks, shards=1, prefix_blocks=prefix_blocks, width=width)
    parts = [join_table(plan, t, plan.permuter.keys(t, fps), None, radius)
             for t in range(plan.ntables)]
    return _sorted_pairs(parts)


def _sorted_pairs(parts):
    """The (a, b) pairs of the tables' (a, b, d) parts, sorted."""
    a = np.concatenate([p[0] for p in parts]) if parts else np.empty(0, np.uint64)
    b = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.uint64)
    order = np.lexsort((b, a))
    return list(zip(a[order].tolist(), b[order].tolist()))


def stored_pairs(store, k: int) -> list:
    """[(seq_a, seq_b, distance, id_a, id_b)] of every stored pair within k, once each.

    Computed whole inside one snapshot of `store` (of one ledger: an index of several has
    ledgers.stored_pairs), so iterating never holds the index open.
    Records above the lowest applied seq (not yet in every shard) join each table's entries
    directly, so the answer is exact for the snapshot.
    """
    plan = store.plan
    pa, pb, pd = [], [], []
    with store.snapshot() as (rtxn, *stxns):
        states = [load_state(t, plan.ntables) for t in stxns]
        a_min = min(s[0] for s in states)
        words = plan.words
        tseqs, tfps = tail(rtxn, a_min + 1, 0, words)

        for t in range(plan.ntables):
            earlier = plan.earlier_masks(t)
            pmask = plan.permuter.prefix_mask(t)
            tkeys = plan.permuter.keys(t, tfps)
            tshard = plan.shard_of_keys(tkeys)
            # a prefix at least as long as the shard bits stays in one shard (and so do the
            # prefixes within flips of it only when there are none)
            if plan.prefix_bits[t] >= plan.shard_bits and plan.flips == 0:
                groups = [[s] for s in range(plan.shards)]
            else:
                groups = [list(range(plan.shards))]
            for group in groups:
                ks, ss = [], []
                for s in group:
                    for run, count in runs_of(states[s][1], t):
                        part = read_run(stxns[s], DB_SLABS, run, count,
                                        low_words=words - 1)
                        kk, sq = part[0], part[1]
                        if words > 1:                  # wide: the whole key, word by word
                            kk = np.column_stack([kk, part[2]])
                        if len(tseqs):
                            applied = sq <= np.uint64(a_min)   # newer: from the tail
                            kk, sq = kk[applied], sq[applied]
                        ks.append(kk)
                        ss.append(sq)
                # the unapplied records of the group's key range, once per group
                mine = tshard == np.uint64(group[0]) if len(group) == 1 else slice(None)
                if len(tseqs):
                    ks.append(tkeys[mine])
                    ss.append(tseqs[mine])
                if sum(len(x) for x in ks) < 2:
                    continue
                if len(ks) == 1 and not len(tseqs):
                    keys, seqs = ks[0], ss[0]          # one run: already sorted
                else:                                  # (the tail is in seq order)
                    keys, seqs = np.concatenate(ks), np.concatenate(ss)
                    order = entry_order(keys if words == 1 else
                                        np.ascontiguousarray(keys[:, 0]), seqs)
                    keys, seqs = keys[order], seqs[order]
                if words == 1:
                    a, b, d = pairs_sorted(keys, seqs, pmask, earlier, k,
                                           plan.permuter.probe_masks(t), plan.flips)
                else:
                    a, b, d = pairs_wide(np.ascontiguousarray(keys), seqs, pmask,
                                         earlier.reshape(-1, words), k,
                                         plan.permuter.probe_masks(t), plan.flips)
                pa.append(a)
                pb.append(b)
                pd.append(d)
        if not pa:
            return []
        a, b, d = np.concatenate(pa), np.concatenate(pb), np.concatenate(pd)
        # every record of a pair, looked up once and in seq order
        uniq, inv = np.unique(np.concatenate([a, b]), return_inverse=True)
        fps, ids = records_lookup(rtxn, DB_SEQS, uniq, plan.words)
    live = np.array([i is not None for i in ids], dtype=bool)
    ia, ib = inv[:len(a)], inv[len(a):]
    x = np.ascontiguousarray(fps[ia] ^ fps[ib])
    dist = np.unpackbits(x.view(np.uint8).reshape(len(x), 8 * plan.words),
                         axis=1).sum(axis=1)
    # removed or replaced since indexed: gone, or its table entry disagrees
    keep = live[ia] & live[ib] & (dist == d)
    return [(sa, sb, dd, ids[ja], ids[jb])
            for sa, sb, dd, ja, jb in zip(a[keep].tolist(), b[keep].tolist(), d[keep].tolist(),
                                          ia[keep].tolist(), ib[keep].tolist())]


def group_pairs(links: Iterable[tuple]) -> list:
    """Connected components of size >= 2 of links (key_a, key_b, id_a, id_b): lists of ids
    in key order, groups in order of their smallest key (keys: seqs or input positions)."""
    parent: dict = {}
    ids: dict = {}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b, ia, ib in links:
        ids[a], ids[b] = ia, ib
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict = {}
    for x in sorted(parent):
        groups.setdefault(find(x), []).append(ids[x])
    return [groups[r] for r in sorted(groups)]
