/* LMDB calls that survive a damaged page.

   LMDB trusts its pages: a damaged page number sends a read past the end of the file
   (SIGBUS) or of the map (SIGSEGV), a damaged page size in a meta page divides by zero
   (SIGFPE), and a damaged page header fails one of its assertions (abort). A host process (a crawler) must get an error instead, so every LMDB call the
   core makes goes through a wrapper here that arms a per-thread jump point first: the
   signal handler, or LMDB's assert callback, jumps back to it and the call returns
   SI_PAGE_FAULT. A fault outside a wrapper is not ours: the handler hands it to the
   handler that was there before (Python's faulthandler, or the default, which ends the
   process as it would have). The jump point costs a sigsetjmp without the signal mask
   (a few nanoseconds); SA_NODEFER leaves the signal unblocked after the jump.

   After a fault the call's transaction is unusable; every caller aborts it on an error,
   and a commit that faulted is aborted here (LMDB frees a transaction whose commit
   failed, and the write lock must not stay held). */
#ifndef SI_GUARD_H
#define SI_GUARD_H

#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <lmdb.h>

#define SI_PAGE_FAULT (-1006)

static __thread sigjmp_buf *si_guard_jump;     /* the armed jump point of this thread */
static const int si_guard_signals[3] = {SIGBUS, SIGSEGV, SIGFPE};
static struct sigaction si_guard_prev[3];   /* the handlers found, by si_guard_signals */
static int si_guard_ready;

static void si_guard_signal(int sig, siginfo_t *info, void *uc)
{
    sigjmp_buf *j = si_guard_jump;
    struct sigaction *prev = &si_guard_prev[sig == SIGBUS ? 0 : sig == SIGSEGV ? 1 : 2];
    if (j != NULL) {
        si_guard_jump = NULL;
        siglongjmp(*j, 1);
    }
    if (prev->sa_flags & SA_SIGINFO) {
        if (prev->sa_sigaction != NULL) {
            prev->sa_sigaction(sig, info, uc);
            return;
        }
    } else if (prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
        prev->sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL);      /* returning repeats the fault, which now ends the process */
}

/* LMDB's assert callback (mdb_env_set_assert): a failed assertion becomes a fault of this
   thread, which the handlers treat as above: the module whose wrapper is running jumps
   back (each module keeps its own jump points, and only the handlers chain); with none
   running, the process ends as it would have. */
static __attribute__((unused)) void si_guard_assert(MDB_env *env, const char *msg)
{
    (void)env;
    (void)msg;
    raise(SIGBUS);
}

/* Install the handlers once per module (each module that includes this has its own jump
   points; the handlers chain). 0, or -1 with errno. */
static __attribute__((unused)) int si_guard_install(void)
{
    struct sigaction sa;
    int i;
    if (si_guard_ready)
        return 0;
    sa.sa_sigaction = si_guard_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    for (i = 0; i < 3; i++)
        if (sigaction(si_guard_signals[i], &sa, &si_guard_prev[i]))
            return -1;
    si_guard_ready = 1;
    return 0;
}

/* rc = call, or SI_PAGE_FAULT when the call faulted on a damaged page. */
#define SI_GUARDED(rc, call) do {                                   \
        sigjmp_buf si_here_;                                        \
        sigjmp_buf *si_outer_ = si_guard_jump;                      \
        if (sigsetjmp(si_here_, 0)) {                               \
            si_guard_jump = si_outer_;                              \
            (rc) = SI_PAGE_FAULT;                                   \
        } else {                                                    \
            si_guard_jump = &si_here_;                              \
            (rc) = (call);                                          \
            si_guard_jump = si_outer_;                              \
        }                                                           \
    } while (0)

static inline int si_mdb_get(MDB_txn *t, MDB_dbi d, MDB_val *k, MDB_val *v)
{ int rc; SI_GUARDED(rc, mdb_get(t, d, k, v)); return rc; }
static inline int si_mdb_put(MDB_txn *t, MDB_dbi d, MDB_val *k, MDB_val *v, unsigned int f)
{ int rc; SI_GUARDED(rc, mdb_put(t, d, k, v, f)); return rc; }
static inline int si_mdb_del(MDB_txn *t, MDB_dbi d, MDB_val *k, MDB_val *v)
{ int rc; SI_GUARDED(rc, mdb_del(t, d, k, v)); return rc; }
static inline int si_mdb_cursor_get(MDB_cursor *c, MDB_val *k, MDB_val *v, MDB_cursor_op op)
{ int rc; SI_GUARDED(rc, mdb_cursor_get(c, k, v, op)); return rc; }
static inline int si_mdb_cursor_put(MDB_cursor *c, MDB_val *k, MDB_val *v, unsigned int f)
{ int rc; SI_GUARDED(rc, mdb_cursor_put(c, k, v, f)); return rc; }
static inline int si_mdb_cursor_del(MDB_cursor *c, unsigned int f)
{ int rc; SI_GUARDED(rc, mdb_cursor_del(c, f)); return rc; }
static inline int si_mdb_dbi_open(MDB_txn *t, const char *name, unsigned int f, MDB_dbi *d)
{ int rc; SI_GUARDED(rc, mdb_dbi_open(t, name, f, d)); return rc; }
static inline int si_mdb_stat(MDB_txn *t, MDB_dbi d, MDB_stat *s)
{ int rc; SI_GUARDED(rc, mdb_stat(t, d, s)); return rc; }
static inline int si_mdb_env_copy2(MDB_env *e, const char *path, unsigned int f)
{ int rc; SI_GUARDED(rc, mdb_env_copy2(e, path, f)); return rc; }
static inline int si_mdb_env_open(MDB_env *e, const char *path, unsigned int f, mdb_mode_t m)
{ int rc; SI_GUARDED(rc, mdb_env_open(e, path, f, m)); return rc; }
static inline int si_mdb_txn_commit(MDB_txn *t)
{
    int rc, aborted = 0;
    SI_GUARDED(rc, mdb_txn_commit(t));
    if (rc == SI_PAGE_FAULT)
        SI_GUARDED(aborted, (mdb_txn_abort(t), 0));     /* as a failed commit does */
    (void)aborted;
    return rc;
}

#endif
