"""The write buffer of an index opened with sync=False: single adds go to a per-process
append-only log in `<index>/pending/` and to memory, and fold into records/ in batches.

A log is `MAGIC` then entries, each `length (u32 LE) | crc32 (u32 LE) | payload`, the CRC
taken over the length's 4 bytes and the payload, the payload a msgpack
[id key, fingerprint, meta bytes] (simindex/codec.py). An entry is written with one
`pwrite`, so once `add` returns it is in the kernel's page cache and survives the death of
the process (not an OS crash: nothing is fsynced). Replay stops at the first entry that is
short or fails its check, so a torn tail is never applied in part.

A fold commits the buffered records in one records/ transaction that also stores, under
`MARKER + token`, how far into the log it got; the process then removes that log and starts
a new one with its next add. Replay applies only what lies past the marker, so a process
that dies between the commit and the removal never has a record applied twice.

Each live log is held under an exclusive `flock`; a writable open replays and removes every
log it can lock (its owner is gone). Names are 32 random hex digits, never reused, so a
marker whose log no longer exists is stale and is dropped by a later transaction.
"""

import fcntl
import os
import re
import secrets
import struct
import warnings
import zlib

import numpy as np

from . import _core
from .codec import MAX_LOG_RECORD, pack_log_record, unpack_log_record
from .errors import CorruptError

PENDING = "pending"
MAGIC = b"SIMLOG\x00\x01"
FOLD = 4096            # records a buffer holds at most: an add that finds it full folds it
FOLD_AGE = 1.0         # seconds: an add or query that finds an older record folds first
MARKER = b"log:"       # records/ info key prefix: log token -> offset folded (u64 BE)
_HEAD = struct.Struct("<II")
_NAME = re.compile(r"[0-9a-f]{32}\.log")


def entry(idkey, fp, meta_bytes):
    """One framed log entry of a record."""
    payload = pack_log_record(idkey, fp, meta_bytes)
    n = len(payload).to_bytes(4, "little")
    return _HEAD.pack(len(payload), zlib.crc32(payload, zlib.crc32(n))) + payload


def is_log_name(name):
    return _NAME.fullmatch(name) is not None


def marker_key(token):
    return MARKER + token.encode()


def log_path(directory, token):
    return os.path.join(directory, token + ".log")


class Log:
    """This process's pending log, created by its first append and locked while it lives.

    Errors are raw OSErrors; the store turns them into simindex errors naming the path.
    """

    def __init__(self, directory):
        self.token = secrets.token_hex(16)
        self.path = log_path(directory, self.token)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            # a new name: this never waits, and holds the log for as long as the process
            # (any process: a fork's child closes its copy of the descriptor) keeps it open
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _write_all(fd, MAGIC, 0)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(self.path)
            except OSError:
                pass
            raise
        self.fd = fd
        self.end = len(MAGIC)

    def append(self, data):
        """Write `data` at the end. On an error the log is cut back to where it was; if even
        that fails, the OSError carries `torn = True` (later entries would be lost)."""
        off = self.end
        try:
            _write_all(self.fd, data, off)
        except OSError as e:
            try:
                os.ftruncate(self.fd, off)
            except OSError:
                e.torn = True
            raise
        self.end = off + len(data)

    def discard(self):
        """Remove the log after its records were folded: unlink first, then close (which
        releases the lock), so a process that opened it meanwhile finds it unlinked."""
        try:
            os.unlink(self.path)
        except OSError:
            pass              # its marker covers it: a later replay applies nothing twice
        self.keep()

    def keep(self):
        """Close the log but leave it for a later writable open to replay."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def forget(self):
        """In a forked child: close the inherited descriptor. Never unlock: the lock belongs
        to the open file the parent still uses."""
        self.keep()


def _write_all(fd, data, off):
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, off)
        if n == 0:
            raise OSError(28, os.strerror(28))           # ENOSPC: nothing more fits
        view, off = view[n:], off + n


def read_log(f):
    """(entries, good, size) of an open log file: entries as (offset, id key, fp, meta bytes)
    up to the first bad one, `good` the offset where the valid part ends."""
    data_head = f.read(len(MAGIC))
    size = os.fstat(f.fileno()).st_size
    entries = []
    if data_head != MAGIC:
        return entries, 0, size
    off = len(MAGIC)
    while True:
        head = f.read(_HEAD.size)
        if len(head) < _HEAD.size:
            break
        n, crc = _HEAD.unpack(head)
        if n > MAX_LOG_RECORD or off + _HEAD.size + n > size:
            break
        payload = f.read(n)
        if len(payload) < n or zlib.crc32(payload, zlib.crc32(head[:4])) != crc:
            break
        try:
            idkey, fp, meta = unpack_log_record(payload)
        except CorruptError:
            break
        entries.append((off, idkey, fp, meta))
        off += _HEAD.size + n
    return entries, off, size


def warn_torn(path, good, size):
    warnings.warn(f"{path}: the last {size - good} bytes of this pending log are torn or "
                  f"damaged (an OS crash or a disk fault); the {good} bytes before them were "
                  f"replayed", RuntimeWarning, stacklevel=4)


def live_tokens(directory):
    """Tokens of the log files in `directory` (none when it does not exist)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return set()
    return {n[:-4] for n in names if _NAME.fullmatch(n)}


def drop_stale_markers(txn, info_db, directory, keep=()):
    """Delete the markers of logs that no longer exist, in a records/ write transaction.

    A marker is written while its log exists and log names are never reused, so a marker
    without a log can never be needed again.
    """
    markers = txn.prefixed(info_db, MARKER)
    if not markers:
        return
    live = live_tokens(directory)
    for key, _value in markers:
        token = key[len(MARKER):].decode("ascii", "replace")
        if token not in live and token not in keep:
            txn.delete(info_db, key)


class Buffer:
    """The records added since the last fold, in order, and what a query needs of them.

    Guarded by the store's buffer lock. `gen` counts folds: a query that read the buffer and
    then the records retries when a fold happened in between.
    """

    def __init__(self):
        self.gen = 0
        self.clear()

    def clear(self):
        self.idkeys = []
        self.metas = []
        self.fps = np.empty(FOLD, dtype=np.uint64)
        self.n = 0
        self.newest = {}     # id key -> position of its newest buffered record
        self.first = {}      # id key -> position of its first buffered record
        self.since = 0.0     # time.monotonic() of the oldest record

    def push(self, idkey, fp, meta, now):
        n = self.n
        if n == len(self.fps):
            self.fps = np.concatenate([self.fps, np.empty(len(self.fps), np.uint64)])
        if not n:
            self.since = now
        self.fps[n] = fp
        self.idkeys.append(idkey)
        self.metas.append(meta)
        self.newest[idkey] = n
        if idkey not in self.first:
            self.first[idkey] = n
        self.n = n + 1

    def within(self, q, k):
        """[(position, distance)] of the buffered records within k of q that are the newest
        of their id, in buffer order."""
        hits = _core.within(self.fps, self.n, q, k)
        if not hits:
            return hits
        newest, idkeys = self.newest, self.idkeys
        return [(i, d) for i, d in hits if newest[idkeys[i]] == i]

    def shadows(self, idkey, n):
        """Whether the first n buffered records hold one of `idkey` (it hides a stored one)."""
        return self.first.get(idkey, n) < n
