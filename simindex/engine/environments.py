"""The LMDB environments of an index directory: making a new index, and opening its records/
and shard environments after the checks that keep a damaged file from crashing the process.

Both the single-process store and the Ray servers open environments here, so they get the
same checks and the same settings.
"""

from __future__ import annotations

import errno
import fcntl
import os
from typing import Optional

from . import lmdbfile, manifest
from ._layout import (
    DB_IDS, DB_INFO, DB_SEQS, DB_SLABS, DB_STATE, INFO_NEXT_SEQ, LOCK_FILE, LOG_DIR,
    LOG_MAGIC, LOG_SUFFIX, MANIFEST, RECORDS_DIR, SHARD_PREFIX, ledger_dir, shard_dir,
)
from ._lmdb import Env, Txn
from ..errors import (
    CorruptError, MissingIndexError, NotAnIndexError, ParameterError, ReadOnlyError,
    StorageError,
)
from .plan import Plan

INITIAL_MAP = 16 << 30    # address space only; grows by doubling when full
MAX_DBS = 4
RECORDS_DBS = (DB_IDS, DB_SEQS, DB_INFO)
SHARD_DBS = (DB_STATE, DB_SLABS)
_KNOWN = {MANIFEST, RECORDS_DIR, LOCK_FILE, LOG_DIR}


def open_records(index_path: str, *, readonly: bool, sync: bool, sums: bool,
                 existing: bool = True, lock: bool = True, ledger: int = 0) -> Env:
    """records/ of the index at `index_path` (or, in an index of several ledgers, ledger
    `ledger`'s records-N/): the log of truth, synced on every commit.
    `sums`: whether its records carry checksums (the manifest's record_sums). `existing`:
    the index was made, so its data file must be there (a missing or empty one is lost
    records, refused: never taken for an empty index)."""
    sub = ledger_dir(ledger)
    try:
        env = _open(index_path, sub, RECORDS_DBS, readonly=readonly, sync=sync,
                    existing=existing, lock=lock)
    except CorruptError as e:
        raise _said(e, f"the index's records are damaged or lost and cannot be rebuilt; "
                       f"restore {sub}/ from a backup (nothing was changed)") from None
    env.sums = sums
    return env


def open_shard(index_path: str, shard: int, *, readonly: bool, sync: bool,
               existing: bool = True, lock: bool = True) -> Env:
    """Shard `shard` of the index. Shards are derived from records/: after an OS crash one
    may lose its last transactions (never its integrity), and replay restores them, so its
    meta page is not synced apart from its data (metasync=False)."""
    try:
        return _open(index_path, shard_dir(shard), SHARD_DBS, readonly=readonly, sync=sync,
                     metasync=False, existing=existing, lock=lock)
    except CorruptError as e:
        raise _said(e, f"shard {shard} is damaged; `simindex repair {index_path}` "
                       f"rebuilds it from the records") from None


def _said(e: CorruptError, then: str) -> CorruptError:
    """`e` (its type, errno and code kept) with what to do about it appended."""
    if e.errno is not None:
        return type(e)(e.errno, f"{e.strerror}: {then}", code=e.code)
    return type(e)(f"{e}: {then}", code=e.code)


def _open(index_path, sub, dbs, *, readonly, sync, metasync=True, existing=True, lock=True):
    d = os.path.join(index_path, sub)
    if not os.path.isdir(d):
        raise CorruptError(f"{index_path}: {sub}/ is missing")
    lmdbfile.check_size(d, readonly=readonly, existing=existing)
    try:
        env = Env(d, readonly=readonly, sync=sync, metasync=metasync, mapsize=INITIAL_MAP,
                  maxdbs=MAX_DBS, lock=lock)
    except StorageError as e:
        if readonly and e.errno in (errno.EACCES, errno.EPERM):
            raise StorageError(e.errno, f"{d}: a reader needs write access to its lock file "
                                        f"{lmdbfile.LOCK_MDB} ({e.strerror}); when no process "
                                        f"writes the index, open it with lock=False (such a "
                                        f"reader takes no locks)") from None
        if readonly or e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        raise ReadOnlyError(e.errno, f"{d} cannot be opened for writing ({e.strerror}): "
                                     f"open the index with readonly=True") from None
    try:
        for name in dbs:
            env.open_db(name, create=not readonly)
        # free the reader slots of processes that died inside a read transaction
        env.reader_check()
    except BaseException:
        env.close()
        raise
    return env


def create(path: str, plan: Plan, scheme: Optional[str],
           calibration: Optional[dict] = None) -> None:
    """Make a new index at `path` (a missing or empty directory), unless another process
    made it meanwhile. The environments come first and the manifest last: its presence
    marks a complete index, and a creation that crashed is finished by the next one."""
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
        fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StorageError(e.errno, f"cannot create {path}/{LOCK_FILE}: {e.strerror}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(path, MANIFEST)):
            return                   # another process created it meanwhile
        extra = [n for n in os.listdir(path)
                 if n not in _KNOWN and not n.startswith(SHARD_PREFIX)
                 and not n.startswith(MANIFEST + ".tmp")]
        if extra:
            raise NotAnIndexError(
                f"{path} is a non-empty directory that is not a simindex index "
                f"(it holds {sorted(extra)[:3]})")
        _check_unfinished(path, plan)
        envs = []
        try:
            for sub in [RECORDS_DIR] + [shard_dir(s) for s in range(plan.shards)]:
                os.makedirs(os.path.join(path, sub), exist_ok=True)
            envs.append(open_records(path, readonly=False, sync=True, existing=False,
                                     sums=True))
            envs += [open_shard(path, s, readonly=False, sync=True, existing=False)
                     for s in range(plan.shards)]
        finally:
            for env in envs:
                env.close()
        manifest.write(path, manifest.make(plan, scheme, calibration))
    finally:
        os.close(fd)


def _check_unfinished(path, plan):
    """Only finish a creation that crashed; never rebuild an index whose manifest is lost."""
    shards = [n for n in os.listdir(path) if n.startswith(SHARD_PREFIX)]
    if any(n not in {shard_dir(s) for s in range(plan.shards)} for n in shards):
        raise CorruptError(f"{path} has shard directories but no manifest; restore "
                           f"{MANIFEST} (nothing was changed)")
    for sub in [RECORDS_DIR] + shards:
        if lmdbfile.never_committed(os.path.join(path, sub)):
            lmdbfile.remove(os.path.join(path, sub))
    rec = os.path.join(path, RECORDS_DIR)
    if not os.path.exists(os.path.join(rec, lmdbfile.DATA_MDB)):
        if any(os.path.getsize(os.path.join(path, n, lmdbfile.DATA_MDB)) > 0 for n in shards
               if os.path.exists(os.path.join(path, n, lmdbfile.DATA_MDB))):
            raise CorruptError(f"{path} has shard data but no records/ and no manifest; "
                               f"it cannot be rebuilt (nothing was changed)")
        return
    env = Env(rec, readonly=True, mapsize=INITIAL_MAP, maxdbs=MAX_DBS)
    try:
        env.open_db(DB_INFO)
    except CorruptError:
        env.close()
        return                                # databases never made: an early crash
    if _ever_used(env):
        raise CorruptError(f"{path} holds records but its manifest is missing; restore "
                           f"{MANIFEST} (nothing was changed)")


def _ever_used(env: Env) -> bool:
    """Whether the records environment `env` ever gave out a seq; closes it."""
    try:
        with Txn(env) as txn:
            used = txn.get(DB_INFO, INFO_NEXT_SEQ) is not None
    finally:
        env.close()
    return used


def writers_lock(path: str) -> Optional[int]:
    """A shared lock on the index's lock file, held by every writable open for its life
    (a file descriptor to close), so that splitting the index over ledgers, which takes
    it exclusively, never runs under a writer. None where the file cannot be opened for
    writing (a read-only index: no split can run there either)."""
    try:
        fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o644)
    except OSError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)         # waits for a creation or a split in progress
    return fd


def _pending(path: str) -> bool:
    """Whether pending/ holds a write-buffer log with records in it (of a writer that
    stopped before folding them: the next writable open of one ledger replays them)."""
    d = os.path.join(path, LOG_DIR)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return False
    return any(n.endswith(LOG_SUFFIX) and
               os.path.getsize(os.path.join(d, n)) > len(LOG_MAGIC) for n in names)


def split_ledgers(m: manifest.Manifest, ledgers: int) -> manifest.Manifest:
    """Split the records of the index of `m` over `ledgers` ledgers (records-1/... made
    next to records/, then the manifest names them): only while the index has never held
    a record (nor holds one in a write-buffer log), since every record's ledger follows
    from its id; refused while it is open for writing anywhere (writers_lock). A split that
    crashed before its manifest is made again."""
    path = m.path
    fd = os.open(os.path.join(path, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ParameterError(f"ledgers={ledgers}: the index at {path} is open for "
                                 f"writing (in this process or another); close it first, "
                                 f"since a split must see every record") from None
        m = manifest.read(path)
        if m.ledgers == ledgers:
            return m
        if m.ledgers != 1:
            raise ParameterError(f"ledgers={ledgers} was given, but the index at {path} has "
                                 f"{m.ledgers} ledgers; reopen without it or with the "
                                 f"stored value")
        if _ever_used(open_records(path, readonly=True, sync=True, sums=m.record_sums)) or \
                _pending(path):
            raise ParameterError(f"ledgers={ledgers}: the index at {path} has held records "
                                 f"in one ledger (committed, or waiting in {LOG_DIR}/), and "
                                 f"an index is split over ledgers only while empty (build "
                                 f"a new one with ledgers={ledgers})")
        for ledger in range(1, ledgers):
            sub = os.path.join(path, ledger_dir(ledger))
            if os.path.exists(sub):
                lmdbfile.remove(sub)         # left by a split that crashed: never used
            os.makedirs(sub, exist_ok=True)
            open_records(path, readonly=False, sync=True, existing=False, sums=True,
                         ledger=ledger).close()
        manifest.write(path, m.with_ledgers(ledgers))
        return manifest.read(path)
    finally:
        os.close(fd)
