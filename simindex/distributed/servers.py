"""The processes of a Cluster: one server per ledger (records/, and records-N/ in an index
of several, simindex/engine/ledgers.py), one server per shard.

Each is a plain class run as a Ray actor that holds its LMDB environment open, and counts
the calls and seconds of each of its methods (busy). They write through the single-machine
write protocol (simindex/engine/protocol.py) and its transaction runners
(simindex/engine/transactions.py): a ledger commits records first (the durability point),
then each shard applies them as sorted runs and advances its applied seq (one per ledger);
a shard that missed records (its actor restarted) is caught up from that ledger.
"""

from __future__ import annotations

import functools
import os
import time
from typing import Optional

import numpy as np

from ..engine import environments, ledgers, protocol, records
from ..engine.codec import pack, unpack
from ..engine.manifest import Manifest
from ..values import words_array
from ..errors import Error
from ..engine.shard import durable_seq, load_state, mark_durable, scan as scan_shard
from ..engine.transactions import TxnRunner
from . import route


def _timed(name: str, method):
    """A server's `method` counting its calls and wall seconds in the server's busy
    table (_Server.busy)."""
    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            b = self._busy.setdefault(name, [0, 0.0])
            b[0] += 1
            b[1] += time.perf_counter() - start
    return timed


class _Server:
    """An actor that holds one environment of the index whose Manifest the driver read
    and sends (a restarted actor gets the same one). An error while opening it (a damaged
    file) is kept and raised by every call, so the caller gets the typed error, not a dead
    actor that Ray restarts without end."""

    txns: Optional[TxnRunner] = None
    _error = None
    _writers: Optional[int] = None

    def __init__(self, *args):
        self._busy: dict = {}
        try:
            self._open(*args)
        except Error as e:
            self._error = e

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name, fn in list(vars(cls).items()):
            if name[0] != "_" and callable(fn):
                setattr(cls, name, _timed(name, fn))

    def __getattribute__(self, name):
        if name[0] != "_" and name not in ("pid", "busy"):
            error = object.__getattribute__(self, "_error")
            if error is not None:
                raise error
        return object.__getattribute__(self, name)

    def pid(self):
        return os.getpid()

    def busy(self):
        """{method: (calls, seconds)} served since this actor started: where its time
        goes (Cluster.busy)."""
        return {name: tuple(v) for name, v in self._busy.items()}

    def close(self):
        """Flush (a shard's last meta page is not synced by its commits) and close."""
        self.txns.close(sync=not self.env.readonly)
        if self._writers is not None:
            os.close(self._writers)
            self._writers = None

    def _hold(self, path, readonly):
        """A writable server holds the index's writers lock (environments.writers_lock)."""
        self._writers = None if readonly else environments.writers_lock(path)


class ShardServer(_Server):
    """One shard environment: applies committed records and scans for candidates."""

    def _open(self, m: Manifest, shard, readonly=False):
        path = m.path
        self.plan = m.plan
        self.nledgers = m.ledgers
        self.shard = shard
        self._hold(path, readonly)
        self.env = environments.open_shard(path, shard, readonly=readonly, sync=True)
        self.txns = TxnRunner(path, [self.env], what=f"shard {shard} of index {path}")

    def _applied(self, txn):
        if self.nledgers == 1:
            return [load_state(txn, self.plan.ntables)[0]]
        return ledgers.load_applied(txn, self.nledgers).tolist()

    def applied(self):
        """Per ledger, the local seq up to which this shard applied its records."""
        return self.txns.read_txn(self.env, self._applied)

    def durable(self):
        """The seq up to which this shard saw records/ on disk (shard.durable_seq)."""
        return self.txns.read_txn(self.env, durable_seq)

    def mark_durable(self, seq):
        """Record that records/ holds every record up to `seq` on disk (shard.mark_durable)."""
        self.txns.write(self.env, lambda txn: mark_durable(txn, seq),
                        then=protocol.SHARD_WRITE_FAILED)

    def apply(self, parts):
        """Store this shard's part of committed records in one transaction: `parts` is
        [(ledger, seqs, fps, since, last)], the records of `ledger` committed after its
        local seq `since` up to `last` (`seqs` ascending: all of them, or at least those
        with an entry in this shard). Returns the shard's applied seq per ledger after it:
        below a part's `since` when the shard missed earlier records of that ledger (its
        actor restarted) and must be caught up from it first."""
        plan, shard = self.plan, self.shard
        deferred = []                  # large merges, each committed on its own after
        if self.nledgers == 1:
            [(_, seqs, fps, since, last)] = parts
            entries = protocol.Entries(plan, seqs, fps, shards=(shard, shard + 1))
            got = [self.txns.write(
                self.env, lambda txn: protocol.apply(txn, plan, shard, entries, last,
                                                     since=since, deferred=deferred),
                then=protocol.SHARD_WRITE_FAILED)]
        else:
            got = self.txns.write(
                self.env, lambda txn: ledgers.apply(txn, plan, shard, self.nledgers,
                                                    parts, deferred).tolist(),
                then=protocol.SHARD_WRITE_FAILED)
        protocol.merge_deferred(self.txns, plan, self.env, deferred)
        return got

    def compact(self, live, newest, stale):
        """Merge each table's runs into one, dropping the entries of records removed before
        the ledgers' snapshots (`live`: their live global seqs, sorted; `newest`: each
        one's newest local seq given out; `stale`: the removals they counted)."""
        keep = ledgers.compaction_keep(live, newest, self.nledgers)
        self.txns.write(self.env,
                        lambda txn: protocol.merge_tables(txn, self.plan, keep, stale),
                        then=protocol.SHARD_WRITE_FAILED)

    def scan(self, queries, k):
        """(qidx, seqs, distances, applied per ledger) of this shard's candidates for each
        query."""
        def one(txn):
            qidx, seqs, dists, applied = scan_shard(txn, self.plan, self.shard, queries, k)
            return qidx, seqs, dists, [applied] if self.nledgers == 1 else self._applied(txn)
        return self.txns.read_txn(self.env, one)


class LedgerServer(_Server):
    """A ledger (records/, or records-N/ of an index of several): assigns its seqs, commits
    records, and resolves candidates into matches. It speaks global seqs of records
    (ledgers.py) and its own local seqs of positions (`prev`, `last`, `since`)."""

    def _open(self, m: Manifest, readonly=False, ledger=0):
        path = self.path = m.path
        self.plan = m.plan
        self.ledger, self.nledgers = ledger, m.ledgers
        self._hold(path, readonly)
        self.env = environments.open_records(path, readonly=readonly, sync=True,
                                             sums=m.record_sums, ledger=ledger)
        self.txns = TxnRunner(path, [self.env], what=f"ledger {ledger} of index {path}",
                              contexts=True)
        self.txns.read_txn(self.env, lambda txn: ledgers.check_home(
            txn, path, ledger, self.nledgers, self.plan.words))

    def _once(self, request, fn):
        """fn(txn) in a write transaction, at most once per request id.

        Ray runs a call again on a restarted actor when the first run's reply was lost; the
        result is stored with the write itself, under the caller's (client, thread) key, so a
        second run returns it instead of writing again (a repeated remove could otherwise
        delete a record another client added meanwhile). A caller's calls are sequential, so
        only its latest request needs remembering.
        """
        def run(txn):
            done = _recalled(txn, request)
            if done is not None:
                return done[0]
            out = fn(txn)
            records.remember_request(txn, request[0], pack([request[1], _flat(out)]))
            return out
        return self.txns.write(self.env, run)

    def recall(self, request):
        """[result] of a write this ledger made for `request`, or None."""
        return self.txns.read_txn(self.env, lambda txn: _recalled(txn, request))

    def last(self):
        """The newest seq given out (0 for none)."""
        return self.txns.read_txn(self.env, records.last_seq)

    def synced_last(self):
        """The newest seq given out, read before this ledger's file is synced: every record
        up to it is then on disk, whoever committed it."""
        last = self.txns.read_txn(self.env, records.last_seq)
        self.txns.sync()
        return last

    def commit(self, request, idkeys, fps, metas, replace=True):
        """Commit records atomically and durably; returns (prev, seqs): the newest local
        seq before them and the global seqs they got. replace=False: an id already stored
        raises IdExistsError and nothing is written."""
        def fn(txn):
            prev = records.last_seq(txn)
            seq0 = records.put(txn, idkeys, fps, metas, replace)
            return prev, ledgers.to_global(
                np.arange(seq0, seq0 + len(idkeys), dtype=np.uint64), self.ledger,
                self.nledgers)
        return self._once(request, fn)

    def not_before(self, top):
        """Never give out a seq at or below `top` (one a shard already applied)."""
        protocol.raise_seq_floor(self.txns, self.env, top)

    def tail(self, start, limit=0):
        """(global seqs, fps) of the live records with local seq >= start, at most `limit`
        (0: all); fps (n, words) at widths above 64."""
        def fn(txn):
            seqs, fps = records.tail(txn, start, limit, self.plan.words)
            return ledgers.to_global(seqs, self.ledger, self.nledgers), fps
        return self.txns.read_txn(self.env, fn)

    def removals(self):
        """(live global seqs, newest local seq given out, removals counted) of one
        snapshot: what a compaction keeps, above which seq entries are newer, and whether
        it has anything to drop."""
        def fn(txn):
            live, stale, newest = protocol.removals(txn, self.plan.words)
            return ledgers.to_global(live, self.ledger, self.nledgers), newest, stale
        return self.txns.read_txn(self.env, fn)

    def forget_removals(self, request, counted):
        """After a compaction: the removals it dropped are no longer counted (those made
        meanwhile stay)."""
        return self._once(request, lambda txn: records.add_stale(txn, -counted))

    def resolve(self, queries, qidx, seqs, dists, applied, k, txn=None):
        """Matches of each query from the shards' candidates of this ledger (local seqs;
        `applied`: per query, the lowest local seq applied by the shards it reached; see
        ReadContext.resolve), with global seqs. `txn`: this ledger's write transaction
        when the caller holds one (add_unique)."""
        return ledgers.resolve_part(self.txns, self.ledger, self.nledgers, queries, qidx,
                                    seqs, dists, applied, k, txn)

    def add_unique(self, request, idk, fp, meta, k, shards, check=None, sketch=None,
                   servers=None, home=0):
        """Insert unless a record within k bits exists (returning those). The shard servers
        scan while this holds the records write lock, so it is atomic across clients.
        `fp`: an int of the index's width. `check` (a TextCheck) with the text's (sketch,
        shingle count): only records that pass it count, judged under the same lock.

        In an index of several ledgers every add_unique goes to ledger 0 (this server, with
        `servers`, every ledger's, and `home`, the record's ledger), which holds its records
        write lock from the scan to the commit in `home`: of two near-identical records
        added at once by any clients exactly one goes in (a plain add in another ledger is
        not waited for). Returns (added, hits), added (prev, seqs) of the commit in
        `home`."""
        q = np.array([fp], dtype=np.uint64) if self.plan.width == 64 else \
            words_array([fp], self.plan.width)

        def fn(txn):
            qidx, seqs, dists, applied = route.scan(self.plan, shards, q, k, self.nledgers)
            if servers is None:
                hits = self.resolve(q, qidx, seqs, dists, applied[:, 0], k, txn)[0]
            else:
                hits = route.resolve(servers, q, qidx, seqs, dists, applied, k, here=self,
                                     txn=txn)[0]
            if hits and check is not None:
                hits = check.passing(sketch[0], sketch[1], hits, fp)
            if hits:
                return None, hits
            if home != self.ledger:
                return route.fetch(servers[home].commit.remote(request, [idk], q, [meta],
                                                               False)), []
            records.refuse_replacing(txn, idk)
            prev = records.last_seq(txn)
            seq0 = records.put(txn, [idk], q, [meta])
            return (prev, ledgers.to_global(np.array([seq0], dtype=np.uint64), self.ledger,
                                            self.nledgers)), []
        if home == self.ledger:
            return self._once(request, fn)

        def elsewhere(txn):
            # the home ledger remembers the request with its commit: a retry of a call
            # whose commit went through returns that commit
            done = route.fetch(servers[home].recall.remote(request))
            return (done[0], []) if done is not None else fn(txn)
        return self.txns.write(self.env, elsewhere)

    def remove(self, request, idk):
        return self._once(request, lambda txn: records.remove(txn, idk))

    def get(self, idk):
        return self.txns.read_txn(self.env, lambda txn: records.get(txn, idk, self.plan.words))

    def count(self):
        return self.txns.read_txn(self.env, records.count)


def _recalled(txn, request):
    """[result] stored for `request` (client key, number) in records/, or None."""
    who, n = request
    old = records.request(txn, who)
    if old is not None:
        seen = unpack(old, "request record")
        if seen[0] == n:
            return [_revive(seen[1])]
    return None


def _flat(out):
    """A write's result in msgpack terms for the request record: arrays as their bytes and
    shape, ints wider than msgpack's 64 bits (wide fingerprints) as big-endian bytes."""
    if isinstance(out, np.ndarray):
        return {"u64": np.ascontiguousarray(out, dtype=np.uint64).tobytes(),
                "shape": list(out.shape)}
    if isinstance(out, (tuple, list)):
        return [_flat(x) for x in out]
    if type(out) is int and out >> 64:
        return {"int": out.to_bytes((out.bit_length() + 7) // 8, "big")}
    return out


def _revive(v):
    """The result _flat() stored (lists come back as tuples)."""
    if isinstance(v, dict) and "u64" in v:
        return np.frombuffer(v["u64"], dtype=np.uint64).reshape(v["shape"]).copy()
    if isinstance(v, dict) and "int" in v:
        return int.from_bytes(v["int"], "big")
    if isinstance(v, list):
        return tuple(_revive(x) for x in v)
    return v
