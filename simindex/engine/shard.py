"""One shard's tables: sorted runs of packed slabs, and the state that lists them.

The shard's state records the highest record seq it has applied and its runs (table, run
id, entry count); its slab database (`blocks` on disk) holds the runs (the codec is
compiled: _slabs.pyx).
Runs are appended sorted and merged by size, like an LSM tree's tiers.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ._slabs import (
    RUN_DTYPE, delete_run, load_state, read_applied, read_run, sort_entries, write_run,
)
from ._query import scan_shard
from ._layout import (
    DB_SLABS, DB_STATE, SLAB_ENTRIES, STATE_APPLIED, STATE_DURABLE, STATE_NEXT_RUN, STATE_RUNS,
)
from ._lmdb import Txn
from .transactions import TxnRunner

__all__ = ["ShardWriter", "applied_seqs", "durable_seq", "durable_seqs", "entry_order",
           "load_state", "mark_durable", "runs_of", "scan", "sorted_entries", "RUN_DTYPE"]


def entry_order(keys: np.ndarray, seqs: np.ndarray) -> np.ndarray:
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


def sorted_entries(keys: np.ndarray, seqs: np.ndarray,
                   lows: Optional[np.ndarray] = None) -> tuple:
    """(keys, seqs, lows) in run order, (key, seq): compiled for 64-bit keys (sort_entries,
    2.5x argsort and its gathers); wide keys carry their lows along by entry_order."""
    if lows is None:
        return (*sort_entries(np.ascontiguousarray(keys), np.ascontiguousarray(seqs)), None)
    order = entry_order(keys, seqs)
    return keys[order], seqs[order], np.ascontiguousarray(lows[order])


def scan(txn: Txn, plan, shard: int, queries: np.ndarray, k: int) -> tuple:
    """(qidx, seqs, distances, applied seq) of the candidates within k of each query in
    the shard `txn` reads (the distributed query's scan; its ledger resolves them)."""
    return scan_shard(txn, plan.permuter, shard, queries, k)


def applied_seqs(txns: TxnRunner, ntables: int) -> list:
    """The applied seq of every shard of a store (`txns`: its TxnRunner, envs records then
    the shards), each from its own read transaction: what the write protocol reads of the
    shard state, without the query engine's read contexts."""
    return txns.gated(read_applied, txns.envs[1:], ntables)


def durable_seq(txn: Txn) -> int:
    """The seq up to which records/ held every record on disk when the shard `txn` reads
    last wrote its state (0: never known): records/ may never hold fewer."""
    v = txn.get(DB_STATE, STATE_DURABLE)
    return int.from_bytes(v, "little") if v is not None and len(v) == 8 else 0


def durable_seqs(txns: TxnRunner) -> list:
    """durable_seq of every shard of a store (`txns`: records, then the shards)."""
    return [txns.read_txn(env, durable_seq) for env in txns.envs[1:]]


def mark_durable(txn: Txn, seq: int) -> None:
    """Record in a shard's write transaction that records/ holds every record up to `seq`
    on disk (the mark only grows)."""
    if durable_seq(txn) < seq:
        txn.put(DB_STATE, STATE_DURABLE, int(seq).to_bytes(8, "little"))


def runs_of(runs: np.ndarray, table: int) -> list:
    """(run, count) of each run of `table` in a runs array from load_state()."""
    sel = runs[runs["table"] == table]
    return [(int(r), int(c)) for r, c in zip(sel["run"], sel["count"])]


class ShardWriter:
    """Changes to one shard inside one write transaction: new runs, merges, state.

    `inline`: the most entries the merges of this transaction rewrite in all; a merge past
    it is left for a transaction of its own (its table in `deferred`; see merge_tier),
    since LMDB holds every page a transaction writes in memory until it commits: the
    largest merges rewrite a table's whole run, and a shard has a table per permutation.
    A merge whose new run alone is past it is made here all the same (its pages are held
    already, and deferring would write the run twice)."""

    def __init__(self, txn: Txn, ntables: int, low_words: int = 0,
                 inline: Optional[int] = None) -> None:
        self.txn = txn
        self.low_words = low_words        # the further words of wide keys
        self.inline = inline
        self.inline_left = inline or 0    # entries this transaction's merges may still rewrite
        self.deferred: list = []          # tables whose merge waits for its own transaction
        self.applied, runs, self.next_run = load_state(txn, ntables)
        self.runs = list(zip(runs["table"].tolist(), runs["run"].tolist(),
                             runs["count"].tolist()))

    def table_runs(self, table: int) -> list:
        return [(run, count) for (t, run, count) in self.runs if t == table]

    def add_run(self, table: int, keys: np.ndarray, seqs: np.ndarray,
                lows: Optional[np.ndarray] = None) -> None:
        """Store sorted entries as a new run of `table`, then merge runs by size."""
        if len(keys) == 0:
            return
        run = self._new_run()
        write_run(self.txn, DB_SLABS, run, keys, seqs, lows)
        self.runs.append((table, run, len(keys)))
        self._merge_tiers(table, self.inline)

    def _new_run(self):
        run = self.next_run
        self.next_run += 1
        return run

    def _merge_tiers(self, table, inline: Optional[int] = None) -> None:
        # Merge the newest runs while the next older one is no larger than all of them
        # together (a run smaller than a slab counts as one slab): run sizes then grow
        # geometrically, so a table keeps O(log n) runs and an entry is rewritten O(log n) times.
        runs = self.table_runs(table)
        if not runs:
            return
        j = len(runs) - 1
        acc = max(runs[j][1], SLAB_ENTRIES)
        while j >= 1 and max(runs[j - 1][1], SLAB_ENTRIES) <= acc:
            acc += runs[j - 1][1]
            j -= 1
        if j < len(runs) - 1:
            size = sum(c for _, c in runs[j:])
            if inline is not None and size > self.inline_left and runs[-1][1] <= inline:
                if table not in self.deferred:
                    self.deferred.append(table)
                return
            self.inline_left -= size
            self.merge(table, [r for r, _ in runs[j:]])

    def merge_tier(self, table: int) -> bool:
        """The merge by size that `table`'s runs call for, whatever its size (a deferred
        one, in a transaction of its own); whether there was one (another writer may have
        made it)."""
        count = len(self.runs)
        self._merge_tiers(table)
        return len(self.runs) != count

    def merge(self, table: int, run_ids: list,
              keep: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> None:
        """Replace the given runs of `table` by one.

        With `keep` (seqs -> bools), only the entries it keeps stay: a compaction drops
        those of records removed or replaced before its records snapshot (see
        protocol.compact).
        """
        counts = {r: c for (t, r, c) in self.runs if t == table}
        parts = [read_run(self.txn, DB_SLABS, r, counts[r], low_words=self.low_words)
                 for r in run_ids]
        keys = np.concatenate([p[0] for p in parts])
        seqs = np.concatenate([p[1] for p in parts])
        lows = np.concatenate([p[2] for p in parts]) if self.low_words else None
        if keep is not None:
            kept = keep(seqs)
            keys, seqs = keys[kept], seqs[kept]
            lows = None if lows is None else lows[kept]
        keys, seqs, lows = sorted_entries(keys, seqs, lows)
        for r in run_ids:
            delete_run(self.txn, DB_SLABS, r)
        self.runs = [x for x in self.runs if not (x[0] == table and x[1] in run_ids)]
        if len(keys):
            run = self._new_run()
            write_run(self.txn, DB_SLABS, run, keys, seqs, lows)
            self.runs.append((table, run, len(keys)))

    def save(self, applied: Optional[int] = None) -> None:
        """Write the state: the applied seq (advanced to `applied` when given) and the runs,
        sorted by (table, run) as the scan loop reads them."""
        if applied is not None:
            self.applied = applied
        arr = np.zeros(len(self.runs), dtype=RUN_DTYPE)
        for i, (t, run, count) in enumerate(self.runs):
            arr[i] = (run, count, t, 0)
        arr = np.sort(arr, order=("table", "run"))
        self.txn.put(DB_STATE, STATE_APPLIED, int(self.applied).to_bytes(8, "little"))
        self.txn.put(DB_STATE, STATE_RUNS, arr.tobytes())
        self.txn.put(DB_STATE, STATE_NEXT_RUN, int(self.next_run).to_bytes(8, "little"))
