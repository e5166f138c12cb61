"""The storage of one index in one process: its environments, their transaction runners, the
write buffer, and the operations the public Index is made of.

A process opens each index once (simindex/engine/registry.py shares one Store between the Index
handles on a path). Writes follow the write protocol of simindex/engine/protocol.py through the
runners of simindex/engine/transactions.py; with sync=False, single adds go through the write
buffer (simindex/engine/writebuffer.py) and every other call folds it first.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Optional

import numpy as np

from . import environments, manifest, protocol, records, writebuffer
from ._layout import DB_IDS, DB_INFO, INFO_NEXT_SEQ, MANIFEST, RECORDS_DIR
from ._lmdb import current_pid
from ._permute import Permuter
from ._query import SingleQuery
from ..values import words_array
from ..errors import (
    Error, MissingIndexError, NotAnIndexError, ReadOnlyError, RecordsLostError, StorageError,
)
from .plan import DEFAULT_K, DEFAULT_SHARDS, Plan
from .results import record_of
from .shard import applied_seqs, durable_seqs
from .transactions import TxnRunner, space_error


class Store:
    """The records and shard environments of one index in this process, and its writes."""

    txns: TxnRunner                  # the runners, made once the environments are open
    nledgers = 1                     # its records are one environment (see ledgers.py)
    _writers: Optional[int] = None   # the writers lock's descriptor while it may write
    read: Callable[..., Any]                  # txns.read(fn, *args), bound once

    def __init__(self, path: str, *, k: Optional[int], blocks: Optional[int],
                 shards: Optional[int], create: bool, readonly: bool, sync: bool,
                 scheme: Optional[str] = None, prefix_blocks: Optional[int] = None,
                 width: Optional[int] = None, calibration: Optional[dict] = None,
                 lock: bool = True) -> None:
        self.path = path
        self.readonly = readonly
        self.lock = lock
        self.sync = sync
        self.pid = os.getpid()
        self.refs = 1
        self.buffer: Optional[writebuffer.WriteBuffer] = None
        self.write_lock = threading.RLock()     # one writer of this index per process
        self.replayed = writebuffer.Replay()
        if os.path.exists(path) and not os.path.isdir(path):
            raise NotAnIndexError(f"{path} is a file, not an index directory")
        if not os.path.exists(os.path.join(path, MANIFEST)):
            if readonly or not create:
                why = "readonly=True" if readonly else "create=False"
                raise MissingIndexError(f"no simindex index at {path} ({why} forbids making one)")
            plan = Plan(k=DEFAULT_K if k is None else k, blocks=blocks,
                        shards=DEFAULT_SHARDS if shards is None else shards,
                        prefix_blocks=prefix_blocks, width=64 if width is None else width)
            if calibration is not None:
                manifest.check_calibration(calibration, scheme, plan)
            try:
                environments.create(path, plan, scheme, calibration)
            except StorageError as e:
                raise space_error(e, path) from None
        # held while this store may write: an index is never split over ledgers under it
        self._writers = None if readonly else environments.writers_lock(path)
        try:
            self._open(path, k, blocks, shards, scheme, prefix_blocks, width, calibration,
                       readonly, sync, lock)
        except BaseException:
            self._release_writers()
            raise

    def _open(self, path, k, blocks, shards, scheme, prefix_blocks, width, calibration,
              readonly, sync, lock) -> None:
        m = self.manifest = manifest.read(path)
        if m.ledgers > 1 and not readonly:      # split since the registry looked
            raise ReadOnlyError(f"index {path} has {m.ledgers} ledgers: on one machine it "
                                f"opens read-only")
        m.check_same(k=k, blocks=blocks, shards=shards, scheme=scheme,
                     prefix_blocks=prefix_blocks, width=width, calibration=calibration)
        self.plan = m.plan
        envs: list = []
        try:
            envs.append(environments.open_records(path, readonly=readonly, sync=sync,
                                                  sums=m.record_sums, lock=lock))
            envs += [environments.open_shard(path, s, readonly=readonly, sync=sync, lock=lock)
                     for s in range(self.plan.shards)]
        except BaseException as e:
            for env in envs:
                env.close()
            if isinstance(e, StorageError):
                raise space_error(e, path) from None
            raise
        self.records, self.shard_envs = envs[0], envs[1:]
        self.txns = TxnRunner(path, envs, what=f"index {path}", contexts=True)
        self.read = self.txns.read           # the runner itself: no extra call per query
        # Index.query's compiled hot path (64-bit plans; None answers: take the Python path)
        perm = self.plan.permuter
        self.single = SingleQuery(self.txns, perm, self.plan.k) \
            if isinstance(perm, Permuter) else None
        try:
            self._check_records_kept()
            if not readonly:
                self.manifest = manifest.upgrade(self.manifest)
                top = max(applied_seqs(self.txns, self.plan.ntables))
                protocol.raise_seq_floor(self.txns, self.records, top)
                self.replayed = writebuffer.replay_logs(path, self.txns, self.records,
                                                        self.plan.width)
                protocol.catch_up(self.txns, self.plan, durable=sync)
                if not sync:
                    self.buffer = writebuffer.WriteBuffer(
                        path, self.txns, self.records, self.write_lock,
                        width=self.plan.width)
        except BaseException as e:
            self.txns.close(sync=not readonly)    # what was replayed reaches the disk
            if isinstance(e, StorageError):
                raise space_error(e, path) from None
            raise

    def _check_records_kept(self) -> None:
        """Refuse records/ that hold fewer records than the shards saw on disk there (see
        records_lost): a records/ emptied, replaced, or restored from an older copy would
        answer without the records it lost."""
        given = self.read_records(lambda txn: txn.get(DB_INFO, INFO_NEXT_SEQ))
        lost = records.lost(self.path, RECORDS_DIR,
                            None if given is None else records.last_seq_of(given),
                            applied_seqs(self.txns, self.plan.ntables),
                            durable_seqs(self.txns))
        if lost:
            raise RecordsLostError(lost)

    # ------------------------------------------------------------ lifetime
    @property
    def closed(self) -> bool:
        return self.txns.closed

    def check_open(self) -> None:
        """Raise ClosedError after close(), or in a child after fork() (every call passes
        here: the common case is two loads and a compare)."""
        txns = self.txns
        if txns.closed or txns.pid != current_pid():
            txns.check_open()

    def check_writable(self) -> None:
        self.check_open()
        if self.readonly:
            raise ReadOnlyError(f"index {self.path} is open read-only")
        if self.txns.failed is not None:
            self.txns.check_failed()

    @property
    def failed(self) -> bool:
        """Whether a write to disk failed: the handle then refuses writes until reopened."""
        return self.txns.failed is not None

    def close(self) -> None:
        """Wait for calls in progress, fold, apply what group commit left to the shards,
        flush, and close every environment."""
        if self.closed:
            return
        if self.pid != os.getpid():
            self.txns.drop()         # a forked child's copy: the handles are the parent's
            return
        if self.reentered():
            raise RuntimeError(f"{self.path}: close() was called from inside a call on the "
                               f"index in the same thread (a garbage-collected handle)")
        with self.write_lock:
            if self.closed:
                return
            error = None
            if self.buffer is not None:
                if not self.failed:
                    try:
                        self.buffer.fold()
                    except Error as e:
                        error = e              # raised once everything is closed
                self.buffer.close()
            if not self.readonly and not self.failed and error is None:
                try:
                    # what group commit left behind: readers then check no unapplied tail
                    protocol.catch_up(self.txns, self.plan, durable=self.sync)
                    if not self.sync:
                        self._synced()
                except Error as e:
                    error = e
            try:
                self.txns.close(sync=not self.readonly)
            finally:
                self._release_writers()
                if error is not None:
                    raise error

    def _release_writers(self) -> None:
        fd, self._writers = self._writers, None
        if fd is not None:
            os.close(fd)

    def reentered(self) -> bool:
        """Whether this thread is inside a call on this store (only the garbage collector
        closing a dropped Index gets here so: a fold or close then would deadlock)."""
        return self.txns.gate.nested() or (self.buffer is not None and self.buffer.reentered())

    def forget_log(self) -> None:
        """In a forked child: let go of the parent's write-buffer log without touching it."""
        if self.buffer is not None:
            self.buffer.forget_log()

    def fold(self) -> None:
        """Commit this process's write buffer, if any (writebuffer.WriteBuffer.fold), then
        apply what it committed to the shards as add_many would (group commit)."""
        buf = self.buffer
        if buf is not None and buf.fold():
            self.catch_up(lag=protocol.GROUP_LIMIT)

    def fold_if_old(self) -> None:
        """fold() when the oldest buffered record is older than FOLD_AGE (a query's check)."""
        buf = self.buffer
        if buf is not None and buf.old() and self.txns.failed is None:
            self.fold()

    def buffered(self) -> int:
        return self.buffer.n if self.buffer is not None else 0

    # ------------------------------------------------------------ reads
    def read_records(self, fn):
        return self.txns.read_txn(self.records, fn)

    def snapshot(self):
        """Read transactions [records, shard 0, shard 1, ...] of one moment (see
        TxnRunner.snapshot)."""
        return self.txns.snapshot()

    def get(self, idkey: bytes) -> Optional[bytes]:
        self.check_open()
        return self.read_records(lambda txn: records.get(txn, idkey, self.plan.words))

    def count(self) -> int:
        self.check_open()
        return self.read_records(records.count)

    def query(self, queries: np.ndarray, k: int, matches: bool = True) -> list:
        return self.read(lambda ctx: ctx.query(self.plan.permuter, queries, k, None, matches))

    def query_one(self, fp: int, k: int) -> list:
        perm = self.plan.permuter
        if self.plan.width != 64:
            q = words_array([fp], self.plan.width)
            return self.read(lambda ctx: ctx.query(perm, q, k, None, True))[0]
        return self.read(lambda ctx: ctx.query_one(perm, fp, k))

    # ------------------------------------------------------------ writes
    def add(self, idkeys: list, fps: np.ndarray, metas: list, jobs: int = 1,
            replace: bool = True) -> None:
        """Commit records in chunks (each atomic and durable), then apply them to the shards
        (`jobs` shards at once). replace=False: see protocol.commit."""
        self.check_writable()
        with self.write_lock:
            prepared = protocol.commit_prepared(self.txns, self.records, self.plan, idkeys,
                                                fps, metas, replace, jobs)
            self.catch_up(lag=protocol.GROUP_LIMIT, jobs=jobs, prepared=prepared)

    def add_unique(self, idkey: bytes, fp: int, meta: bytes, k: int,
                   passing: Optional[Callable[[list], list]] = None) -> list:
        """Insert unless a stored record is within k bits (and, with `passing`, among the
        hits it returns); the core's hits of those that are. The records write transaction
        is held while the index is queried and the hits judged, so of two near-identical
        records added at once by any processes exactly one goes in. A record stored under
        the same id that does not block the insert raises IdExistsError: an insert never
        replaces."""
        self.check_writable()
        q = np.array([fp], dtype=np.uint64) if self.plan.width == 64 else \
            words_array([fp], self.plan.width)

        def admit(txn):
            hits = self.read(lambda ctx: ctx.query(self.plan.permuter, q, k, txn))[0]
            if hits and passing is not None:
                hits = passing(hits)
            if not hits:
                records.refuse_replacing(txn, idkey)
                records.put(txn, [idkey], q, [meta])
            return hits
        with self.write_lock:
            found = self.txns.write(self.records, admit)
            if not found:
                self.catch_up(lag=protocol.LAG_LIMIT)
        return found

    def admit(self, fn: Callable[["Admission"], Any], lag: int = protocol.GROUP_LIMIT) -> Any:
        """fn(admission) inside one records write transaction: what it reads through the
        Admission (the hits of queries, the records committed since a seq) holds every
        record any writer committed before, and what it puts commits with them or not at
        all, so of two admissions made at once by any processes, the later sees the
        earlier's records (as add_unique does). fn may run again from the start when the
        map must grow: it must not change anything outside before it returns. The shards
        are then brought within `lag` records of the last (catch_up)."""
        self.check_writable()

        def run(txn):
            adm = Admission(self, txn)
            return fn(adm), adm.added
        with self.write_lock:
            result, added = self.txns.write(self.records, run)
            if added:
                self.catch_up(lag=lag)
        return result

    def remove(self, idkey: bytes) -> bool:
        self.check_writable()
        with self.write_lock:
            return self.txns.write(self.records, lambda txn: records.remove(txn, idkey))

    def catch_up(self, lag: int = 0, jobs: int = 1,
                 prepared: Optional[protocol.Prepared] = None) -> None:
        """Bring the shards up to the last committed record, or within `lag` records of it
        (protocol.catch_up)."""
        with self.write_lock:
            protocol.catch_up(self.txns, self.plan, lag=lag, jobs=jobs, prepared=prepared,
                              durable=self.sync)

    def compact(self) -> None:
        """Merge each table's runs in each shard into one, dropping removed entries
        (protocol.compact)."""
        self.check_writable()
        with self.write_lock:
            protocol.compact(self.txns, self.plan)

    def flush(self) -> None:
        """Bring every shard level and force every environment to disk."""
        self.check_writable()
        with self.write_lock:
            self.catch_up()
            self.txns.sync()
            if not self.sync:
                self._synced()

    def _synced(self) -> None:
        """Mark in every shard that records/ is on disk up to its last record (a sync=False
        store's flush or close: its commits are not synced one by one): the last seq is read
        before the sync, so a record another writer commits meanwhile is not counted."""
        last = self.read_records(records.last_seq)
        self.txns.sync(envs=self.txns.envs[:1])
        protocol.mark_synced(self.txns, last)


class Admission:
    """The reads and writes of one Store.admit: queries answered from its records write
    transaction (records no shard has applied yet included), and records put in it."""

    def __init__(self, store: Store, txn: Any) -> None:
        self._store, self._txn = store, txn
        self.added = 0
        self.last_seq = records.last_seq(txn)     # the newest seq given out before it

    def hits(self, queries: np.ndarray, k: int) -> list:
        """For each query, the core's hits (distance, fingerprint, seq, id, meta bytes)
        within k bits, sorted by (distance, seq)."""
        st, txn = self._store, self._txn
        return st.read(lambda ctx: ctx.query(st.plan.permuter, queries, k, txn))

    def since(self, seq: int) -> tuple:
        """(seqs, fingerprints) of the live records with a seq above `seq`, in seq order."""
        return records.tail(self._txn, seq + 1, 0, self._store.plan.words)

    def stored(self, idkey: bytes) -> bool:
        """Whether a record is stored under `idkey`."""
        return self._txn.get(DB_IDS, idkey) is not None

    def meta(self, idkey: bytes) -> Any:
        """The meta value stored under `idkey` (None also when no record is)."""
        record = record_of(records.get(self._txn, idkey, self._store.plan.words),
                           self._store.plan.words)
        return None if record is None else record.meta

    def put(self, idkeys: list, fps: np.ndarray, metas: list) -> None:
        """Add records, none replacing a stored one (records.put with replace=False:
        IdExistsError names an id already stored or given twice)."""
        if idkeys:
            records.put(self._txn, idkeys, fps, metas, replace=False)
            self.added += len(idkeys)
