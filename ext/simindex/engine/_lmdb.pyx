# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The LMDB binding of the core: environments, transactions, the resize gate, and the one
place where LMDB's (and the core's) return codes become simindex errors.

Every LMDB handle of an index is made here, through LMDB's C API. Closing an Env invalidates
its transactions and read contexts (each a Handle), so misuse raises instead of crashing;
handles inherited across fork() are never used or closed by the child.
"""

import os

from libc.stdint cimport uint8_t
from libc.string cimport memcmp
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from posix.unistd cimport getpid, usleep

from simindex.engine.clmdb cimport (
    si_guard_install, si_guard_assert, SI_PAGE_FAULT, MDB_assert_func, mdb_env_set_assert,
    MDB_env, MDB_txn, MDB_cursor, MDB_dbi, MDB_val, MDB_stat, MDB_envinfo,
    MDB_NOTLS, MDB_NOLOCK, MDB_RDONLY, MDB_NOSYNC, MDB_NOMETASYNC, MDB_CREATE, MDB_APPEND,
    MDB_SET_RANGE, MDB_NEXT, MDB_NOTFOUND, MDB_MAP_FULL, MDB_MAP_RESIZED, MDB_CORRUPTED,
    MDB_PAGE_NOTFOUND, MDB_INVALID, MDB_VERSION_MISMATCH, MDB_PANIC,
    mdb_version, mdb_strerror, mdb_env_create, mdb_env_open, mdb_env_close, mdb_env_stat,
    mdb_env_set_maxdbs, mdb_env_set_maxreaders, mdb_env_set_mapsize, mdb_env_sync,
    mdb_env_info, mdb_reader_check, mdb_txn_begin, mdb_txn_commit, mdb_txn_abort,
    mdb_txn_id, mdb_dbi_open, mdb_get, mdb_put, mdb_del, mdb_stat, mdb_cursor_open,
    mdb_cursor_close, mdb_cursor_get,
)
from simindex.errors import (
    ClosedError, CorruptError, MapFullError, MapResizedError, ReadOnlyError, StorageError,
    closed_error,
)

if si_guard_install():           # LMDB calls return an error on a damaged page (guard.h)
    raise OSError("cannot install the page-fault handlers")


cdef extern from "pthread.h" nogil:
    int pthread_atfork(void (*prepare)() noexcept nogil, void (*parent)() noexcept nogil,
                       void (*child)() noexcept nogil)

cdef extern from "unistd.h":
    int getpagesize()

# This process's id, kept current by a fork handler: every call checks that a handle is not
# a parent's (getpid() is a system call; this is a load).
cdef long _pid = getpid()


cdef void _forked() noexcept nogil:
    global _pid
    _pid = getpid()


pthread_atfork(NULL, NULL, _forked)


cdef long process_id() noexcept nogil:
    return _pid


def current_pid():
    """os.getpid() without the system call (a fork handler keeps it current)."""
    return _pid


def lmdb_version():
    """The version string of the LMDB library this core is linked against."""
    return mdb_version(NULL, NULL, NULL).decode()


cdef object error(int rc, str what):
    """The simindex exception of an LMDB or core return code; `what` says what failed."""
    if rc == MDB_MAP_FULL:
        return MapFullError(f"{what}: the LMDB map is full", code=rc)
    if rc == MDB_MAP_RESIZED:
        return MapResizedError(f"{what}: another process grew the LMDB map", code=rc)
    if rc in (MDB_CORRUPTED, MDB_PAGE_NOTFOUND, MDB_INVALID, MDB_VERSION_MISMATCH, MDB_PANIC):
        return CorruptError(f"{what}: {mdb_strerror(rc).decode(errors='replace')}", code=rc)
    if rc == CORRUPT_SLAB:
        return CorruptError(f"{what}: a table slab is damaged (bad header, size or order)",
                            code=rc)
    if rc == CORRUPT_STATE:
        return CorruptError(f"{what}: a shard's state record is damaged", code=rc)
    if rc == CORRUPT_RECORD:
        return CorruptError(f"{what}: a stored record is damaged", code=rc)
    if rc == CORRUPT_KEY:
        return CorruptError(f"{what}: a table key has the wrong size", code=rc)
    if rc == SI_PAGE_FAULT:
        return CorruptError(f"{what}: a damaged page of the data file stopped LMDB's read "
                            f"(`simindex verify` names it)", code=rc)
    if rc == NO_MEMORY:
        return MemoryError(what)
    if rc > 0:
        return StorageError(rc, f"{what}: {os.strerror(rc)}", code=rc)
    return StorageError(f"{what}: {mdb_strerror(rc).decode(errors='replace')} (LMDB {rc})",
                        code=rc)


cdef inline MDB_val _val(bytes b):
    cdef MDB_val v
    v.mv_size = PyBytes_GET_SIZE(b)
    v.mv_data = <void *>PyBytes_AS_STRING(b)
    return v


cdef inline bytes _bytes(MDB_val v):
    return PyBytes_FromStringAndSize(<char *>v.mv_data, v.mv_size)


cdef size_t page_size(MDB_env *env) noexcept:
    """The environment's page size when its pages are aligned in memory (it is not above
    the OS page size), else 0: then values are not checked against page bounds."""
    cdef MDB_stat st
    if mdb_env_stat(env, &st) or st.ms_psize == 0 or st.ms_psize > <unsigned int>getpagesize() \
            or st.ms_psize & (st.ms_psize - 1):
        return 0
    return st.ms_psize


# ---------------------------------------------------------------- the resize gate
cdef extern from *:
    """
    /* The gates this thread is inside, innermost last (calls nest at most a few deep). */
    #define SI_GATE_MAX 32
    static __thread void *si_gates[SI_GATE_MAX];
    static __thread int si_ngates = 0;
    static int si_gate_push(void *g) {
        if (si_ngates == SI_GATE_MAX) return -1;
        si_gates[si_ngates++] = g;
        return 0;
    }
    static void si_gate_pop(void) { if (si_ngates) si_ngates--; }
    static int si_gate_held(void *g) {
        for (int i = 0; i < si_ngates; i++) if (si_gates[i] == g) return 1;
        return 0;
    }
    """
    int si_gate_push(void *g)
    void si_gate_pop()
    int si_gate_held(void *g)


cdef class Gate:
    """Many calls inside at once, or one map resize alone (LMDB needs no live transaction
    of this process while it resizes).

    Re-entrant per thread: a call already inside (add_unique queries inside its write)
    never waits for a resize, which itself waits for that call to leave. Every method runs
    under the GIL without releasing it, so the counters need no lock: entering is a few
    loads and stores, not the two lock round trips of a threading.Condition.
    """

    def __cinit__(self):
        self.inside = 0
        self.resizing = False

    cpdef void enter(self) except *:
        """Enter as one of many; waits while a resize runs (unless already inside)."""
        if not si_gate_held(<void *>self):
            while self.resizing:
                with nogil:
                    usleep(200)
        if si_gate_push(<void *>self):
            raise RuntimeError("calls nested too deep inside one thread")
        self.inside += 1

    cpdef void exit(self):
        self.inside -= 1
        si_gate_pop()

    def nested(self):
        """Whether this thread is inside (a resize must then wait for its outer call)."""
        return bool(si_gate_held(<void *>self))

    def shared(self):
        """`with gate.shared():` runs the block as one of many."""
        return _Inside(self)

    def exclusive(self):
        """`with gate.exclusive():` runs the block alone (a map resize)."""
        return _Alone(self)

    def begin_exclusive(self):
        """Wait for other resizes and for every call to leave, then hold the gate alone."""
        if si_gate_held(<void *>self):
            raise RuntimeError("a map resize was attempted from inside a gated call")
        while self.resizing:
            with nogil:
                usleep(200)
        self.resizing = True
        while self.inside:
            with nogil:
                usleep(200)

    def end_exclusive(self):
        self.resizing = False


cdef class _Inside:
    """`with gate.shared():` (a plain object, not a generator: every query passes here)."""
    cdef Gate gate

    def __cinit__(self, Gate gate):
        self.gate = gate

    def __enter__(self):
        self.gate.enter()

    def __exit__(self, *exc):
        self.gate.exit()
        return False


cdef class _Alone:
    """`with gate.exclusive():`."""
    cdef Gate gate

    def __cinit__(self, Gate gate):
        self.gate = gate

    def __enter__(self):
        self.gate.begin_exclusive()

    def __exit__(self, *exc):
        self.gate.end_exclusive()
        return False


# ---------------------------------------------------------------- environments
cdef class Handle:
    """Something that holds LMDB handles of an Env: closing the Env invalidates it."""

    cdef void invalidate(self) noexcept:
        pass


cdef class Env:
    """One LMDB environment (a directory). Closing it invalidates its transactions."""

    def __cinit__(self):
        self.env = NULL

    def __init__(self, path, *, bint readonly=False, bint sync=True, bint metasync=True,
                 size_t mapsize=1 << 30, unsigned int maxdbs=4, unsigned int maxreaders=1024,
                 bint lock=True):
        cdef int rc
        cdef unsigned int flags = MDB_NOTLS
        cdef bytes bpath = os.fsencode(path)
        cdef const char *cpath = bpath
        self.path = os.fsdecode(path)
        self.readonly = readonly
        self.deps = set()
        self.dbis = {}
        self.pid = _pid
        if readonly:
            flags |= MDB_RDONLY
        if not lock:
            flags |= MDB_NOLOCK          # a reader of an index no process writes
        if not sync:
            flags |= MDB_NOSYNC
        elif not metasync:
            flags |= MDB_NOMETASYNC
        rc = mdb_env_create(&self.env)
        if rc:
            self.env = NULL
            raise error(rc, f"cannot create an LMDB environment for {self.path}")
        mdb_env_set_assert(self.env, <MDB_assert_func *>si_guard_assert)  # see guard.h
        mdb_env_set_maxdbs(self.env, maxdbs)
        mdb_env_set_maxreaders(self.env, maxreaders)
        mdb_env_set_mapsize(self.env, mapsize)
        with nogil:
            rc = mdb_env_open(self.env, cpath, flags, 0o644)
        if rc:
            mdb_env_close(self.env)
            self.env = NULL
            raise error(rc, f"cannot open LMDB environment {self.path}")
        self.psize = page_size(self.env)

    def __dealloc__(self):
        # Never close in a forked child: the handle belongs to the parent.
        if self.env is not NULL and self.pid == getpid():
            mdb_env_close(self.env)
        self.env = NULL

    cdef int check(self) except -1:
        if self.env is NULL:
            raise closed_error(f"LMDB environment {self.path}")
        if self.pid != _pid:
            raise closed_error(f"LMDB environment {self.path}", self.pid)
        return 0

    @property
    def closed(self):
        return self.env is NULL

    def close(self):
        """Invalidate every transaction and read context on this environment, then close it."""
        for dep in list(self.deps):
            (<Handle>dep).invalidate()
        self.deps.clear()
        if self.env is not NULL:
            if self.pid == getpid():
                mdb_env_close(self.env)
            self.env = NULL

    def open_db(self, name, bint create=False):
        """Open (or create) the named database once; later calls reuse the handle."""
        cdef MDB_txn *txn
        cdef MDB_dbi dbi
        cdef int rc
        cdef bytes bname = name.encode()
        self.check()
        if name in self.dbis:
            return
        rc = mdb_txn_begin(self.env, NULL, 0 if create else MDB_RDONLY, &txn)
        if rc:
            raise error(rc, f"{self.path}: cannot begin a transaction")
        rc = mdb_dbi_open(txn, bname, MDB_CREATE if create else 0, &dbi)
        if rc:
            mdb_txn_abort(txn)
            if rc == MDB_NOTFOUND:
                raise CorruptError(f"{self.path}: database {name!r} is missing", code=rc)
            raise error(rc, f"{self.path}: cannot open database {name!r}")
        rc = mdb_txn_commit(txn)
        if rc:
            raise error(rc, f"{self.path}: cannot open database {name!r}")
        self.dbis[name] = dbi

    cdef MDB_dbi dbi(self, name) except? 0:
        try:
            return self.dbis[name]
        except KeyError:
            raise CorruptError(f"{self.path}: database {name!r} is not open") from None

    def sync(self, bint force=True):
        """Flush the environment to disk (needed with sync=False before a clean stop)."""
        cdef int rc
        self.check()
        if self.readonly:
            return
        with nogil:
            rc = mdb_env_sync(self.env, force)
        if rc:
            raise error(rc, f"{self.path}: sync failed")

    def info(self):
        """Map size, last page, last transaction id and reader counts."""
        cdef MDB_envinfo i
        self.check()
        mdb_env_info(self.env, &i)
        return {"mapsize": i.me_mapsize, "last_pgno": i.me_last_pgno,
                "last_txnid": i.me_last_txnid, "maxreaders": i.me_maxreaders,
                "numreaders": i.me_numreaders}

    def set_mapsize(self, size_t size):
        """Grow the map (0 adopts the size another process set). No transaction may be live."""
        cdef int rc
        self.check()
        rc = mdb_env_set_mapsize(self.env, size)
        self.mapgen += 1         # pointers into the old map are void (even after a failure)
        if rc:
            raise error(rc, f"{self.path}: cannot set the map size")

    def reader_check(self):
        """Clear reader slots left by dead processes; returns how many were cleared."""
        cdef int dead = 0
        self.check()
        mdb_reader_check(self.env, &dead)
        return dead


# ---------------------------------------------------------------- transactions
cdef class Txn(Handle):
    """A read or write transaction; a `with` block commits on success and aborts on error."""

    def __cinit__(self, Env env, bint write=False):
        cdef int rc
        self.txn = NULL
        env.check()
        if write and env.readonly:
            raise ReadOnlyError(f"{env.path} is open read-only")
        self.env = env
        self.write = write
        with nogil:
            rc = mdb_txn_begin(env.env, NULL, 0 if write else MDB_RDONLY, &self.txn)
        if rc:
            self.txn = NULL
            raise error(rc, f"{env.path}: cannot begin a transaction")
        env.deps.add(self)

    def __dealloc__(self):
        self.invalidate()

    cdef void invalidate(self) noexcept:
        # In a forked child the handle is the parent's: aborting would free the parent's
        # reader slot in the shared lock file, so the pointer is only dropped.
        if self.txn is not NULL and self.env is not None and self.env.env is not NULL \
                and self.env.pid == getpid():
            mdb_txn_abort(self.txn)
        self.txn = NULL

    cdef int check(self) except -1:
        if self.txn is NULL:
            raise ClosedError(f"{self.env.path}: the transaction is finished")
        return 0

    def __enter__(self):
        return self

    def __exit__(self, etype, evalue, tb):
        if etype is None:
            self.commit()
        else:
            self.abort()
        return False

    @property
    def id(self):
        self.check()
        return mdb_txn_id(self.txn)

    def commit(self):
        cdef int rc
        self.check()
        with nogil:
            rc = mdb_txn_commit(self.txn)
        self.txn = NULL
        self.env.deps.discard(self)
        if rc:
            raise error(rc, f"{self.env.path}: commit failed")

    def abort(self):
        self.invalidate()
        self.env.deps.discard(self)

    def get(self, db, bytes key not None):
        cdef MDB_val k = _val(key), v
        cdef int rc
        self.check()
        rc = mdb_get(self.txn, self.env.dbi(db), &k, &v)
        if rc == MDB_NOTFOUND:
            return None
        if rc:
            raise error(rc, f"{self.env.path}: read from {db!r} failed")
        if not self.write and not val_in_pages(&v, self.env.psize):
            raise CorruptError(f"{self.env.path}: a value in {db!r} is damaged (its size runs "
                               f"past its page)")
        return _bytes(v)

    def put(self, db, bytes key not None, bytes value not None, bint append=False):
        cdef MDB_val k = _val(key), v = _val(value)
        cdef int rc
        self.check()
        rc = mdb_put(self.txn, self.env.dbi(db), &k, &v, MDB_APPEND if append else 0)
        if rc:
            raise error(rc, f"{self.env.path}: write to {db!r} failed")

    def delete(self, db, bytes key not None):
        """Delete `key`; returns whether it was there."""
        cdef MDB_val k = _val(key)
        cdef int rc
        self.check()
        rc = mdb_del(self.txn, self.env.dbi(db), &k, NULL)
        if rc == MDB_NOTFOUND:
            return False
        if rc:
            raise error(rc, f"{self.env.path}: delete from {db!r} failed")
        return True

    def prefixed(self, db, bytes prefix not None):
        """[(key, value), ...] of every key of the named database that starts with `prefix`,
        in key order."""
        cdef MDB_val k = _val(prefix), v
        cdef MDB_cursor *cur = NULL
        cdef int rc
        cdef Py_ssize_t n = len(prefix)
        self.check()
        out = []
        rc = mdb_cursor_open(self.txn, self.env.dbi(db), &cur)
        if rc:
            raise error(rc, f"{self.env.path}: read from {db!r} failed")
        try:
            rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE)
            while rc == 0:
                if <Py_ssize_t>k.mv_size < n or memcmp(k.mv_data, <const char *>prefix, n):
                    break
                if not self.write and not (val_in_pages(&k, self.env.psize) and
                                           val_in_pages(&v, self.env.psize)):
                    raise CorruptError(f"{self.env.path}: a value in {db!r} is damaged (its "
                                       f"size runs past its page)")
                out.append((_bytes(k), _bytes(v)))
                rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)
            if rc and rc != MDB_NOTFOUND:
                raise error(rc, f"{self.env.path}: read from {db!r} failed")
        finally:
            mdb_cursor_close(cur)
        return out

    def entries(self, db):
        """How many keys the named database holds."""
        cdef MDB_stat st
        cdef int rc
        self.check()
        rc = mdb_stat(self.txn, self.env.dbi(db), &st)
        if rc:
            raise error(rc, f"{self.env.path}: stat of {db!r} failed")
        return st.ms_entries
