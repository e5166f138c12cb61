"""The per-process registry of open indexes: a process opens each index once.

LMDB's locks break if one process opens the same environment twice, so every Index on a
path (found by the device and inode of its directory) shares one Store, counted by
references; the last release closes it. A forked child never reuses its parent's stores.
"""

from __future__ import annotations

import os
import threading

from ..errors import ParameterError, ParameterTypeError, ReadOnlyError
from ..scheme_names import known as known_scheme
from . import manifest
from .ledgers import LedgerReader
from .store import Store

_registry: dict = {}
_registry_lock = threading.RLock()     # re-entrant: a garbage-collected Index may release


def _after_fork_in_child():
    global _registry_lock
    _registry_lock = threading.RLock()     # another thread may have held it at fork()
    for store in _registry.values():
        store.forget_log()                 # the log and its lock stay the parent's
    _registry.clear()                      # the parent's handles are never used here


os.register_at_fork(after_in_child=_after_fork_in_child)


def acquire(path, *, k, blocks, shards, create, readonly, sync, scheme=None,
            prefix_blocks=None, width=None, calibration=None, lock=True) -> Store:
    """The process's store for the index at `path`, opening or creating it if needed.
    lock=False (read-only opens only) takes no LMDB reader locks; a store opened with locks
    serves such a handle too (locks are only safer), the other way round is refused."""
    if isinstance(calibration, dict) and known_scheme(calibration.get("scheme")):
        calibration = dict(calibration, scheme=known_scheme(calibration["scheme"]))
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise ParameterTypeError(f"path must be a str, bytes or os.PathLike, got "
                                 f"{type(path).__name__} {path!r:.60}")
    for name, flag in (("create", create), ("readonly", readonly), ("sync", sync),
                       ("lock", lock)):
        if not isinstance(flag, bool):
            raise ParameterTypeError(f"{name} must be True or False, got {flag!r:.60}")
    if not lock and not readonly:
        raise ParameterError("lock=False is for readonly=True opens (a writer always locks)")
    path = os.path.abspath(os.fsdecode(os.fspath(path)))
    with _registry_lock:
        key = _identity(path)
        store = _registry.get(key) if key else None
        if store is not None and store.pid != os.getpid():
            _registry.clear()          # inherited from a parent process: never reuse
            store = None
        if store is not None:
            store.manifest.check_same(k=k, blocks=blocks, shards=shards, scheme=scheme,
                                      prefix_blocks=prefix_blocks, width=width,
                                      calibration=calibration)
            if store.readonly and not readonly:
                raise ParameterError(
                    f"{path} is already open read-only in this process; close it before "
                    f"opening it for writing")
            if not store.lock and lock:
                raise ParameterError(
                    f"{path} is already open with lock=False in this process; close it "
                    f"before opening it with locks")
            if store.sync != sync and not readonly:
                raise ParameterError(
                    f"{path} is already open in this process with sync={store.sync}; "
                    f"open it with the same setting")
            store.refs += 1
            return store
        if _ledgers(path) > 1:
            store = _ledger_reader(path, readonly, lock, k=k, blocks=blocks, shards=shards,
                                   scheme=scheme, prefix_blocks=prefix_blocks, width=width,
                                   calibration=calibration)
            _registry[_identity(path)] = store
            return store
        store = Store(path, k=k, blocks=blocks, shards=shards, create=create,
                      readonly=readonly, sync=sync, scheme=scheme, prefix_blocks=prefix_blocks,
                      width=width, calibration=calibration, lock=lock)
        _registry[_identity(path)] = store
        return store


def _ledgers(path) -> int:
    """How many ledgers the index at `path` has (1 when it has no manifest yet)."""
    if not os.path.exists(os.path.join(path, manifest.NAME)):
        return 1
    return manifest.read(path).ledgers


def _ledger_reader(path, readonly, lock, **given):
    """The store of an index of several ledgers: read-only on one machine."""
    m = manifest.read(path)
    m.check_same(**given)
    if not readonly:
        raise ReadOnlyError(f"index {path} has {m.ledgers} ledgers: on one machine it "
                            f"opens read-only (readonly=True; simindex serve --readonly), "
                            f"and it is written through simindex.distributed.Cluster")
    return LedgerReader(path, m, lock=lock)


def _identity(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def release(store: Store) -> None:
    """Drop one reference; the last one closes the store.

    Closed under the registry lock, so no new handle on the same path can open its
    environments a second time while these are still open. A store that could not close
    (a close the garbage collector ran inside a call) stays registered for the next handle.
    """
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


def forget_all() -> None:
    """Drop every registered store without closing it (a test's simulated crash)."""
    with _registry_lock:
        _registry.clear()
