"""The public index: ids and fingerprints in, exact near-duplicates out."""

import os
from typing import Any, NamedTuple, Union

import numpy as np

from . import _core, lmdbcheck, manifest, shard as _shard, store as _store
from .codec import check_fp, decode_id, encode_id, encode_ids, fp_array, pack_meta, unpack
from .errors import (
    ClosedError, CorruptError, InputError, InputTypeError, ParameterError, ReadOnlyError,
)
from .fingerprints import fingerprint
from .plan import Plan, default_blocks, default_shards

Id = Union[str, bytes, int]


class Record(NamedTuple):
    """A stored document: its id, fingerprint and meta value."""
    id: Id
    fingerprint: int
    meta: Any = None


class Match(NamedTuple):
    """A stored document within the asked distance of a query fingerprint."""
    id: Id
    fingerprint: int
    distance: int
    meta: Any = None


def hamming(a, b):
    """Number of bits in which two 64-bit fingerprints differ."""
    return _core.hamming(check_fp(a), check_fp(b))


_core.set_match_type(Match, unpack)      # queries get their Match objects from the core


def _match(hit):
    """A Match from the core's (distance, fingerprint, seq, id, meta bytes or None)."""
    dist, fp, _seq, id_, meta = hit
    return Match(id_, fp, dist, None if meta is None else unpack(meta, "meta value"))


def _distance(m):
    return m.distance


def _check_verify(verify):
    if not callable(verify):
        raise InputTypeError(f"verify must be callable, got {type(verify).__name__}")


def _verified(matches, verify):
    if verify is None:
        return matches
    _check_verify(verify)
    return [m for m in matches if verify(m)]


def find_all(fingerprints, k=3, blocks=None):
    """Every pair of positions (i, j), i < j, whose fingerprints are within k bits, sorted.

    In memory, with the same block-permutation tables as the index. Equal fingerprints at
    different positions are a pair.
    """
    fps = fp_array(fingerprints)
    plan = Plan(k=k, blocks=blocks, shards=1)
    parts_a, parts_b = [], []
    for t in range(plan.ntables):
        keys = plan.core.keys(t, fps)
        order = _shard.prefix_order(keys, plan.core.prefix_mask(t))
        a, b, _ = _core.pairs_sorted(keys[order], order.astype(np.uint64),
                                     plan.core.prefix_mask(t), plan.earlier_masks(t), k)
        parts_a.append(a)
        parts_b.append(b)
    a = np.concatenate(parts_a) if parts_a else np.empty(0, np.uint64)
    b = np.concatenate(parts_b) if parts_b else np.empty(0, np.uint64)
    order = np.lexsort((b, a))
    return list(zip(a[order].tolist(), b[order].tolist()))


def record_of(value):
    """The Record of a stored record value (None for None)."""
    if value is None:
        return None
    fp, idk, mb = _core.split_record(value)
    return Record(decode_id(idk), fp, unpack(mb, "meta value"))


def records_of(items, fingerprints=None):
    """(id keys, fingerprint array, packed metas) of add_many's arguments, all checked first."""
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        raise InputTypeError(f"add_many takes an iterable of records (or of ids), got "
                             f"{type(items).__name__} {items!r:.60}")
    if fingerprints is not None:
        ids = list(items)
        fps = fp_array(fingerprints)
        if len(ids) != len(fps):
            raise InputError(f"add_many got {len(ids)} ids and {len(fps)} fingerprints")
        idks = encode_ids(ids)
        metas = [pack_meta(None)] * len(ids)
    else:
        idks, fpl, metas = [], [], []
        for n, item in enumerate(items):
            if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
                raise InputTypeError(
                    f"item {n} must be (id, fingerprint) or (id, fingerprint, meta), "
                    f"got {item!r:.80}")
            try:
                idks.append(encode_id(item[0]))
                fpl.append(check_fp(item[1]))
                metas.append(pack_meta(item[2] if len(item) == 3 else None, item[0]))
            except (InputError, InputTypeError) as e:
                raise type(e)(f"item {n}: {e}") from None
        fps = np.array(fpl, dtype=np.uint64)
    return idks, fps, metas


def group_pairs(links):
    """Connected components of size >= 2 of links (key_a, key_b, id_a, id_b): lists of ids
    in key order, groups in order of their smallest key (keys: seqs or input positions)."""
    parent, ids = {}, {}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b, ia, ib in links:
        ids[a], ids[b] = ia, ib
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups = {}
    for x in sorted(parent):
        groups.setdefault(find(x), []).append(ids[x])
    return [groups[r] for r in sorted(groups)]


class Index:
    """A persistent, sharded, exact near-duplicate index of 64-bit fingerprints.

    `Index(path)` opens (or creates) the index in directory `path`. Parameters come from the
    manifest on reopen; one given that differs from the stored value raises. Use it as a
    context manager or call close(). Safe to share between threads; open it again in a child
    process after fork().
    """

    def __init__(self, path, *, k=None, blocks=None, shards=None, create=True,
                 readonly=False, sync=True, scheme=None, expected=None):
        self._store = None
        self._readonly = readonly
        if expected is not None and \
                not os.path.exists(os.path.join(os.fspath(path), manifest.NAME)):
            # a new index sized for `expected` fingerprints (ignored once it exists)
            if isinstance(expected, bool) or not isinstance(expected, int) or expected < 0:
                raise ParameterError(f"expected must be a number of fingerprints, got "
                                     f"{expected!r}")
            if blocks is None:
                blocks = default_blocks(3 if k is None else Plan(k=k).k, expected)
            if shards is None:
                shards = default_shards(expected)
        self._store = _store.acquire(path, k=k, blocks=blocks, shards=shards, create=create,
                                     readonly=readonly, sync=sync, scheme=scheme)
        self.path = self._store.path

    # ------------------------------------------------------------ lifetime
    def close(self):
        """Fold the write buffer, flush and close; idempotent. Other handles on the same
        path stay open."""
        st, self._store = self._store, None
        if st is not None:
            try:
                if st.pid == os.getpid() and not st.closed and st.failed is None:
                    st.fold()
            finally:
                _store.release(st)

    @property
    def closed(self):
        return self._store is None or self._store.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if self._store is not None and self._store.pid == os.getpid():
                self.close()
        except Exception:
            pass

    def __repr__(self):
        state = "closed" if self.closed else f"k={self.k} blocks={self.blocks}"
        return f"<simindex.Index {self.path!r} {state}>"

    def _s(self):
        st = self._store
        if st is None:
            raise ClosedError(f"index {self.path} is closed")
        st.check_open()
        return st

    def _w(self):
        st = self._s()
        if self._readonly:
            raise ReadOnlyError(f"index {self.path} is open read-only")
        st.check_writable()
        return st

    def _fs(self):
        """The store, after folding this process's write buffer: every call but add and
        query reads or writes the state with everything added before it in records/."""
        st = self._s()
        st.fold()
        return st

    def _fw(self):
        st = self._w()
        st.fold()
        return st

    # ------------------------------------------------------------ parameters
    @property
    def k(self):
        return self._s().plan.k

    @property
    def blocks(self):
        return self._s().plan.blocks

    @property
    def shards(self):
        return self._s().plan.shards

    @property
    def readonly(self):
        return self._readonly

    @property
    def scheme(self):
        """The fingerprint scheme the *_text calls use (recorded at creation)."""
        return self._s().manifest.get("scheme")

    def fingerprint(self, text):
        """The fingerprint of `text` under this index's scheme."""
        return fingerprint(text, scheme=self.scheme)

    def _k(self, k, st=None):
        plan = (st or self._s()).plan
        if k is None:
            return plan.k
        if isinstance(k, bool) or not isinstance(k, int):
            raise ParameterError(f"k must be an int, got {type(k).__name__} {k!r}")
        if not 0 <= k <= plan.k:
            raise ParameterError(
                f"k ({k}) must be between 0 and the index's k ({plan.k}): its tables only "
                f"guarantee matches up to {plan.k} bits")
        return k

    # ------------------------------------------------------------ writes
    def add(self, id, fingerprint, meta=None):
        """Store `fingerprint` under `id` (replacing any earlier record of that id).

        With sync=False the record goes to this process's write buffer (see README).
        """
        idk = encode_id(id)
        fp = check_fp(fingerprint)
        mb = pack_meta(meta, id)
        st = self._w()
        if st.buffer is not None:
            st.append(idk, fp, mb)
        else:
            st.add([idk], np.array([fp], dtype=np.uint64), [mb])

    def add_many(self, items, fingerprints=None, *, jobs=1):
        """Store many records: `add_many([(id, fp), (id, fp, meta), ...])` or, columnar,
        `add_many(ids, fingerprints)` (fingerprints may be a numpy uint64 array).

        Everything is checked before anything is written. Records commit in atomic chunks
        of 262,144; a call that returns is durable (with sync=True). `jobs` shards are
        written at once (threads).
        """
        st = self._w()
        idks, fps, metas = records_of(items, fingerprints)
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ParameterError(f"jobs must be an int >= 1, got {jobs!r}")
        st.fold()
        if idks:
            st.add(idks, fps, metas, jobs=jobs)

    def remove(self, id):
        """Remove the record of `id`; returns whether there was one."""
        idk = encode_id(id)
        return self._fw().remove(idk)

    def add_unique(self, id, fingerprint, meta=None, k=None):
        """Insert only if no stored record is within k bits; returns those that are.

        Atomic across threads and processes: of two near-identical fingerprints added at
        once, exactly one goes in. An existing record of the same id counts like any other.
        """
        st = self._w()
        k = self._k(k)
        idk = encode_id(id)
        fp = check_fp(fingerprint)
        mb = pack_meta(meta, id)
        q = np.array([fp], dtype=np.uint64)
        st.fold()

        def admit(txn):
            hits = st.read(lambda ctx: ctx.query(st.plan.core, q, k, txn))[0]
            if hits:
                return [_match(h) for h in hits]
            st.put_records(txn, [idk], q, [mb])
            return []

        with st._wlock:
            found = st.write(st.records, admit)
            if not found:
                st.apply_pending(force=False)
        return found

    # ------------------------------------------------------------ reads
    def get(self, id):
        """The stored Record of `id`, or None."""
        idk = encode_id(id)
        return record_of(self._fs().get(idk))

    def __contains__(self, id):
        try:
            idk = encode_id(id)
        except (InputError, InputTypeError):
            return False
        return self._fs().get(idk) is not None

    def __len__(self):
        return self._fs().count()

    def query(self, fingerprint, k=None, verify=None):
        """Stored records within k bits (default: the index's k) of `fingerprint`.

        Sorted by distance, then by insertion order (the order of each record's latest add).
        `verify(match) -> bool`, when given, drops the matches it rejects (for example a
        Jaccard check of stored shingles against the query document's).
        """
        st = self._s()
        plan = st.plan
        k = plan.k if k is None else self._k(k, st)
        fp, core = check_fp(fingerprint), plan.core
        buf = st.buffer
        if buf is not None and buf.n:
            st.fold_if_old()
            if buf.n:
                return _verified(self._query_buffered(st, fp, k), verify)
        out = st.read(lambda ctx: ctx.query_one(core, fp, k))
        return out if verify is None else _verified(out, verify)

    def _query_buffered(self, st, fp, k):
        """query() with records in the write buffer: what it would answer once they are
        folded. The stored matches less those of ids with a newer buffered record, then
        the buffered matches (each id's newest only), sorted by distance, stored first."""
        buf, core = st.buffer, st.plan.core
        while True:
            with st._block:
                gen, n = buf.gen, buf.n
                mine = [(d, buf.idkeys[i], int(buf.fps[i]), buf.metas[i])
                        for i, d in buf.within(fp, k)]
            stored = st.read(lambda ctx: ctx.query_one(core, fp, k))
            with st._block:
                if buf.gen != gen:
                    continue               # folded meanwhile: the records may hold them
                if n:
                    stored = [m for m in stored if not buf.shadows(encode_id(m.id), n)]
            break
        if not mine:
            return stored
        out = stored + [Match(decode_id(idk), f, d, unpack(mb, "meta value"))
                        for d, idk, f, mb in mine]
        out.sort(key=_distance)            # stable: stored (by seq), then buffer order
        return out

    def query_many(self, fingerprints, k=None, verify=None):
        """query() for each fingerprint, as one batch scanned without the GIL.

        `verify(query_index, match) -> bool` drops the matches it rejects.
        """
        st = self._s()
        k = self._k(k)
        q = fp_array(fingerprints)
        st.fold()
        out = st.read(lambda ctx: ctx.query(st.plan.core, q, k, None, True))
        if verify is not None:
            _check_verify(verify)
            out = [[m for m in ms if verify(i, m)] for i, ms in enumerate(out)]
        return out

    # ------------------------------------------------------------ text
    def add_text(self, id, text, meta=None):
        """add() the fingerprint of `text` under the index's scheme; returns it."""
        fp = self.fingerprint(text)
        self.add(id, fp, meta)
        return fp

    def query_text(self, text, k=None, verify=None):
        """query() with the fingerprint of `text` under the index's scheme."""
        return self.query(self.fingerprint(text), k=k, verify=verify)

    def add_unique_text(self, id, text, meta=None, k=None):
        """add_unique() with the fingerprint of `text` under the index's scheme."""
        return self.add_unique(id, self.fingerprint(text), meta=meta, k=k)

    def _pair_seqs(self, k):
        """(seq_a, seq_b, distance, id_a, id_b) of every stored pair within k, once each.

        Computed whole inside one snapshot, so iterating never holds the index open.
        Records above the lowest applied seq (not yet in every shard) join each table's
        entries directly, so the answer is exact for the snapshot.
        """
        st = self._fs()
        plan = st.plan
        pa, pb, pd = [], [], []
        with st.snapshot() as (rtxn, stxns):
            states = [_shard.load_state(t) for t in stxns]
            a_min = min(s[0] for s in states)
            tseqs, tfps = _core.read_tail(rtxn, _store.SEQS_DB, a_min + 1)

            for t in range(plan.ntables):
                earlier = plan.earlier_masks(t)
                pmask = plan.core.prefix_mask(t)
                tkeys = plan.core.keys(t, tfps)
                tshard = (tkeys >> np.uint64(64 - plan.shard_bits)) if plan.shard_bits \
                    else np.zeros(len(tkeys), np.uint64)
                if plan.prefix_bits[t] >= plan.shard_bits:
                    groups = [[s] for s in range(plan.shards)]
                else:
                    groups = [list(range(plan.shards))]
                for group in groups:
                    ks, ss = [], []
                    for s in group:
                        for run, count in _shard.runs_of(states[s][1], t):
                            kk, sq = _core.read_run(stxns[s], _shard.BLOCKS_DB, run, count)
                            if len(tseqs):
                                applied = sq <= np.uint64(a_min)   # newer: from the tail
                                kk, sq = kk[applied], sq[applied]
                            ks.append(kk)
                            ss.append(sq)
                    # the unapplied records of the group's key range, once per group
                    mine = tshard == np.uint64(group[0]) if len(group) == 1 else slice(None)
                    if len(tseqs):
                        ks.append(tkeys[mine])
                        ss.append(tseqs[mine])
                    if sum(len(x) for x in ks) < 2:
                        continue
                    if len(ks) == 1:
                        keys, seqs = ks[0], ss[0]          # one run: already sorted
                    else:
                        keys, seqs = np.concatenate(ks), np.concatenate(ss)
                        order = _shard.entry_order(keys, seqs)
                        keys, seqs = keys[order], seqs[order]
                    a, b, d = _core.pairs_sorted(keys, seqs, pmask, earlier, k)
                    pa.append(a)
                    pb.append(b)
                    pd.append(d)
            if not pa:
                return []
            a, b, d = np.concatenate(pa), np.concatenate(pb), np.concatenate(pd)
            # every record of a pair, looked up once and in seq order
            uniq, inv = np.unique(np.concatenate([a, b]), return_inverse=True)
            fps, ids = _core.records_lookup(rtxn, _store.SEQS_DB, uniq)
        live = np.array([i is not None for i in ids], dtype=bool)
        ia, ib = inv[:len(a)], inv[len(a):]
        x = fps[ia] ^ fps[ib]
        dist = np.unpackbits(x.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)
        # removed or replaced since indexed: gone, or its table entry disagrees
        keep = live[ia] & live[ib] & (dist == d)
        found = []
        for sa, sb, dd, ja, jb in zip(a[keep].tolist(), b[keep].tolist(), d[keep].tolist(),
                                      ia[keep].tolist(), ib[keep].tolist()):
            found.append((sa, sb, dd, ids[ja], ids[jb]))
        return found

    def pairs(self, k=None):
        """Every stored pair within k bits, once: (id_a, id_b, distance), a added before b.

        The pairs of one snapshot, computed before the first is returned.
        """
        k = self._k(k)
        return iter([(ia, ib, d) for _sa, _sb, d, ia, ib in self._pair_seqs(k)])

    def clusters(self, k=None):
        """Groups of ids linked by pairs within k bits (connected components of size >= 2).

        Each group lists its ids in insertion order; groups come in order of their oldest id.
        """
        k = self._k(k)
        yield from group_pairs((sa, sb, ia, ib) for sa, sb, _d, ia, ib in self._pair_seqs(k))

    # ------------------------------------------------------------ maintenance
    def flush(self):
        """Fold the write buffer, apply pending records to every table and force everything
        to disk."""
        self._fw().flush()

    def compact(self):
        """Merge each table's runs into one and drop the entries of removed records."""
        self._fw().compact()

    def stats(self):
        """Counts, parameters, runs and bytes on disk."""
        st = self._s()
        buffered = st.buffered()
        st.fold()
        plan = st.plan
        with st.snapshot() as (rtxn, stxns):
            count = rtxn.entries(_store.IDS_DB)
            v = rtxn.get(_store.INFO_DB, b"stale")
            stale = int.from_bytes(v, "big") if v else 0
            last = st.next_seq(rtxn) - 1
            states = [_shard.load_state(t) for t in stxns]
        size = 0
        for root, _dirs, files in os.walk(st.path):
            for f in files:
                try:
                    size += os.path.getsize(os.path.join(root, f))
                except OSError:
                    pass
        return {
            "count": count, "width": 64, "k": plan.k, "blocks": plan.blocks,
            "tables": plan.ntables, "shards": plan.shards,
            "runs": int(sum(len(s[1]) for s in states)),
            "entries": int(sum(int(s[1]["count"].sum()) for s in states)),
            "stale": stale, "last_seq": last,
            "pending": int(max(0, last - min(s[0] for s in states))),
            "prefix_bits": plan.prefix_bits, "bytes": size,
            "scheme": st.manifest.get("scheme"), "format": st.manifest["format"],
            "buffered": buffered, "replayed": st.replayed, "torn_bytes": st.torn_bytes,
        }

    def verify(self):
        """Check every table of every shard against the records; returns the problems found.

        Reads every block (checksums included); an empty list means the index is sound.
        """
        st = self._fs()
        plan = st.plan
        problems = []
        with st.snapshot() as (rtxn, stxns):
            # LMDB aborts the process on a cursor step onto a damaged page: walk the pages
            # of these snapshots (kept from reuse while they are open) before reading them
            for txn in [rtxn] + stxns:
                f = os.path.join(txn.env.path, "data.mdb")
                meta = _store._read_meta(f, txn.id)
                if meta is not None:              # None: a newer commit raced past it
                    problems += lmdbcheck.check(f, meta)
            if problems:
                return problems
            seqs, fps = _core.read_tail(rtxn, _store.SEQS_DB, 0)
            n_ids = rtxn.entries(_store.IDS_DB)
            if n_ids != len(seqs):
                problems.append(f"records: {n_ids} ids but {len(seqs)} records")
            for s, txn in enumerate(stxns):
                applied, runs, _ = _shard.load_state(txn)
                sel = seqs <= np.uint64(applied)
                for t in range(plan.ntables):
                    keys = plan.core.keys(t, fps[sel])
                    mine = ((keys >> np.uint64(64 - plan.shard_bits)) == s
                            if plan.shard_bits else np.ones(len(keys), bool))
                    want = _sorted_pairs(keys[mine], seqs[sel][mine])
                    got_k, got_s = [], []
                    for run, count in _shard.runs_of(runs, t):
                        try:
                            kk, sq = _core.read_run(txn, _shard.BLOCKS_DB, run, count, True)
                        except CorruptError as e:
                            problems.append(f"{_store.shard_dir(s)} table {t}: {e}")
                            continue
                        got_k.append(kk)
                        got_s.append(sq)
                    gk = np.concatenate(got_k) if got_k else np.empty(0, np.uint64)
                    gs = np.concatenate(got_s) if got_s else np.empty(0, np.uint64)
                    live = np.isin(gs, seqs)
                    have = _sorted_pairs(gk[live], gs[live])
                    if not np.array_equal(have, want):
                        problems.append(
                            f"{_store.shard_dir(s)} table {t}: holds {len(have)} live entries "
                            f"for {len(want)} records, {len(_diff(want, have))} missing, "
                            f"{len(_diff(have, want))} wrong")
        return problems


def _sorted_pairs(keys, seqs):
    """(key, seq) rows sorted, as one structured array for exact comparison."""
    out = np.empty(len(keys), dtype=[("k", "<u8"), ("s", "<u8")])
    out["k"], out["s"] = keys, seqs
    return np.sort(out, order=("k", "s"))


def _diff(a, b):
    return np.setdiff1d(a, b)
