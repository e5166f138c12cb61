"""The processes of a Cluster: one ledger serving records/, one server per shard.

Each is a plain class run as a Ray actor that holds its LMDB environment open. The write
protocol is the single-machine one (see simindex/store.py): the ledger commits records
first (the durability point), then each shard applies them as sorted runs and advances its
applied seq; a shard that missed records (its actor restarted) is caught up from the ledger.
"""

import os

import numpy as np

from .. import _core, manifest
from ..errors import MapFullError, MapResizedError
from ..plan import Plan
from ..shard import BLOCKS_DB, STATE_DB, ShardWriter, entry_order, load_state
from ..store import (
    IDS_DB,
    INFO_DB,
    INITIAL_MAP,
    RECORDS,
    SEQS_DB,
    Store,
    get_record,
    put_records,
    remove_record,
    shard_dir,
)
from . import route
from .route import shard_lead


def plan_of(path):
    """The Plan recorded in an index's manifest."""
    m = manifest.read(path)
    return Plan(k=m["k"], blocks=m["blocks"], shards=m["shards"])


def _write(env, fn):
    """fn(txn) in a write transaction, growing the map when full (one writer per actor)."""
    while True:
        try:
            with _core.Txn(env, write=True) as txn:
                return fn(txn)
        except MapFullError:
            env.set_mapsize(env.info()["mapsize"] * 2)
        except MapResizedError:
            env.set_mapsize(0)              # another process grew it: adopt its size


def _read(env, fn):
    while True:
        try:
            with _core.Txn(env) as txn:
                return fn(txn)
        except MapResizedError:
            env.set_mapsize(0)


class ShardServer:
    """One shard environment: applies committed records and scans for candidates."""

    def __init__(self, path, shard):
        self.plan = plan_of(path)
        self.shard = shard
        self.env = _core.Env(os.path.join(path, shard_dir(shard)), sync=True, metasync=False,
                             mapsize=INITIAL_MAP, maxdbs=4)
        for name in (STATE_DB, BLOCKS_DB):
            self.env.open_db(name, create=True)
        self.env.reader_check()

    def pid(self):
        return os.getpid()

    def applied(self):
        return _read(self.env, lambda txn: load_state(txn)[0])

    def apply(self, seqs, fps, prev, last):
        """Store this shard's part of the records committed after seq `prev` up to `last`
        (`seqs` ascending: all of them, or at least those with an entry in this shard).
        Returns the shard's applied seq after it: below `prev` when the shard missed earlier
        records (its actor restarted) and must be caught up from the ledger first."""
        plan, s = self.plan, self.shard

        def fn(txn):
            w = ShardWriter(txn)
            if w.applied < prev or w.applied >= last:
                return w.applied                 # a gap to fill first, or nothing new
            keep = seqs > np.uint64(w.applied)
            sq, fp = seqs[keep], fps[keep]
            for t in range(plan.ntables):
                keys = plan.core.keys(t, fp)
                mine = shard_lead(plan, keys) == s
                k, q = keys[mine], sq[mine]
                order = entry_order(k, q)
                w.add_run(t, np.ascontiguousarray(k[order]), np.ascontiguousarray(q[order]))
            w.save(applied=last)
            return last
        return _write(self.env, fn)

    def scan(self, queries, k):
        """(qidx, seqs, distances, applied) of this shard's candidates for each query."""
        plan = self.plan

        def fn(txn):
            applied, runs, _ = load_state(txn)
            starts = np.searchsorted(runs["table"], np.arange(plan.ntables + 1)).astype(np.uint32)
            run_ids = np.ascontiguousarray(runs["run"], dtype=np.uint64)
            q, sq, d = _core.scan_shard(txn, plan.core, self.shard, queries, k, run_ids, starts)
            return q, sq, d, applied
        return _read(self.env, fn)

    def close(self):
        self.env.close()


class LedgerServer:
    """records/: assigns seqs, commits records, and resolves candidates into matches."""

    def __init__(self, path):
        self.path = path
        self.plan = plan_of(path)
        self.env = _core.Env(os.path.join(path, RECORDS), sync=True, mapsize=INITIAL_MAP,
                             maxdbs=4)
        for name in (IDS_DB, SEQS_DB, INFO_DB):
            self.env.open_db(name, create=True)
        self.env.reader_check()
        self.ctx = _core.ReadContext(self.env, [])

    def pid(self):
        return os.getpid()

    def last(self):
        """The newest seq given out (0 for none)."""
        return _read(self.env, lambda txn: Store.next_seq(txn) - 1)

    def commit(self, idkeys, fps, metas):
        """Commit records atomically and durably; returns (prev, seqs): the newest seq before
        them and the seqs they got."""
        def fn(txn):
            prev = Store.next_seq(txn) - 1
            seq0 = put_records(txn, idkeys, fps, metas)
            return prev, np.arange(seq0, seq0 + len(idkeys), dtype=np.uint64)
        return _write(self.env, fn)

    def not_before(self, top):
        """Never give out a seq at or below `top` (one a shard already applied)."""
        def fn(txn):
            if Store.next_seq(txn) <= top:
                txn.put(INFO_DB, b"next_seq", (top + 1).to_bytes(8, "big"))
        _write(self.env, fn)

    def tail(self, start, limit=0):
        """(seqs, fps) of the live records with seq >= start, at most `limit` (0: all)."""
        return _read(self.env, lambda txn: _core.read_tail(txn, SEQS_DB, start, limit))

    def records(self, start=0, limit=0):
        """(seqs, fps, id keys) of the live records from seq `start`, in seq order."""
        def fn(txn):
            seqs, fps = _core.read_tail(txn, SEQS_DB, start, limit)
            keys = [_core.split_record(txn.get(SEQS_DB, int(s).to_bytes(8, "big")))[1]
                    for s in seqs.tolist()]
            return seqs, fps, keys
        return _read(self.env, fn)

    def resolve(self, queries, qidx, seqs, dists, applied, k):
        """Matches of each query from the shards' candidates (see ReadContext.resolve)."""
        order = np.argsort(qidx, kind="stable")
        while True:
            try:
                return self.ctx.resolve(queries, qidx[order], seqs[order], dists[order],
                                        applied, k)
            except MapResizedError:
                self.env.set_mapsize(0)

    def add_unique(self, idk, fp, meta, k, shards):
        """Insert unless a record within k bits exists (returning those). The shard servers
        scan while this holds the records write lock, so it is atomic across clients."""
        import ray
        q = np.array([fp], dtype=np.uint64)

        def fn(txn):
            qidx, seqs, dists, applied = route.scan(ray, self.plan, shards, q, k)
            hits = self.ctx.resolve(q, qidx, seqs, dists, applied, k, txn)[0]
            if hits:
                return None, hits
            prev = Store.next_seq(txn) - 1
            seq0 = put_records(txn, [idk], q, [meta])
            return (prev, np.array([seq0], dtype=np.uint64)), []
        return _write(self.env, fn)

    def remove(self, idk):
        return _write(self.env, lambda txn: remove_record(txn, idk))

    def get(self, idk):
        return _read(self.env, lambda txn: get_record(txn, idk, self.path))

    def count(self):
        return _read(self.env, lambda txn: txn.entries(IDS_DB))

    def close(self):
        self.ctx.close()
        self.env.close()
