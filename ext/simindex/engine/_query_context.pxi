# The read context (included by _query.pyx): ReadContext's snapshots of the records and shards,
# its kept tail, query() and resolve() over the other parts (include cannot split a class).


cdef class ReadContext(Handle):
    """Read transactions on the records and on every shard, renewed per call.

    One context serves one caller at a time; the index keeps a pool of them so threads can
    query at once. Queries run without the GIL and see one snapshot per environment; every
    candidate is checked against the records snapshot, so the answer is exact for it.
    """

    def __cinit__(self, Env records, list shards):
        cdef int s
        cdef Env env
        self.views = NULL
        self.shard_envs = NULL
        self.mapgens = NULL
        self.slabs_dbi = NULL
        self.state_dbi = NULL
        self.rec_txn = NULL
        self.rec_cur = NULL
        self.rec_state = VIEW_NEW
        self.nshards = len(shards)
        self.records = records
        self.envs = list(shards)
        records.check()
        self.rec_env = records.env
        # (at least one slot: a records-only context, used by resolve(), has no shards)
        self.shard_envs = <MDB_env **>calloc(self.nshards or 1, sizeof(MDB_env *))
        self.mapgens = <size_t **>calloc(self.nshards or 1, sizeof(size_t *))
        self.views = <ShardView *>calloc(self.nshards or 1, sizeof(ShardView))
        self.slabs_dbi = <MDB_dbi *>calloc(self.nshards or 1, sizeof(MDB_dbi))
        self.state_dbi = <MDB_dbi *>calloc(self.nshards or 1, sizeof(MDB_dbi))
        if self.shard_envs == NULL or self.views == NULL or self.slabs_dbi == NULL or \
                self.state_dbi == NULL or self.mapgens == NULL:
            raise MemoryError()
        self.seqs_dbi = records.dbi(layout.DB_SEQS.decode())
        self.psize = page_size(records.env)
        self.sums = records.sums
        for s in range(self.nshards):
            env = <Env>self.envs[s]
            env.check()
            self.shard_envs[s] = env.env
            self.mapgens[s] = &env.mapgen
            self.slabs_dbi[s] = env.dbi(layout.DB_SLABS.decode())
            self.state_dbi[s] = env.dbi(layout.DB_STATE.decode())
            env.deps.add(self)
        records.deps.add(self)

    def __dealloc__(self):
        self.invalidate()
        free(self.views)
        free(self.shard_envs)
        free(<void *>self.mapgens)
        free(self.slabs_dbi)
        free(self.state_dbi)

    cdef void invalidate(self) noexcept:
        cdef int s
        cdef bint mine = self.records is not None and self.records.pid == getpid()
        if self.views != NULL:
            for s in range(self.nshards):
                if self.views[s].cur != NULL:
                    if mine:
                        mdb_cursor_close(self.views[s].cur)
                    self.views[s].cur = NULL
                if self.views[s].txn != NULL:
                    if mine:
                        mdb_txn_abort(self.views[s].txn)
                    self.views[s].txn = NULL
                free_state(&self.views[s].runs)
                _free_dirs(&self.views[s])
                self.views[s].state = VIEW_NEW
                self.views[s].parsed = 0
        if self.rec_cur != NULL:
            if mine:
                mdb_cursor_close(self.rec_cur)
            self.rec_cur = NULL
        if self.rec_txn != NULL:
            if mine:
                mdb_txn_abort(self.rec_txn)
            self.rec_txn = NULL
        self.rec_state = VIEW_NEW
        free_tail(&self.ctail)
        self.ctail_ok = False
        _free_tail_tables(&self.ttab)

    cdef object _error(self, int rc, str what):
        """The error of a call that failed with `rc`, naming the damaged record it met."""
        if rc == CORRUPT_RECORD and self.bad_seq:
            return damaged_record(what, self.bad_seq)
        return error(rc, what)

    @property
    def run_filters(self):
        """Directories of the runs this context has read that hold a prefix filter (tests,
        tools)."""
        cdef int s
        cdef size_t r, n = 0
        for s in range(self.nshards):
            if self.views[s].dirs != NULL:
                for r in range(self.views[s].ndirs):
                    n += self.views[s].dirs[r].filt != NULL
        return n

    def close(self):
        self.invalidate()
        self.records.deps.discard(self)
        for env in self.envs:
            (<Env>env).deps.discard(self)

    cdef int _begin_records(self) noexcept nogil:
        cdef int rc = 0
        if self.rec_state == VIEW_NEW:
            rc = mdb_txn_begin(self.rec_env, NULL, MDB_RDONLY, &self.rec_txn)
            if rc:
                self.rec_txn = NULL
                return rc
        elif self.rec_state == VIEW_RESET:
            rc = mdb_txn_renew(self.rec_txn)
            if rc:
                return rc
        self.rec_state = VIEW_ACTIVE
        if self.rec_cur == NULL:
            rc = mdb_cursor_open(self.rec_txn, self.seqs_dbi, &self.rec_cur)
            if rc:
                self.rec_cur = NULL
        else:
            rc = mdb_cursor_renew(self.rec_txn, self.rec_cur)
        return rc

    cdef int _tail(self, MDB_cursor *cur, uint64_t start, uint64_t last, int words,
                   Tail **out) noexcept nogil:
        """The records of seq >= start in this call's own records snapshot (newest seq
        `last`; `cur` on its seqs), kept across calls: a later snapshot reads only the
        records committed since, and drops those every shard has applied since.

        Own snapshots only: they only move forward and committed seqs are never handed out
        again, so a kept record is either still there or removed (a hit on it is dropped
        when its record is resolved; a newest seq below the kept ones means they were
        removed). A given transaction may hold uncommitted records and loads its own."""
        cdef Tail *c = &self.ctail
        cdef size_t had
        cdef bint changed = False
        cdef int rc = 0
        if not self.ctail_ok or c.words != words or start < self.ctail_from:
            free_tail(c)                     # a first load (or, never seen, a lower start)
            c.words = words
            c.sums = self.sums
            self.ctail_from = start
            self.ctail_upto = start - 1
            changed = True
        if start > self.ctail_from:
            had = c.n
            drop_tail_below(c, start)
            self.ctail_from = start
            changed |= c.n != had
        if last > self.ctail_upto:
            had = c.n
            rc = load_tail(cur, self.ctail_upto + 1, c)
            if rc:
                self.ctail_ok = False
                self.ttab.ok = False
                return rc
            self.tail_loads += c.n - had
            self.ctail_upto = last
            changed |= c.n != had
        if changed:                          # its tables are stale
            self.ttab.ok = False
            self.tail_work = 0
        self.ctail_ok = True
        out[0] = c
        return 0

    cdef int _waiting(self, MDB_cursor *cur, uint64_t last, int words, int ntables, bint own,
                      Tail *local, Tail **out) noexcept nogil:
        """The committed records not yet in every shard (above the lowest applied seq of
        all of them, so single queries and batches share one kept list): the context's kept
        list for its own snapshots, else loaded into `local`."""
        cdef uint64_t low = 0xFFFFFFFFFFFFFFFF
        cdef int s, rc
        for s in range(self.nshards):
            rc = self._activate(s, ntables)
            if rc:
                return rc
            if self.views[s].runs.applied < low:
                low = self.views[s].runs.applied
        if own:
            return self._tail(cur, low + 1, last, words, out)
        out[0] = local
        return load_tail(cur, low + 1, local)

    cdef int _tail_check(self, const Tables *tb, Tail *tail, uint64_t applied,
                         const uint64_t *q, int words, int k, size_t nq,
                         HitBuf *hits) noexcept nogil:
        """Check the unapplied records above `applied` against q (`nq`: the queries of the
        call not yet counted). A pass over them; or, on a 64-bit index once the kept tail
        has served enough queries to pay for it, its own tables probed like runs."""
        cdef int rc
        if words != 1 and tb.omask != NULL and 0 <= tb.guarantee < k and \
                tb.owords == words:
            return _tail_hits_held(tail, applied, q, k, tb, hits)
        if tail != &self.ctail or words != 1 or tail.n < _tail_tables_min or tail.n == 0:
            return _tail_hits(tail, applied, q, k, hits)
        if not (self.ttab.ok and self.ttab.tb == tb):
            # ski rental: build once the passes have cost what a build costs
            self.tail_work += nq * tail.n
            if self.tail_work < <size_t>TAIL_BUILD_COST * <size_t>tb.ntables * tail.n:
                return _tail_hits(tail, applied, q, k, hits)
            rc = _build_tail_tables(&self.ttab, tb, tail)
            if rc:
                return rc
            self.tail_builds += 1
        return _probe_tail_tables(&self.ttab, tb, applied, q[0], k, hits)

    cdef int _activate(self, int s, int ntables) noexcept nogil:
        """Begin (or renew) shard s's read txn and read its state: applied seq and runs.

        The cursor is kept across calls (renewed with the txn) and the state is read again
        only when the snapshot changed: a shard that took no write since costs a renew."""
        cdef ShardView *sv = &self.views[s]
        cdef int rc
        if sv.state == VIEW_ACTIVE:
            return 0
        if sv.state == VIEW_NEW:
            rc = mdb_txn_begin(self.shard_envs[s], NULL, MDB_RDONLY, &sv.txn)
            if rc:
                sv.txn = NULL
                return rc
        else:
            rc = mdb_txn_renew(sv.txn)
            if rc:
                return rc
        sv.state = VIEW_ACTIVE
        if sv.cur == NULL:
            rc = mdb_cursor_open(sv.txn, self.slabs_dbi[s], &sv.cur)
            if rc:
                sv.cur = NULL
                return rc
        else:
            rc = mdb_cursor_renew(sv.txn, sv.cur)
            if rc:
                return rc
        if sv.parsed and sv.parsed == mdb_txn_id(sv.txn) and sv.mapgen == self.mapgens[s][0]:
            return 0
        sv.parsed = 0
        rc = read_state(sv.txn, self.state_dbi[s], ntables, &sv.runs)
        if rc == 0:
            rc = _sync_dirs(sv, self.mapgens[s][0], ntables)
        if rc:
            return rc
        sv.parsed = mdb_txn_id(sv.txn)
        return 0

    cdef void _release(self) noexcept nogil:
        cdef int s
        for s in range(self.nshards):
            if self.views[s].state == VIEW_ACTIVE:
                mdb_txn_reset(self.views[s].txn)     # its cursor stays, to be renewed
                self.views[s].state = VIEW_RESET
        if self.rec_state == VIEW_ACTIVE:
            mdb_txn_reset(self.rec_txn)
            self.rec_state = VIEW_RESET

    cdef size_t _entries(self) noexcept nogil:
        """Table entries of the shards this call reads (their snapshots' run counts)."""
        cdef size_t total = 0, i
        cdef int s
        for s in range(self.nshards):
            if self.views[s].state == VIEW_ACTIVE:
                for i in range(self.views[s].runs.nruns):
                    total += bits.load64(<const uint8_t *>self.views[s].runs.raw.mv_data +
                                         layout.RUN_ENTRY * i + layout.RUN_COUNT_AT)
        return total

    cdef int _scan_in_key_order(self, const Tables *tb, WidePermuter wp,
                                const uint64_t *queries, Py_ssize_t n, int words, int k,
                                HitBuf *hits) noexcept nogil:
        """Every probe of a batch, sorted by (table, range start), scanned in that order into
        `hits`, each hit tagged with its query (see ProbeItem)."""
        cdef int T = tb.ntables, t, s, rc = 0
        cdef size_t per = 0, ni = 0, i, r
        cdef Py_ssize_t qi
        cdef uint32_t j
        cdef uint64_t pk
        cdef uint64_t *pkw
        cdef ProbeItem *items
        cdef ShardView *sv
        cdef ProbeBuf probes
        cdef size_t w, e
        cdef uint64_t *keys = <uint64_t *>malloc(<size_t>n * T * words * sizeof(uint64_t))
        for t in range(T):
            per += tb.probe_start[t + 1] - tb.probe_start[t]
        items = <ProbeItem *>malloc((<size_t>n * per or 1) * sizeof(ProbeItem))
        if keys == NULL or items == NULL:
            free(keys)
            free(items)
            return NO_MEMORY
        for qi in range(n):
            for t in range(T):
                pkw = keys + (<size_t>qi * T + t) * words    # each query's key words, table after table
                pk = _key(tb, wp, t, queries + qi * words, words, pkw)
                for j in range(tb.probe_start[t], tb.probe_start[t + 1]):
                    items[ni].pk = pk
                    items[ni].pkt = pkw + 1
                    items[ni].qi = <size_t>qi
                    items[ni].t = t
                    prefix_range(tb, t, pk ^ tb.probe[j], &items[ni].lo, &items[ni].hi,
                                 &items[ni].s0, &items[ni].s1)
                    ni += 1
        qsort(items, ni, sizeof(ProbeItem), _cmp_item)
        memset(&probes, 0, sizeof(ProbeBuf))
        i = 0
        while i < ni and rc == 0:
            # a window of consecutive probes in the passes of a single query's, so
            # the misses of slabs read in order still overlap
            probes.n = 0
            w = i
            while i < ni and i < w + KEY_ORDER_WINDOW and rc == 0:
                for s in range(items[i].s0, items[i].s1 + 1):
                    rc = self._activate(s, T)
                    if rc:
                        break
                    sv = &self.views[s]
                    for r in range(sv.runs.table_start[items[i].t],
                                   sv.runs.table_start[items[i].t + 1]):
                        e = probes.n
                        rc = _probe_push(&probes, &sv.dirs[r], sv.cur, self.psize,
                                         items[i].lo, items[i].hi, items[i].pk, items[i].pkt,
                                         tb.pmask[items[i].t])
                        if rc:
                            break
                        if probes.n > e:
                            probes.p[e].q = items[i].qi
                    if rc:
                        break
                i += 1
            if rc == 0:
                rc = _run_probes(&probes, k, hits, words - 1, self.psize, &self.failed_dir)
        free(probes.p)
        free(items)
        free(keys)
        return rc

    cdef int _resolve_batch(self, MDB_cursor *cur, const uint64_t *queries, int words,
                            HitBuf *hits, size_t *qstart, Py_ssize_t n,
                            size_t psize) noexcept nogil:
        """Resolve a batch's hits (each query's de-duplicated, see _dedup) in the records by
        ascending seq, through one cursor: the records are read in key order, so a cold
        cache reads them ahead in big chunks and a warm one touches each page once. Then
        drop the hits of removed records, and sort each query's by (distance, seq)."""
        cdef size_t nh = hits.n, i, r, e, w = 0
        cdef Py_ssize_t qi
        # (seq, place) pairs, sorted by the bucket sort of run entries: the seqs shifted up
        # to fill the leading bits it buckets by (a third of a batch's time in qsort)
        cdef uint64_t *order = <uint64_t *>malloc(2 * (nh or 1) * sizeof(uint64_t))
        cdef uint64_t *at = order + nh
        cdef uint64_t any_seq = 0, seq, prev = 0
        cdef int shift = 0
        cdef Hit *h
        cdef MDB_val key, val
        cdef uint8_t kbuf[8]
        cdef int rc = 0, ok = 0
        cdef bint have = False
        cdef uint64_t fp
        cdef size_t body = 0
        if order == NULL:
            return NO_MEMORY
        i = 0
        for qi in range(n):
            for r in range(qstart[qi], qstart[qi + 1]):
                hits.h[r].q = <size_t>qi
                order[i] = hits.h[r].seq
                at[i] = r
                any_seq |= order[i]
                i += 1
        if any_seq:
            shift = bits.clz64(any_seq)
            for i in range(nh):
                order[i] <<= shift
        rc = sort_pairs(order, at, nh)
        if rc:
            free(order)
            return rc
        for i in range(nh):
            h = &hits.h[at[i]]
            seq = order[i] >> shift
            if not have or seq != prev:
                prev = seq
                bits.store_be64(kbuf, seq)
                key.mv_size = 8
                key.mv_data = kbuf
                rc = mdb_cursor_get(cur, &key, &val, MDB_SET_KEY)
                have = True
                if rc == MDB_NOTFOUND:
                    rc = 0
                    val.mv_data = NULL      # removed or replaced since the entry was written
                elif rc:
                    break
            h.val = NULL
            if val.mv_data == NULL:
                continue
            ok = _check_record(&val, seq, self.sums, queries + h.q * words, words, psize,
                               h.dist, &fp, &body)
            if ok < 0:
                rc = ok
                self.bad_seq = seq
                break
            if ok == 0:
                self.anomalies += 1         # a table entry disagrees with its record
                continue
            h.fp = fp
            h.val = <const uint8_t *>val.mv_data
            h.vlen = body
            h.plain = record_plain_int(h.val, h.vlen, words, &h.id)
        free(order)
        if rc:
            return rc
        for qi in range(n):
            r = qstart[qi]
            e = qstart[qi + 1]
            qstart[qi] = w
            while r < e:
                if hits.h[r].val != NULL:
                    hits.h[w] = hits.h[r]
                    w += 1
                r += 1
            qsort(hits.h + qstart[qi], w - qstart[qi], sizeof(Hit), _cmp_dist_seq)
        qstart[n] = w
        hits.n = w
        return 0

    cdef int _finish(self, MDB_txn *rtxn, const uint64_t *q, HitBuf *hits, size_t start,
                     size_t psize, int words=1) noexcept nogil:
        """De-duplicate one query's hits by seq, resolve them in the records, sort them.

        `psize`: check values against their pages (0 for a write txn, whose dirty pages are
        not in the map)."""
        cdef size_t n, i, w = 0
        cdef Hit *h
        cdef MDB_val key, val
        cdef uint8_t kbuf[8]
        cdef int rc
        cdef uint64_t fp
        cdef size_t body = 0
        _dedup(hits, start)
        n = hits.n - start
        h = hits.h + start
        for i in range(n):
            bits.store_be64(kbuf, h[i].seq)
            key.mv_size = 8
            key.mv_data = kbuf
            rc = mdb_get(rtxn, self.seqs_dbi, &key, &val)
            if rc == MDB_NOTFOUND:
                continue        # removed or replaced since the table entry was written
            if rc:
                return rc
            rc = _check_record(&val, h[i].seq, self.sums, q, words, psize, h[i].dist, &fp,
                               &body)
            if rc < 0:
                self.bad_seq = h[i].seq
                return rc
            if rc == 0:
                self.anomalies += 1     # a table entry disagrees with its record
                continue
            h[w] = h[i]
            h[w].fp = fp
            h[w].val = <const uint8_t *>val.mv_data
            h[w].vlen = body
            h[w].plain = record_plain_int(h[w].val, h[w].vlen, words, &h[w].id)
            w += 1
        hits.n = start + w
        qsort(h, w, sizeof(Hit), _cmp_dist_seq)
        return 0

    cdef void _end_call(self, MDB_cursor *rc_cur, size_t *qstart, HitBuf *hits,
                        Tail *tail) noexcept:
        """What every query and resolve call ends with: close a cursor it opened on a given
        transaction, reset the snapshots (kept for the next call), free its buffers."""
        if rc_cur != NULL and rc_cur != self.rec_cur:
            mdb_cursor_close(rc_cur)
        self._release()
        free(qstart)
        free(hits.h)
        free_tail(tail)

    def resolve(self, queries, const uint64_t[::1] qidx,
                const uint64_t[::1] seqs, const uint16_t[::1] dists,
                const uint64_t[::1] applied, int k, Txn txn=None):
        """query() for candidates found elsewhere (a distributed query's shard scans).

        `queries` is an (n,) uint64 array, or (n, words) for wide fingerprints (most
        significant word first). Candidate i is (query qidx[i], record seq seqs[i], distance
        dists[i]), qidx ascending; applied[q] is the lowest applied seq of the shard
        snapshots that scanned query q. The shard snapshots must be older than this call's
        records snapshot (or `txn`, a records write transaction held since before them).
        Records above applied[q] are checked directly, every candidate against its record,
        as in query().
        """
        cdef const uint64_t[:, ::1] q2 = _rows(queries)
        cdef int words = <int>q2.shape[1]
        cdef Py_ssize_t n = q2.shape[0], qi, c = 0, nc = qidx.shape[0]
        cdef const uint64_t *qp = &q2[0, 0] if n else NULL
        cdef int rc = 0
        cdef uint64_t lowest = 0xFFFFFFFFFFFFFFFF
        cdef HitBuf hits
        cdef Tail tail
        cdef size_t *qstart = NULL
        cdef MDB_cursor *rc_cur = NULL
        cdef MDB_txn *rtxn = NULL
        cdef size_t vpsize = 0 if txn is not None and txn.write else self.psize
        if txn is not None:
            txn.check()
            if txn.env is not self.records:
                raise ValueError("txn is not on this index's records")
            rtxn = txn.txn
        if applied.shape[0] != n or seqs.shape[0] != nc or dists.shape[0] != nc:
            raise ValueError("resolve: array lengths differ")
        for c in range(1, nc):
            if qidx[c] < qidx[c - 1]:
                raise ValueError("resolve: qidx must be ascending")
        if nc and qidx[nc - 1] >= <uint64_t>n:
            raise ValueError("resolve: qidx out of range")
        memset(&hits, 0, sizeof(HitBuf))
        self.bad_seq = 0
        memset(&tail, 0, sizeof(Tail))
        self.records.check()
        qstart = <size_t *>malloc((n + 1) * sizeof(size_t))
        if qstart == NULL:
            raise MemoryError()
        try:
            with nogil:
                for qi in range(n):
                    if applied[qi] < lowest:
                        lowest = applied[qi]
                if rtxn == NULL:
                    rc = self._begin_records()
                    rtxn = self.rec_txn
                    rc_cur = self.rec_cur
                elif rc == 0:
                    rc = mdb_cursor_open(rtxn, self.seqs_dbi, &rc_cur)
                tail.words = words
                tail.sums = self.sums
                if rc == 0 and n:
                    rc = load_tail(rc_cur, lowest + 1, &tail)
                c = 0
                qi = 0
                while qi < n and rc == 0:
                    qstart[qi] = hits.n
                    while c < nc and qidx[c] == <uint64_t>qi and rc == 0:
                        if dists[c] <= k:
                            rc = _hit_push(&hits, seqs[c], dists[c])
                        c += 1
                    if rc == 0:
                        rc = _tail_hits(&tail, applied[qi], qp + qi * words, k, &hits)
                    if rc == 0:
                        rc = self._finish(rtxn, qp + qi * words, &hits, qstart[qi], vpsize,
                                          words)
                    qi += 1
                qstart[n] = hits.n
            if rc:
                raise self._error(rc, f"resolving candidates on {self.records.path}")
            return _hit_lists(&hits, qstart, n, False, words)
        finally:
            self._end_call(rc_cur, qstart, &hits, &tail)

    def query(self, perm, queries, int k, Txn txn=None, bint matches=False):
        """For each query, [(distance, fingerprint, seq, id, meta bytes or None), ...] sorted by
        (distance, seq): every record of the snapshot within `k` bits, each once. With
        `matches`, the registered Match objects instead (see set_match_type).

        `perm` is the plan's Permuter, with `queries` an (n,) uint64 array, or its
        WidePermuter, with an (n, words) array. `txn`, when given, is the records
        transaction to answer from (a writer's, for add_unique); otherwise this context's
        own records snapshot is used.
        """
        cdef const uint64_t[::1] q1
        cdef const uint64_t[:, ::1] q2
        cdef Py_ssize_t n
        if isinstance(perm, Permuter):
            q1 = queries
            n = q1.shape[0]
            return self._query(perm, &q1[0] if n else NULL, n, k, txn, matches, 1)
        if not isinstance(perm, WidePermuter):
            raise TypeError("perm must be a Permuter or a WidePermuter")
        q2 = queries
        n = q2.shape[0]
        if n and q2.shape[1] != (<WidePermuter>perm).words:
            raise ValueError(f"queries have {q2.shape[1]} words, the plan "
                             f"{(<WidePermuter>perm).words}")
        return self._query(perm, &q2[0, 0] if n else NULL, n, k, txn, matches,
                           (<WidePermuter>perm).words)

    def query_one(self, Permuter perm, uint64_t fingerprint, int k):
        """The Match list of one fingerprint given as an int: no array in or out."""
        return self._query(perm, &fingerprint, 1, k, None, True, 1)[0]

    cdef list _query(self, object perm, const uint64_t *queries, Py_ssize_t n, int k,
                     Txn txn, bint matches, int words=1):
        cdef WidePermuter wp = perm if words > 1 else None
        cdef const Tables *tb = &(<Permuter>perm).c if words == 1 else &wp.c
        cdef const uint64_t *qp
        cdef uint64_t pkw[bits.MAX_WORDS]
        cdef uint64_t *pkws = NULL     # each table's key words, MAX_WORDS per table
        cdef uint64_t *pkt              # a table's key words in pkws
        cdef ProbeBuf probes
        cdef Py_ssize_t qi
        cdef int T = tb.ntables, t, s, s0, s1, rc = 0
        cdef uint64_t pk, lo, hi, last = 0, minA
        cdef HitBuf hits
        cdef size_t *qstart = NULL
        cdef size_t r
        cdef Tail tail
        cdef Tail *tp = &tail          # the call's tail: its own, or the context's kept one
        cdef bint tail_loaded = False
        cdef bint counted = False       # the call's queries counted towards the tail
        cdef MDB_txn *rtxn = NULL
        cdef MDB_cursor *rc_cur = NULL
        cdef MDB_val key, val
        cdef ShardView *sv
        cdef str where = self.records.path
        cdef int bad = -1              # the shard whose read failed, when it is known
        self.failed_dir = NULL
        self.bad_seq = 0
        cdef bint own = txn is None
        cdef size_t vpsize = 0 if txn is not None and txn.write else self.psize
        cdef int active
        cdef uint32_t j
        cdef bint keyed = False
        cdef MDB_txn *given = NULL
        memset(&hits, 0, sizeof(HitBuf))
        memset(&tail, 0, sizeof(Tail))
        memset(&probes, 0, sizeof(ProbeBuf))
        if txn is not None:
            txn.check()
            if txn.env is not self.records:
                raise ValueError("txn is not on this index's records")
            given = txn.txn
        self.records.check()
        qstart = <size_t *>malloc((n + 1) * sizeof(size_t))
        pkws = <uint64_t *>malloc(<size_t>T * bits.MAX_WORDS * sizeof(uint64_t))
        if qstart == NULL or pkws == NULL:
            free(qstart)
            free(pkws)
            raise MemoryError()
        try:
            with nogil:
                # Shard snapshots first, the records snapshot after: anything a shard
                # snapshot lacks is then either in the records' unapplied tail or gone
                # from the records too (compaction only drops what was already removed).
                active = 0
                qi = 0
                while qi < n and rc == 0 and active < self.nshards:
                    qp = queries + qi * words
                    for t in range(T):
                        pk = _key(tb, wp, t, qp, words, pkw)
                        for j in range(tb.probe_start[t], tb.probe_start[t + 1]):
                            prefix_range(tb, t, pk ^ tb.probe[j], &lo, &hi, &s0, &s1)
                            for s in range(s0, s1 + 1):
                                if self.views[s].state != VIEW_ACTIVE:
                                    rc = self._activate(s, T)
                                    if rc:
                                        bad = s
                                        break
                                    active += 1
                            if rc:
                                break
                        if rc:
                            break
                    qi += 1
                if rc == 0 and own:
                    rc = self._begin_records()
                    rtxn = self.rec_txn
                    rc_cur = self.rec_cur
                elif rc == 0:
                    rtxn = given
                    rc = mdb_cursor_open(rtxn, self.seqs_dbi, &rc_cur)
                if rc == 0:
                    rc = mdb_cursor_get(rc_cur, &key, &val, MDB_LAST)
                    if rc == 0:
                        if key.mv_size != 8:
                            rc = CORRUPT_RECORD
                        else:
                            last = bits.load_be64(key.mv_data)
                    elif rc == MDB_NOTFOUND:
                        rc = 0
                qi = 0
                tail.words = words
                tail.sums = self.sums
                keyed = rc == 0 and n > 1 and <size_t>n >= _key_order_min and \
                    self._entries() >= _key_order_entries
                if keyed:
                    rc = self._scan_in_key_order(tb, wp, queries, n, words, k, &hits)
                    # records not yet in every table the batch read: checked directly
                    minA = 0xFFFFFFFFFFFFFFFF
                    for s in range(self.nshards):
                        if self.views[s].state == VIEW_ACTIVE and \
                                self.views[s].runs.applied < minA:
                            minA = self.views[s].runs.applied
                    if rc == 0 and last > minA:
                        rc = self._waiting(rc_cur, last, words, T, own, &tail, &tp)
                        while qi < n and rc == 0:
                            r = hits.n
                            rc = self._tail_check(tb, tp, minA, queries + qi * words, words,
                                                  k, n if qi == 0 else 0, &hits)
                            while r < hits.n:
                                hits.h[r].q = <size_t>qi
                                r += 1
                            qi += 1
                    if rc == 0:
                        rc = _group_hits(&hits, qstart, n)
                    qi = n                  # the per-query loop below has nothing to do
                while qi < n and rc == 0:
                    qp = queries + qi * words
                    qstart[qi] = hits.n
                    minA = 0xFFFFFFFFFFFFFFFF
                    probes.n = 0
                    for t in range(T):
                        pkt = pkws + t * bits.MAX_WORDS
                        pk = _key(tb, wp, t, qp, words, pkt)
                        for j in range(tb.probe_start[t], tb.probe_start[t + 1]):
                            prefix_range(tb, t, pk ^ tb.probe[j], &lo, &hi, &s0, &s1)
                            for s in range(s0, s1 + 1):
                                rc = self._activate(s, T)
                                if rc:
                                    bad = s
                                    break
                                sv = &self.views[s]
                                if sv.runs.applied < minA:
                                    minA = sv.runs.applied
                                for r in range(sv.runs.table_start[t],
                                               sv.runs.table_start[t + 1]):
                                    rc = _probe_push(&probes, &sv.dirs[r], sv.cur,
                                                     self.psize, lo, hi, pk, pkt + 1,
                                                     tb.pmask[t])
                                    if rc:
                                        bad = s
                                        break
                                if rc:
                                    break
                            if rc:
                                break
                        if rc:
                            break
                    if rc == 0:
                        rc = _run_probes(&probes, k, &hits, words - 1, self.psize,
                                         &self.failed_dir)
                    if rc:
                        break
                    if last > minA:
                        # Records committed but not yet in every table: check them directly.
                        if not tail_loaded:
                            rc = self._waiting(rc_cur, last, words, T, own, &tail, &tp)
                            if rc:
                                break
                            tail_loaded = True
                        # the call's queries from here on count once towards its tables
                        rc = self._tail_check(tb, tp, minA, qp, words, k,
                                              0 if counted else <size_t>(n - qi), &hits)
                        counted = True
                        if rc:
                            break
                    if n == 1:
                        rc = self._finish(rtxn, qp, &hits, qstart[qi], vpsize, words)
                    else:
                        _dedup(&hits, qstart[qi])   # resolved with the batch, in seq order
                    qi += 1
                if not keyed:
                    qstart[n] = hits.n
                if rc == 0 and n > 1:
                    rc = self._resolve_batch(rc_cur, queries, words, &hits, qstart, n, vpsize)
            if rc:
                if bad < 0 and self.failed_dir != NULL:
                    for s in range(self.nshards):
                        if self.views[s].dirs <= self.failed_dir < \
                                self.views[s].dirs + self.views[s].ndirs:
                            bad = s
                if bad >= 0:
                    where = (<Env>self.envs[bad]).path
                elif rc == CORRUPT_SLAB or rc == CORRUPT_STATE:
                    where = f"a shard of {os.path.dirname(self.records.path)}"
                raise self._error(rc, f"query on {where}")
            return _hit_lists(&hits, qstart, n, matches, words)
        finally:
            free(pkws)
            free(probes.p)
            self._end_call(rc_cur, qstart, &hits, &tail)
