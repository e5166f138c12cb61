"""The processes of a Cluster: one ledger serving records/, one server per shard.

Each is a plain class run as a Ray actor that holds its LMDB environment open. The write
protocol is the single-machine one (see simindex/store.py): the ledger commits records
first (the durability point), then each shard applies them as sorted runs and advances its
applied seq; a shard that missed records (its actor restarted) is caught up from the ledger.
"""

import os

import numpy as np

from .. import _core, manifest
from ..codec import pack, unpack
from ..errors import Error, MapFullError, MapResizedError
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
    _check_data_file,
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


def _open_env(path, readonly, names, **kw):
    """An environment of the index, after the checks Store makes (a truncated data file
    raises CorruptError instead of killing the actor with SIGBUS on every restart)."""
    _check_data_file(path)
    env = _core.Env(path, readonly=readonly, mapsize=INITIAL_MAP, maxdbs=4, **kw)
    for name in names:
        env.open_db(name, create=not readonly)
    if not readonly:
        env.reader_check()
    return env


def _read(env, fn):
    while True:
        try:
            with _core.Txn(env) as txn:
                return fn(txn)
        except MapResizedError:
            env.set_mapsize(0)


class _Server:
    """An actor that holds one environment. An error while opening it (a damaged file) is
    kept and raised by every call, so the caller gets the typed error, not a dead actor
    that Ray restarts without end."""

    env = None
    _error = None

    def __init__(self, *args):
        try:
            self._open(*args)
        except Error as e:
            self._error = e

    def __getattribute__(self, name):
        if name[0] != "_" and name != "pid":
            error = object.__getattribute__(self, "_error")
            if error is not None:
                raise error
        return object.__getattribute__(self, name)

    def pid(self):
        return os.getpid()


class ShardServer(_Server):
    """One shard environment: applies committed records and scans for candidates."""

    def _open(self, path, shard, readonly=False):
        self.plan = plan_of(path)
        self.shard = shard
        self.env = _open_env(os.path.join(path, shard_dir(shard)), readonly, (STATE_DB, BLOCKS_DB),
                         sync=True, metasync=False)

    def applied(self):
        return _read(self.env, lambda txn: load_state(txn)[0])

    def apply(self, seqs, fps, since, last):
        """Store this shard's part of the records committed after seq `since` up to `last`
        (`seqs` ascending: all of them, or at least those with an entry in this shard).
        Returns the shard's applied seq after it: below `since` when the shard missed
        earlier records (its actor restarted) and must be caught up from the ledger first."""
        plan, s = self.plan, self.shard

        def fn(txn):
            w = ShardWriter(txn)
            if w.applied < since or w.applied >= last:
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
        if not self.env.readonly:
            self.env.sync(True)         # metasync=False left the last meta page unsynced
        self.env.close()


class LedgerServer(_Server):
    """records/: assigns seqs, commits records, and resolves candidates into matches."""

    def _open(self, path, readonly=False):
        self.path = path
        self.plan = plan_of(path)
        self.env = _open_env(os.path.join(path, RECORDS), readonly, (IDS_DB, SEQS_DB, INFO_DB),
                         sync=True)
        self.ctx = _core.ReadContext(self.env, [])

    def _once(self, request, fn):
        """fn(txn) in a write transaction, at most once per request id.

        Ray runs a call again on a restarted actor when the first run's reply was lost; the
        result is stored with the write itself, under the caller's (client, thread) key, so a
        second run returns it instead of writing again (a repeated remove could otherwise
        delete a record another client added meanwhile). A caller's calls are sequential, so
        only its latest request needs remembering.
        """
        who, n = request
        key = b"req:" + who

        def run(txn):
            old = txn.get(INFO_DB, key)
            if old is not None:
                seen = unpack(old, "request record")
                if seen[0] == n:
                    return _revive(seen[1])
            out = fn(txn)
            txn.put(INFO_DB, key, pack([n, _flat(out)]))
            return out
        return _write(self.env, run)

    def last(self):
        """The newest seq given out (0 for none)."""
        return _read(self.env, lambda txn: Store.next_seq(txn) - 1)

    def commit(self, request, idkeys, fps, metas):
        """Commit records atomically and durably; returns (prev, seqs): the newest seq before
        them and the seqs they got."""
        def fn(txn):
            prev = Store.next_seq(txn) - 1
            seq0 = put_records(txn, idkeys, fps, metas)
            return prev, np.arange(seq0, seq0 + len(idkeys), dtype=np.uint64)
        return self._once(request, fn)

    def not_before(self, top):
        """Never give out a seq at or below `top` (one a shard already applied)."""
        def fn(txn):
            if Store.next_seq(txn) <= top:
                txn.put(INFO_DB, b"next_seq", (top + 1).to_bytes(8, "big"))
        _write(self.env, fn)

    def tail(self, start, limit=0):
        """(seqs, fps) of the live records with seq >= start, at most `limit` (0: all)."""
        return _read(self.env, lambda txn: _core.read_tail(txn, SEQS_DB, start, limit))

    def resolve(self, queries, qidx, seqs, dists, applied, k):
        """Matches of each query from the shards' candidates (see ReadContext.resolve)."""
        order = np.argsort(qidx, kind="stable")
        while True:
            try:
                return self.ctx.resolve(queries, qidx[order], seqs[order], dists[order],
                                        applied, k)
            except MapResizedError:
                self.env.set_mapsize(0)

    def add_unique(self, request, idk, fp, meta, k, shards):
        """Insert unless a record within k bits exists (returning those). The shard servers
        scan while this holds the records write lock, so it is atomic across clients."""
        q = np.array([fp], dtype=np.uint64)

        def fn(txn):
            qidx, seqs, dists, applied = route.scan(self.plan, shards, q, k)
            hits = self.ctx.resolve(q, qidx, seqs, dists, applied, k, txn)[0]
            if hits:
                return None, hits
            prev = Store.next_seq(txn) - 1
            seq0 = put_records(txn, [idk], q, [meta])
            return (prev, np.array([seq0], dtype=np.uint64)), []
        return self._once(request, fn)

    def remove(self, request, idk):
        return self._once(request, lambda txn: remove_record(txn, idk))

    def get(self, idk):
        return _read(self.env, lambda txn: get_record(txn, idk, self.path))

    def count(self):
        return _read(self.env, lambda txn: txn.entries(IDS_DB))

    def close(self):
        self.ctx.close()
        self.env.close()


def _flat(out):
    """A write's result in msgpack terms (arrays as lists) for the request record."""
    if isinstance(out, np.ndarray):
        return {"u64": out.tolist()}
    if isinstance(out, (tuple, list)):
        return [_flat(x) for x in out]
    return out


def _revive(v):
    if isinstance(v, dict) and "u64" in v:
        return np.array(v["u64"], dtype=np.uint64)
    if isinstance(v, list):
        return tuple(_revive(x) for x in v)
    return v
