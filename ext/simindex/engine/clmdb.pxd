# Declarations of the LMDB C API (lmdb.h, Debian package liblmdb-dev) used by the core.
from libc.stddef cimport size_t

cdef extern from "lmdb.h" nogil:
    ctypedef struct MDB_env:
        pass
    ctypedef struct MDB_txn:
        pass
    ctypedef struct MDB_cursor:
        pass
    ctypedef unsigned int MDB_dbi

    ctypedef struct MDB_val:
        size_t mv_size
        void *mv_data

    ctypedef struct MDB_stat:
        unsigned int ms_psize
        unsigned int ms_depth
        size_t ms_branch_pages
        size_t ms_leaf_pages
        size_t ms_overflow_pages
        size_t ms_entries

    ctypedef struct MDB_envinfo:
        void *me_mapaddr
        size_t me_mapsize
        size_t me_last_pgno
        size_t me_last_txnid
        unsigned int me_maxreaders
        unsigned int me_numreaders

    ctypedef enum MDB_cursor_op:
        MDB_FIRST
        MDB_GET_CURRENT
        MDB_LAST
        MDB_NEXT
        MDB_PREV
        MDB_SET
        MDB_SET_KEY
        MDB_SET_RANGE

    enum:
        MDB_NOSUBDIR
        MDB_NOSYNC
        MDB_RDONLY
        MDB_NOMETASYNC
        MDB_NOTLS
        MDB_NOLOCK
        MDB_NORDAHEAD
        MDB_CREATE
        MDB_NOOVERWRITE
        MDB_RESERVE
        MDB_APPEND
        MDB_CP_COMPACT

    enum:
        MDB_SUCCESS
        MDB_KEYEXIST
        MDB_NOTFOUND
        MDB_PAGE_NOTFOUND
        MDB_CORRUPTED
        MDB_PANIC
        MDB_VERSION_MISMATCH
        MDB_INVALID
        MDB_MAP_FULL
        MDB_DBS_FULL
        MDB_READERS_FULL
        MDB_TXN_FULL
        MDB_MAP_RESIZED
        MDB_BAD_TXN
        MDB_BAD_VALSIZE

    char *mdb_version(int *major, int *minor, int *patch)
    char *mdb_strerror(int err)

    int mdb_env_create(MDB_env **env)
    int mdb_env_info(MDB_env *env, MDB_envinfo *stat)
    int mdb_env_sync(MDB_env *env, int force)
    void mdb_env_close(MDB_env *env)
    int mdb_env_set_mapsize(MDB_env *env, size_t size)
    int mdb_env_set_maxreaders(MDB_env *env, unsigned int readers)
    int mdb_env_set_maxdbs(MDB_env *env, MDB_dbi dbs)
    int mdb_env_get_maxkeysize(MDB_env *env)
    int mdb_reader_check(MDB_env *env, int *dead)
    ctypedef void MDB_assert_func(MDB_env *env, const char *msg)
    int mdb_env_set_assert(MDB_env *env, MDB_assert_func *func)

    int mdb_txn_begin(MDB_env *env, MDB_txn *parent, unsigned int flags, MDB_txn **txn)
    size_t mdb_txn_id(MDB_txn *txn)
    void mdb_txn_abort(MDB_txn *txn)
    void mdb_txn_reset(MDB_txn *txn)
    int mdb_txn_renew(MDB_txn *txn)
    int mdb_cursor_renew(MDB_txn *txn, MDB_cursor *cursor)

    int mdb_env_stat(MDB_env *env, MDB_stat *stat)

    int mdb_cursor_open(MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cursor)
    void mdb_cursor_close(MDB_cursor *cursor)


# The calls that read or write pages, each through its guard (guard.h): a damaged page makes
# the call return SI_PAGE_FAULT instead of ending the process.
cdef extern from "guard.h" nogil:
    enum:
        SI_PAGE_FAULT
    int si_guard_install()
    void si_guard_assert(MDB_env *env, const char *msg)
    int mdb_get "si_mdb_get"(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data)
    int mdb_put "si_mdb_put"(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data,
                             unsigned int flags)
    int mdb_del "si_mdb_del"(MDB_txn *txn, MDB_dbi dbi, MDB_val *key, MDB_val *data)
    int mdb_cursor_get "si_mdb_cursor_get"(MDB_cursor *cursor, MDB_val *key, MDB_val *data,
                                           MDB_cursor_op op)
    int mdb_cursor_put "si_mdb_cursor_put"(MDB_cursor *cursor, MDB_val *key, MDB_val *data,
                                           unsigned int flags)
    int mdb_cursor_del "si_mdb_cursor_del"(MDB_cursor *cursor, unsigned int flags)
    int mdb_dbi_open "si_mdb_dbi_open"(MDB_txn *txn, const char *name, unsigned int flags,
                                       MDB_dbi *dbi)
    int mdb_stat "si_mdb_stat"(MDB_txn *txn, MDB_dbi dbi, MDB_stat *stat)
    int mdb_env_copy2 "si_mdb_env_copy2"(MDB_env *env, const char *path, unsigned int flags)
    int mdb_env_open "si_mdb_env_open"(MDB_env *env, const char *path, unsigned int flags,
                                       unsigned int mode)
    int mdb_txn_commit "si_mdb_txn_commit"(MDB_txn *txn)
