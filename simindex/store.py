"""The storage of one index in one process: its LMDB environments and the write protocol.

Write protocol (see README, "Guarantees"):
1. records/ commits first; that commit is the durability point.
2. Each shard then applies the records it has not seen (seq > its applied seq) as new
   sorted runs and advances its applied seq in the same shard transaction.
3. After a crash, opening the index for writing replays what any shard missed. Until then
   queries check the unapplied records directly, so answers stay exact.

With sync=False, single adds go to a write buffer first (simindex/pending.py): a per-process
log in pending/ and memory, folded into records/ by one normal add of the buffered records.
Every call but add and query folds first; a writable open replays the logs of dead processes.

A process opens each index once: `acquire()` returns the shared store for a path, so LMDB
never sees the same environment opened twice in one process.
"""

import errno
import fcntl
import os
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from . import _core, manifest, pending
from .errors import (
    ClosedError, CorruptError, DiskFullError, Error, MapFullError, MapResizedError,
    MissingIndexError, NotAnIndexError, ParameterError, ParameterTypeError, ReadOnlyError,
    StorageError,
)
from .fingerprints import _scheme
from .plan import DEFAULT_SHARDS, Plan
from .shard import BLOCKS_DB, STATE_DB, ShardWriter, entry_order

RECORDS = "records"
DEFAULT_SCHEME = "simindex-v1"
IDS_DB, SEQS_DB, INFO_DB = "ids", "seqs", "info"
INITIAL_MAP = 16 << 30    # address space only; grows by doubling when full
RECORD_CHUNK = 1 << 18     # records per records/ transaction in add_many
# records per shard application pass: each pass adds a run per table, and later merges leave
# its pages free in the file, so bulk loads want few passes (a pass of 16.7M holds ~0.6 GB)
APPLY_CHUNK = 1 << 24
LAG_LIMIT = 256            # records a shard with nothing new may stay behind
READER_CHECK_EVERY = 1.0   # seconds between clearing the reader slots of dead processes
LOW_SPACE = 4 << 20        # an EIO with less free space than this is a short write: disk full
_KNOWN = {manifest.NAME, RECORDS, "lock", pending.PENDING}


def shard_dir(s):
    return f"shard-{s:03d}"


def _be(seq):
    return int(seq).to_bytes(8, "big")


class _Gate(_core.Gate):
    """The core's resize gate (see _core.Gate) with a context manager for the resize."""

    @contextmanager
    def exclusive(self):
        self.begin_exclusive()
        try:
            yield
        finally:
            self.end_exclusive()


class _HeldLock:
    """A lock that knows which thread holds it: a garbage-collected Index whose close the
    collector runs in the middle of a section of the same thread must not fold or close
    (see Store._reentered)."""
    __slots__ = ("_lock", "holder")

    def __init__(self):
        self._lock = threading.Lock()
        self.holder = None

    def __enter__(self):
        self._lock.acquire()
        self.holder = threading.get_ident()

    def __exit__(self, *exc):
        self.holder = None
        self._lock.release()
        return False


_registry = {}
_registry_lock = threading.RLock()     # re-entrant: a garbage-collected Index may release


def _after_fork_in_child():
    global _registry_lock
    _registry_lock = threading.RLock()     # another thread may have held it at fork()
    for store in _registry.values():
        store.forget_log()                 # the log and its lock stay the parent's
    _registry.clear()                      # the parent's handles are never used here


os.register_at_fork(after_in_child=_after_fork_in_child)


def acquire(path, *, k, blocks, shards, create, readonly, sync, scheme=None):
    """The process's store for the index at `path`, opening or creating it if needed."""
    if scheme is not None:
        scheme = _scheme(scheme).name              # a clear error for an unknown name
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise ParameterTypeError(f"path must be a str, bytes or os.PathLike, got "
                                 f"{type(path).__name__} {path!r:.60}")
    for name, flag in (("create", create), ("readonly", readonly), ("sync", sync)):
        if not isinstance(flag, bool):
            raise ParameterTypeError(f"{name} must be True or False, got {flag!r:.60}")
    path = os.path.abspath(os.fsdecode(os.fspath(path)))
    with _registry_lock:
        key = _identity(path)
        store = _registry.get(key) if key else None
        if store is not None and store.pid != os.getpid():
            _registry.clear()          # inherited from a parent process: never reuse
            store = None
        if store is not None:
            manifest.check_same(store.manifest, k=k, blocks=blocks, shards=shards,
                                scheme=scheme)
            if store.readonly and not readonly:
                raise ParameterError(
                    f"{path} is already open read-only in this process; close it before "
                    f"opening it for writing")
            if store.sync != sync and not readonly:
                raise ParameterError(
                    f"{path} is already open in this process with sync={store.sync}; "
                    f"open it with the same setting")
            store.refs += 1
            return store
        store = Store(path, k=k, blocks=blocks, shards=shards, create=create,
                      readonly=readonly, sync=sync, scheme=scheme)
        _registry[_identity(path)] = store
        return store


def _identity(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def release(store):
    # Closed under the registry lock, so no new handle on the same path can open its
    # environments a second time while these are still open. A store that could not close
    # (a close the garbage collector ran inside a call) stays registered for the next handle.
    with _registry_lock:
        store.refs -= 1
        if store.refs > 0:
            return
        try:
            store.close()
        finally:
            if store.closed:
                for key, s in list(_registry.items()):
                    if s is store:
                        del _registry[key]
            else:
                store.refs += 1


class Store:
    """Records env + shard envs of one index, their locks, and the read-context pool."""

    def __init__(self, path, *, k, blocks, shards, create, readonly, sync, scheme=None):
        self.path = path
        self.readonly = readonly
        self.sync = sync
        self.pid = os.getpid()
        self.refs = 1
        self.records = None
        self.shards = []
        self._pool = []
        self._wlock = threading.RLock()
        self._gate = _Gate()
        self.failed = None           # (errno, message) of the write error that makes this
                                     # handle refuse writes (no traceback: no cycles)
        self._reaped = {}            # env -> when its dead readers' slots were last cleared
        # the write buffer of single adds (sync=False writers only), its log and its lock;
        # lock order: _wlock, then _block
        self.buffer = pending.Buffer() if not (readonly or sync) else None
        self._block = _HeldLock()
        self._log = None
        self._shut = False           # closing: adds raise ClosedError
        self.pending_dir = os.path.join(path, pending.PENDING)
        self.replayed = 0            # records this handle replayed from dead writers' logs
        self.torn_bytes = 0          # bytes of torn log tails it found and ignored
        if os.path.exists(path) and not os.path.isdir(path):
            raise NotAnIndexError(f"{path} is a file, not an index directory")
        if not os.path.exists(os.path.join(path, manifest.NAME)):
            if readonly or not create:
                why = "readonly=True" if readonly else "create=False"
                raise MissingIndexError(f"no simindex index at {path} ({why} forbids making one)")
            plan = Plan(k=3 if k is None else k, blocks=blocks,
                        shards=DEFAULT_SHARDS if shards is None else shards)
            try:
                self._create(path, plan, scheme or DEFAULT_SCHEME)
            except StorageError as e:
                raise _space_error(e, path) from None
        self.manifest = manifest.read(path)
        manifest.check_same(self.manifest, k=k, blocks=blocks, shards=shards, scheme=scheme)
        m = self.manifest
        try:
            self.plan = Plan(k=m["k"], blocks=m["blocks"], shards=m["shards"])
        except ParameterError as e:
            raise CorruptError(f"{path}: the manifest holds impossible parameters: {e}") from None
        if self.plan.ntables != m["tables"]:
            raise CorruptError(f"{path}: the manifest's table count does not match k and blocks")
        try:
            self._open_envs()
            if not readonly:
                self.manifest = manifest.upgrade(path, self.manifest)
                self._fix_next_seq()
                self._replay_logs()
                self.apply_pending()
        except StorageError as e:
            self.close()
            raise _space_error(e, path) from None
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ creation and opening
    def _create(self, path, plan, scheme):
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        except FileNotFoundError:
            raise MissingIndexError(
                f"cannot create {path}: its parent directory {os.path.dirname(path)} does "
                f"not exist") from None
        except NotADirectoryError:
            raise NotAnIndexError(f"cannot create {path}: {os.path.dirname(path)} is not a "
                                  f"directory") from None
        except OSError as e:
            raise StorageError(e.errno, f"cannot create {path}: {e.strerror}") from e
        try:
            fd = os.open(os.path.join(path, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StorageError(e.errno, f"cannot create {path}/lock: {e.strerror}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.path.exists(os.path.join(path, manifest.NAME)):
                return                   # another process created it meanwhile
            extra = [n for n in os.listdir(path)
                     if n not in _KNOWN and not n.startswith("shard-")
                     and not n.startswith(manifest.NAME + ".tmp")]
            if extra:
                raise NotAnIndexError(
                    f"{path} is a non-empty directory that is not a simindex index "
                    f"(it holds {sorted(extra)[:3]})")
            self._check_unfinished(path, plan)
            # environments first, the manifest last: its presence marks a complete index
            for sub in [RECORDS] + [shard_dir(s) for s in range(plan.shards)]:
                os.makedirs(os.path.join(path, sub), exist_ok=True)
            self._open_envs(plan=plan, create=True)
            self._close_envs()
            manifest.write(path, manifest.make(plan, scheme))
        finally:
            os.close(fd)

    @staticmethod
    def _check_unfinished(path, plan):
        """Only finish a creation that crashed; never rebuild an index whose manifest is lost."""
        shards = [n for n in os.listdir(path) if n.startswith("shard-")]
        if any(n not in {shard_dir(s) for s in range(plan.shards)} for n in shards):
            raise CorruptError(f"{path} has shard directories but no manifest; restore "
                               f"{manifest.NAME} (nothing was changed)")
        for sub in [RECORDS] + shards:
            _drop_if_never_committed(os.path.join(path, sub))
        rec = os.path.join(path, RECORDS)
        if not os.path.exists(os.path.join(rec, "data.mdb")):
            if any(os.path.getsize(os.path.join(path, n, "data.mdb")) > 0 for n in shards
                   if os.path.exists(os.path.join(path, n, "data.mdb"))):
                raise CorruptError(f"{path} has shard data but no records/ and no manifest; "
                                   f"it cannot be rebuilt (nothing was changed)")
            return
        env = _core.Env(rec, readonly=True, mapsize=INITIAL_MAP, maxdbs=4)
        try:
            try:
                env.open_db(INFO_DB)
            except CorruptError:
                return                            # databases never made: an early crash
            with _core.Txn(env) as txn:
                used = txn.get(INFO_DB, b"next_seq") is not None
        finally:
            env.close()
        if used:
            raise CorruptError(f"{path} holds records but its manifest is missing; restore "
                               f"{manifest.NAME} (nothing was changed)")

    def _open_envs(self, plan=None, create=False):
        plan = plan or self.plan
        ro = self.readonly and not create
        for sub in [RECORDS] + [shard_dir(s) for s in range(plan.shards)]:
            d = os.path.join(self.path, sub)
            if not os.path.isdir(d):
                raise CorruptError(f"{self.path}: {sub}/ is missing")
            _check_data_file(d)
        self.records = _core.Env(os.path.join(self.path, RECORDS), readonly=ro,
                                 sync=self.sync, mapsize=INITIAL_MAP, maxdbs=4)
        for name in (IDS_DB, SEQS_DB, INFO_DB):
            self.records.open_db(name, create=not ro)
        self.shards = []
        for s in range(plan.shards):
            # Shards are derived from records/: after an OS crash one may lose its last
            # transactions (never its integrity), and replay restores them.
            env = _core.Env(os.path.join(self.path, shard_dir(s)), readonly=ro,
                            sync=self.sync, metasync=False, mapsize=INITIAL_MAP, maxdbs=4)
            self.shards.append(env)
            for name in (STATE_DB, BLOCKS_DB):
                env.open_db(name, create=not ro)
        # free the reader slots of processes that died inside a read transaction
        for env in [self.records] + self.shards:
            env.reader_check()

    def _close_envs(self):
        for ctx in self._pool:
            ctx.close()
        self._pool.clear()
        for env in self.shards:
            env.close()
        self.shards = []
        if self.records is not None:
            self.records.close()
            self.records = None

    def close(self):
        """Wait for calls in progress, flush, and close every environment."""
        if self.records is None:
            return
        if self.pid != os.getpid():
            # A forked child's copy: the handles are the parent's; drop them untouched.
            self._pool, self.shards, self.records = [], [], None
            return
        if self._reentered():
            raise RuntimeError(f"{self.path}: close() was called from inside a call on the "
                               f"index in the same thread (a garbage-collected handle)")
        with self._wlock:
            if self.records is None:
                return
            error = None
            if self.buffer is not None:
                if self.failed is None:
                    try:
                        self.fold()
                    except Error as e:
                        error = e              # raised once everything is closed
                with self._block:
                    self._shut = True
                    self._close_log()
            try:
                self._close_all()
            finally:
                if error is not None:
                    raise error

    def _close_all(self):
        with self._gate.exclusive():
            if not self.readonly:
                try:
                    for env in [self.records] + self.shards:
                        env.sync(True)
                except StorageError:
                    pass
            self._close_envs()

    def forget_log(self):
        """In a forked child: let go of the parent's log without touching it."""
        log, self._log = self._log, None
        if log is not None:
            log.forget()

    @property
    def closed(self):
        return self.records is None

    def check_open(self):
        if self.records is None:
            raise ClosedError(f"index {self.path} is closed")
        if self.pid != _core.process_id():
            raise ClosedError(f"index {self.path} was opened in process {self.pid} and cannot "
                              f"be used after fork(); open it again in this process")

    def _inside_open(self):
        if self.records is None:
            raise ClosedError(f"index {self.path} is closed")

    def check_writable(self):
        self.check_open()
        if self.readonly:
            raise ReadOnlyError(f"index {self.path} is open read-only")
        self._check_failed()

    def _check_failed(self):
        if self.failed is not None:
            raise StorageError(
                self.failed[0],
                f"{self.path}: this handle refuses writes since a write to disk failed "
                f"({self.failed[1]}); close every handle on the index and open it again "
                f"(the reopen replays what was committed)")

    def _write_failed(self, e, env):
        """Remember an I/O error of a commit or sync: what reached the disk is unknown (a
        failed fsync may have dropped dirty pages), so only a reopen may write again."""
        e = _space_error(e, self.path)
        self.failed = (e.errno, e.strerror)
        if env is not None and env is not self.records:
            e = type(e)(e.errno, f"{e.strerror}; the records are committed and queries find "
                                 f"them, and reopening the index brings its tables up to date")
        return e

    def _reap(self, env):
        """Free the reader slots of processes that died inside a read transaction (they
        would pin old pages forever and make the file grow); at most once a second."""
        now = time.monotonic()
        if now - self._reaped.get(env, 0.0) >= READER_CHECK_EVERY:
            self._reaped[env] = now
            env.reader_check()

    # ------------------------------------------------------------ map size
    def _grow(self, env):
        with self._gate.exclusive():
            size = env.info()["mapsize"]
            env.set_mapsize(size * 2)

    def _adopt(self, env=None):
        with self._gate.exclusive():
            for e in ([env] if env is not None else [self.records] + self.shards):
                e.set_mapsize(0)

    def _resized(self, env=None):
        """Adopt another process's map growth, or leave it to the outermost call."""
        if self._gate.nested():
            raise MapResizedError(f"{self.path}: the map was grown by another process")
        self._adopt(env)

    def write(self, env, fn):
        """Run fn(txn) in a write transaction on env, growing the map and retrying if full.

        An I/O error (a failed write, fsync or a full disk) makes this handle refuse writes.
        """
        self._check_failed()
        while True:
            try:
                with self._gate.shared():
                    self._inside_open()
                    self._reap(env)
                    with _core.Txn(env, write=True) as txn:
                        return fn(txn)
            except MapFullError:
                if self._gate.nested():
                    raise
                self._grow(env)
            except MapResizedError:
                self._resized()          # fn may have read other environments too
            except StorageError as e:
                if not _is_io(e):
                    raise
                raise self._write_failed(e, env) from None

    def read(self, fn):
        """Run fn(ctx) with a pooled read context, adopting a map another process grew."""
        gate, pool = self._gate, self._pool
        while True:
            try:
                gate.enter()
                try:
                    if self.records is None:
                        raise ClosedError(f"index {self.path} is closed")
                    ctx = pool.pop() if pool else _core.ReadContext(self.records, self.shards)
                    try:
                        return fn(ctx)
                    finally:
                        pool.append(ctx)
                finally:
                    gate.exit()
            except MapResizedError:
                self._resized()

    def with_txn(self, env, fn):
        """Run fn(txn) in a read transaction on env."""
        while True:
            try:
                with self._gate.shared():
                    self._inside_open()
                    with _core.Txn(env) as txn:
                        return fn(txn)
            except MapResizedError:
                self._resized(env)

    # ------------------------------------------------------------ records
    @staticmethod
    def next_seq(txn):
        v = txn.get(INFO_DB, b"next_seq")
        return int.from_bytes(v, "big") if v is not None else 1

    @staticmethod
    def _bump(txn, name, by):
        v = txn.get(INFO_DB, name)
        n = int.from_bytes(v, "big") if v is not None else 0
        txn.put(INFO_DB, name, max(0, n + by).to_bytes(8, "big"))

    def put_records(self, txn, idkeys, fps, metas):
        return put_records(txn, idkeys, fps, metas)

    def add(self, idkeys, fps, metas, jobs=1):
        """Commit records in chunks (each atomic and durable), then apply them to the shards
        (`jobs` shards at once)."""
        self.check_writable()
        with self._wlock:
            for i in range(0, len(idkeys), RECORD_CHUNK):
                j = i + RECORD_CHUNK
                self.write(self.records,
                           lambda txn: self.put_records(txn, idkeys[i:j], fps[i:j], metas[i:j]))
            self.apply_pending(force=False, jobs=jobs)

    def remove(self, idkey):
        self.check_writable()

        with self._wlock:
            return self.write(self.records, lambda txn: remove_record(txn, idkey))

    def get(self, idkey):
        self.check_open()

        return self.with_txn(self.records, lambda txn: get_record(txn, idkey, self.path))

    def count(self):
        self.check_open()
        return self.with_txn(self.records, lambda txn: txn.entries(IDS_DB))

    # ------------------------------------------------------------ the write buffer
    def append(self, idkey, fp, meta):
        """Add one record through the write buffer (sync=False): one write to this process's
        log, then memory. The record survives this process's death from the moment the
        call returns; a full or old buffer is folded first."""
        buf = self.buffer
        if buf.n and (buf.n >= pending.FOLD or
                      time.monotonic() - buf.since > pending.FOLD_AGE):
            self.fold()
        data = pending.entry(idkey, fp, meta)
        with self._block:
            if self._shut or self.records is None:
                raise ClosedError(f"index {self.path} is closed")
            self._check_failed()
            log = self._log
            if log is None:
                try:
                    log = self._log = pending.Log(self.pending_dir)
                except OSError as e:
                    raise self._log_error(e, f"cannot create a log in {self.pending_dir}") \
                        from None
            try:
                log.append(data)
            except OSError as e:
                err = self._log_error(e, f"cannot write {log.path}")
                if getattr(e, "torn", False):
                    # the log could not be cut back: entries after the torn one would be lost
                    self.failed = (err.errno, err.strerror)
                raise err from None
            buf.push(idkey, fp, meta, time.monotonic())

    def _log_error(self, e, what):
        """The simindex error of a failed log write: the record was not added."""
        err = _space_error(StorageError(e.errno, f"{what}: {e.strerror}"), self.path,
                           then="add the record again (it was not added)")
        if isinstance(err, DiskFullError):
            return err
        return StorageError(e.errno, f"{what}: {e.strerror}; the record was not added")

    def fold_if_old(self):
        """Fold when the oldest buffered record is older than FOLD_AGE (a query's check)."""
        buf = self.buffer
        if buf is not None and buf.n and self.failed is None and \
                time.monotonic() - buf.since > pending.FOLD_AGE:
            self.fold()

    def fold(self):
        """Commit the buffered records to records/ (one add, in order) with the marker of
        how far into the log they reach, switch to a new log, then apply them to the shards.

        Every call of the index but add and query folds first. A handle whose writes failed
        cannot fold: its buffered records stay in its log for the next writable open.
        """
        buf = self.buffer
        if buf is None or not buf.n:
            return
        if self._reentered():
            raise RuntimeError(f"{self.path}: a fold was attempted from inside a call on the "
                               f"index in the same thread (a garbage-collected handle)")
        with self._wlock:
            with self._block:
                if not buf.n:
                    return
                self._check_failed()
                buf.gen += 1           # queries that read the buffer before this retry
                log, n = self._log, buf.n
                idkeys, metas, fps, end = buf.idkeys, buf.metas, buf.fps[:n], log.end

                def commit(txn):
                    put_records(txn, idkeys, fps, metas)
                    txn.put(INFO_DB, pending.marker_key(log.token), end.to_bytes(8, "big"))
                    pending.drop_stale_markers(txn, INFO_DB, self.pending_dir,
                                               keep={log.token})
                self.write(self.records, commit)
                buf.clear()
                buf.gen += 1
                self._log = None
                log.discard()
            self.apply_pending(force=False)

    def _reentered(self):
        """Whether this thread is inside a call on this store: only the garbage collector
        running a dropped Index's close can get here so, and a fold or close then would
        deadlock or tear the buffer apart."""
        return self._block.holder == threading.get_ident() or self._gate.nested()

    def _close_log(self):
        """At close (under _block): remove the log when its records are folded, else keep it
        for the next writable open to replay."""
        log, self._log = self._log, None
        if log is None:
            return
        if self.buffer.n:
            log.keep()
        else:
            log.discard()

    def buffered(self):
        return self.buffer.n if self.buffer is not None else 0

    def _replay_logs(self):
        """Apply the logs of writers that died with records buffered (a writable open)."""
        d = self.pending_dir
        try:
            os.makedirs(d, exist_ok=True)       # indexes made before pending/ existed
            names = sorted(os.listdir(d))
        except OSError as e:
            raise StorageError(e.errno, f"cannot create or list {d}: {e.strerror}") from e
        for name in names:
            if pending.is_log_name(name):
                self._replay_log(name[:-len(".log")])
        if self.with_txn(self.records, lambda txn: txn.prefixed(INFO_DB, pending.MARKER)):
            self.write(self.records,
                       lambda txn: pending.drop_stale_markers(txn, INFO_DB, d))

    def _replay_log(self, token):
        path = pending.log_path(self.pending_dir, token)
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            return                               # replayed by another process meanwhile
        except OSError as e:
            raise StorageError(e.errno, f"cannot open {path}: {e.strerror}") from e
        with f:
            self._replay_file(f, path, token)

    def _replay_file(self, f, path, token):
        """Replay the log open as `f` unless its writer lives (holds its lock) or another
        process replayed and removed it since `f` was opened."""
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return                           # its writer is alive
        except OSError as e:
            raise StorageError(e.errno, f"cannot lock {path}: {e.strerror}") from e
        try:
            if os.fstat(f.fileno()).st_nlink == 0:
                return                       # replayed and removed meanwhile
            entries, good, size = pending.read_log(f)
        except OSError as e:
            raise StorageError(e.errno, f"cannot read {path}: {e.strerror}") from e
        key = pending.marker_key(token)

        def apply(txn):
            v = txn.get(INFO_DB, key)
            if v is not None and len(v) != 8:
                raise CorruptError(f"{self.path}: the fold marker of {path} is damaged")
            done = int.from_bytes(v, "big") if v is not None else 0
            todo = [e for e in entries if e[0] >= done]
            if todo:
                put_records(txn, [e[1] for e in todo],
                            np.array([e[2] for e in todo], dtype=np.uint64),
                            [e[3] for e in todo])
            txn.put(INFO_DB, key, max(done, good).to_bytes(8, "big"))
            return len(todo)
        if entries:
            self.replayed += self.write(self.records, apply)
        if size > good:
            self.torn_bytes += size - good
            pending.warn_torn(path, good, size)
        try:
            os.unlink(path)                  # before the lock goes with the close
        except FileNotFoundError:
            pass
        except OSError as e:
            raise StorageError(e.errno, f"cannot remove {path}: {e.strerror}") from e

    # ------------------------------------------------------------ shard application
    def apply_pending(self, force=True, jobs=1):
        """Bring the shards up to the last committed record (the replay after a crash).

        With force=False a shard that none of the new records touch is left behind by up
        to LAG_LIMIT records (queries check those directly), saving its commit and fsync.
        """
        with self._wlock:
            while True:
                applied = self.read(lambda ctx: ctx.applied(self.plan.ntables))
                start = min(applied) + 1
                seqs, fps, last = self.with_txn(self.records, lambda txn: (
                    *_core.read_tail(txn, SEQS_DB, start, APPLY_CHUNK), self.next_seq(txn) - 1))
                if len(seqs) == 0:
                    if force and last >= start:
                        self._advance(applied, last)   # only removed records above
                    return
                self._apply(seqs, fps, applied, force, jobs)
                if len(seqs) < APPLY_CHUNK and not (force and int(seqs[-1]) < last):
                    return

    def _advance(self, applied, last):
        """Move lagging shards' applied seq up to `last` when no live record lies between."""
        for s, a in enumerate(applied):
            if a < last:
                def bump(txn):
                    w = ShardWriter(txn)
                    if w.applied < last:
                        w.save(applied=last)
                self.write(self.shards[s], bump)

    def _fix_next_seq(self):
        """After an OS crash with sync=False a shard may have applied seqs the records lost:
        never hand those seqs out again, or their stale table entries would come back."""
        top = max(self.read(lambda ctx: ctx.applied(self.plan.ntables)))

        def bump(txn):
            if self.next_seq(txn) <= top:
                txn.put(INFO_DB, b"next_seq", (top + 1).to_bytes(8, "big"))
        self.write(self.records, bump)

    def _apply(self, seqs, fps, applied, force, jobs=1):
        plan = self.plan
        last = int(seqs[-1])
        bounds = np.arange(plan.shards + 1, dtype=np.uint64)
        per_table = []
        for t in range(plan.ntables):
            keys = plan.core.keys(t, fps)
            order = entry_order(keys, seqs)
            keys, sq = keys[order], seqs[order]
            # keys are sorted, and a shard is a range of leading bits: split by search
            if plan.shard_bits:
                lead = keys >> np.uint64(64 - plan.shard_bits)
                cuts = np.searchsorted(lead, bounds)
            else:
                cuts = np.array([0, len(keys)])
            per_table.append((keys, sq, cuts))

        def apply_shard(s):
            def apply(txn):
                w = ShardWriter(txn)
                if w.applied >= last:
                    return                 # another writer got here first
                for t, (keys, sq, cuts) in enumerate(per_table):
                    k = keys[cuts[s]:cuts[s + 1]]
                    q = sq[cuts[s]:cuts[s + 1]]
                    if w.applied >= int(seqs[0]):
                        keep = q > np.uint64(w.applied)
                        k, q = k[keep], q[keep]
                    w.add_run(t, np.ascontiguousarray(k), np.ascontiguousarray(q))
                w.save(applied=last)
            self.write(self.shards[s], apply)

        def news(s):
            # entries of records this shard has not applied yet (the tail read from the
            # most lagging shard holds records the others already have)
            return any((sq[cuts[s]:cuts[s + 1]] > np.uint64(applied[s])).any()
                       for _k, sq, cuts in per_table)

        todo = [s for s in range(plan.shards)
                if force or last - applied[s] >= LAG_LIMIT or news(s)]
        if jobs > 1 and len(todo) > 1:
            # each shard is its own environment with its own write lock, and the block
            # writes and commits release the GIL
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                list(pool.map(apply_shard, todo))
        else:
            for s in todo:
                apply_shard(s)

    # ------------------------------------------------------------ reads across shards
    @contextmanager
    def snapshot(self):
        """Read transactions on records and every shard, for whole-index scans."""
        self.check_open()
        outer = self._gate.nested()
        while True:
            txns = []
            with self._gate.shared():
                self._inside_open()
                try:
                    # shards first, records last (see ReadContext.query)
                    for env in self.shards + [self.records]:
                        txns.append(_core.Txn(env))
                except MapResizedError:
                    for t in txns:
                        t.abort()
                    if outer:
                        raise
                else:
                    try:
                        yield txns[-1], txns[:-1]
                    finally:
                        for t in txns:
                            t.abort()
                    return
            self._adopt()

    def compact(self):
        """Merge each table's runs in each shard into one, dropping removed entries."""
        self.check_writable()
        with self._wlock:
            self.apply_pending()
            def live_state(txn):
                v = txn.get(INFO_DB, b"stale")
                return _core.read_tail(txn, SEQS_DB, 0)[0], int.from_bytes(v or b"", "big")
            live, stale = self.with_txn(self.records, live_state)
            # seqs above the snapshot's newest may belong to records added meanwhile
            newest = int(live[-1]) if len(live) else 0
            for env in self.shards:
                def merge_all(txn):
                    w = ShardWriter(txn)
                    for t in range(self.plan.ntables):
                        runs = [r for r, _ in w.table_runs(t)]
                        # one run and no removed records: rewriting it would only free
                        # its old pages, which LMDB keeps in the file
                        if len(runs) > 1 or (runs and stale):
                            w.merge(t, runs, live=live, newest=newest)
                    w.save()
                self.write(env, merge_all)
            # removals made meanwhile stay counted
            self.write(self.records, lambda txn: self._bump(txn, b"stale", -stale))

    def flush(self):
        self.check_writable()
        with self._wlock:
            self.apply_pending()
            with self._gate.shared():
                for env in [self.records] + self.shards:
                    try:
                        env.sync(True)
                    except StorageError as e:
                        if not _is_io(e):
                            raise
                        raise self._write_failed(e, None) from None


def _is_io(e):
    """Whether a StorageError carries an operating-system error (EIO, ENOSPC, ...)."""
    return type(e) in (StorageError, DiskFullError) and isinstance(e.errno, int) and e.errno > 0


def _space_error(e, path, then="reopen the index"):
    """A DiskFullError when `e` means the disk (or a quota, or RLIMIT_FSIZE) is full.

    LMDB reports a short write as EIO, so an EIO with almost no free space counts too.
    `then` says what to do once there is room.
    """
    if not _is_io(e) or isinstance(e, DiskFullError):
        return e
    full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    free = None
    try:
        st = os.statvfs(path)
        free = st.f_bavail * st.f_frsize
    except OSError:
        pass
    if e.errno == errno.EIO and free is not None and free < LOW_SPACE:
        full = True
    if e.errno == errno.EIO and resource.getrlimit(resource.RLIMIT_FSIZE)[0] != \
            resource.RLIM_INFINITY:
        full = True                      # a short write at the file size limit (a guess)
    if not full:
        return e
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if e.errno == errno.EFBIG or (limit != resource.RLIM_INFINITY and e.errno == errno.EIO):
        why = f"the file size limit (RLIMIT_FSIZE, ulimit -f) of {limit:,} bytes was reached"
    elif e.errno == errno.EDQUOT:
        why = "the disk quota is exhausted"
    else:
        room = f"{free:,} bytes free" if free is not None else "free space unknown"
        why = f"the disk is full ({room} at {path})"
    return DiskFullError(e.errno, f"{e.strerror}: {why}; make room and {then}")


def put_records(txn, idkeys, fps, metas):
    """Write records in a records/ write transaction; returns the first seq given out.

    Record i gets seq seq0 + i; an id stored before loses its older record.
    """
    seq0 = Store.next_seq(txn)
    seq, replaced = _core.records_put(txn, IDS_DB, SEQS_DB, idkeys, fps, metas, seq0)
    txn.put(INFO_DB, b"next_seq", seq.to_bytes(8, "big"))
    if replaced:
        Store._bump(txn, b"stale", replaced)
    return seq0


def remove_record(txn, idkey):
    """Delete the record of an id key in a records/ write transaction; whether there was one."""
    old = txn.get(IDS_DB, idkey)
    if old is None:
        return False
    txn.delete(IDS_DB, idkey)
    txn.delete(SEQS_DB, old)
    Store._bump(txn, b"stale", 1)
    return True


def get_record(txn, idkey, path):
    """The stored record value of an id key, or None."""
    seq = txn.get(IDS_DB, idkey)
    if seq is None:
        return None
    value = txn.get(SEQS_DB, seq)
    if value is None:
        raise CorruptError(f"{path}: an id points to a missing record")
    return value


def _check_data_file(d):
    """Refuse a data.mdb cut short of its root pages (LMDB would SIGBUS reading them).

    LMDB may leave free pages at the end of the file unwritten (allocated and freed in one
    transaction), so a file shorter than its last page is normal after a crash; the missing
    tail is filled with zeros, so that a page lost to real damage reads as a damaged page
    (an error) instead of a SIGBUS.
    """
    f = os.path.join(d, "data.mdb")
    try:
        size = os.path.getsize(f)
    except FileNotFoundError:
        return
    if size == 0:
        return
    meta = _read_meta(f)
    if meta is None:
        raise CorruptError(f"{f} is damaged or not an LMDB data file (no valid meta page)")
    psize, _txnid, last_pg, roots = meta
    for root in roots:
        if root != _NO_PAGE and (root > last_pg or (root + 1) * psize > size):
            raise CorruptError(f"{f} is truncated: {size} bytes, its root page {root} "
                               f"needs {(root + 1) * psize}")
    need = (last_pg + 1) * psize
    if size < need:
        try:
            fd = os.open(f, os.O_WRONLY)
            try:
                os.posix_fallocate(fd, size, need - size)     # never shrinks the file
            finally:
                os.close(fd)
        except OSError as e:
            raise CorruptError(f"{f} is truncated: {size} bytes, its meta page needs {need}, "
                               f"and it cannot be extended ({e.strerror})") from None


_NO_PAGE = (1 << 64) - 1          # LMDB's P_INVALID: the root of an empty database


def _read_meta(f, txnid=None):
    """(page size, txn id, last page, [free root, main root]) of the newer valid meta page
    of an LMDB data file (or of the one of transaction `txnid`), or None."""
    with open(f, "rb") as fh:
        head = fh.read(2 * 65536)
    # Each meta page: a 16-byte page header, then MDB_meta: magic u32, version u32,
    # address, mapsize, two 48-byte MDB_db records (free pages, main; the first one's pad
    # holds the page size, each ends with its root page), last page number, txn id. LMDB
    # trusts the meta with the larger txn id.
    psize = int.from_bytes(head[40:44], "little") if len(head) >= 44 else 0
    if psize not in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536):
        psize = 4096
    best = None
    for i in range(2):
        page = head[i * psize:(i + 1) * psize]
        if len(page) < 152 or int.from_bytes(page[16:20], "little") != 0xBEEFC0DE:
            continue
        roots = [int.from_bytes(page[o:o + 8], "little") for o in (80, 128)]
        last_pg = int.from_bytes(page[136:144], "little")
        t = int.from_bytes(page[144:152], "little")
        if (txnid is None and (best is None or t > best[1])) or t == txnid:
            best = (psize, t, last_pg, roots)
    return best


def _drop_if_never_committed(d):
    """Remove an environment's files when no transaction ever committed in them (a creation
    that crashed while LMDB was writing them): they hold nothing, and LMDB cannot open a
    half-written first page."""
    f = os.path.join(d, "data.mdb")
    if not os.path.exists(f):
        return
    meta = _read_meta(f)
    if meta is None or meta[1] == 0:
        for name in ("data.mdb", "lock.mdb"):
            try:
                os.remove(os.path.join(d, name))
            except FileNotFoundError:
                pass
