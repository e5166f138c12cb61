"""The write buffer of an index opened with sync=False: single adds go to a per-process
append-only log in `<index>/pending/` and to memory, and fold into records/ in batches.

A log is LOG_MAGIC then entries, each `length (u32 LE) | crc32 (u32 LE) | payload`, the CRC
taken over the length's 4 bytes and the payload, the payload a msgpack
[id key, fingerprint, meta bytes] (simindex/engine/codec.py; the fingerprint an int at width 64,
big-endian bytes of width/8 above). An entry is written with one
`pwrite`, so once `add` returns it is in the kernel's page cache and survives the death of
the process (not an OS crash: nothing is fsynced). Replay stops at the first entry that is
short or fails its check, so a torn tail is never applied in part.

A fold commits the buffered records in one records/ transaction that also stores, under
INFO_LOG_MARKER + token, how far into the log it got; the process then removes that log and
starts a new one with its next add. Replay applies only what lies past the marker, so a
process that dies between the commit and the removal never has a record applied twice.

Each live log is held under an exclusive `flock`; a writable open replays and removes every
log it can lock (its owner is gone). Names are 32 random hex digits, never reused, so a
marker whose log no longer exists is stale and is dropped by a later transaction.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import struct
import threading
import time
import warnings
from typing import Any, Callable, Optional

import numpy as np

from . import records
from ._join import within, within_words
from ._layout import (
    DB_INFO, INFO_LOG_MARKER, LOG_DIR, LOG_ENTRY_HEADER, LOG_MAGIC, LOG_SUFFIX, LOG_TOKEN_HEX,
)
from ._lmdb import Env
from ._records import checksum
from .codec import (
    MAX_LOG_RECORD, decode_id, encode_id, pack_log_record, unpack, unpack_log_record, words_array,
)
from ..errors import CorruptError, DiskFullError, StorageError, closed_error
from .transactions import TxnRunner, space_error

FOLD = 4096            # records a buffer holds at most: an add that finds it full folds it
FOLD_AGE = 1.0         # seconds: an add or query that finds an older record folds first
_HEAD = struct.Struct("<II")
assert _HEAD.size == LOG_ENTRY_HEADER
_NAME = re.compile(f"[0-9a-f]{{{LOG_TOKEN_HEX}}}{re.escape(LOG_SUFFIX)}")


# ---------------------------------------------------------------- the log file
def entry(idkey: bytes, fp: int, meta_bytes: bytes, width: int = 64) -> bytes:
    """One framed log entry of a record of a `width`-bit index."""
    payload = pack_log_record(idkey, fp, meta_bytes, width)
    n = len(payload).to_bytes(4, "little")
    return _HEAD.pack(len(payload), checksum(payload, checksum(n))) + payload


def is_log_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def token_of(name: str) -> str:
    """The token of a log file's name (its hex digits)."""
    return name[:-len(LOG_SUFFIX)]


def marker_key(token: str) -> bytes:
    return INFO_LOG_MARKER + token.encode()


def marker_value(offset: int) -> bytes:
    """A fold marker's value: how far into its log the folds reached (u64 BE)."""
    return int(offset).to_bytes(8, "big")


def marker_offset(value: bytes) -> int:
    return int.from_bytes(value, "big")


def log_path(directory: str, token: str) -> str:
    return os.path.join(directory, token + LOG_SUFFIX)


class Log:
    """This process's log, created by its first append and locked while it lives.

    Errors are raw OSErrors; the buffer turns them into simindex errors naming the path.
    """

    def __init__(self, directory: str) -> None:
        while True:
            self.token = secrets.token_hex(LOG_TOKEN_HEX // 2)
            self.path = log_path(directory, self.token)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            try:
                # the lock is held for as long as the process (any process: a fork's child
                # closes its copy of the descriptor) keeps the log open. Between the open and
                # the lock, another process's open may find it unlocked and replay it as a
                # dead writer's: it then holds the lock, or has removed the file; a new log
                # is made, never one that no replay would find
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    taken = os.fstat(fd).st_nlink == 0
                except BlockingIOError:
                    taken = True
                if not taken:
                    _write_all(fd, LOG_MAGIC, 0)
            except BaseException:
                os.close(fd)
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
                raise
            if not taken:
                break
            os.close(fd)
        self.fd = fd
        self.end = len(LOG_MAGIC)

    def append(self, data: bytes) -> None:
        """Write `data` at the end. On an error the log is cut back to where it was; if even
        that fails, the OSError carries `torn = True` (later entries would be lost)."""
        off = self.end
        try:
            _write_all(self.fd, data, off)
        except OSError as e:
            try:
                os.ftruncate(self.fd, off)
            except OSError:
                setattr(e, "torn", True)
            raise
        self.end = off + len(data)

    def discard(self) -> None:
        """Remove the log after its records were folded: unlink first, then close (which
        releases the lock), so a process that opened it meanwhile finds it unlinked."""
        try:
            os.unlink(self.path)
        except OSError:
            pass              # its marker covers it: a later replay applies nothing twice
        self.keep()

    def keep(self) -> None:
        """Close the log but leave it for a later writable open to replay. (In a forked
        child this only closes the inherited descriptor: the lock belongs to the open file
        the parent still uses.)"""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def _write_all(fd, data, off):
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, off)
        if n == 0:
            raise OSError(28, os.strerror(28))           # ENOSPC: nothing more fits
        view, off = view[n:], off + n


def read_log(f, width: int = 64) -> tuple:
    """(entries, good, size) of an open log file of a `width`-bit index: entries as (offset,
    id key, fp, meta bytes) up to the first bad one, `good` the offset where the valid part
    ends."""
    data_head = f.read(len(LOG_MAGIC))
    size = os.fstat(f.fileno()).st_size
    entries: list = []
    if data_head != LOG_MAGIC:
        return entries, 0, size
    off = len(LOG_MAGIC)
    while True:
        head = f.read(_HEAD.size)
        if len(head) < _HEAD.size:
            break
        n, crc = _HEAD.unpack(head)
        if n > MAX_LOG_RECORD or off + _HEAD.size + n > size:
            break
        payload = f.read(n)
        if len(payload) < n or checksum(payload, checksum(head[:4])) != crc:
            break
        try:
            idkey, fp, meta = unpack_log_record(payload, width)
        except CorruptError:
            break
        entries.append((off, idkey, fp, meta))
        off += _HEAD.size + n
    return entries, off, size


def live_tokens(directory: str) -> set:
    """Tokens of the log files in `directory` (none when it does not exist)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return set()
    return {token_of(n) for n in names if _NAME.fullmatch(n)}


def drop_stale_markers(txn, directory: str, keep=()) -> None:
    """Delete the markers of logs that no longer exist, in a records/ write transaction.

    A marker is written while its log exists and log names are never reused, so a marker
    without a log can never be needed again.
    """
    markers = txn.prefixed(DB_INFO, INFO_LOG_MARKER)
    if not markers:
        return
    live = live_tokens(directory)
    for key, _value in markers:
        token = key[len(INFO_LOG_MARKER):].decode("ascii", "replace")
        if token not in live and token not in keep:
            txn.delete(DB_INFO, key)


# ---------------------------------------------------------------- replay at open
class Replay:
    """What a writable open replayed from the logs of dead writers."""

    def __init__(self) -> None:
        self.records = 0         # records applied
        self.torn_bytes = 0      # bytes of torn or damaged log tails skipped


def replay_logs(index_path: str, txns: TxnRunner, records_env: Env,
                width: int = 64) -> Replay:
    """Apply the logs of writers that died with records buffered (a writable open of a
    `width`-bit index)."""
    d = os.path.join(index_path, LOG_DIR)
    done = Replay()
    try:
        os.makedirs(d, exist_ok=True)       # indexes made before pending/ existed
        names = sorted(os.listdir(d))
    except OSError as e:
        raise StorageError(e.errno, f"cannot create or list {d}: {e.strerror}") from e
    for name in names:
        if is_log_name(name):
            path = os.path.join(d, name)
            try:
                f = open(path, "rb")
            except FileNotFoundError:
                continue                         # replayed by another process meanwhile
            except OSError as e:
                raise StorageError(e.errno, f"cannot open {path}: {e.strerror}") from e
            with f:
                replay_file(f, path, token_of(name), txns, records_env, done, width)
    if txns.read_txn(records_env, lambda txn: txn.prefixed(DB_INFO, INFO_LOG_MARKER)):
        txns.write(records_env, lambda txn: drop_stale_markers(txn, d))
    return done


def replay_file(f, path: str, token: str, txns: TxnRunner, records_env: Env,
                done: Replay, width: int = 64) -> None:
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
        entries, good, size = read_log(f, width)
    except OSError as e:
        raise StorageError(e.errno, f"cannot read {path}: {e.strerror}") from e
    key = marker_key(token)

    def apply(txn):
        v = txn.get(DB_INFO, key)
        if v is not None and len(v) != 8:
            raise CorruptError(f"{path}: its fold marker in records/ is damaged")
        folded = marker_offset(v) if v is not None else 0
        todo = [e for e in entries if e[0] >= folded]
        if todo:
            fps = [e[2] for e in todo]
            records.put(txn, [e[1] for e in todo], np.array(fps, dtype=np.uint64)
                        if width == 64 else words_array(fps, width), [e[3] for e in todo])
        txn.put(DB_INFO, key, marker_value(max(folded, good)))
        return len(todo)
    if entries:
        done.records += txns.write(records_env, apply)
    if size > good:
        done.torn_bytes += size - good
        warnings.warn(f"{path}: the last {size - good} bytes of this pending log are torn or "
                      f"damaged (an OS crash or a disk fault); the {good} bytes before them "
                      f"were replayed", RuntimeWarning, stacklevel=4)
    try:
        os.unlink(path)                  # before the lock goes with the close
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StorageError(e.errno, f"cannot remove {path}: {e.strerror}") from e


# ---------------------------------------------------------------- the buffer in memory
class _HeldLock:
    """A lock that knows which thread holds it: a garbage-collected Index whose close the
    collector runs in the middle of a section of the same thread must not fold or close
    (see WriteBuffer.reentered)."""
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


class WriteBuffer:
    """The records this process added since its last fold, its log, and its lock.

    `write_lock` is the store's (a fold is a write of the index: lock order is that lock,
    then this buffer's own). The buffer only commits to records/: its owner folds it when
    due() and brings the shards up after a fold. `gen` counts folds: a query that read the
    buffer and then the records retries when a fold happened in between.
    """

    def __init__(self, index_path: str, txns: TxnRunner, records_env: Env,
                 write_lock, width: int = 64) -> None:
        self.path = index_path
        self.width = width
        self._shape: tuple = (FOLD,) if width == 64 else (FOLD, width // 64)
        self.directory = os.path.join(index_path, LOG_DIR)
        self._txns = txns
        self._records = records_env
        self._write_lock = write_lock
        self._lock = _HeldLock()
        self._log: Optional[Log] = None
        self._shut = False           # closing: adds raise ClosedError
        self.gen = 0
        self._clear()

    def _clear(self) -> None:
        self.idkeys: list = []
        self.metas: list = []
        self.fps = np.empty(self._shape, dtype=np.uint64)   # (n,) or (n, words) wide
        self.n = 0
        self.newest: dict = {}   # id key -> position of its newest buffered record
        self.first: dict = {}    # id key -> position of its first buffered record
        self.since = 0.0         # time.monotonic() of the oldest record

    @property
    def log_path(self) -> Optional[str]:
        """The path of this process's live log (None before the first add after a fold)."""
        log = self._log
        return None if log is None else log.path

    def _push(self, idkey, fp, meta, now):
        n = self.n
        if n == len(self.fps):
            self.fps = np.concatenate([self.fps, np.empty_like(self.fps)])
        if not n:
            self.since = now
        if self.width == 64:
            self.fps[n] = fp
        else:
            self.fps[n] = words_array([fp], self.width)[0]
        self.idkeys.append(idkey)
        self.metas.append(meta)
        self.newest[idkey] = n
        if idkey not in self.first:
            self.first[idkey] = n
        self.n = n + 1

    def old(self) -> bool:
        """Whether the oldest buffered record is older than FOLD_AGE (a query folds then)."""
        return bool(self.n) and time.monotonic() - self.since > FOLD_AGE

    def due(self) -> bool:
        """Whether the buffer is to be folded before the next add: full, or old."""
        n = self.n
        return bool(n) and (n >= FOLD or time.monotonic() - self.since > FOLD_AGE)

    # ------------------------------------------------------------ adds
    def append(self, idkey: bytes, fp: int, meta: bytes) -> None:
        """Add one record: one write to this process's log, then memory. The record survives
        this process's death from the moment the call returns (the caller folds a buffer
        that is due() first)."""
        data = entry(idkey, fp, meta, self.width)
        with self._lock:
            if self._shut or self._txns.closed:
                raise closed_error(f"index {self.path}")
            self._txns.check_failed()
            log = self._log
            if log is None:
                try:
                    log = self._log = Log(self.directory)
                except OSError as e:
                    raise self._log_error(e, f"cannot create a log in {self.directory}") \
                        from None
            try:
                log.append(data)
            except OSError as e:
                err = self._log_error(e, f"cannot write {log.path}")
                if getattr(e, "torn", False):
                    # the log could not be cut back: entries after the torn one would be lost
                    self._txns.failed = (err.errno, err.strerror)
                raise err from None
            self._push(idkey, fp, meta, time.monotonic())

    def _log_error(self, e, what):
        """The simindex error of a failed log write: the record was not added."""
        err = space_error(StorageError(e.errno, f"{what}: {e.strerror}"), self.path,
                          then="add the record again (it was not added)")
        if isinstance(err, DiskFullError):
            return err
        return StorageError(e.errno, f"{what}: {e.strerror}; the record was not added")

    # ------------------------------------------------------------ folds
    def fold(self) -> int:
        """Commit the buffered records to records/ (one add, in order) with the marker of
        how far into the log they reach, and switch to a new log; returns how many records
        it committed (0: none were buffered). Applying them to the shards is the caller's.

        A handle whose writes failed cannot fold: its buffered records stay in its log for
        the next writable open.
        """
        if not self.n:
            return 0
        if self.reentered():
            raise RuntimeError(f"{self.path}: a fold was attempted from inside a call on the "
                               f"index in the same thread (a garbage-collected handle)")
        with self._write_lock:
            with self._lock:
                if not self.n:
                    return 0
                self._txns.check_failed()
                self.gen += 1           # queries that read the buffer before this retry
                log, n = self._log, self.n
                assert log is not None  # every buffered record was written to it
                idkeys, metas, fps, end = self.idkeys, self.metas, self.fps[:n], log.end

                def commit(txn):
                    records.put(txn, idkeys, fps, metas)
                    txn.put(DB_INFO, marker_key(log.token), marker_value(end))
                    drop_stale_markers(txn, self.directory, keep={log.token})
                self._txns.write(self._records, commit)
                self._clear()
                self.gen += 1
                self._log = None
                log.discard()
        return n

    def reentered(self) -> bool:
        """Whether this thread is inside a call on the index: only the garbage collector
        running a dropped Index's close can get here so, and a fold or close then would
        deadlock or tear the buffer apart."""
        return self._lock.holder == threading.get_ident() or self._txns.gate.nested()

    # ------------------------------------------------------------ queries
    def fingerprint(self, i: int) -> int:
        """The fingerprint of the record at buffer position i, as an int."""
        if self.width == 64:
            return int(self.fps[i])
        return int.from_bytes(self.fps[i].astype(">u8").tobytes(), "big")

    def within(self, q: int, k: int) -> list:
        """[(position, distance)] of the buffered records within k of q that are the newest
        of their id, in buffer order."""
        if self.width == 64:
            hits = within(self.fps, self.n, q, k)
        else:
            hits = within_words(self.fps, self.n, words_array([q], self.width)[0], k)
        if not hits:
            return hits
        newest, idkeys = self.newest, self.idkeys
        return [(i, d) for i, d in hits if newest[idkeys[i]] == i]

    def query(self, fp: int, k: int, stored: Callable[[], list], match: Callable[..., Any],
              raw: bool = False) -> list:
        """What query(fp, k) will answer once the buffer is folded: `stored()` (the stored
        matches) less those of ids with a newer buffered record, then the buffered matches
        (each id's newest only), sorted by distance, stored first. `match(id, fingerprint,
        distance, meta)` makes each buffered one (raw: with the meta bytes as stored)."""
        while True:
            with self._lock:
                gen, n = self.gen, self.n
                mine = [(d, self.idkeys[i], self.fingerprint(i), self.metas[i])
                        for i, d in self.within(fp, k)]
            found = stored()
            with self._lock:
                if self.gen != gen:
                    continue               # folded meanwhile: the records may hold them
                if n:
                    found = [m for m in found
                             if self.first.get(encode_id(m.id), n) >= n]
            break
        if not mine:
            return found
        out = found + [match(decode_id(idk), f, d, mb if raw else unpack(mb, "meta value"))
                       for d, idk, f, mb in mine]
        out.sort(key=lambda m: m.distance)  # stable: stored (by seq), then buffer order
        return out

    # ------------------------------------------------------------ the end
    def close(self) -> None:
        """At the store's close: refuse further adds; remove the log when its records are
        folded, else keep it for the next writable open to replay."""
        with self._lock:
            self._shut = True
            log, self._log = self._log, None
            if log is None:
                return
            if self.n:
                log.keep()
            else:
                log.discard()

    def forget_log(self) -> None:
        """In a forked child: let go of the parent's log without touching it."""
        log, self._log = self._log, None
        if log is not None:
            log.keep()
