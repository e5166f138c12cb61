"""The public index: ids and fingerprints in, exact near-duplicates out."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import numpy as np

from .engine import ledgers, registry, verify as _verify
from .engine._join import hamming as _hamming
from .engine._layout import DB_IDS, MANIFEST
from .engine._query import ReadContext
from .engine.codec import Packed, encode_id, encode_records, pack_meta
from .errors import InputError, InputTypeError, ParameterError, ReadOnlyError, closed_error
from .signatures.fingerprints import DEFAULT_SCHEME, scheme_name, scheme_width
from .signatures.fingerprints import fingerprint as _fingerprint
from .engine.pairs import group_pairs, stored_pairs
from .engine.plan import DEFAULT_K, Plan, default_plan, default_shards
from .bands import band_hits, band_hits_many, band_plan, is_band_index
from .radius import Calibration
from .scheme_names import lsh_rows
from .engine.records import last_seq, stale
from .engine.results import (
    Id, Match, Record, kept_where, kept_where_many, match_of, record_of,
)
from .engine.shard import load_state
from .engine.store import Store
from .values import MAX_FP, check_fp, check_wide_fp, fps_array, words_array
from .textcheck import Hit, TextCheck, keeps_sketches, text_check, text_matches, text_sketch

Fingerprints = Union[Iterable[int], np.ndarray]
_query_one = ReadContext.query_one


def hamming(a: int, b: int) -> int:
    """Number of bits in which two fingerprints (ints of up to 1024 bits) differ."""
    if type(a) is int and type(b) is int and 0 <= a <= MAX_FP and 0 <= b <= MAX_FP:
        return _hamming(a, b)
    for v in (a, b):
        if isinstance(v, (bytes, bytearray, memoryview)):
            raise InputTypeError(f"hamming takes int fingerprints, got bytes {v[:40]!r}")
    return bin(check_wide_fp(a, 1024) ^ check_wide_fp(b, 1024)).count("1")


class Index:
    """A persistent, sharded, exact near-duplicate index of 64-, 128- or 256-bit fingerprints.

    `Index(path)` opens (or creates) the index in directory `path`. Parameters come from the
    manifest on reopen; one given that differs from the stored value raises. A new index
    made with `calibration=simindex.calibrate(texts, t)` takes its scheme, width and k, and
    its text calls judge at that threshold (see query_text). Use it as a
    context manager or call close(). Safe to share between threads; open it again in a child
    process after fork(). `readonly=True, lock=False` reads an index whose lock files this
    user may not write (LMDB's readers register in them), without locks: only while no
    process writes it.
    """

    def __init__(self, path: Union[str, bytes, os.PathLike], *, k: Optional[int] = None,
                 blocks: Optional[int] = None, shards: Optional[int] = None,
                 create: bool = True, readonly: bool = False, sync: bool = True,
                 scheme: Optional[str] = None, expected: Optional[int] = None,
                 prefix_blocks: Optional[int] = None, width: Optional[int] = None,
                 calibration: Union[Calibration, dict, None] = None,
                 lock: bool = True) -> None:
        self._store: Optional[Store] = None
        if isinstance(path, (str, bytes, os.PathLike)) and \
                ("\0" in os.fsdecode(os.fspath(path))):
            raise ParameterError(f"an index path cannot hold a NUL character: "
                                 f"{os.fsdecode(os.fspath(path))!r:.80}")
        # a path without a manifest is a new index: the arguments below decide how it is made
        new = isinstance(path, (str, bytes, os.PathLike)) and \
            not os.path.exists(os.path.join(os.fsdecode(os.fspath(path)), MANIFEST))
        if isinstance(calibration, Calibration) and new:
            # a new index made for the calibration's scheme, width and k, and sized for the
            # rows it expects when it was told them (not for its sample alone)
            scheme = calibration.scheme if scheme is None else scheme
            width = calibration.width if width is None else width
            k = calibration.k if k is None else k
            if expected is None and calibration.expected_rows > calibration.sample_rows:
                expected = calibration.expected_rows    # the rows it was made for
        if isinstance(calibration, Calibration):
            calibration = calibration.stored()
        if new and scheme is not None and lsh_rows(scheme_name(scheme)) is not None:
            width, k, blocks, prefix_blocks = band_plan(scheme_name(scheme), width, k, blocks,
                                                        prefix_blocks)
        self._readonly = readonly
        self.path: str = os.path.abspath(os.fsdecode(os.fspath(path))) \
            if isinstance(path, (str, bytes, os.PathLike)) else repr(path)
        if expected is not None and new:
            # a new index sized for `expected` fingerprints (ignored once it exists)
            if isinstance(expected, bool) or not isinstance(expected, int) or expected < 0:
                raise ParameterError(f"expected must be a number of fingerprints, got "
                                     f"{expected!r}")
            if blocks is None:
                w = 64 if width is None else width
                blocks, p = default_plan(DEFAULT_K if k is None else Plan(k=k, width=w).k,
                                         expected, width=w)
                if prefix_blocks is None:
                    prefix_blocks = p
            if shards is None:
                shards = default_shards(expected)
        if scheme is not None:
            scheme = scheme_name(scheme)               # a clear error for an unknown name
            scheme_width(scheme, 64 if width is None else width)   # and one without the width
        elif new:
            scheme = DEFAULT_SCHEME                    # what a new index records
        self._store = registry.acquire(path, k=k, blocks=blocks, shards=shards, create=create,
                                       readonly=readonly, sync=sync, scheme=scheme,
                                       prefix_blocks=prefix_blocks, width=width,
                                       calibration=calibration, lock=lock)
        self.path = self._store.path

    # ------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Fold the write buffer, flush and close; idempotent. Other handles on the same
        path stay open."""
        st, self._store = self._store, None
        if st is not None:
            try:
                if st.pid == os.getpid() and not st.closed and not st.failed:
                    st.fold()
            finally:
                registry.release(st)

    @property
    def closed(self) -> bool:
        return self._store is None or self._store.closed

    @property
    def failed(self) -> bool:
        """Whether a write to disk failed through this process's handles (a full disk, an
        I/O error): they then refuse writes until every one is closed and the index opened
        again, which replays what was committed."""
        return self._store is not None and self._store.failed

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if self._store is not None and self._store.pid == os.getpid():
                self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"k={self.k} blocks={self.blocks}"
        return f"<simindex.Index {self.path!r} {state}>"

    # The store behind a call, after the checks it needs. Every call but add and query
    # folds the write buffer first: it reads or writes the state with everything added
    # before it in records/.
    def _open_store(self) -> Store:
        st = self._store
        if st is None:
            raise closed_error(f"index {self.path}")
        st.check_open()
        return st

    def _writable_store(self) -> Store:
        st = self._store
        if st is None:
            raise closed_error(f"index {self.path}")
        if self._readonly:
            st.check_open()
            raise ReadOnlyError(f"index {self.path} is open read-only")
        st.check_writable()
        return st

    def _folded_store(self) -> Store:
        st = self._open_store()
        st.fold()
        return st

    def _folded_writable_store(self) -> Store:
        st = self._writable_store()
        st.fold()
        return st

    # ------------------------------------------------------------ parameters
    @property
    def k(self) -> int:
        return self._open_store().plan.k

    @property
    def blocks(self) -> int:
        return self._open_store().plan.blocks

    @property
    def prefix_blocks(self) -> int:
        """Blocks leading each table (blocks - k for the paper's plans, fewer with flips)."""
        return self._open_store().plan.prefix_blocks

    @property
    def width(self) -> int:
        """Bits per fingerprint: 64, 128, 256, 512, 768 or 1024 (recorded at creation)."""
        return self._open_store().plan.width

    @staticmethod
    def _fp(fingerprint: Any, st: Store) -> int:
        """A fingerprint checked against the index's width, as an int."""
        width = st.plan.width
        return check_fp(fingerprint) if width == 64 else check_wide_fp(fingerprint, width)

    @property
    def flips(self) -> int:
        """Bits a query flips in each table's prefix (0 for the paper's plans)."""
        return self._open_store().plan.flips

    @property
    def shards(self) -> int:
        return self._open_store().plan.shards

    @property
    def readonly(self) -> bool:
        return self._readonly

    @property
    def scheme(self) -> Optional[str]:
        """The fingerprint scheme the *_text calls use (recorded at creation)."""
        return self._open_store().manifest.scheme

    @property
    def calibration(self) -> Optional[dict]:
        """The similarity threshold this index's k was chosen for, and how (see
        `simindex.calibrate`), or None: recorded at creation, so later runs judge alike."""
        return self._open_store().manifest.calibration

    @property
    def bands(self) -> Optional[int]:
        """Rows per band of an index of MinHash LSH band keys (a minhash-lsh-v1 scheme),
        else None. Its text calls find the records that share a band's key with the text
        (see query_text), whatever their distance in bits."""
        return lsh_rows(self.scheme)

    def fingerprint(self, text: str) -> int:
        """The fingerprint of `text` under this index's scheme."""
        return _fingerprint(text, scheme=self.scheme, width=self.width)

    def _k(self, k: Optional[int], st: Optional[Store] = None) -> int:
        plan = (st or self._open_store()).plan
        if k is None:
            return plan.k
        if isinstance(k, bool) or not isinstance(k, int):
            raise ParameterError(f"k must be an int, got {type(k).__name__} {k!r}")
        if k >= plan.width and is_band_index(self.scheme, plan):
            return k                  # a band index's search: every record sharing a band
        if not 0 <= k <= plan.k:
            raise ParameterError(
                f"k ({k}) must be between 0 and the index's k ({plan.k}): its tables only "
                f"guarantee matches up to {plan.k} bits")
        return k

    # ------------------------------------------------------------ writes
    def add(self, id: Id, fingerprint: int, meta: Any = None) -> None:
        """Store `fingerprint` under `id` (replacing any earlier record of that id).

        With sync=False the record goes to this process's write buffer (see docs/design/processes.md).
        """
        idk = encode_id(id)
        st = self._writable_store()
        fp = self._fp(fingerprint, st)
        mb = pack_meta(meta, id)
        buf = st.buffer
        if buf is not None:            # every single add's path: Store.append, inline
            if buf.n and buf.due():
                st.fold()
            buf.append(idk, fp, mb)
        elif st.plan.width == 64:
            st.add([idk], np.array([fp], dtype=np.uint64), [mb])
        else:
            st.add([idk], words_array([fp], st.plan.width), [mb])

    def add_many(self, items: Iterable[Any], fingerprints: Optional[Fingerprints] = None, *,
                 jobs: int = 1, replace: bool = True) -> None:
        """Store many records: `add_many([(id, fp), (id, fp, meta), ...])` or, columnar,
        `add_many(ids, fingerprints)` (fingerprints may be a numpy uint64 array).

        Everything is checked before anything is written. Records commit in atomic chunks
        of 1,048,576; a call that returns is durable (with sync=True). `jobs` shards are
        written at once (threads). With replace=False an id already stored, or given twice,
        raises InputError naming it instead of replacing, and its chunk writes nothing.
        """
        st = self._writable_store()
        idks, fps, metas = encode_records(items, fingerprints, st.plan.width)
        if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
            raise ParameterError(f"jobs must be an int >= 1, got {jobs!r}")
        st.fold()
        if len(idks):
            st.add(idks, fps, metas, jobs=jobs, replace=bool(replace))

    def remove(self, id: Id) -> bool:
        """Remove the record of `id`; returns whether there was one."""
        idk = encode_id(id)
        return self._folded_writable_store().remove(idk)

    def add_unique(self, id: Id, fingerprint: int, meta: Any = None,
                   k: Optional[int] = None) -> list[Match]:
        """Insert only if no stored record is within k bits; returns those that are.

        Atomic across threads and processes: of two near-identical fingerprints added at
        once, exactly one goes in. An existing record of the same id counts like any other;
        when it is not within k, IdExistsError is raised: add_unique never replaces a
        record (remove() it first, or add() to replace it).
        """
        st = self._writable_store()
        k = self._k(k)
        idk = encode_id(id)
        fp = self._fp(fingerprint, st)
        mb = pack_meta(meta, id)
        st.fold()
        return [match_of(h) for h in st.add_unique(idk, fp, mb, k)]

    # ------------------------------------------------------------ reads
    def get(self, id: Id) -> Optional[Record]:
        """The stored Record of `id`, or None."""
        idk = encode_id(id)
        st = self._folded_store()
        return record_of(st.get(idk), st.plan.words)

    def __contains__(self, id: object) -> bool:
        try:
            idk = encode_id(id)
        except InputError:
            return False
        return self._folded_store().get(idk) is not None

    def __len__(self) -> int:
        return self._folded_store().count()

    def query(self, fingerprint: int, k: Optional[int] = None,
              where: Optional[Callable[[Match], bool]] = None) -> list[Match]:
        """Stored records within k bits (default: the index's k) of `fingerprint`. An index
        of band keys (see `bands`) also takes a k of its width or more (k = 256 at 8 bands):
        the records that share a band's key.

        Sorted by distance, then by insertion order (the order of each record's latest add;
        in an index of several ledgers, global seq order: each ledger's own insertion
        order, the ledgers interleaved).
        `where(match) -> bool`, when given, drops the matches it rejects (for example a
        Jaccard check of stored shingles against the query document's).
        """
        st = self._store
        if st is not None and st.single is not None and (st.buffer is None or not st.buffer.n):
            out = st.single.query(fingerprint, k)     # compiled; None: not its case
            if out is not None:
                return out if where is None else kept_where(out, where)
        st = self._open_store()
        plan = st.plan
        k = plan.k if k is None else self._k(k, st)
        fp = check_fp(fingerprint) if plan.width == 64 else \
            check_wide_fp(fingerprint, plan.width)
        buf = st.buffer
        if buf is not None and buf.n:
            st.fold_if_old()
            if buf.n:
                return kept_where(self._query_buffered(st, fp, k), where)
        if k > plan.k:
            return kept_where(band_hits(fp, st.query_one(fp, k), plan.blocks), where)
        if plan.width != 64 or st.nledgers > 1:
            return kept_where(st.query_one(fp, k), where)
        out = st.read(_query_one, plan.permuter, fp, k)
        return out if where is None else kept_where(out, where)

    @staticmethod
    def _query_buffered(st: Store, fp: int, k: int) -> list[Match]:
        """query() with records in this process's write buffer (apart, so that the common
        path's closure holds only what its own lambda needs)."""
        assert st.buffer is not None
        out = st.buffer.query(fp, k, lambda: st.query_one(fp, k), Match)
        return band_hits(fp, out, st.plan.blocks) if k > st.plan.k else out

    def query_many(self, fingerprints: Fingerprints, k: Optional[int] = None,
                   where: Optional[Callable[[int, Match], bool]] = None) -> list[list[Match]]:
        """query() for each fingerprint, as one batch scanned without the GIL.

        `where(query_index, match) -> bool` drops the matches it rejects.
        """
        st = self._open_store()
        k = self._k(k)
        q = fps_array(fingerprints, st.plan.width)
        st.fold()
        return kept_where_many(self._held(q, st.query(q, k), k, st), where)

    @staticmethod
    def _held(q: np.ndarray, found: list, k: int, st: Store) -> list:
        """The answers of a band search (k beyond the plan's) as the tables hold them: the
        records sharing a band with each query (see simindex/bands.py)."""
        return found if k <= st.plan.k else band_hits_many(q, found, st.plan.blocks)

    def queries(self, fingerprints: Fingerprints) -> np.ndarray:
        """Fingerprints checked against the index's width, as the array its batch calls
        take: (n,) uint64 at width 64, (n, width/64) words above."""
        st = self._open_store()
        return fps_array(fingerprints, st.plan.width)

    def _admit(self, fn: Callable[[Any], Any], lag: Optional[int] = None) -> Any:
        """fn(admission) with the index's queries and inserts in one records write
        transaction (Store.admit): what dedup's batches decide and add as one step.
        `lag`: the most records the shards may leave untaken after it (the next queries
        pass over those one by one); None, the store's group size; 0, none."""
        st = self._writable_store()
        st.fold()
        return st.admit(fn) if lag is None else st.admit(fn, lag=lag)

    def _hits_many(self, fingerprints: Fingerprints, k: Optional[int] = None) -> list:
        """query_many()'s matches as the core finds them: per fingerprint, (distance,
        fingerprint, seq, id, meta bytes or None) tuples (for the callers that read what
        the meta bytes hold besides the meta value, such as a text's sketch)."""
        st = self._open_store()
        k = self._k(k)
        q = fps_array(fingerprints, st.plan.width)
        st.fold()
        return self._held(q, st.query(q, k, matches=False), k, st)

    # ------------------------------------------------------------ text
    def text_check(self, min_similarity: Optional[float] = None,
                   k: Optional[int] = None) -> Optional[TextCheck]:
        """The check text calls make with `min_similarity` (default: the calibration's):
        its radius k, threshold t and measure; None when they judge by distance alone.
        Raises ParameterError when no radius is known for the threshold."""
        st = self._open_store()
        return self._text_check(st, k, min_similarity)

    def _text_check(self, st: Store, k: Optional[int],
                    min_similarity: Optional[float]) -> Optional[TextCheck]:
        return text_check(st.manifest.scheme, st.plan.width, st.plan.k,
                          st.manifest.calibration, min_similarity,
                          None if k is None else self._k(k, st))

    def text_record(self, text: str, meta: Any = None, id: Optional[Id] = None) -> tuple:
        """(fingerprint, meta) to store for `text`: add(id, *text_record(text, meta)) and
        add_many([(id, *text_record(text, meta)), ...]) store what add_text stores (the
        meta then holds the text's sketch where the index keeps sketches)."""
        st = self._open_store()
        if not keeps_sketches(st.manifest.scheme, st.manifest.calibration):
            return self.fingerprint(text), meta
        fp, sketch = text_sketch(text, st.manifest.scheme, st.plan.width)
        return fp, Packed(pack_meta(meta, id, sketch))

    def add_text(self, id: Id, text: str, meta: Any = None) -> int:
        """add() the fingerprint of `text` under the index's scheme; returns it. Under
        minhash-v1, or in a calibrated index, the text's sketch is kept with the record for
        the similarity check of later text calls."""
        fp, stored = self.text_record(text, meta, id)
        self.add(id, fp, stored)
        return fp

    def query_text(self, text: str, k: Optional[int] = None,
                   where: Optional[Callable[[Match], bool]] = None,
                   min_similarity: Optional[float] = None) -> list[Match]:
        """query() with the fingerprint of `text` under the index's scheme.

        With `min_similarity` (or in a calibrated index, at its threshold), only records
        whose stored text is that similar pass (estimated from their sketches), searched at
        the radius that finds them (see simindex/textcheck.py); records stored without a
        sketch count on their distance alone.
        """
        return self._query_text(text, k, where, min_similarity)[1]

    def _query_text(self, text: str, k: Optional[int] = None,
                    where: Optional[Callable[[Match], bool]] = None,
                    min_similarity: Optional[float] = None) -> tuple:
        """(fingerprint, matches) of query_text (the server answers with both)."""
        st = self._open_store()
        check = self._text_check(st, k, min_similarity)
        if check is None and (self.bands is not None or not keeps_sketches(
                st.manifest.scheme, st.manifest.calibration)):
            fp = self.fingerprint(text)
            return fp, self.query(fp, k=k, where=where)
        fp, (sketch, size) = text_sketch(text, st.manifest.scheme, st.plan.width)
        radius = check.k if check is not None else self._k(k, st)
        q = np.array([fp], dtype=np.uint64) if st.plan.width == 64 else \
            words_array([fp], st.plan.width)
        buf = st.buffer
        if buf is not None and buf.n:       # this process's buffered records too, unfolded
            hits = buf.query(fp, radius, lambda: list(map(
                Hit._make, st.query(q, radius, matches=False)[0])),
                lambda id_, f, d, mb: Hit(d, f, 0, id_, mb), raw=True)
        else:
            hits = st.query(q, radius, matches=False)[0]
        found = check.similar(sketch, size, hits, fp) if check is not None else \
            text_matches(hits, sketch, size)
        return fp, kept_where(found, where)

    def add_unique_text(self, id: Id, text: str, meta: Any = None,
                        k: Optional[int] = None,
                        min_similarity: Optional[float] = None) -> list[Match]:
        """add_unique() with the fingerprint of `text` under the index's scheme.

        With `min_similarity` (or in a calibrated index), a stored record blocks the insert
        only if its text passes the similarity check (see query_text); the check is made
        inside the atomic section, so of two similar texts added at once exactly one goes
        in. The text's sketch is kept as add_text keeps it (and always with a threshold).
        As add_unique, it never replaces: a record of the same id that does not block the
        insert raises IdExistsError.
        """
        return self._add_unique_text(id, text, meta, k, min_similarity)[1]

    def _add_unique_text(self, id: Id, text: str, meta: Any = None, k: Optional[int] = None,
                         min_similarity: Optional[float] = None) -> tuple:
        """(fingerprint, matches) of add_unique_text (the server answers with both)."""
        st = self._writable_store()
        check = self._text_check(st, k, min_similarity)
        if check is None and not keeps_sketches(st.manifest.scheme,
                                                st.manifest.calibration):
            fp = self.fingerprint(text)
            return fp, self.add_unique(id, fp, meta=meta, k=k)
        idk = encode_id(id)
        fp, (sketch, size) = text_sketch(text, st.manifest.scheme, st.plan.width)
        mb = pack_meta(meta, id, (sketch, size))
        st.fold()
        if check is None:
            return fp, text_matches(st.add_unique(idk, fp, mb, self._k(k, st)), sketch, size)
        hits = st.add_unique(idk, fp, mb, check.k,
                             lambda found: check.passing(sketch, size, found, fp))
        return fp, text_matches(hits, sketch, size, check.measure)

    # ------------------------------------------------------------ all pairs
    def _stored_pairs(self, k: int) -> list:
        """stored_pairs of this index's records, of one ledger or of several."""
        st = self._folded_store()
        return ledgers.stored_pairs(st, k) if isinstance(st, ledgers.LedgerReader) \
            else stored_pairs(st, k)

    def pairs(self, k: Optional[int] = None) -> Iterator[tuple[Id, Id, int]]:
        """Every stored pair within k bits, once: (id_a, id_b, distance), a added before b
        (in an index of several ledgers, a before b in global seq order).

        The pairs of one snapshot, computed before the first is returned.
        """
        k = self._k(k)
        found = self._stored_pairs(k)
        return iter([(ia, ib, d) for _sa, _sb, d, ia, ib in found])

    def clusters(self, k: Optional[int] = None) -> Iterator[list[Id]]:
        """Groups of ids linked by pairs within k bits (connected components of size >= 2).

        Each group lists its ids in insertion order; groups come in order of their oldest id.
        A generator: the pairs are computed (in one snapshot) at the first next().
        """
        k = self._k(k)
        found = self._stored_pairs(k)
        yield from group_pairs((sa, sb, ia, ib) for sa, sb, _d, ia, ib in found)

    # ------------------------------------------------------------ maintenance
    def flush(self) -> None:
        """Fold the write buffer, bring every shard up to the last record, and force
        everything to disk."""
        self._folded_writable_store().flush()

    def compact(self) -> None:
        """Merge each table's runs into one and drop the entries of removed records."""
        self._folded_writable_store().compact()

    def stats(self) -> dict[str, Any]:
        """Counts, parameters, runs and bytes on disk (docs/guide/python.md lists every key)."""
        st = self._open_store()
        buffered = st.buffered()
        st.fold()
        plan = st.plan
        nl = st.nledgers
        with st.snapshot() as txns:
            ltxns, stxns = txns[:nl], txns[nl:]
            count = sum(t.entries(DB_IDS) for t in ltxns)
            removed = sum(stale(t) for t in ltxns)
            lasts = [last_seq(t) for t in ltxns]
            states = [load_state(t, plan.ntables) for t in stxns]
            if nl > 1:
                low = np.min([ledgers.load_applied(t, nl) for t in stxns], axis=0)
                unapplied = int(sum(max(0, a - int(b)) for a, b in zip(lasts, low)))
            else:
                unapplied = int(max(0, lasts[0] - min(s[0] for s in states)))
        last = max(ledgers.global_seq(a, n, nl) for n, a in enumerate(lasts))
        size = 0
        for root, _dirs, files in os.walk(st.path):
            for f in files:
                try:
                    size += os.path.getsize(os.path.join(root, f))
                except OSError:
                    pass
        return {
            "count": count, "width": plan.width, "k": plan.k, "blocks": plan.blocks,
            "prefix_blocks": plan.prefix_blocks, "flips": plan.flips,
            "probes": sum(plan.probes), "tables": plan.ntables, "shards": plan.shards,
            "runs": int(sum(len(s[1]) for s in states)),
            "entries": int(sum(int(s[1]["count"].sum()) for s in states)),
            "stale": removed, "last_seq": last,
            "unapplied": unapplied,
            "prefix_bits": plan.prefix_bits, "bytes": size,
            "scheme": st.manifest.scheme, "format": st.manifest.format, "ledgers": nl,
            "buffered": buffered, "replayed": st.replayed.records,
            "torn_bytes": st.replayed.torn_bytes,
        }

    def verify(self) -> list[str]:
        """Check every table of every shard against the records; returns the problems found.

        Reads every table slab (checksums included); an empty list means the index is sound.
        """
        return _verify.problems(self._folded_store())
