"""The write protocol of an index, in one place (docs/design/how-it-works.md, guarantees.md).

1. records/ commits first: that commit is the durability point (`commit`).
2. Each shard then applies the records it has not seen (seq above its applied seq) as one
   new sorted run per table and advances its applied seq in the same shard transaction
   (`apply`); `catch_up` does it for every shard of a store.
3. After a crash, a writable open replays what any shard missed (`catch_up`) after making
   sure no seq a shard already applied is handed out again (`raise_seq_floor`). Until then
   queries check the unapplied records directly, so answers stay exact.
4. A bulk load may compute its first pass while its records commit (`commit_prepared`);
   the shards apply it only if the records got the seqs it was made for, still after
   step 1.
5. Compaction (`compact`) rewrites each shard's runs of a table as one in a shard write
   transaction of its own, dropping only entries of records removed before its records
   snapshot; records/ then forgets the removals it counted.

The single-process store and the Ray servers both write through these functions and
through the runners of simindex/engine/transactions.py, so the rules cannot drift apart.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import NamedTuple, Optional

import numpy as np

from . import records
from ._slabs import sort_entries
from ._lmdb import Env, Txn
from ._permute import Permuter
from .plan import Plan
from .shard import ShardWriter, applied_seqs, durable_seqs, mark_durable, sorted_entries
from .transactions import TxnRunner

# records per records/ transaction of a large add. LMDB gives a transaction's pages in the
# order it writes them, its seqs (records) then its ids, so the larger the transaction the
# longer the stretches of seqs a cold query reads through the kernel's readahead (8 MiB on
# the benchmarks' VM) without the ids it does not need: a cold batch at 1M reads 64 MB of
# records/ with 2**18 (seqs and ids in 10 and 7 MB stretches) and 40 MB with 2**20 (~65 MB
# of dirty pages per transaction with short ids; LMDB spills beyond 512 MB)
RECORD_CHUNK = 1 << 20
# records per shard application pass (64-bit; wide fingerprints: this over their words).
# Each pass adds one run per table to a shard, and a later pass's run is merged into the
# runs before it, rewriting their entries and leaving the old pages free in the file, so a
# bulk load wants one pass (2 GiB of seqs and fingerprints; 100M in 6 passes of 16.7M
# built in 119 s to 23.1 B per entry, in one pass 70-81 s to 10.1 B)
APPLY_CHUNK = 1 << 27
# the most entries a merge rewrites inside the transaction that applies records (about
# 32 MB of a table's new run, which LMDB holds in memory until commit); larger merges
# commit on their own, a table at a time, so a transaction holds one large run at most
MERGE_INLINE = 1 << 20
# table entries a pass sorts at once (64-bit; 2 GiB of keys and seqs): a pass with more
# builds and writes its shards a group at a time, each group gathering its own entries of
# every table in one pass over the records (by their shard ids, computed once) and
# sorting them, in buffers every group fills again (100M records, 10 tables, 8 shards:
# 8 groups, peak RSS 9.0 GB with the pass's seqs and fingerprints). Groups are sized so
# that two sets of buffers fit this when they can: the next group is then gathered and
# sorted on a second thread while one is written (100M, 4 tables: 8 groups of one shard,
# peak RSS 7.0 GB as with 4 groups in one set; the build 47.7-51.3 s, 59.8 s without the
# overlap)
SORT_ENTRIES = 1 << 27
# Group commit: add_many commits its records (the durability point) and applies them to
# the shards only once they lag by this many records, so batches of 1,000 pay one records
# commit each and the shards' commits and merges once per ~4 batches (100M, 10 tables:
# 8 shard commits and fsyncs on every batch would be 60% of its time). Queries check the
# records not yet in a shard directly; a read context keeps them across calls, so that
# costs each query a pass over at most this many fingerprints, not a read of their records.
GROUP_LIMIT = 4096
# records a shard may stay behind after add_unique (its admission query, inside the records
# write, reads them from its own snapshot) and, with nothing new for it, on the Ray driver
LAG_LIMIT = 256
# records in one add from which a bulk load computes their table entries on a second thread
# while they commit (the seqs they will get are known before, when no shard lags): the
# entries need not wait for the commit, nor read the records back (10M records, 4 tables:
# commit 1.4 s, entries 1.4 s, applying them 1.2 s, reading the records back 0.24 s)
PREPARE_MIN = 1 << 16
# what a failed shard write leaves (added to its error message)
SHARD_WRITE_FAILED = ("the records are committed and queries find them, and reopening the "
                      "index brings its tables up to date")
MERGE_FAILED = ("the records are committed and applied, and queries find them; the table's "
                "runs stay unmerged until a later write to it or compact() merges them")


def commit(txns: TxnRunner, records_env: Env, idkeys: list, fps: np.ndarray,
           metas: list, replace: bool = True) -> list:
    """Commit records to records/ in chunks of RECORD_CHUNK, each atomic (and durable with
    sync); returns [(seq0, count, new)] of the chunks: their records got seqs seq0, seq0 +
    1..., and `new` of their ids were not stored before (count - new replaced a record).
    With replace=False a chunk holding an id already stored (or twice) raises InputError
    and writes nothing."""
    def put(txn, i, j):
        before = records.count(txn)
        seq0 = records.put(txn, idkeys[i:j], fps[i:j], metas[i:j], replace)
        return seq0, len(idkeys[i:j]), records.count(txn) - before
    return [txns.write(records_env, lambda txn: put(txn, i, i + RECORD_CHUNK))
            for i in range(0, len(idkeys), RECORD_CHUNK)]


def commit_prepared(txns: TxnRunner, records_env: Env, plan: Plan, idkeys: list,
                    fps: np.ndarray, metas: list, replace: bool = True,
                    jobs: int = 1) -> Optional[Prepared]:
    """commit() the records of a bulk load while a second thread prepares their pass for
    the seqs they will get if no other writer commits first: the table entries of its first
    group of shards (of all shards when they fit one), and in a pass of several groups every
    record's shard ids and the buffers the groups fill. Returns that for catch_up when the
    records got exactly those seqs, every id new, else None. A batch of fewer than
    PREPARE_MIN records, of more than one pass, that group commit leaves waiting, or of
    wide fingerprints in several groups, is not prepared."""
    n = len(idkeys)
    group, sets = _grouping(plan, n, jobs)
    if n < max(PREPARE_MIN, GROUP_LIMIT) or n > max(1, APPLY_CHUNK // plan.words) or \
            (group < plan.shards and not isinstance(plan.permuter, Permuter)):
        commit(txns, records_env, idkeys, fps, metas, replace)
        return None
    first = txns.read_txn(records_env, records.next_seq)
    if any(a != first - 1 for a in applied_seqs(txns, plan.ntables)):
        commit(txns, records_env, idkeys, fps, metas, replace)     # records wait already
        return None
    seqs = np.arange(first, first + n, dtype=np.uint64)
    # one group: the tables are filled by the second thread, and by this one once the
    # records are committed (10M, 4 tables: the entries took 2.3 s beside a 1.5 s commit)
    whole = Entries(plan, seqs, fps, lazy=True) if group == plan.shards else None

    def prepare() -> Prepared:
        if whole is not None:
            whole.fill()
            return Prepared(seqs, fps, None, None, whole)
        perm = plan.permuter
        assert isinstance(perm, Permuter)            # (wide passes in groups: not prepared)
        split = perm.shard_ids(fps)
        work = group_buffers(split[1], group, sets)
        return Prepared(seqs, fps, split, work,
                        Entries(plan, seqs, fps, shards=(0, group), split=split, work=work[0]))
    with ThreadPoolExecutor(max_workers=1) as pool:
        made = pool.submit(prepare)
        chunks = commit(txns, records_env, idkeys, fps, metas, replace)
        # (a failed commit raises once the entries are done: the pool waits for them)
        if whole is not None:
            try:
                whole.fill()
            except MemoryError:
                pass                 # the table it took stays empty: not used below
    if made.exception() is not None or not made.result().entries.complete():
        return None                  # catch_up computes them again, and raises there
    expect = first
    for seq0, count, new in chunks:
        if seq0 != expect or new != count:
            return None              # another writer's records came between, or a replace
        expect += count
    return made.result()


class Prepared(NamedTuple):
    """A bulk load's first application pass, made while its records committed."""
    seqs: np.ndarray
    fps: np.ndarray
    split: Optional[tuple]           # Permuter.shard_ids(fps), when the pass has groups
    work: Optional[tuple]            # group_buffers' sets, when the pass has groups
    entries: Entries                 # of the first group (of every shard when one group)


def _grouping(plan: Plan, n: int, jobs: int) -> tuple:
    """(shards a pass of n records builds at once, sets of buffers): all shards when their
    entries fit SORT_ENTRIES (or `jobs` says so); else groups of at least `jobs` shards,
    sized so that two sets fit it (one gathered while the other is written) when they can,
    and as large as one set allows when they cannot."""
    per_shard = max(1, n * plan.ntables * plan.words // plan.shards)
    whole = min(plan.shards, max(jobs, SORT_ENTRIES // per_shard, 1))
    if whole == plan.shards:
        return whole, 1
    group = min(plan.shards, max(jobs, SORT_ENTRIES // 2 // per_shard, 1))
    return (group, 2) if 2 * group * per_shard <= SORT_ENTRIES else (whole, 1)


class Entries:
    """The table entries of a batch of records (ascending seqs): per table, the permuted
    keys sorted as runs store them, and where each shard's key range starts. With
    `shards` (lo, hi), only the entries of shards lo..hi-1 are computed and kept: a bulk
    load's group of shards, or a Ray shard server's part."""

    def __init__(self, plan: Plan, seqs: np.ndarray, fps: np.ndarray,
                 shards: Optional[tuple] = None, split: Optional[tuple] = None,
                 work: Optional[tuple] = None, lazy: bool = False) -> None:
        """`split`: plan.permuter.shard_ids(fps) when the caller already has it (64-bit);
        `work`: a set of group_buffers' arrays to fill (a bulk load's groups reuse them).
        `lazy` (not for a group gathered through `split`): the tables are left to fill()."""
        self.plan = plan
        self.first = int(seqs[0]) if len(seqs) else 0
        self.tables: list = [None] * plan.ntables
        self._seqs, self._fps = seqs, fps
        lo, hi = self._range = shards if shards is not None else (0, plan.shards)
        self._part = bool(plan.shard_bits) and (lo, hi) != (0, plan.shards)
        self._todo = iter(range(plan.ntables))
        self._taking = threading.Lock()
        perm = plan.permuter
        if self._part and isinstance(perm, Permuter):
            self.tables = []
            self._gather(perm, seqs, fps, lo, hi, split or perm.shard_ids(fps), work)
        elif not lazy:
            self.fill()

    def fill(self) -> None:
        """Compute the tables no call has taken yet, one at a time: two threads filling at
        once share the tables (the permutes and sorts release the GIL)."""
        while True:
            with self._taking:
                t = next(self._todo, None)
            if t is None:
                return
            self.tables[t] = self._table(t)

    def complete(self) -> bool:
        return all(t is not None for t in self.tables)

    def _table(self, t: int) -> tuple:
        plan, (lo, hi) = self.plan, self._range
        keys, sq, lows = plan.permuter.keys(t, self._fps), self._seqs, None
        if keys.ndim == 2:           # wide: sorted by the first word, the rest carried
            keys, lows = np.ascontiguousarray(keys[:, 0]), keys[:, 1:]
        if self._part:
            s = plan.shard_of_keys(keys)
            mine = (s >= np.uint64(lo)) & (s < np.uint64(hi))
            keys, sq = keys[mine], sq[mine]
            lows = None if lows is None else lows[mine]
        keys, sq, lows = sorted_entries(keys, sq, lows)
        # keys are sorted, and a shard is a range of leading bits: split by search
        cuts = np.concatenate(([0], np.searchsorted(keys, _shard_starts(plan)),
                               [len(keys)]))
        return keys, sq, lows, cuts

    def _gather(self, perm, seqs, fps, lo, hi, split, work):
        """64-bit, a group of shards: every table's entries gathered in one pass over the
        records by their shard ids, then each table's sorted (into `work` when given)."""
        ids, counts = split
        own = counts[:, lo:hi]                      # entries per table and shard
        sizes = own.sum(axis=1) + 1                 # + gather_shards' spare slot
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        ak, aq, bk, bq = work if work is not None else group_buffers(own, hi - lo)[0]
        got = perm.gather_shards(fps, seqs, ids, lo, hi, ak, aq, starts)
        if not np.array_equal(got, sizes - 1):
            raise ValueError("shard ids and their counts disagree")
        for t in range(self.plan.ntables):
            a, b = int(starts[t]), int(starts[t] + got[t])
            keys, sq = sort_entries(ak[a:b], aq[a:b], bk[a:b], bq[a:b])
            cuts = np.zeros(self.plan.shards + 1, dtype=np.int64)
            cuts[lo + 1:hi + 1] = np.cumsum(own[t])
            cuts[hi + 1:] = got[t]
            self.tables.append((keys, sq, None, cuts))

    def of(self, table: int, shard: int) -> tuple:
        """(keys, seqs, lows or None) of `table` in `shard`, sorted (lows: the further
        words of wide keys)."""
        keys, sq, lows, cuts = self.tables[table]
        a, b = cuts[shard], cuts[shard + 1]
        return keys[a:b], sq[a:b], None if lows is None else lows[a:b]


def group_buffers(counts: np.ndarray, group: int, sets: int = 1) -> tuple:
    """`sets` sets of four uint64 arrays (gathered keys and seqs, sorted keys and seqs),
    each big enough for the entries of any `group` consecutive shards (`counts`:
    shard_ids' second array). A bulk load's groups fill the same pages one after another,
    taking the sets in turn: fresh arrays per group had the kernel zero 4 GB per group
    (100M records, 10 tables: 20 s of a 143 s build)."""
    ntables, shards = counts.shape
    size = max(int(counts[:, lo:lo + group].sum()) for lo in range(0, shards, group))
    return tuple(tuple(np.empty(size + ntables, dtype=np.uint64) for _ in range(4))
                 for _ in range(sets))


def _shard_starts(plan: Plan) -> np.ndarray:
    """The first key of each shard but the first (a shard is a range of leading bits)."""
    return np.arange(1, plan.shards, dtype=np.uint64) << np.uint64(64 - plan.shard_bits) \
        if plan.shard_bits else np.zeros(0, dtype=np.uint64)


def apply(txn: Txn, plan: Plan, shard: int, entries: Entries, last: int,
          since: Optional[int] = None, durable: bool = False,
          deferred: Optional[list] = None) -> int:
    """Apply a batch of records (those with seqs up to `last`; `entries` holds at least
    every one with an entry in this shard) to `shard` in its write transaction `txn`, and
    advance its applied seq to `last`. Returns the shard's applied seq after it.

    A shard that already applied `last` is left as it is (another writer got there first);
    entries it already holds are skipped. With `since` (the newest seq below the batch), a
    shard that has not applied `since` missed earlier records and is left alone too: the
    caller must catch it up first (its applied seq, below `since`, says so). `durable`:
    records/ was synced after every record up to `last` was committed, so the shard marks
    them as on disk there (mark_durable: an open refuses records/ that hold fewer).
    `deferred`: a list that receives the tables whose merge of more than MERGE_INLINE
    entries is left for a transaction of its own (merge_deferred); without it every merge
    is made here.
    """
    w = ShardWriter(txn, plan.ntables, plan.words - 1,
                    inline=None if deferred is None else MERGE_INLINE)
    if deferred is not None:
        deferred.clear()               # this transaction's, when it is run again
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
    if durable:
        mark_durable(txn, last)
    if deferred is not None:
        deferred.extend(w.deferred)
    return last


def merge_deferred(txns: TxnRunner, plan: Plan, env: Env, tables: list) -> None:
    """The merges apply() left for transactions of their own: each table's, one
    transaction each (the state read again, so what other writers did meanwhile counts)."""
    for t in tables:
        def one(txn: Txn, t: int = t) -> None:
            w = ShardWriter(txn, plan.ntables, plan.words - 1)
            if w.merge_tier(t):        # else nothing written: LMDB commits it for free
                w.save()
        txns.write(env, one, then=MERGE_FAILED)


def catch_up(txns: TxnRunner, plan: Plan, lag: int = 0, jobs: int = 1,
             prepared: Optional[Prepared] = None, durable: bool = False) -> None:
    """Bring the shards of a store (txns.envs: records, then each shard) up to the last
    committed record, in passes of APPLY_CHUNK records (a pass over more than SORT_ENTRIES
    table entries goes a group of shards at a time).

    With `lag`, a shard behind the last committed record by fewer than `lag` records is
    left behind (queries check those records directly), saving its commit, fsync and
    merges (GROUP_LIMIT, LAG_LIMIT). `jobs` shards are written at once (each its own
    environment and write lock; the slab writes and commits release the GIL).
    `prepared`: commit_prepared's first pass, taken as it is when every shard still stands
    right below its records. `durable`: records/ syncs its commits, so each pass syncs it
    (a clean file: nothing to write, unless a sync=False writer's commits wait) and marks
    the records it applies as on disk (see apply).
    """
    txns.check_open()
    rec, shards = txns.envs[0], txns.envs[1:]
    chunk = max(1, APPLY_CHUNK // plan.words)
    while True:
        applied = applied_seqs(txns, plan.ntables)
        start = min(applied) + 1
        if prepared is not None:
            ready, prepared = prepared, None
            if start == ready.entries.first and max(applied) == start - 1:
                _apply_pass(txns, plan, shards, applied, ready.seqs, ready.fps, lag, jobs,
                            durable, ready)
                del ready
                continue
        if lag and txns.read_txn(rec, records.last_seq) - min(applied) < lag:
            return
        seqs, fps, last = txns.read_txn(rec, lambda txn: (
            *records.tail(txn, start, chunk, plan.words), records.last_seq(txn)))
        if len(seqs) == 0:
            if not lag and last >= start:
                if durable:
                    txns.sync(envs=txns.envs[:1])
                _advance(txns, plan, shards, applied, last, durable)   # only removed above
            return
        _apply_pass(txns, plan, shards, applied, seqs, fps, lag, jobs, durable)
        if len(seqs) < chunk and not (not lag and int(seqs[-1]) < last):
            return


def _apply_pass(txns, plan, shards, applied, seqs, fps, lag, jobs, durable, ready=None):
    """Apply one pass of records (seqs ascending, fps theirs) to the shards, a group of
    shards at a time; `ready`: the pass as commit_prepared made it."""
    top = int(seqs[-1])
    if durable:                    # every record up to top on disk before a shard says so
        txns.sync(envs=txns.envs[:1])
    group, sets = _grouping(plan, len(seqs), jobs)
    # each record's shard in every table, permuted once for all the groups, and the
    # buffers the groups fill again, taking the sets in turn
    split, work = (ready.split, ready.work) if ready is not None else (None, None)
    if split is None and group < plan.shards and isinstance(plan.permuter, Permuter):
        split = plan.permuter.shard_ids(fps)
        work = group_buffers(split[1], group, sets)
    ranges = [(lo, min(plan.shards, lo + group)) for lo in range(0, plan.shards, group)]

    def make(i: int) -> Entries:
        return Entries(plan, seqs, fps, shards=ranges[i], split=split,
                       work=None if work is None else work[i % len(work)])
    first = ready.entries if ready is not None else None
    del ready
    # with two sets, group i + 1 is gathered and sorted on a second thread while group i is
    # written (both release the GIL); group i + 2 takes group i's set once it is written
    with ThreadPoolExecutor(max_workers=1) if sets > 1 else nullcontext() as pool:
        ahead = None                 # the Future of the next group's Entries
        for i, (lo, hi) in enumerate(ranges):
            if first is not None:
                entries, first = first, None
            else:
                entries = ahead.result() if ahead is not None else make(i)
            ahead = pool.submit(make, i + 1) if pool and i + 1 < len(ranges) else None
            todo = [s for s in range(lo, hi) if top - applied[s] >= lag]
            _apply_shards(txns, plan, shards, entries, top, todo, jobs, durable)
            del entries              # before the next group's are made


def _apply_shards(txns, plan, shards, entries, top, todo, jobs, durable):
    """Apply `entries` (up to seq `top`) to the shards `todo`, `jobs` at once."""
    def one(s: int) -> None:
        deferred: list = []
        txns.write(shards[s], lambda txn: apply(txn, plan, s, entries, top, durable=durable,
                                                deferred=deferred),
                   then=SHARD_WRITE_FAILED)
        merge_deferred(txns, plan, shards[s], deferred)
    if jobs > 1 and len(todo) > 1:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, todo))
    else:
        for s in todo:
            one(s)


def _advance(txns, plan, shards, applied, last, durable):
    """Move lagging shards' applied seq up to `last` when no live record lies between."""
    for s, a in enumerate(applied):
        if a < last:
            def bump(txn):
                w = ShardWriter(txn, plan.ntables, plan.words - 1)
                if w.applied < last:
                    w.save(applied=last)
                    if durable:
                        mark_durable(txn, last)
            txns.write(shards[s], bump, then=SHARD_WRITE_FAILED)


def mark_synced(txns: TxnRunner, last: int) -> None:
    """After records/ was synced up to seq `last` (a sync=False store's flush or close):
    mark it in every shard (mark_durable), so an open refuses records/ that hold fewer."""
    if min(durable_seqs(txns), default=last) >= last:
        return
    for env in txns.envs[1:]:
        txns.write(env, lambda txn: mark_durable(txn, last), then=SHARD_WRITE_FAILED)


def compact(txns: TxnRunner, plan: Plan) -> None:
    """Bring every shard level, then merge each table's runs in each shard into one against
    one records snapshot, dropping the entries of records removed before it. Each shard is
    one write transaction: a failed one leaves that shard as it was (SHARD_WRITE_FAILED),
    and the removals stay counted until a compact completes."""
    catch_up(txns, plan)
    rec, shards = txns.envs[0], txns.envs[1:]
    # seqs above the snapshot's newest may belong to records added meanwhile
    live, stale, newest = txns.read_txn(rec, lambda txn: removals(txn, plan.words))
    for env in shards:
        txns.write(env, lambda txn: _merge_all(txn, plan, live, newest, stale),
                   then=SHARD_WRITE_FAILED)
    # removals made meanwhile stay counted
    txns.write(rec, lambda txn: records.add_stale(txn, -stale))


def removals(txn: Txn, words: int) -> tuple:
    """(live seqs ascending, removals counted, newest seq given out) of the records
    snapshot `txn`: what a compaction keeps, whether it has anything to drop, and above
    which seq entries belong to records added after it."""
    return records.tail(txn, 0, 0, words)[0], records.stale(txn), records.last_seq(txn)


def _merge_all(txn, plan, live, newest, stale):
    """Merge every table's runs of the shard `txn` writes into one, keeping the entries of
    `live` seqs and of seqs above `newest`."""
    merge_tables(txn, plan, lambda seqs: np.isin(seqs, live) | (seqs > np.uint64(newest)),
                 stale)


def merge_tables(txn: Txn, plan: Plan, keep, stale: int) -> None:
    """Merge every table's runs of the shard `txn` writes into one, keeping the entries
    `keep` (seqs -> bools) keeps; a table of one run is left as it is when nothing is
    `stale`."""
    w = ShardWriter(txn, plan.ntables, plan.words - 1)
    for t in range(plan.ntables):
        runs = [r for r, _ in w.table_runs(t)]
        # one run and no removed records: rewriting it would only free its old pages,
        # which LMDB keeps in the file
        if len(runs) > 1 or (runs and stale):
            w.merge(t, runs, keep=keep)
    w.save()


def raise_seq_floor(txns: TxnRunner, records_env: Env, top: int) -> None:
    """Never hand out a seq at or below `top` (the highest seq any shard applied): after an
    OS crash with sync=False a shard may hold seqs the records lost, and their stale table
    entries must never match a new record."""
    txns.write(records_env, lambda txn: records.raise_next_seq(txn, top))
