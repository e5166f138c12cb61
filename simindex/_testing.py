"""The one way tests and tools look inside an index, for what no public call shows.

Everything else a test checks goes through the public API (`stats()`, `verify()`, queries,
the files on disk). Keep this small: each function names a situation a test must create or
observe (a crash between two commits, a write that fails, a map that must grow), so the
internals behind it can move without touching the tests.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

import numpy as np

from .engine import (
    _query, environments, protocol, records, registry, transactions, writebuffer,
)
from .engine._layout import DB_INFO, INFO_LOG_MARKER, INFO_NEXT_SEQ
from .engine.codec import encode_id, pack_meta
from .index import Index
from .engine.lmdbfile import Meta, read_meta  # noqa: F401  (the meta page of a data file)

# Tuning knobs tests shrink to reach rare paths quickly: name -> (module, attribute).
KNOBS = {
    "fold": (writebuffer, "FOLD"),                       # records a write buffer holds
    "fold_age": (writebuffer, "FOLD_AGE"),               # seconds before a buffer folds
    "initial_map": (environments, "INITIAL_MAP"),        # bytes an environment maps first
    "apply_chunk": (protocol, "APPLY_CHUNK"),            # records per shard application pass
    "merge_inline": (protocol, "MERGE_INLINE"),          # entries a merge rewrites inline
    "sort_entries": (protocol, "SORT_ENTRIES"),          # entries a pass sorts at once
    "group": (protocol, "GROUP_LIMIT"),                  # records add_many leaves unapplied
    "prepare": (protocol, "PREPARE_MIN"),                # records a bulk load sorts early
    "reader_check_every": (transactions, "READER_CHECK_EVERY"),   # seconds between reaps
}


def tune(**knobs: Any) -> dict:
    """Set tuning knobs (see KNOBS) for this process; returns their old values."""
    old = {}
    for name, value in knobs.items():
        module, attr = KNOBS[name]
        old[name] = getattr(module, attr)
        setattr(module, attr, value)
    return old


@contextmanager
def tuned(**knobs: Any) -> Iterator[None]:
    """tune() for the duration of a block."""
    old = tune(**knobs)
    try:
        yield
    finally:
        tune(**old)


def _store(idx: Index):
    st = idx._store
    if st is None:
        raise ValueError("the index handle is closed")
    return st


def same_store(a: Index, b: Index) -> bool:
    """Whether two handles share one store (one LMDB open of each environment)."""
    return _store(a) is _store(b)


def buffered(idx: Index) -> int:
    """Records in this process's write buffer, without folding them (stats() folds)."""
    return _store(idx).buffered()


def has_buffer(idx: Index) -> bool:
    """Whether the handle adds through a write buffer (sync=False and writable)."""
    return _store(idx).buffer is not None


def log_path(idx: Index) -> Optional[str]:
    """The path of this process's live write-buffer log, if one is open."""
    buf = _store(idx).buffer
    return None if buf is None else buf.log_path


def replay_log(idx: Index, f, path: str) -> None:
    """Replay the write-buffer log open as `f` through this handle, as a writable open does
    (a test of the race with another process that replays it at the same moment)."""
    st = _store(idx)
    token = writebuffer.token_of(os.path.basename(path))
    writebuffer.replay_file(f, path, token, st.txns, st.records, writebuffer.Replay())


@contextmanager
def key_ordered_batches(min_queries: int = 2) -> Iterator[None]:
    """During the block, every batch of at least `min_queries` scans in key order, the path
    of big batches over big tables, whatever the tables' size."""
    old = _query.key_order(min_queries, 0)
    try:
        yield
    finally:
        _query.key_order(*old)


@contextmanager
def tail_tables(min_records: int) -> Iterator[None]:
    """During the block, a read context builds tables over its kept unapplied records from
    `min_records` of them on (0: from any; a huge number: never, a pass over them)."""
    old = _query.tail_tables(min_records)
    try:
        yield
    finally:
        _query.tail_tables(old)


@contextmanager
def run_filters(max_entries: int) -> Iterator[None]:
    """During the block, runs of up to `max_entries` entries get a prefix filter when first
    read (0: none does; the scans read every run)."""
    old = _query.run_filters(max_entries)
    try:
        yield
    finally:
        _query.run_filters(old)


def run_filters_built(idx: Index) -> int:
    """Over the handle's pooled read contexts: run directories that hold a prefix filter."""
    return sum(c.run_filters for c in _store(idx).txns._pool)


def tail_counters(idx: Index) -> dict:
    """Over the handle's pooled read contexts: unapplied records read from LMDB into their
    kept tails ("loads"), and tables built over those tails ("builds")."""
    pool = _store(idx).txns._pool
    return {"loads": sum(c.tail_loads for c in pool), "builds": sum(c.tail_builds for c in pool)}


def mapsizes(idx: Index) -> dict:
    """{"records": bytes, 0: bytes, 1: ...}: the map size of each environment."""
    st = _store(idx)
    out: dict = {"records": st.records.info()["mapsize"]}
    out.update((s, env.info()["mapsize"]) for s, env in enumerate(st.shard_envs))
    return out


@contextmanager
def snapshot(idx: Index) -> Iterator[None]:
    """Hold read transactions on every environment of the index during the block (as a
    reader that dies inside one leaves them)."""
    with _store(idx).snapshot():
        yield


def write_records(idx: Index, fn: Callable) -> Any:
    """fn(txn) in a records/ write transaction run by the write protocol's runner (its
    error handling included): to raise a write error, or to set what a crash leaves."""
    st = _store(idx)
    return st.txns.write(st.records, fn)


def set_next_seq(txn, seq: int) -> None:
    """In write_records: make `seq` the next seq to give out (lower it, as an OS crash with
    sync=False can leave records/ behind the shards)."""
    txn.put(DB_INFO, INFO_NEXT_SEQ, int(seq).to_bytes(8, "big"))


def commit_unapplied(idx: Index, ids: list, fps: np.ndarray) -> None:
    """Commit records to records/ only, as a writer killed before it touched the shards."""
    idks = [encode_id(i) for i in ids]
    metas = [pack_meta(None)] * len(ids)
    write_records(idx, lambda txn: records.put(txn, idks, np.asarray(fps, np.uint64), metas))


def crash(idx: Index) -> None:
    """Drop the handle as a killed process would: close its environments without folding,
    syncing or applying anything, and forget the process's open indexes."""
    st = _store(idx)
    idx._store = None
    st.txns.drop()
    st._release_writers()            # a killed process's locks go with it
    registry.forget_all()


@contextmanager
def after_compact_snapshot(idx: Index, fn: Callable[[], None]) -> Iterator[None]:
    """Run fn() once, right after the next compact() of `idx` read its records snapshot
    (to add records from another process while it merges)."""
    _store(idx)
    real = protocol.removals
    calls: list = []

    def removals(txn, words):
        out = real(txn, words)
        if not calls:
            calls.append(1)
            fn()
        return out
    protocol.removals = removals
    try:
        yield
    finally:
        protocol.removals = real


def log_markers(idx: Index) -> list:
    """[(key, offset bytes)] of the write-buffer fold markers records/ holds."""
    st = _store(idx)
    return st.read_records(lambda txn: txn.prefixed(DB_INFO, INFO_LOG_MARKER))


def set_log_marker(idx: Index, token: str, offset: int) -> None:
    """Record that a fold reached `offset` of the log named `token` (as a fold commits)."""
    write_records(idx, lambda txn: txn.put(DB_INFO, writebuffer.marker_key(token),
                                           writebuffer.marker_value(offset)))


def read_log(path: str) -> tuple:
    """(entries, good, size) of a write-buffer log file (writebuffer.read_log)."""
    with open(path, "rb") as f:
        return writebuffer.read_log(f)
