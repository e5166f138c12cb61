"""The write protocol of an index, in one place (README "How it works", "Guarantees").

1. records/ commits first: that commit is the durability point (`commit`).
2. Each shard then applies the records it has not seen (seq above its applied seq) as one
   new sorted run per table and advances its applied seq in the same shard transaction
   (`apply`); `catch_up` does it for every shard of a store.
3. After a crash, a writable open replays what any shard missed (`catch_up`) after making
   sure no seq a shard already applied is handed out again (`raise_seq_floor`). Until then
   queries check the unapplied records directly, so answers stay exact.

The single-process store and the Ray servers both write through these functions and
through the runners of simindex/transactions.py, so the rules cannot drift apart.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import numpy as np

from . import records
from ._lmdb import Env, Txn
from .plan import Plan
from .shard import ShardWriter, sorted_entries
from .transactions import Transactions

RECORD_CHUNK = 1 << 18     # records per records/ transaction of a large add
# records per shard application pass: each pass adds a run per table, and later merges leave
# its pages free in the file, so bulk loads want few passes (a pass of 16.7M holds ~0.6 GB)
APPLY_CHUNK = 1 << 24
LAG_LIMIT = 256            # records a shard with nothing new may stay behind
# what a failed shard write leaves (added to its error message)
SHARD_WRITE_FAILED = ("the records are committed and queries find them, and reopening the "
                      "index brings its tables up to date")


def commit(txns: Transactions, records_env: Env, idkeys: list, fps: np.ndarray,
           metas: list, replace: bool = True) -> list:
    """Commit records to records/ in chunks of RECORD_CHUNK, each atomic (and durable with
    sync); returns [(seq0, count)] of the chunks: their records got seqs seq0, seq0 + 1...
    With replace=False a chunk holding an id already stored (or twice) raises InputError
    and writes nothing."""
    out = []
    for i in range(0, len(idkeys), RECORD_CHUNK):
        j = i + RECORD_CHUNK
        seq0 = txns.write(records_env,
                          lambda txn: records.put(txn, idkeys[i:j], fps[i:j], metas[i:j],
                                                  replace))
        out.append((seq0, len(idkeys[i:j])))
    return out


class Entries:
    """The table entries of a batch of records (ascending seqs): per table, the permuted
    keys sorted as runs store them, and where each shard's key range starts. With `shard`,
    only that shard's entries are kept (and sorted): a Ray shard server's part."""

    def __init__(self, plan: Plan, seqs: np.ndarray, fps: np.ndarray,
                 shard: Optional[int] = None) -> None:
        self.plan = plan
        self.first = int(seqs[0]) if len(seqs) else 0
        self.tables = []
        bounds = np.arange(plan.shards + 1, dtype=np.uint64)
        for t in range(plan.ntables):
            keys, sq, tails = plan.permuter.keys(t, fps), seqs, None
            if keys.ndim == 2:           # wide: sorted by the first word, the rest carried
                keys, tails = np.ascontiguousarray(keys[:, 0]), keys[:, 1:]
            if shard is not None and plan.shard_bits:
                mine = plan.shard_of_keys(keys) == np.uint64(shard)
                keys, sq = keys[mine], sq[mine]
                tails = None if tails is None else tails[mine]
            keys, sq, tails = sorted_entries(keys, sq, tails)
            # keys are sorted, and a shard is a range of leading bits: split by search
            cuts = np.searchsorted(plan.shard_of_keys(keys), bounds) if plan.shard_bits \
                else np.array([0, len(keys)])
            self.tables.append((keys, sq, tails, cuts))

    def of(self, table: int, shard: int) -> tuple:
        """(keys, seqs, tails or None) of `table` in `shard`, sorted (tails: the further
        words of wide keys)."""
        keys, sq, tails, cuts = self.tables[table]
        a, b = cuts[shard], cuts[shard + 1]
        return keys[a:b], sq[a:b], None if tails is None else tails[a:b]

    def newer(self, shard: int, applied: int) -> bool:
        """Whether `shard` holds an entry of a record above `applied`."""
        return any((self.of(t, shard)[1] > np.uint64(applied)).any()
                   for t in range(len(self.tables)))


def apply(txn: Txn, plan: Plan, shard: int, entries: Entries, last: int,
          since: Optional[int] = None) -> int:
    """Apply a batch of records (those with seqs up to `last`; `entries` holds at least
    every one with an entry in this shard) to `shard` in its write transaction `txn`, and
    advance its applied seq to `last`. Returns the shard's applied seq after it.

    A shard that already applied `last` is left as it is (another writer got there first);
    entries it already holds are skipped. With `since` (the newest seq below the batch), a
    shard that has not applied `since` missed earlier records and is left alone too: the
    caller must catch it up first (its applied seq, below `since`, says so).
    """
    w = ShardWriter(txn, plan.ntables, plan.words - 1)
    if w.applied >= last or (since is not None and w.applied < since):
        return w.applied
    for t in range(plan.ntables):
        k, q, tl = entries.of(t, shard)
        if w.applied >= entries.first:
            keep = q > np.uint64(w.applied)
            k, q = k[keep], q[keep]
            tl = None if tl is None else tl[keep]
        w.add_run(t, np.ascontiguousarray(k), np.ascontiguousarray(q),
                  None if tl is None else np.ascontiguousarray(tl))
    w.save(applied=last)
    return last


def catch_up(txns: Transactions, plan: Plan, force: bool = True, jobs: int = 1) -> None:
    """Bring the shards of a store (txns.envs: records, then each shard) up to the last
    committed record, in passes of APPLY_CHUNK records.

    With force=False a shard that none of the new records touch is left behind by up to
    LAG_LIMIT records (queries check those directly), saving its commit and fsync. `jobs`
    shards are written at once (each its own environment and write lock; the block writes
    and commits release the GIL).
    """
    txns.check_open()
    rec, shards = txns.envs[0], txns.envs[1:]
    while True:
        applied = txns.read(lambda ctx: ctx.applied(plan.ntables))
        start = min(applied) + 1
        seqs, fps, last = txns.read_txn(rec, lambda txn: (
            *records.tail(txn, start, APPLY_CHUNK, plan.words), records.last_seq(txn)))
        if len(seqs) == 0:
            if force and last >= start:
                _advance(txns, plan, shards, applied, last)   # only removed records above
            return
        entries = Entries(plan, seqs, fps)
        top = int(seqs[-1])
        todo = [s for s in range(plan.shards)
                if force or top - applied[s] >= LAG_LIMIT or entries.newer(s, applied[s])]

        def one(s):
            txns.write(shards[s], lambda txn: apply(txn, plan, s, entries, top),
                       then=SHARD_WRITE_FAILED)
        if jobs > 1 and len(todo) > 1:
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                list(pool.map(one, todo))
        else:
            for s in todo:
                one(s)
        if len(seqs) < APPLY_CHUNK and not (force and top < last):
            return


def _advance(txns, plan, shards, applied, last):
    """Move lagging shards' applied seq up to `last` when no live record lies between."""
    for s, a in enumerate(applied):
        if a < last:
            def bump(txn):
                w = ShardWriter(txn, plan.ntables, plan.words - 1)
                if w.applied < last:
                    w.save(applied=last)
            txns.write(shards[s], bump, then=SHARD_WRITE_FAILED)


def raise_seq_floor(txns: Transactions, records_env: Env, top: int) -> None:
    """Never hand out a seq at or below `top` (the highest seq any shard applied): after an
    OS crash with sync=False a shard may hold seqs the records lost, and their stale table
    entries must never match a new record."""
    txns.write(records_env, lambda txn: records.raise_next_seq(txn, top))
