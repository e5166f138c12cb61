"""One shard: an LMDB environment holding, for every table, sorted runs of packed blocks.

The shard's `state` database records the highest record seq it has applied and its runs
(table, run id, entry count); `blocks` holds the runs (see ext/simindex/_core.pyx for the
block format). Runs are appended sorted and merged by size, like an LSM tree's tiers.
"""

import numpy as np

from . import _core

STATE_DB, BLOCKS_DB = "state", "blocks"
RUN_DTYPE = np.dtype([("run", "<u8"), ("count", "<u8"), ("table", "<u4"), ("pad", "<u4")])
BLOCK_ENTRIES = _core.BLOCK_ENTRIES


def entry_order(keys, seqs):
    """The permutation sorting entries by (key, seq), as runs store them.

    numpy's unstable sort of 64-bit keys is SIMD and 3-4x faster than lexsort; only the
    groups of equal keys (duplicate fingerprints) are then put in seq order.
    """
    order = np.argsort(keys)
    ks = keys[order]
    dup = ks[1:] == ks[:-1]
    if dup.any():
        grouped = np.zeros(len(ks), dtype=bool)
        grouped[1:] |= dup
        grouped[:-1] |= dup
        pos = np.flatnonzero(grouped)
        sub = order[pos]
        order[pos] = sub[np.lexsort((seqs[sub], keys[sub]))]
    return order


def prefix_order(keys, pmask):
    """A permutation grouping keys by their prefix `pmask` (the leading bits), prefixes
    ascending and positions ascending within a prefix, as `_core.pairs_sorted` joins them.

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


def load_state(txn):
    """(applied seq, runs array sorted by (table, run), next run id) of a shard."""
    a = txn.get(STATE_DB, b"applied")
    applied = int.from_bytes(a, "little") if a is not None else 0
    r = txn.get(STATE_DB, b"runs")
    runs = np.frombuffer(r, dtype=RUN_DTYPE).copy() if r else np.empty(0, RUN_DTYPE)
    nr = txn.get(STATE_DB, b"next_run")
    next_run = int.from_bytes(nr, "little") if nr is not None else 1
    return applied, runs, next_run


def save_state(txn, applied, runs, next_run):
    runs = np.sort(runs, order=("table", "run"))
    txn.put(STATE_DB, b"applied", int(applied).to_bytes(8, "little"))
    txn.put(STATE_DB, b"runs", runs.astype(RUN_DTYPE).tobytes())
    txn.put(STATE_DB, b"next_run", int(next_run).to_bytes(8, "little"))


class ShardWriter:
    """Changes to one shard inside one write transaction: new runs, merges, state."""

    def __init__(self, txn):
        self.txn = txn
        self.applied, runs, self.next_run = load_state(txn)
        self.runs = [(int(r["table"]), int(r["run"]), int(r["count"])) for r in runs]

    def table_runs(self, table):
        return [(run, count) for (t, run, count) in self.runs if t == table]

    def add_run(self, table, keys, seqs):
        """Store sorted entries as a new run of `table`, then merge runs by size."""
        if len(keys) == 0:
            return
        run = self._new_run()
        _core.write_run(self.txn, BLOCKS_DB, run, keys, seqs)
        self.runs.append((table, run, len(keys)))
        self._merge_tiers(table)

    def _new_run(self):
        run = self.next_run
        self.next_run += 1
        return run

    def _merge_tiers(self, table):
        # Merge the newest runs while the next older one is no larger than all of them
        # together (a run smaller than a block counts as one block): run sizes then grow
        # geometrically, so a table keeps O(log n) runs and an entry is rewritten O(log n) times.
        runs = self.table_runs(table)
        j = len(runs) - 1
        acc = max(runs[j][1], BLOCK_ENTRIES)
        while j >= 1 and max(runs[j - 1][1], BLOCK_ENTRIES) <= acc:
            acc += runs[j - 1][1]
            j -= 1
        if j < len(runs) - 1:
            self.merge(table, [r for r, _ in runs[j:]])

    def read(self, run, count, check=False):
        return _core.read_run(self.txn, BLOCKS_DB, run, count, check)

    def merge(self, table, run_ids, live=None, newest=0):
        """Replace the given runs of `table` by one.

        With `live` (the sorted seqs of a records snapshot whose newest seq is `newest`),
        entries of records removed or replaced before that snapshot are dropped; entries
        above `newest` belong to records added since and are kept.
        """
        counts = {r: c for (t, r, c) in self.runs if t == table}
        parts = [self.read(r, counts[r]) for r in run_ids]
        keys = np.concatenate([p[0] for p in parts])
        seqs = np.concatenate([p[1] for p in parts])
        if live is not None:
            keep = np.isin(seqs, live) | (seqs > np.uint64(newest))
            keys, seqs = keys[keep], seqs[keep]
        order = entry_order(keys, seqs)
        for r in run_ids:
            _core.delete_run(self.txn, BLOCKS_DB, r)
        self.runs = [x for x in self.runs if not (x[0] == table and x[1] in run_ids)]
        if len(keys):
            run = self._new_run()
            _core.write_run(self.txn, BLOCKS_DB, run, keys[order], seqs[order])
            self.runs.append((table, run, len(keys)))

    def save(self, applied=None):
        if applied is not None:
            self.applied = applied
        arr = np.zeros(len(self.runs), dtype=RUN_DTYPE)
        for i, (t, run, count) in enumerate(self.runs):
            arr[i] = (run, count, t, 0)
        save_state(self.txn, self.applied, arr, self.next_run)


def runs_of(runs, table):
    """(run, count) of each run of `table` in a runs array from load_state()."""
    sel = runs[runs["table"] == table]
    return [(int(r), int(c)) for r, c in zip(sel["run"], sel["count"])]
