"""The transaction runners of the environments one process holds open: every read and write
of an index goes through them, in the single-process store and in the Ray servers alike.

`write(env, fn)` runs fn(txn) in a write transaction and owns what a write must survive:
a full map is grown (doubling) and the write retried; a map another process grew is
adopted; an I/O error of a commit or sync makes the handle refuse writes until the index is
reopened (what reached the disk is unknown); reader slots of dead processes are reaped so
freed pages are reused. A resize needs no live transaction of this process, so every call
runs inside the resize gate and a resize waits for the gate to empty.
"""

from __future__ import annotations

import errno
import os
import resource
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, TypeVar

from ._lmdb import Env, Gate, Txn, current_pid
from ._query import ReadContext
from ..errors import DiskFullError, MapFullError, MapResizedError, StorageError, closed_error

T = TypeVar("T")
READER_CHECK_EVERY = 1.0   # seconds between clearing the reader slots of dead processes
LOW_SPACE = 4 << 20        # an EIO with less free space than this is a short write: disk full


class TxnRunner:
    """Runs the read and write transactions of a fixed list of environments.

    With `contexts`, envs[0] is records/ and the rest are shards (all of them, or none: the
    Ray ledger), and `read()` runs in a pooled ReadContext over them; `what` names the
    handle in errors ("index /path").
    """

    def __init__(self, path: str, envs: list, *, what: str, contexts: bool = False) -> None:
        self.path = path
        self.envs = list(envs)
        self.what = what
        self.pid = current_pid()
        self.gate = Gate()
        self.failed: Optional[tuple] = None   # (errno, message) of the write error that
        # makes this handle refuse writes (no traceback kept: no reference cycles)
        self._context: Optional[Callable[[], ReadContext]] = \
            (lambda: ReadContext(envs[0], list(envs[1:]))) if contexts else None
        self._pool: list = []
        self._reaped: dict = {}
        self.closed = False                  # a plain attribute: every call reads it

    # ------------------------------------------------------------ state
    def check_open(self) -> None:
        """Raise ClosedError after close(), or in a child after fork()."""
        if self.closed:
            raise closed_error(self.what)
        if self.pid != current_pid():
            raise closed_error(self.what, self.pid)

    def _inside_open(self):
        if self.closed:
            raise closed_error(self.what)

    def check_failed(self) -> None:
        if self.failed is not None:
            raise StorageError(
                self.failed[0],
                f"{self.path}: this handle refuses writes since a write to disk failed "
                f"({self.failed[1]}); close every handle on the index and open it again "
                f"(the reopen replays what was committed)")

    def write_failed(self, e: StorageError, env: Optional[Env],
                     then: Optional[str] = None) -> StorageError:
        """Remember an I/O error of a commit or sync: what reached the disk is unknown (a
        failed fsync may have dropped dirty pages), so only a reopen may write again.
        `then` is added to the message (what the caller's data is left as)."""
        e = space_error(e, self.path)
        self.failed = (e.errno, e.strerror)
        if then is not None:
            e = type(e)(e.errno, f"{e.strerror}; {then}", code=e.code)
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
        with self.gate.exclusive():
            env.set_mapsize(env.info()["mapsize"] * 2)

    def _adopt(self, env=None):
        with self.gate.exclusive():
            for e in ([env] if env is not None else self.envs):
                e.set_mapsize(0)

    def _resized(self, env=None):
        """Adopt another process's map growth, or leave it to the outermost call."""
        if self.gate.nested():
            raise MapResizedError(f"{self.path}: the map was grown by another process")
        self._adopt(env)

    # ------------------------------------------------------------ runners
    def write(self, env: Env, fn: Callable[[Txn], T], then: Optional[str] = None) -> T:
        """fn(txn) in a write transaction on `env`, committed when it returns, growing the
        map and retrying if full. An I/O error makes this handle refuse writes; `then` is
        added to its message."""
        self.check_failed()
        while True:
            try:
                with self.gate.shared():
                    self._inside_open()
                    self._reap(env)
                    with Txn(env, write=True) as txn:
                        return fn(txn)
            except MapFullError:
                if self.gate.nested():
                    raise
                self._grow(env)
            except MapResizedError:
                self._resized()          # fn may have read other environments too
            except StorageError as e:
                if not is_io(e):
                    raise
                raise self.write_failed(e, env, then) from None

    def read_txn(self, env: Env, fn: Callable[[Txn], T]) -> T:
        """fn(txn) in a read transaction on `env`."""
        while True:
            try:
                with self.gate.shared():
                    self._inside_open()
                    with Txn(env) as txn:
                        return fn(txn)
            except MapResizedError:
                self._resized(env)

    def gated(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) for a compiled read that begins its own read transactions on these
        environments, inside the resize gate, adopting a map another process grew."""
        while True:
            try:
                with self.gate.shared():
                    self._inside_open()
                    return fn(*args)
            except MapResizedError:
                self._resized()

    def read(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(ctx, *args) with a pooled ReadContext over every environment (one per thread
        at a time), adopting a map another process grew. (`args` spare the hot single
        query a closure per call.)"""
        gate, pool = self.gate, self._pool
        while True:
            try:
                gate.enter()
                try:
                    if self.closed:
                        raise closed_error(self.what)
                    if pool:
                        ctx = pool.pop()
                    elif self._context is None:
                        raise TypeError(f"{self.what}: these runners make no read contexts")
                    else:
                        ctx = self._context()
                    try:
                        return fn(ctx, *args)
                    finally:
                        pool.append(ctx)
                finally:
                    gate.exit()
            except MapResizedError:
                self._resized()

    @contextmanager
    def snapshot(self) -> Iterator[list]:
        """Read transactions on every environment, in reverse order (records, which comes
        first in the list, is begun last: see ReadContext.query), for whole-index scans."""
        self.check_open()
        outer = self.gate.nested()
        while True:
            txns = []
            with self.gate.shared():
                self._inside_open()
                try:
                    for env in reversed(self.envs):
                        txns.append(Txn(env))
                except MapResizedError:
                    for t in txns:
                        t.abort()
                    if outer:
                        raise
                else:
                    try:
                        yield txns[::-1]
                    finally:
                        for t in txns:
                            t.abort()
                    return
            self._adopt()

    def sync(self, then: Optional[str] = None, envs: Optional[list] = None) -> None:
        """Force every environment (or those of `envs`) to disk (a failure makes the handle
        refuse writes)."""
        self.check_open()
        with self.gate.shared():
            for env in self.envs if envs is None else envs:
                try:
                    env.sync(True)
                except StorageError as e:
                    if not is_io(e):
                        raise
                    raise self.write_failed(e, None, then) from None

    def close(self, sync: bool) -> None:
        """Wait for calls inside to leave, sync (if asked, errors ignored) and close every
        environment and read context."""
        if self.closed:
            return
        with self.gate.exclusive():
            if sync:
                for env in self.envs:
                    try:
                        env.sync(True)
                    except StorageError:
                        pass
            self.drop()

    def drop(self) -> None:
        """Close everything now (a forked child's copy: its handles are the parent's, and
        the core's objects know not to touch them)."""
        self.closed = True
        for ctx in self._pool:
            ctx.close()
        self._pool.clear()
        for env in self.envs:         # closed, but kept: a late call meets ClosedError
            env.close()


def is_io(e: BaseException) -> bool:
    """Whether a StorageError carries an operating-system error (EIO, ENOSPC, ...)."""
    code = getattr(e, "errno", None)
    return type(e) in (StorageError, DiskFullError) and isinstance(code, int) and code > 0


def space_error(e: StorageError, path: str, then: str = "reopen the index") -> StorageError:
    """A DiskFullError when `e` means the disk (or a quota, or RLIMIT_FSIZE) is full.

    LMDB reports a short write as EIO, so an EIO with almost no free space counts too.
    `then` says what to do once there is room.
    """
    if not is_io(e) or isinstance(e, DiskFullError):
        return e
    full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    free = None
    try:
        st = os.statvfs(path)
        free = st.f_bavail * st.f_frsize
    except OSError:
        pass
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if e.errno == errno.EIO and free is not None and free < LOW_SPACE:
        full = True
    if e.errno == errno.EIO and limit != resource.RLIM_INFINITY:
        full = True                      # a short write at the file size limit (a guess)
    if not full:
        return e
    # the errno says what ran out (LMDB's EIO for a short write becomes ENOSPC or EFBIG);
    # `code` keeps what was reported
    if e.errno == errno.EFBIG or (limit != resource.RLIM_INFINITY and e.errno == errno.EIO):
        why = f"the file size limit (RLIMIT_FSIZE, ulimit -f) of {limit:,} bytes was reached"
        number = errno.EFBIG
    elif e.errno == errno.EDQUOT:
        why = "the disk quota is exhausted"
        number = errno.EDQUOT
    else:
        room = f"{free:,} bytes free" if free is not None else "free space unknown"
        why = f"the disk is full ({room} at {path})"
        number = errno.ENOSPC
    return DiskFullError(number, f"{e.strerror}: {why}; make room and {then}", code=e.code)
