"""Several ledgers: an index's records split by id over environments that commit apart.

An index of one ledger keeps every record in records/, the one environment every write
commits in. An index of L > 1 ledgers keeps the records of an id in ledger
`crc32(id key) % L` (records/, records-1/, ...): each ledger is an ordinary records
environment numbering its own seqs 1, 2, 3..., so an id's replacement and its removal stay
inside one ledger's transaction and ledgers never wait for each other. The shards hold
global seqs: local seq s of ledger l is (s - 1) * L + l + 1 (with one ledger the two are
the same). A shard keeps, per ledger, the local seq up to which it applied that ledger's
records (STATE_LEDGERS); queries check each ledger's records above the lowest of those
directly, so answers stay exact while shards lag. Matches of one distance come in global
seq order: each ledger's insertion order, the ledgers interleaved.

The Ray servers (simindex/distributed/servers.py) write such an index; simindex.Index
opens it read-only (LedgerReader).
"""

from __future__ import annotations

import os
import zlib
from typing import Optional, Sequence

import numpy as np

from . import environments, records
from ._layout import DB_STATE, STATE_LEDGERS, ledger_dir
from ._lmdb import Env, Txn
from ._query import scan_shard
from .codec import encode_id
from .manifest import Manifest
from .pairs import join_table
from . import protocol
from .protocol import Entries
from .results import match_of
from .shard import ShardWriter
from .transactions import TxnRunner
from .writebuffer import Replay
from ..errors import CorruptError, ReadOnlyError, RecordsLostError
from ..values import words_array

__all__ = ["ledger_dir", "ledger_of", "to_global", "global_seq", "to_local", "load_applied",
           "apply", "split", "globalize", "merge", "gather", "resolve_part", "LedgerReader", "live",
           "stored_pairs", "compaction_keep", "catch_up", "check_kept"]

_U64 = np.uint64


def ledger_of(idkeys: Sequence[bytes], ledgers: int) -> np.ndarray:
    """The ledger of each id key (int64 array): crc32 of the key modulo `ledgers`, a rule
    on disk (an id's records are looked up in that ledger only)."""
    if ledgers == 1:
        return np.zeros(len(idkeys), dtype=np.int64)
    return np.fromiter((zlib.crc32(k) % ledgers for k in idkeys), dtype=np.int64,
                       count=len(idkeys))


def to_global(local: np.ndarray, ledger: int, ledgers: int) -> np.ndarray:
    """Global seqs of a ledger's local seqs (uint64 arrays; local 0, "none", stays 0)."""
    local = np.asarray(local, dtype=_U64)
    if ledgers == 1:
        return local
    out = (local - _U64(1)) * _U64(ledgers) + _U64(ledger + 1)
    return np.where(local == 0, _U64(0), out)


def global_seq(local: int, ledger: int, ledgers: int) -> int:
    """to_global() of one int."""
    return 0 if local == 0 else (local - 1) * ledgers + ledger + 1


def to_local(seqs: np.ndarray, ledgers: int) -> tuple:
    """(ledger, local seq) of each global seq (int64 and uint64 arrays)."""
    seqs = np.asarray(seqs, dtype=_U64)
    if ledgers == 1:
        return np.zeros(len(seqs), dtype=np.int64), seqs
    g = seqs - _U64(1)
    return (g % _U64(ledgers)).astype(np.int64), g // _U64(ledgers) + _U64(1)


# ---------------------------------------------------------------- a shard's applied seqs
def load_applied(txn: Txn, ledgers: int) -> np.ndarray:
    """Per ledger, the local seq up to which the shard `txn` reads applied its records."""
    v = txn.get(DB_STATE, STATE_LEDGERS)
    if v is None:
        return np.zeros(ledgers, dtype=_U64)
    if len(v) != 8 * ledgers:
        raise CorruptError(f"{txn.env.path}: a shard's state record is damaged (its applied "
                           f"seqs hold {len(v)} bytes for {ledgers} ledgers)")
    return np.frombuffer(v, dtype="<u8").astype(_U64)


def _save_applied(txn: Txn, applied: np.ndarray) -> None:
    txn.put(DB_STATE, STATE_LEDGERS, np.asarray(applied, dtype="<u8").tobytes())


def apply(txn: Txn, plan, shard: int, ledgers: int, parts: list,
          deferred: Optional[list] = None) -> np.ndarray:
    """Apply committed records of several ledgers to `shard` in its write transaction, as
    one run per table: `parts` is [(ledger, global seqs ascending, fps, since, last)], the
    records of `ledger` with local seqs after `since` up to `last` (at least every one with
    an entry in this shard). A part whose ledger the shard already applied up to `last` is
    skipped, and so is one the shard missed records before (applied below `since`: the
    caller catches it up first). Returns the shard's applied local seq per ledger.
    `deferred`: as protocol.apply's (large merges left for protocol.merge_deferred)."""
    if deferred is not None:
        deferred.clear()
    applied = load_applied(txn, ledgers)
    keep_s, keep_f = [], []
    for ledger, seqs, fps, since, last in parts:
        a = int(applied[ledger])
        if a >= last or (since is not None and a < since):
            continue
        floor = _U64(global_seq(a, ledger, ledgers))
        mine = seqs > floor
        keep_s.append(seqs[mine])
        keep_f.append(fps[mine])
        applied[ledger] = last
    if not keep_s:
        return applied
    seqs = np.concatenate(keep_s)
    order = np.argsort(seqs, kind="stable")          # Entries takes ascending seqs
    seqs, fps = seqs[order], np.concatenate(keep_f)[order]
    w = ShardWriter(txn, plan.ntables, plan.words - 1,
                    inline=None if deferred is None else protocol.MERGE_INLINE)
    if len(seqs):
        entries = Entries(plan, seqs, fps, shards=(shard, shard + 1))
        for t in range(plan.ntables):
            k, q, tl = entries.of(t, shard)
            w.add_run(t, np.ascontiguousarray(k), np.ascontiguousarray(q),
                      None if tl is None else np.ascontiguousarray(tl))
    w.save()
    _save_applied(txn, applied)
    if deferred is not None:
        deferred.extend(w.deferred)
    return applied


def compaction_keep(live: np.ndarray, newest: Sequence[int], ledgers: int):
    """The `keep` of a compaction's merges (protocol.merge_tables) over the ledgers'
    snapshots: entries of `live` global seqs, and of records each ledger added after its
    snapshot (local seq above its `newest`)."""
    top = np.asarray(newest, dtype=_U64)

    def keep(seqs: np.ndarray) -> np.ndarray:
        led, local = to_local(seqs, ledgers)
        return np.isin(seqs, live) | (local > top[led])
    return keep


def check_kept(path: str, applied: np.ndarray, lasts: Sequence[int],
               durable: Optional[Sequence[int]] = None) -> None:
    """Refuse a ledger that holds fewer records than the shards applied of it
    (records.lost): `lasts`, each ledger's last seq; `applied`, (ledgers, shards). A
    ledger's commits are synced, so what a shard applied of it was on disk; an index of
    one ledger may have been written by sync=False writers too, so there `durable`, its
    shards' durable seqs, counts instead."""
    for j, last in enumerate(lasts):
        marks = list(durable) if durable is not None and len(lasts) == 1 else \
            [int(a) for a in applied[j]]
        why = records.lost(path, ledger_dir(j), int(last) or None,
                           [int(a) for a in applied[j]], marks)
        if why:
            raise RecordsLostError(why)


def check_home(txn: Txn, path: str, ledger: int, ledgers: int, words: int) -> None:
    """Refuse a ledger environment that holds another ledger's records (its first live
    record's id belongs elsewhere): ledger directories swapped, or copied from another
    index, would answer lookups from the wrong records."""
    if ledgers == 1:
        return
    seqs, _ = records.tail(txn, 0, 1, words)
    if not len(seqs):
        return
    id_ = records.live_ids(txn, seqs, words)[0]
    home = int(ledger_of([encode_id(id_)], ledgers)[0])
    if home != ledger:
        raise CorruptError(
            f"{path}: {ledger_dir(ledger)}/ holds the records of {ledger_dir(home)}/ (its "
            f"record of {id_!r:.60} belongs there): ledger directories swapped, or copied "
            f"from another index; put each ledger back in its own directory (nothing was "
            f"changed)")


# ---------------------------------------------------------------- queries
def split(qidx: np.ndarray, seqs: np.ndarray, dists: np.ndarray, ledgers: int) -> list:
    """The shards' candidates (global seqs) as [(qidx, local seqs, dists)] per ledger."""
    led, local = to_local(seqs, ledgers)
    out = []
    for ledger in range(ledgers):
        m = led == ledger
        out.append((qidx[m], local[m], dists[m]))
    return out


def globalize(hits: list, ledger: int, ledgers: int) -> list:
    """A ledger's resolved hits (per query, (distance, fp, local seq, id, meta)) with
    global seqs."""
    if ledgers == 1:
        return hits
    return [[(d, fp, global_seq(s, ledger, ledgers), i, m) for d, fp, s, i, m in hs]
            if hs else hs for hs in hits]


def merge(per_ledger: list) -> list:
    """Each query's hits of every ledger (global seqs), sorted by (distance, seq)."""
    out = []
    for hs in zip(*per_ledger):
        found = [part for part in hs if part]
        if len(found) <= 1:
            out.append(found[0] if found else [])    # one ledger's: already in order
            continue
        joined = [h for part in found for h in part]
        joined.sort(key=lambda h: (h[0], h[2]))
        out.append(joined)
    return out


def gather(scans: list, n: int, nledgers: int) -> tuple:
    """(qidx, seqs, distances, applied) of shard scans [(positions of the queries a shard
    scanned, (qidx, seqs, distances, applied per ledger))]: every candidate named by its
    query's position among the n, and per query the lowest applied local seq of each
    ledger over the shards that scanned it."""
    applied = np.full((n, nledgers), np.iinfo(np.uint64).max, dtype=_U64)
    qs, ss, ds = [], [], []
    for idx, (qi, sq, d, a) in scans:
        applied[idx] = np.minimum(applied[idx], np.asarray(a, dtype=_U64))
        qs.append(idx[qi.astype(np.int64)].astype(_U64))
        ss.append(sq)
        ds.append(d)
    if not scans:
        empty = np.empty(0, dtype=_U64)
        return empty, empty, np.empty(0, dtype=np.uint16), applied
    return np.concatenate(qs), np.concatenate(ss), np.concatenate(ds), applied


def resolve_part(runner: TxnRunner, ledger: int, nledgers: int, queries: np.ndarray,
                 qidx: np.ndarray, seqs: np.ndarray, dists: np.ndarray,
                 applied: np.ndarray, k: int, txn: Optional[Txn] = None) -> list:
    """Each query's hits from one ledger (`runner`: its read contexts): the candidates of
    its local `seqs` and its records above `applied` (ReadContext.resolve), with global
    seqs. `txn`: the ledger's write transaction when the caller holds one."""
    order = np.argsort(qidx, kind="stable")
    hits = runner.read(lambda ctx: ctx.resolve(queries, qidx[order], seqs[order],
                                               dists[order], applied, k, txn))
    return globalize(hits, ledger, nledgers)


# ---------------------------------------------------------------- one machine
class LedgerReader:
    """An index of several ledgers opened read-only in this process (simindex.Index's store
    for it): its ledgers' and shards' environments, queried as the Ray servers do (the
    shards scanned, then each ledger resolving its candidates)."""

    buffer = None
    single = None
    failed = False
    def __init__(self, path: str, m: Manifest, *, lock: bool = True) -> None:
        self.path = path
        self.manifest = m
        self.plan = m.plan
        self.nledgers = n = m.ledgers
        self.readonly = True
        self.lock, self.sync = lock, True
        self.replayed = Replay()
        envs: list = []
        try:
            for ledger in range(self.nledgers):
                envs.append(environments.open_records(path, readonly=True, sync=True,
                                                      sums=m.record_sums, lock=lock,
                                                      ledger=ledger))
            envs += [environments.open_shard(path, s, readonly=True, sync=True, lock=lock)
                     for s in range(self.plan.shards)]
        except BaseException:
            for env in envs:
                env.close()
            raise
        self.ledger_envs: list[Env] = envs[:self.nledgers]
        self.shard_envs: list[Env] = envs[self.nledgers:]
        # snapshots and scans; and per ledger, the read contexts that resolve candidates
        self.txns = TxnRunner(path, envs, what=f"index {path}")
        self.runners = [TxnRunner(path, [env], what=f"ledger {ledger} of index {path}",
                                  contexts=True)
                        for ledger, env in enumerate(self.ledger_envs)]
        self.pid = os.getpid()
        self.refs = 1
        try:
            applied = np.array([self.txns.read_txn(env, lambda txn: load_applied(txn, n))
                                for env in self.shard_envs]).T
            check_kept(path, applied, [r.read_txn(env, records.last_seq) for r, env in
                                       zip(self.runners, self.ledger_envs)])
            for j, (r, env) in enumerate(zip(self.runners, self.ledger_envs)):
                r.read_txn(env, lambda txn: check_home(txn, path, j, n, self.plan.words))
        except BaseException:
            self.close()
            raise

    # the store interface simindex.Index uses
    @property
    def closed(self) -> bool:
        return self.txns.closed

    def check_open(self) -> None:
        self.txns.check_open()

    def check_writable(self) -> None:
        self.check_open()
        raise ReadOnlyError(f"index {self.path} has {self.nledgers} ledgers: it opens "
                            f"read-only on one machine (write it through "
                            f"simindex.distributed.Cluster)")

    def fold(self) -> None:
        pass

    def buffered(self) -> int:
        return 0

    def close(self) -> None:
        for r in self.runners:
            r.close(sync=False)
        self.txns.close(sync=False)

    def _ledger(self, idkey: bytes) -> int:
        return int(ledger_of([idkey], self.nledgers)[0])

    def get(self, idkey: bytes) -> Optional[bytes]:
        self.check_open()
        ledger = self._ledger(idkey)
        return self.runners[ledger].read_txn(
            self.ledger_envs[ledger], lambda txn: records.get(txn, idkey, self.plan.words))

    def count(self) -> int:
        self.check_open()
        return sum(r.read_txn(env, records.count)
                   for r, env in zip(self.runners, self.ledger_envs))

    def query(self, queries: np.ndarray, k: int, matches: bool = True) -> list:
        """Hits of each query: (distance, fp, global seq, id, meta bytes), or Matches."""
        self.check_open()
        plan, n = self.plan, self.nledgers
        reach = plan.permuter.shard_reach(queries)
        scans = []
        # every shard snapshot is taken before the ledgers' (see ReadContext.resolve)
        for s, env in enumerate(self.shard_envs):
            idx = np.nonzero(reach[s])[0]
            if len(idx):
                def one(txn, idx=idx, s=s):
                    qi, sq, d, _ = scan_shard(txn, plan.permuter, s, queries[idx], k)
                    return qi, sq, d, load_applied(txn, n)
                scans.append((idx, self.txns.read_txn(env, one)))
        qidx, seqs, dists, low = gather(scans, len(queries), n)
        out = merge([resolve_part(self.runners[j], j, n, queries, qi, sq, d,
                                  np.ascontiguousarray(low[:, j]), k)
                     for j, (qi, sq, d) in enumerate(split(qidx, seqs, dists, n))])
        return [[match_of(h) for h in hs] for hs in out] if matches else out

    def query_one(self, fp: int, k: int) -> list:
        q = np.array([fp], dtype=_U64) if self.plan.width == 64 else \
            words_array([fp], self.plan.width)
        return self.query(q, k)[0]

    def snapshot(self):
        """Read transactions [ledger 0, ledger 1, ..., shard 0, shard 1, ...], the shards'
        begun first (TxnRunner.snapshot)."""
        return self.txns.snapshot()


def catch_up(path: str, m: Manifest) -> None:
    """Bring every shard of the index of several ledgers at `path` up to every ledger's
    last record, on one machine (repair's step after it made a damaged shard again: a
    Cluster does the same when it opens). Run it while no other process writes the index."""
    plan, n = m.plan, m.ledgers
    envs = [environments.open_records(path, readonly=True, sync=True, sums=m.record_sums,
                                      ledger=j) for j in range(n)]
    envs += [environments.open_shard(path, s, readonly=False, sync=True)
             for s in range(plan.shards)]
    txns = TxnRunner(path, envs, what=f"index {path}")
    try:
        ledger_envs, shard_envs = envs[:n], envs[n:]
        applied = np.array([txns.read_txn(env, lambda txn: load_applied(txn, n))
                            for env in shard_envs])
        check_kept(path, applied.T, [txns.read_txn(env, records.last_seq)
                                     for env in ledger_envs])
        low = applied.min(axis=0)
        parts = []
        for j, env in enumerate(ledger_envs):
            def tail(txn, j=j):
                seqs, fps = records.tail(txn, int(low[j]) + 1, 0, plan.words)
                return to_global(seqs, j, n), fps, records.last_seq(txn)
            seqs, fps, last = txns.read_txn(env, tail)
            parts.append((j, seqs, fps, None, last))
        for s, env in enumerate(shard_envs):
            deferred: list = []

            def one(txn: Txn, s: int = s, deferred: list = deferred) -> np.ndarray:
                return apply(txn, plan, s, n, parts, deferred)
            txns.write(env, one)
            protocol.merge_deferred(txns, plan, env, deferred)
    finally:
        txns.close(sync=True)


def live(ltxns: list, words: int) -> tuple:
    """(global seqs ascending, fps, ids) of every live record in the ledger snapshots."""
    ss, fs, ids = [], [], []
    for ledger, txn in enumerate(ltxns):
        s, f, i = records.live(txn, words)
        ss.append(to_global(s, ledger, len(ltxns)))
        fs.append(f)
        ids += i
    seqs = np.concatenate(ss)
    fps = np.concatenate(fs)
    order = np.argsort(seqs, kind="stable")
    return seqs[order], fps[order], [ids[i] for i in order.tolist()]


def stored_pairs(reader: LedgerReader, k: int) -> list:
    """pairs.stored_pairs of an index of several ledgers: its live records of one snapshot
    joined table by table, [(seq_a, seq_b, distance, id_a, id_b)] in seq order."""
    plan = reader.plan
    with reader.snapshot() as txns:
        seqs, fps, ids = live(txns[:reader.nledgers], plan.words)
    parts = [join_table(plan, t, plan.permuter.keys(t, fps), None, k)
             for t in range(plan.ntables)]
    a = np.concatenate([p[0] for p in parts]).astype(np.int64)
    b = np.concatenate([p[1] for p in parts]).astype(np.int64)
    d = np.concatenate([p[2] for p in parts])
    order = np.lexsort((b, a))
    return [(int(seqs[x]), int(seqs[y]), int(z), ids[x], ids[y])
            for x, y, z in zip(a[order].tolist(), b[order].tolist(), d[order].tolist())]
