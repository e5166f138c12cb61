# One shard's scan for a distributed index (included by _query.pyx): scan_shard, run by a Ray
# shard server; apart as the distributed path only (a ReadContext resolves its candidates).


def scan_shard(Txn txn, perm, int shard, queries, int k):
    """Candidates of one shard for each query: (qidx, seq, distance) arrays, qidx ascending,
    and the shard's applied seq, all from the snapshot `txn` reads.

    `perm` is the plan's Permuter, with `queries` an (n,) uint64 array, or its
    WidePermuter, with an (n, words) array. Only key ranges inside this shard are scanned,
    so a distributed query sends each shard just the queries that reach it.
    """
    cdef const uint64_t[:, ::1] q2
    cdef int words = 1
    if isinstance(perm, WidePermuter):
        words = (<WidePermuter>perm).words
    elif not isinstance(perm, Permuter):
        raise TypeError("perm must be a Permuter or a WidePermuter")
    q2 = _rows(queries)
    if q2.shape[0] and q2.shape[1] != words:
        raise ValueError(f"queries have {q2.shape[1]} words, the plan {words}")
    return _scan_shard(txn, perm, shard, &q2[0, 0] if q2.shape[0] else NULL, q2.shape[0],
                       words, k)


cdef tuple _scan_shard(Txn txn, object perm, int shard, const uint64_t *queries,
                       Py_ssize_t n, int words, int k):
    cdef WidePermuter wp = perm if words > 1 else None
    cdef const Tables *tb = &(<Permuter>perm).c if words == 1 else &wp.c
    cdef const uint64_t *qp
    cdef uint64_t pkw[bits.MAX_WORDS]
    cdef Py_ssize_t qi
    cdef int T = tb.ntables, t, s0, s1, rc = 0
    cdef uint64_t pk, lo, hi
    cdef size_t r, i, before
    cdef uint32_t j
    cdef HitBuf hits
    cdef PairBuf out
    cdef RunList runs
    cdef MDB_cursor *cur = NULL
    txn.check()
    cdef MDB_dbi dbi = txn.env.dbi(layout.DB_SLABS.decode())
    cdef MDB_dbi state = txn.env.dbi(layout.DB_STATE.decode())
    memset(&hits, 0, sizeof(HitBuf))
    memset(&out, 0, sizeof(PairBuf))
    memset(&runs, 0, sizeof(RunList))
    try:
        with nogil:
            rc = read_state(txn.txn, state, T, &runs)
            if rc == 0:
                rc = mdb_cursor_open(txn.txn, dbi, &cur)
            qi = 0
            while qi < n and rc == 0:
                qp = queries + qi * words
                before = hits.n
                for t in range(T):
                    pk = _key(tb, wp, t, qp, words, pkw)
                    for j in range(tb.probe_start[t], tb.probe_start[t + 1]):
                        prefix_range(tb, t, pk ^ tb.probe[j], &lo, &hi, &s0, &s1)
                        if shard < s0 or shard > s1:
                            continue
                        for r in range(runs.table_start[t], runs.table_start[t + 1]):
                            rc = _scan_run(cur, runs.run_ids[r], lo, hi, pk, k, &hits,
                                           pkw + 1, words - 1)
                            if rc:
                                break
                        if rc:
                            break
                    if rc:
                        break
                # one (qidx, seq, distance) per candidate; `a` carries the query index
                i = before
                while i < hits.n and rc == 0:
                    rc = pair_push(&out, <uint64_t>qi, hits.h[i].seq, <uint16_t>hits.h[i].dist)
                    i += 1
                hits.n = 0
                qi += 1
        if rc:
            raise error(rc, f"scan of shard {shard} in {txn.env.path}")
        qidx, seqs, dists = pair_arrays(&out)
        return qidx, seqs, dists, runs.applied
    finally:
        if cur != NULL:
            mdb_cursor_close(cur)
        free(hits.h)
        free_pairs(&out)
        free_state(&runs)
