"""Deduplicating datasets: rows of JSONL, CSV or Parquet files judged in input order against
everything kept before, in this run and (with a kept index) in earlier runs.

The rule is the crawler's (`Index.add_unique`): a row is kept when no kept row is within k
bits of its fingerprint, and a removed row names the kept one it matched. There is no
chaining: a row within k of a removed row only is kept.

Rows go in batches: signatures (the compiled text pass, in `jobs` threads; other schemes in
worker processes), one query_many of the batch against the index (and the reference index),
the batch's own pairs (find_all), then the kept rows are added in one atomic add_many. Each
kept record's meta holds the run's token and the row's position, which makes a re-run of a
killed run give the output of an uninterrupted one: a record this run's earlier process kept
at the same position is the row itself, and records it kept at later positions are not yet
"before" the row.

With a similarity threshold the check decides: a match within k bits counts only when the
two rows' shingles are similar enough (Jaccard, or containment), computed exactly for rows
of this run (their shingle sets wait in a temporary file) and estimated from the sketch
stored in the record for rows of earlier runs. Without k, the radius comes from the data
(`simindex.calibrate`) and the index keeps it, so later runs judge alike.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import queue
import shutil
import tempfile
import threading
import time
from contextlib import closing, contextmanager
from types import SimpleNamespace
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import (
    Any, Callable, Generator, Iterable, Iterator, NamedTuple, Optional, Union,
)

import msgpack
import numpy as np

from ..signatures import _text
from ..engine import manifest
from ..radius import MEASURES, Calibration
from ..engine.codec import encode_ids, pack_metas
from ..values import check_fp, check_wide_fp, fps_array
from ..errors import BadLine, Error, IdExistsError, InputError
from ..signatures.fingerprints import DEFAULT_SCHEME, WORD_SCHEMES, scheme_name
from ..index import Index
from ..inputs import check_id, parse_fp
from ..scheme_names import lsh_bands, lsh_rows
from .check import Check, Shingles, batch_signatures, text_signatures
from .publish import temporary_dir
from .parts import in_order, parts_of, read_part, splittable
from .rows import (
    Row, format_of, json_columns, json_line, json_row, lines_as_read, read_rows,
)
from .rules import (
    components_outside, distance, greedy_outside, greedy_verdict, held, id_taken, matches,
    near_pairs, pairs_as_searched, search_shape, sketched, taken_row, verdict_of_group,
)
from .settings import (
    check_options, choose_radius, input_files, judging, open_indexes, run_token,
)

@contextmanager
def few_collections() -> Iterator[None]:
    """Rare cyclic garbage collections while a run streams rows: its objects die young, and
    the collector's full passes over everything already alive (what was imported, a
    caller's data in memory) cost a sixth of a run. The collector's settings are put back
    after."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(20000, 50, 50)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


BATCH = 4096              # rows judged together: one query_many, one add_many
BATCH_CHARS = 8 << 20      # ... or fewer, when their texts hold this many characters
APPLY_LAG = 1024           # the most records a run's shards leave untaken after a batch


class Decision(NamedTuple):
    """What dedup decided for one input row."""
    row: Any                        # the row's columns, as read (a dict; its JSON line's
                                    # bytes in a run asked for lines)
    id: Any                         # its id (the --id-field value, or "file:row")
    where: str                      # "file:row"
    fingerprint: int
    kept: bool
    match: Any = None               # removed: the id of the kept record it matched
    distance: Optional[int] = None  # removed: the distance to that record
    reference: bool = False         # removed: the match is in the --against index
    cluster: Any = None             # the id its group is known by: its kept row's (or,
                                    # with drop_all, the row that would have been kept)
    similarity: Optional[float] = None  # removed, with min_similarity: the similarity to
                                        # the match
    evidence: Optional[str] = None  # how `similarity` was known: "exact" (both shingle
                                    # sets) or "sketch" (a stored sketch's estimate)


class Summary:
    """Counts of a run (also printed by the CLI), and the radius it used."""

    def __init__(self) -> None:
        self.rows = 0
        self.kept = 0
        self.removed = 0
        self.skipped = 0
        self.start = time.perf_counter()
        self.calibration: Optional[Calibration] = None   # when the radius came from data
        self.radius: Optional[dict] = None    # scheme, width, k, threshold of the run

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def __str__(self) -> str:
        secs = self.seconds
        rate = self.rows / secs if secs > 0 else 0.0
        out = (f"rows in {self.rows}, kept {self.kept}, removed {self.removed}, skipped "
               f"{self.skipped}, in {secs:.2f} s ({rate:,.0f} rows/s)")
        if self.radius is not None:
            r = self.radius
            search = f"{lsh_bands(r['scheme'])} bands of {r['bands']} rows" \
                if r.get("bands") else f"k={r['k']}"
            out += f"; {r['scheme']} {r['width']} bits, {search}"
            if r.get("min_similarity") is not None:
                out += f", {r['measure']} >= {r['min_similarity']:g}"
            if r.get("expected_recall") is not None:
                out += f", expected recall {r['expected_recall']:.4f}"
            cal = self.calibration
            if cal is not None and cal.chosen.capped:
                out += (f" (k capped by the time budget of {cal.time_budget:g} s, below the "
                        f"{cal.recall:g} recall asked for)")
        return out


class _Judge:
    """The greedy decision of batches of rows against an index and a reference."""

    def __init__(self, idx: Index, ref: Optional[Index], k: int, token: bytes,
                 check: Optional[Check] = None) -> None:
        self.idx, self.ref, self.k, self.token = idx, ref, k, token
        self.check = check

    def put(self, adm: Any, adds: list, idkeys: list, q: Any, metas: list, ids: list,
            places: list) -> None:
        """Add the records of kept rows (batch positions `adds`; `metas`: every row's
        packed meta) in an admission; an id already stored, or kept twice, is an error
        naming the row."""
        if not adds:
            return
        try:
            adm.put([idkeys[i] for i in adds], q[adds], [metas[i] for i in adds])
        except IdExistsError as e:
            raise taken_row(e, adds, idkeys, adm, places, ids, self.token) from None

    def for_workers(self) -> dict:
        """What a worker process needs to make a batch's Prepared as ahead() would."""
        return dict(token=self.token, k=self.k, shape=search_shape(self.idx))

    def ahead(self, batch: Any) -> "Ahead":
        """A batch of good rows (a list, or a Prepared a worker made) in columns, with what
        judging it needs and no transaction reads made: its queries, id keys and the pairs
        of its rows within k (done on the reader's thread, one batch ahead, when the run
        has one). An Ahead the reader made from a worker's columns is taken as it is."""
        if type(batch) is Ahead:
            return batch
        good = batch.good if type(batch) is Prepared else batch
        fps = [g.fp for g in good]
        ids = [g.id for g in good]
        positions = [[g.p, g.row.number] for g in good]
        sh = [g.sh for g in good]
        if type(batch) is Prepared:
            ready = batch
        else:
            ready = prepared(good, self.token, self.k, search_shape(self.idx),
                             self.check is not None, self.idx.queries(fps))
        return Ahead([g.row.written for g in good], ids, fps, positions,
                     [g.row.where for g in good], sh, ready.queries, ready.idkeys,
                     ready.earlier, ready.metas)

    def batch(self, a: "Ahead") -> list:
        """Decisions for one batch, its kept rows added to the index in the transaction
        that judged them against it: a row is kept only when nothing any writer admitted
        before is a near-copy."""
        check = self.check
        k = self.k
        refs = matches(self.ref, a.fps, k, check) if self.ref is not None else None
        mark = check.mark() if check is not None else None
        q = a.queries

        def decide(adm: Any) -> list:
            if check is not None:
                check.rewind(mark)         # made again from its start (the map grew)
            stored = sketched(held(self.idx, q, adm.hits(q, k), k))
            out, adds = self.greedy(a, stored, refs)
            self.put(adm, adds, a.idkeys, q, a.metas, a.ids, a.places)
            return out
        # a batch of kept rows is a group of its own: its records go to the shards at
        # once, rather than wait for the next batches' queries to pass over them one by
        # one; a few kept rows wait for more, but never under a band search, to which
        # every record that waits is a candidate (checked by distance alone)
        return self.idx._admit(decide, lag=0 if k > self.idx.k else APPLY_LAG)

    def greedy(self, a: "Ahead", stored: list, refs: Optional[list]) -> tuple:
        """(decisions, the batch positions of the kept rows to add) of a batch under the
        greedy rule: `stored` and `refs`, each row's (Match, sketch) in the index and the
        reference; `a.earlier`, each row's earlier rows of the batch within k."""
        ids, fps, sh, places, earlier = a.ids, a.fps, a.sh, a.places, a.earlier
        check, token = self.check, self.token
        out: list = []
        kept_here: dict = {}           # batch position -> True for kept rows
        adds = []
        made = tuple.__new__           # a Decision made without its __new__'s call
        for i, (row, id_, fp, pos) in enumerate(zip(a.rows, ids, fps, a.positions)):
            near = stored[i] or (refs is not None and refs[i]) or i in earlier
            if not near:               # the common row: nothing near it, kept
                kept_here[i] = True
                adds.append(i)
                if check is not None and sh[i] is not None:
                    check.keep(pos, sh[i].set)
                out.append(made(Decision, (row, id_, places[i], fp, True, None, None, False,
                                           id_, None, None)))
                continue
            best, mine = greedy_outside(stored[i], refs[i] if refs is not None else (),
                                        sh[i], pos, token, check)
            for j in earlier.get(i, ()):
                if kept_here.get(j):
                    d = distance(fps[i], fps[j])
                    if best is not None and (d, 1 + j) >= best[:2]:
                        continue
                    ok, sim, how = (True, None, None) if check is None else \
                        check(sh[i], sh[j])
                    if ok:
                        best = (d, 1 + j, ids[j], False, sim, how)
            if best is None:
                kept_here[i] = True
                if not mine:
                    adds.append(i)
                if check is not None and sh[i] is not None:
                    check.keep(pos, sh[i].set)
                out.append(Decision(row, id_, places[i], fp, True, None, None, False, id_))
            else:
                out.append(Decision(row, id_, places[i], fp, False, *greedy_verdict(best)))
        return out, adds


def decisions(inputs: Union[str, Iterable[str]], **options: Any
              ) -> Generator[Decision, None, None]:
    """A Decision for every row of `inputs`, in input order; the options are `dedup`'s."""
    for batch in decision_batches(inputs, **options):
        yield from batch


def decision_batches(inputs: Union[str, Iterable[str]], *, text_field: str = "text",
              id_field: Optional[str] = None, fingerprint_field: Optional[str] = None,
              k: Optional[int] = None, scheme: Optional[str] = None,
              width: Optional[int] = None, index: Optional[str] = None,
              against: Optional[str] = None, mode: Optional[str] = None, keep: str = "first",
              drop_all: bool = False, min_similarity: Optional[float] = None,
              recall: Optional[float] = None, containment: bool = False,
              time_budget: Optional[float] = None, fmt: Optional[str] = None, jobs: int = 1,
              on_error: Union[str, Callable[[BadLine], None]] = "stop",
              summary: Optional[Summary] = None, reserved: tuple = (),
              lines: bool = False) -> Iterator[list]:
    """The Decisions of the rows of `inputs`, in input order, a list at a time (see
    `dedup`). `reserved`: columns no row may hold (those the caller adds to its output):
    a row that holds one is a bad row. `lines`: for a caller that writes rows back as JSON
    lines only (RowWriter takes either): a row of a JSON lines file stands as its line's
    bytes, as read, instead of its columns (read in parts by worker processes, the run
    does not decode it a second time)."""
    paths = input_files(inputs)
    mode = check_options(mode, keep, drop_all, jobs, min_similarity, recall, on_error)
    if scheme is not None:
        scheme = scheme_name(scheme)
    measure = MEASURES[1] if containment else MEASURES[0]
    summary = summary if summary is not None else Summary()
    pool: Any = None
    scratch = ref = idx = check = lock = None
    try:
        # the run's scratch folder (its index without --index, the shingle sets waiting
        # for checks); what killed runs left there is removed
        scratch, lock = temporary_dir(tempfile.gettempdir(), "simindex-dedup-")
        if index is None:
            index = os.path.join(scratch, "index")
        new = not os.path.exists(os.path.join(index, manifest.NAME))
        cal, made, scheme, width, empty = choose_radius(
            paths, new, k=k, scheme=scheme, width=width, min_similarity=min_similarity,
            recall=recall, measure=measure, fmt=fmt, text_field=text_field,
            fingerprint_field=fingerprint_field, time_budget=time_budget, summary=summary)
        if empty:                      # no row: judged against a scratch index, not kept
            index = os.path.join(scratch, "index")
        # JSON lines read in parts, by worker processes (or with one job, by this process
        # when rows are written back as their lines: no row is decoded into a dict)
        whole = all(format_of(path, fmt) == "jsonl" and splittable(path) for path in paths)
        parts = jobs if whole and (jobs > 1 or lines) else 0
        if parts > 1:
            pool = _processes(jobs)
        elif jobs > 1 and (fingerprint_field is None or min_similarity is not None):
            word = (scheme or DEFAULT_SCHEME) in WORD_SCHEMES if new else None
            if word is False or (word is None and not _index_reads_words(index)):
                pool = _processes(jobs)
            else:
                pool = ThreadPoolExecutor(jobs)
        idx, ref, kk, min_similarity, measure = open_indexes(
            index, against, new, cal, k=k, scheme=scheme, width=width,
            min_similarity=min_similarity, measure=measure, summary=summary)
        token = run_token(paths, text_field, id_field, fingerprint_field,
                          judging(mode, kk, measure, min_similarity, idx.width))
        if min_similarity is not None:
            check = Check(float(min_similarity), measure, token, scratch)
        run = BatchReader(paths, fmt, text_field, id_field, fingerprint_field, keep, pool,
                          on_error, summary, idx, check is not None, made, reserved, parts,
                          lines)
        run.scratch = scratch
        judge = _Judge(idx, ref, kk, token, check)
        if mode == "greedy":
            run.preparing = judge.for_workers()
            # its reader stops before the pool
            with closing(run.batches(judge.ahead)) as batches:
                for batch in batches:
                    yield run.judged(batch, judge)
        else:
            out: list = []
            for d in _components(run, judge, drop_all):
                out.append(d)
                if len(out) >= BATCH:
                    yield out
                    out = []
            if out:
                yield out
        idx.flush()
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if check is not None:
            check.close()
        if ref is not None:
            ref.close()
        if idx is not None:
            idx.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if lock is not None:
            os.close(lock)


def _processes(jobs: int) -> ProcessPoolExecutor:
    """A pool of `jobs` worker processes, started now (before an index is open), each of
    which ends itself once the run's process is gone: killed, it would leave them waiting
    for work forever, holding its pipes and files open."""
    if "fork" in multiprocessing.get_all_start_methods():
        # forked: a worker's parent is the run's process (under forkserver it would be
        # the server), and the workers start at once, before anything is opened
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"),
                                   initializer=_watch_parent, initargs=(os.getpid(),))
    else:
        pool = ProcessPoolExecutor(jobs)
    pool.submit(int).result()
    return pool


def _watch_parent(pid: int) -> None:
    """A worker's watch on the run's process (`pid`): the worker exits when it is gone."""
    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(0.2)
        os._exit(1)
    threading.Thread(target=watch, name="simindex-parent-watch", daemon=True).start()


def _index_reads_words(index: str) -> bool:
    """Whether an existing index's scheme is read by the compiled text pass (threads)."""
    try:
        m = manifest.read(index)
    except Error:
        return True
    return (m.scheme or DEFAULT_SCHEME) in WORD_SCHEMES


class _Good(NamedTuple):
    """A row that passed its checks: file number, the Row, its id, fingerprint, and the
    value the keep policy ranks it by."""
    p: int
    row: Row
    id: Any
    fp: Any          # None until the batch's texts are fingerprinted
    rank: Any
    sh: Any = None   # the shingle set (with min_similarity)


class Prepared(NamedTuple):
    """What judging a batch of good rows needs that a worker process can make (prepared)."""
    good: list               # the _Good rows
    queries: Any             # their fingerprints as the index's batch calls take them
    idkeys: list             # their ids' record keys
    earlier: dict            # row -> the earlier rows of the batch within k
    metas: list              # the packed metas of their records, should they be kept


def prepared(good: list, token: bytes, k: int, shape: tuple, checked: bool,
             queries: Any) -> Prepared:
    """The Prepared of a batch of good rows judged at k by an index of this search_shape,
    in a run with this token (`checked`: with a similarity check); `queries`: their
    fingerprints as the index's batch calls take them."""
    return prepared_columns(good, [g.id for g in good], [[g.p, g.row.number] for g in good],
                            [g.sh for g in good], token, k, shape, checked, queries)


def prepared_columns(rows: Any, ids: list, positions: list, sh: list, token: bytes, k: int,
                     shape: tuple, checked: bool, queries: Any) -> Prepared:
    """prepared() of a batch given in columns: its ids, positions and Shingles (or Nones);
    `rows` stands in the Prepared's place of the good rows."""
    earlier: dict = {}
    for a, b in pairs_as_searched(shape, queries, k):
        earlier.setdefault(b, []).append(a)
    metas = kept_metas(token, positions, ids, sh, checked)
    return Prepared(rows, queries, encode_ids(ids), earlier, metas)


def _line_batches(p: int, shown: str, first: int, lines: list, numbers: list,
                  ids: Optional[list], fps: list, flat: Optional[tuple],
                  batches: list) -> Iterator[Ahead]:
    """The Aheads of a part's good rows, made from the columns its worker gave (prepared_part:
    their line numbers, ids or None, fingerprints, flat shingle sets or None, and each
    batch's Prepared but its rows) with no object per row but what judging takes: each
    row stands as its line's bytes."""
    places = [f"{shown}:{n}" for n in numbers]
    rows = lines_as_read(lines, first, numbers)
    positions = [[p, n] for n in numbers]
    sh = [None] * len(numbers) if flat is None else _unflat_sets(flat)
    ids = places if ids is None else ids
    for c, i in enumerate(range(0, len(numbers), BATCH)):
        at = slice(i, i + BATCH)
        yield Ahead(rows[at], ids[at], fps[at], positions[at], places[at], sh[at],
                    *batches[c])


def kept_metas(token: bytes, positions: list, ids: list, sh: list, checked: bool) -> list:
    """The stored metas of kept records: the run token and the row's position, and with
    a check (`checked`) the row's sketch and set size (for later runs' checks)."""
    if not checked:                # [token, [p, n]] packed by parts: msgpack's array of
        pack = msgpack.Packer(use_bin_type=True).pack    # two is its header and each item
        head = b"\x92" + pack(token) + b"\x92"
        return [b"".join((head, pack(p), pack(n))) for p, n in positions]
    values = [[token, pos] for pos in positions]
    return pack_metas(values, ids, [None if x is None else (x.sketch, len(x.set))
                                    for x in sh])


class Ahead(NamedTuple):
    """A batch of good rows in columns (see _Judge.ahead)."""
    rows: list               # their columns, as read (or their JSON lines' bytes)
    ids: list
    fps: list
    positions: list          # [file number, row number]
    places: list             # "file:row"
    sh: list                 # Shingles, or None without a check
    queries: Any             # the fingerprints as the index's batch calls take them
    idkeys: list             # the ids' record keys
    earlier: dict            # row -> the earlier rows of the batch within k
    metas: list              # the packed metas of their records, should they be kept


class BatchReader:
    """The inputs of one run read in fingerprinted batches of good rows."""

    def __init__(self, paths: list, fmt: Optional[str], text_field: str,
                 id_field: Optional[str], fingerprint_field: Optional[str], keep: str,
                 pool: Any, on_error: Any, summary: Summary, idx: Any,
                 shingled: bool = False, made: Optional[dict] = None,
                 reserved: tuple = (), parts: int = 0, lines: bool = False) -> None:
        self.paths, self.fmt = paths, fmt
        self.parts = parts            # JSON lines read in parts by the pool's processes
                                      # (this many), or 0
        self.as_lines = lines         # rows of JSON lines written back as their lines'
                                      # bytes (read in parts: not decoded again, the
                                      # workers checked them)
        self.preparing: Optional[dict] = None  # _Judge.for_workers(): the workers make
                                               # each batch's Prepared too
        self.text_field, self.id_field, self.fingerprint_field = \
            text_field, id_field, fingerprint_field
        self.keep, self.pool, self.on_error, self.summary = keep, pool, on_error, summary
        self.width, self.scheme = idx.width, idx.scheme or DEFAULT_SCHEME
        self.shingled = shingled      # shingle sets too (min_similarity needs the texts)
        self.made = made or {}        # minhash-v1 rows a calibration read: shingle sets
        self.reserved = reserved      # columns a row may not hold (--annotate adds them)
        self.events: Optional[list] = None   # rows read and rejected on the reader thread
        self.scratch: Optional[str] = None   # where workers leave the shingle sets they
                                             # make (the run's scratch folder), or None
        # (file number, path, name shown in rows' places) of the files it reads
        self.files = [(p, path, path) for p, path in enumerate(paths)]

    def counted(self, rows: int = 1) -> None:
        """Rows were read."""
        if self.events is not None:
            self.events.append(rows)
        else:
            self.summary.rows += rows

    def rejected(self, e: BadLine) -> None:
        """A bad row: raised under on_error="stop", else counted and reported (by the
        caller's thread, in its place, when read ahead)."""
        if self.on_error == "stop":
            raise e
        if self.events is not None:
            self.events.append(e)
        else:
            _bad(e, self.on_error, self.summary)

    def replay(self, events: list) -> None:
        for e in events:
            if type(e) is int:
                self.summary.rows += e
            else:
                _bad(e, self.on_error, self.summary)

    def rows_again(self) -> Iterator[tuple]:
        """(file number, Row) of every input row read again, in order (the lines that are
        not rows were reported when first read, and are skipped)."""
        for p, path, shown in self.files:
            for row in read_rows(path, self.fmt, lambda e: None, shown):
                yield p, row

    def batches(self, ahead: Optional[Callable[[list], Any]] = None
                ) -> Generator[Any, None, None]:
        """Lists of _Good rows (a Prepared or an Ahead when the workers made the batch's
        columns; or what `ahead` makes of each), BATCH rows (or BATCH_CHARS characters of
        text) read at a time; bad rows go to on_error. With a pool (more
        than one job), a second thread reads, fingerprints and prepares (`ahead`) the next
        batch while this one is judged: one batch ahead at most, so memory stays bounded;
        the rows it counts and rejects (on_error) and an error reach the caller's thread in
        their place."""
        if self.pool is None:
            for batch in self._batches():
                yield batch if ahead is None else ahead(batch)
            return
        handed: queue.Queue = queue.Queue(maxsize=1)
        stop = threading.Event()

        def put(item: tuple) -> bool:
            while not stop.is_set():
                try:
                    handed.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            self.events = []
            try:
                for batch in self._batches():
                    if ahead is not None:
                        batch = ahead(batch)
                    events, self.events = self.events, []
                    if not put(("batch", (batch, events))):
                        return
                put(("end", self.events))
            except BaseException as e:        # noqa: B902 - handed to the consumer
                put(("error", (e, self.events)))
        reader = threading.Thread(target=produce, name="simindex-dedup-reader", daemon=True)
        reader.start()
        try:
            while True:
                what, item = handed.get()
                if what == "end":
                    self.replay(item)
                    return
                if what == "error":
                    self.replay(item[1])
                    raise item[0]
                self.replay(item[1])
                yield item[0]
        finally:
            stop.set()
            reader.join()
            self.events = None

    def _batches(self) -> Iterator[Any]:
        if self.parts:
            yield from self._part_batches()
            return
        rows: list = []
        unread: list = []             # (place in the batch, BadLine) of rows not read
        chars = 0
        field = self.text_field

        def bad(e: BadLine) -> None:  # before the batch's next row: reported in order
            unread.append((len(rows), e))
        for p, path, shown in self.files:
            for row in read_rows(path, self.fmt, bad, shown, self.as_lines):
                rows.append((p, row))
                text = row.data.get(field)
                chars += len(text) if isinstance(text, str) else 0
                if len(rows) >= BATCH or chars >= BATCH_CHARS:
                    yield self.prepare(rows, unread)
                    rows, unread = [], []
                    chars = 0
        if rows or unread:
            yield self.prepare(rows, unread)

    def settings(self) -> dict:
        """What a worker needs to check and fingerprint rows as this reader does."""
        return dict(fmt=self.fmt, text_field=self.text_field, id_field=self.id_field,
                    fingerprint_field=self.fingerprint_field, keep=self.keep,
                    width=self.width, scheme=self.scheme, shingled=self.shingled,
                    reserved=self.reserved, preparing=self.preparing, scratch=self.scratch)

    def _part_batches(self) -> Iterator[Any]:
        """_batches of JSON lines files read in parts by the pool's worker processes
        (prepared_part): each part's rows are built again here, from its bytes, for the
        good rows the worker names, with the ids, fingerprints, ranks and shingles it
        made (rows that stand as their lines, with each batch's Prepared from the worker:
        the batches' Aheads, _line_batches)."""
        settings = self.settings()
        self.made = {}                 # the workers make every row's sets themselves
        for p, path, shown in self.files:
            if self.pool is None:      # one job: this process does the workers' work
                here = dict(settings, scratch=None)
                done: Iterator[tuple] = ((part, lines, part_work(here, lines, part.first, p,
                                                                 shown))
                                         for part, lines in parts_of(path, digests=False))
            else:
                jobs = ((part, lines, (settings, part, p, shown))
                        for part, lines in parts_of(path))
                done = in_order(self.pool, prepared_part, jobs, self.parts + 1)
            for part, lines, got in done:
                counted, numbers, ids, fps, ranks, flat, bad, batches = got
                self.counted(counted)
                for _, where, reason in bad:
                    self.rejected(BadLine(where, reason))
                if self.as_lines and batches is not None:
                    yield from _line_batches(p, shown, part.first, lines, numbers, ids, fps,
                                             flat, batches)
                    continue
                good = []
                sets = [None] * len(numbers) if flat is None else _unflat_sets(flat)
                for j, n in enumerate(numbers):
                    if self.as_lines:      # the line as read: the worker checked the same
                        row = Row(json_line(lines[n - part.first], n), n, f"{shown}:{n}")
                    else:
                        row = json_row(lines[n - part.first], n, shown)
                    good.append(_Good(p, row, row.where if ids is None else ids[j], fps[j],
                                      None if ranks is None else ranks[j], sets[j]))
                for c, i in enumerate(range(0, len(good), BATCH)):
                    chunk = good[i:i + BATCH]
                    yield chunk if batches is None else Prepared(chunk, *batches[c])

    def prepare(self, rows: list, unread: Optional[list] = None) -> list:
        """The good rows of a batch of (file number, Row), fingerprinted. Bad rows go to
        on_error in input order (under "stop", the first of them is raised): those whose
        columns break a rule, those whose text turns out to have no token, and `unread`,
        the (place in the batch, BadLine) of lines that were not rows, each before the
        batch's row at that place."""
        width = self.width
        good: list = []
        texts: list = []
        where: list = []            # each good row's place in the batch
        bad: list = []              # ((place in the batch, 1), BadLine)
        for i, e in unread or ():
            bad.append(((i, 0), e))
        reserved, id_field, text_field = self.reserved, self.id_field, self.text_field
        fp_field, shingled, ranked = self.fingerprint_field, self.shingled, self.keep != "first"
        read = 0                    # rows read (all but those after a bad one under "stop")
        for i, (p, row) in enumerate(rows):
            read += 1
            try:
                if reserved:
                    clash = [c for c in reserved if c in row.data]
                    if clash:
                        raise BadLine(row.where, f"the row already has the column "
                                                 f"{clash[0]!r} that --annotate adds")
                id_ = row.where if id_field is None else _row_id(row, id_field)
                text = None
                fp = None
                if fp_field is not None:
                    fp = _row_fp(row, fp_field, width)
                if fp is None or shingled:
                    text = row.data.get(text_field)
                    if not isinstance(text, str):
                        raise BadLine(row.where, f'text field "{text_field}" is missing '
                                                 f'or not text (got {type(text).__name__})')
                good.append((p, row, id_, fp, self.rank(row, text) if ranked else None))
                where.append(i)
                if text is not None:                 # a text for each good row, in step
                    texts.append(text)
            except BadLine as e:
                # without its traceback, which holds this frame: no cycle for the
                # collector to find
                bad.append(((i, 1), e.with_traceback(None)))
                if self.on_error == "stop":
                    break                            # an earlier row may still be bad
        self.counted(read + len(unread or ()))
        if not texts:
            out = [_Good(*g) for g in good]
        else:
            sigs = self.signatures(good, texts)
            out = []
            for i, (p, row, id_, fp, rank), sig in zip(where, good, sigs):
                if type(sig) is str:
                    bad.append(((i, 1), BadLine(row.where, sig)))
                elif self.shingled:
                    out.append(_Good(p, row, id_, sig[0] if fp is None else fp, rank, sig[1]))
                else:
                    out.append(_Good(p, row, id_, sig, rank))
        for _, line in sorted(bad, key=lambda x: x[0]):
            self.rejected(line)
        return out

    def signatures(self, good: list, texts: list) -> list:
        """batch_signatures of the good rows' texts, made from what the calibration kept for
        rows it read (a minhash-v1 code is a function of the shingle set)."""
        made = self.made
        keys = [(p, row.number) for p, row, *_ in good] if made else []
        done = [i for i, key in enumerate(keys) if key in made]
        if not done:
            return _fingerprints(texts, self.scheme, self.width, self.pool, self.shingled)
        out: list = [None] * len(texts)
        todo = [i for i, key in enumerate(keys) if key not in made]
        for i, got in zip(todo, _fingerprints([texts[i] for i in todo], self.scheme,
                                              self.width, self.pool, self.shingled)):
            out[i] = got
        sets = [made.pop(keys[i]) for i in done]
        codes = _text.minhash_codes(sets, self.width // 64, lsh_rows(self.scheme) or 0)
        for i, exact, code in zip(done, sets, codes):
            fp = int.from_bytes(code.astype(">u8").tobytes(), "big")
            out[i] = (fp, Shingles.of_set(exact)) if self.shingled else fp
        return out

    def rank(self, row: Row, text: Optional[str]) -> Any:
        """What the keep policy maximises for a row (None under "first")."""
        if self.keep == "first":
            return None
        if self.keep == "longest":
            if text is None:
                text = row.data.get(self.text_field)
            if not isinstance(text, str):
                raise BadLine(row.where, f'keep="longest" needs the text field '
                                         f'"{self.text_field}"')
            return len(text)
        v = row.data.get(self.keep)
        if isinstance(v, str):
            try:
                v = float(v)               # CSV cells are text
            except ValueError:
                v = None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise BadLine(row.where, f'keep column "{self.keep}" is missing or not a number '
                                     f'(got {row.data.get(self.keep)!r:.40})')
        return v

    def judged(self, a: Ahead, judge: _Judge) -> list:
        """The greedy decisions of a batch of good rows."""
        if not a.ids:
            return []
        out = judge.batch(a)
        kept = sum(d.kept for d in out)
        self.summary.kept += kept
        self.summary.removed += len(out) - kept
        return out

    def count(self, d: Decision) -> None:
        if d.kept:
            self.summary.kept += 1
        else:
            self.summary.removed += 1


def _first_pass(good: list, ids: list, fps: list, pos: list, ranks: list, earlier: dict,
                present: set, idx: Index, ref: Optional[Index], k: int, token: bytes,
                check: Optional[Check]) -> None:
    """Components' first pass over one batch: each row's id, fingerprint, position and rank
    (its shingle set into the check's spill), and its nearest record of the index or the
    reference that passes the check."""
    base = len(ids)
    q = [g.fp for g in good]
    stored = matches(idx, q, k, check)
    refs = matches(ref, q, k, check) if ref is not None else [[]] * len(q)
    for i, g in enumerate(good):
        ids.append(g.id)
        fps.append(g.fp)
        pos.append([g.p, g.row.number])
        ranks.append(g.rank)
        if check is not None:
            check.keep(pos[-1], g.sh.set)
        best, mine = components_outside(stored[i], refs[i], g.sh, pos[-1], token, check)
        if mine:
            present.add(base + i)
        if best is not None:
            earlier[base + i] = best


def _components(run: BatchReader, judge: _Judge, drop_all: bool) -> Iterator[Decision]:
    """Connected components of the near-duplicate graph of the run's rows (links within k,
    chains included), each joined by any record of the index or the reference within k of
    a member. A component with such a record keeps none of its rows; otherwise it keeps its
    best row by the keep policy (all of them go with drop_all, when it has two or more).

    With a similarity check, a link counts only when its two rows pass it, and a member is
    removed only when it passes it against the row or record its component is known by
    (no removal through a chain alone); a member that does not stays, on its own.

    Three passes: read and fingerprint every row (keeping its id, position, fingerprint and
    rank in memory, its shingle set in the check's spill) and query the index and the
    reference; join the rows (find_all) and group them; then, in one records write
    transaction, judge the groups again against what other writers admitted to the index
    since the first query and add the kept rows; finally read the rows again and decide.
    """
    idx, ref, k, token, check = judge.idx, judge.ref, judge.k, judge.token, judge.check
    ids: list = []
    fps: list = []
    pos: list = []
    ranks: list = []
    earlier: dict = {}        # row -> (distance, id, fingerprint, reference, similarity,
                              #         evidence, the record's shingles for the check)
    present: set = set()      # rows this run's killed process already added
    since = idx._admit(lambda adm: adm.last_seq)   # what the first query sees, at least
    with closing(run.batches()) as batches:
        for good in batches:
            if not good:
                continue
            _first_pass(good, ids, fps, pos, ranks, earlier, present, idx, ref, k, token,
                        check)
    n = len(ids)
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def shingles(i: int) -> Shingles:
        return Shingles.of_set(check.spill.get(pos[i]))      # type: ignore[union-attr]
    for a, b in near_pairs(idx, fps, k):
        if check is not None and not check(shingles(a), shingles(b), symmetric=True)[0]:
            continue                       # near in bits, not in shingles
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    members: dict = {}
    for i in range(n):
        members.setdefault(find(i), []).append(i)
    verdict: list = [None] * n
    for group in members.values():
        if len(group) > 1 or group[0] in earlier:
            verdict_of_group(group, earlier, ids, fps, ranks, run.keep, drop_all, check,
                             shingles, verdict)

    def admit(adm: Any) -> list:
        """The verdicts judged again with the records other writers admitted since the
        first query, and the kept rows added, in one records write transaction."""
        final = verdict
        grew = _outside_since(adm, since, idx, fps, pos, earlier, k, token, check, shingles)
        if grew:
            final = list(verdict)
            for root in {find(i) for i in grew}:
                group = members[root]
                for i in group:
                    final[i] = None
                verdict_of_group(group, grew, ids, fps, ranks, run.keep, drop_all, check,
                                 shingles, final)
        given: set = set()
        adds: list = []
        for i in range(n):
            v = final[i]
            if (v is None or not isinstance(v, tuple)) and i not in present:
                adds.append(i)
                if len(adds) >= BATCH:
                    _put_kept(adm, adds, ids, fps, pos, given, judge, run, shingles)
                    adds = []
        _put_kept(adm, adds, ids, fps, pos, given, judge, run, shingles)
        return final
    verdict = idx._admit(admit)
    i = 0
    for p, row in run.rows_again():
        if i >= n or [p, row.number] != pos[i]:
            continue                       # a bad row, skipped in the first pass
        v = verdict[i]
        if v is None or not isinstance(v, tuple):
            d = Decision(row.written, ids[i], row.where, fps[i], True, cluster=ids[i])
        else:
            d = Decision(row.written, ids[i], row.where, fps[i], False, *v)
        run.count(d)
        yield d
        i += 1


def _outside_since(adm: Any, since: int, idx: Index, fps: list, pos: list, earlier: dict,
                   k: int, token: bytes, check: Optional[Check],
                   shingles: Callable) -> Optional[dict]:
    """`earlier` with each row's nearest record among those other writers admitted after
    seq `since` (when nearer), or None when none of them is within k of a row."""
    seqs, others = adm.since(since)
    if not len(seqs) or not fps:
        return None
    mine = idx.queries(fps)
    n = len(mine)
    near = sorted({a for a, b in near_pairs(idx, np.concatenate([mine, others]), k)
                   if a < n <= b})
    if not near:
        return None
    out = dict(earlier)
    grew = False
    for i, hits in zip(near, held(idx, mine[near], adm.hits(mine[near], k), k)):
        fresh = sketched([[h for h in hits if since < h[2] <= adm.last_seq]])[0]
        best, _ = components_outside(fresh, [], shingles(i) if check is not None else None,
                                     pos[i], token, check)
        if best is not None and (i not in out or best[0] < out[i][0]):
            out[i] = best
            grew = True
    return out if grew else None


def _put_kept(adm: Any, adds: list, ids: list, fps: list, pos: list, given: set,
              judge: _Judge, run: BatchReader, shingles: Callable) -> None:
    """Add the records of kept rows (positions `adds` of the run) in an admission; an id
    already stored, or kept twice, is an error naming the row."""
    if not adds:
        return
    ids_ = [ids[i] for i in adds]
    idkeys = encode_ids(ids_)
    places = [f"{run.files[pos[i][0]][2]}:{pos[i][1]}" for i in adds]
    for n, idk in enumerate(idkeys):      # in order: the first row whose id is taken
        if idk in given or adm.stored(idk):
            raise id_taken(places[n], ids_[n], idk in given)
        given.add(idk)
    sh = [shingles(i) for i in adds] if judge.check is not None else [None] * len(adds)
    judge.put(adm, list(range(len(adds))), idkeys, judge.idx.queries([fps[i] for i in adds]),
              kept_metas(judge.token, [pos[i] for i in adds], ids_, sh,
                         judge.check is not None), ids_, places)


def _bad(e: BadLine, on_error, summary) -> None:
    if on_error == "stop":
        raise e
    summary.skipped += 1
    if callable(on_error):
        on_error(e)


def _row_id(row: Row, id_field: Optional[str]):
    if id_field is None:
        return row.where
    v = row.data.get(id_field)
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise BadLine(row.where, f'id field "{id_field}" is missing or not a string or an '
                                 f'integer (got {v!r:.40})')
    try:
        return check_id(v)
    except InputError as e:
        raise BadLine(row.where, str(e)) from None


def _row_fp(row: Row, field: str, width: int) -> int:
    v = row.data.get(field)
    try:
        if isinstance(v, str):
            return parse_fp(v, "hex", width)
        if isinstance(v, int) and not isinstance(v, bool):
            return check_fp(v) if width == 64 else check_wide_fp(v, width)
    except (ValueError, Error) as e:
        raise BadLine(row.where, str(e)) from None
    raise BadLine(row.where, f'fingerprint field "{field}" is missing or not a hex string or '
                             f'an integer (got {v!r:.40})')


def _fingerprints(texts: list, scheme, width: int, pool, shingled: bool = False) -> list:
    """batch_signatures of a batch, in `pool`'s threads or processes when given (in 16 parts, so
    workers stay busy while one takes a long text)."""
    if pool is None:
        return batch_signatures((texts, scheme, width, shingled))
    step = max(64, -(-len(texts) // 16))
    parts = [texts[i:i + step] for i in range(0, len(texts), step)]
    out: list = []
    for got in pool.map(batch_signatures, [(p, scheme, width, shingled) for p in parts]):
        out += got
    return out


def prepared_part(args: tuple) -> tuple:
    """A worker's work on one part of a JSON lines file (parts.Part): part_work on its
    lines. InputError when the part's bytes are not those the run's process read."""
    settings, part, p, shown = args
    return part_work(settings, read_part(part, shown), part.first, p, shown)


def part_work(settings: dict, lines: list, first: int, p: int, shown: str) -> tuple:
    """Some lines of a JSON lines file (the first numbered `first`) read and checked as
    BatchReader.prepare checks them, and fingerprinted. Returns (rows counted, the good
    rows' line numbers, their ids or None when they are "file:row", fingerprints, ranks or
    None, their shingle sets and sketches (_flat_sets; no sketches when the settings say
    "sketches": False) or None, each bad row's (line
    number, "file:row", reason) in the order the run reports them, and with `preparing` in
    the settings each batch's Prepared but its rows, else None)."""
    got = _part_in_columns(settings, lines, first, p, shown)
    return got if got is not None else _part_by_rows(settings, lines, first, p, shown)


def _id_of(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise InputError("not an id")
    return check_id(v)


def _part_in_columns(settings: dict, lines: list, first: int, p: int,
                     shown: str) -> Optional[tuple]:
    """part_work of lines whose rows need only their text (and id) columns, read as
    columns (json_columns) with no object per row but the text: None when the rows need
    more, or any line breaks a rule other than having no token (_part_by_rows reads such
    lines and says what is wrong with each)."""
    text_field, id_field, keep = settings["text_field"], settings["id_field"], settings["keep"]
    if settings["fingerprint_field"] is not None or settings["reserved"] or \
            keep not in ("first", "longest") or not lines:
        return None
    cols = json_columns(lines, (text_field,) if id_field is None else (text_field, id_field))
    if cols is None:
        return None
    texts = cols[0]
    for t in texts:
        if type(t) is not str:
            return None
    ids = None
    if id_field is not None:
        try:
            ids = [_id_of(v) for v in cols[1]]
        except InputError:
            return None
    checked = settings["shingled"]
    sketched = settings["preparing"] is not None or settings.get("sketches", True)
    sigs, joined = text_signatures(texts, settings["scheme"], settings["width"], checked,
                                   sketched)
    good = [i for i, sig in enumerate(sigs) if type(sig) is not str]
    bad = []
    if len(good) < len(sigs):
        bad = [(first + i, f"{shown}:{first + i}", sig) for i, sig in enumerate(sigs)
               if type(sig) is str]
        sigs = [sigs[i] for i in good]
        texts = [texts[i] for i in good]
        if ids is not None:
            ids = [ids[i] for i in good]
        numbers = [first + i for i in good]
    else:
        numbers = list(range(first, first + len(lines)))
    sh: list = [None] * len(numbers)
    if checked:
        fps = [sig[0] for sig in sigs]
        sh = [sig[1] for sig in sigs]
    else:
        fps = sigs
    batches = None
    if settings["preparing"] is not None and numbers:
        j = settings["preparing"]
        places = [f"{shown}:{n}" for n in numbers] if ids is None else ids
        batches = []
        for i in range(0, len(numbers), BATCH):    # the batches the run's process makes
            at = slice(i, i + BATCH)
            queries = fps_array(fps[at], settings["width"])
            batches.append(prepared_columns(
                None, places[at], [[p, n] for n in numbers[at]], sh[at], j["token"], j["k"],
                j["shape"], checked, queries)[1:])
    return (len(lines), numbers, ids, fps,
            [len(t) for t in texts] if keep == "longest" else None,
            _flat_sets(sh, _sets_file(settings, p, first),
                       with_sketches=batches is None and settings.get("sketches", True),
                       values=joined) if checked else None,
            bad, batches)


def _sets_file(settings: dict, p: int, first: int) -> Optional[str]:
    """Where a worker leaves a part's shingle sets (in the run's scratch folder), or None
    to hand them back in memory."""
    scratch = settings["scratch"]
    return scratch and os.path.join(scratch, f"sets-{p}-{first}")


def _part_by_rows(settings: dict, lines: list, first: int, p: int, shown: str) -> tuple:
    """part_work row by row: each line a Row (json_row), checked by BatchReader.prepare."""
    rows: list = []
    unread: list = []
    number: dict = {}                  # "file:row" -> row number
    for n, raw in enumerate(lines, first):
        got = json_row(raw, n, shown, True)   # a dict: the columns are what is sent
        if type(got) is Row:
            rows.append((p, got))
            number[got.where] = n
        elif got is not None:
            unread.append((len(rows), got))
            number[got.where] = n
    bad: list = []
    reader = BatchReader([shown], settings["fmt"], settings["text_field"],
                         settings["id_field"], settings["fingerprint_field"],
                         settings["keep"], None, bad.append, Summary(),
                         SimpleNamespace(width=settings["width"], scheme=settings["scheme"]),
                         settings["shingled"], reserved=settings["reserved"])
    good = reader.prepare(rows, unread)
    checked = settings["shingled"]
    batches = None
    if settings["preparing"] is not None and good:
        j = settings["preparing"]
        batches = []
        for i in range(0, len(good), BATCH):    # the batches the run's process makes
            chunk = good[i:i + BATCH]
            fps = [g.fp for g in chunk]
            queries = fps_array(fps, reader.width)
            batches.append(prepared(chunk, j["token"], j["k"], j["shape"], checked,
                                 queries)[1:])
    return (len(rows) + len(unread),
            [g.row.number for g in good],
            None if settings["id_field"] is None else [g.id for g in good],
            [g.fp for g in good],
            None if settings["keep"] == "first" else [g.rank for g in good],
            _flat_sets([g.sh for g in good], _sets_file(settings, p, first),
                       with_sketches=batches is None and settings.get("sketches", True))
            if checked else None,
            [(number[e.where], e.where, e.reason) for e in bad], batches)


def _unflat_sets(flat: tuple) -> list:
    """The Shingles of each row of a _flat_sets (its file read, then removed)."""
    values, ends, blob, sk_ends = flat
    if isinstance(values, str):
        path = values
        values = np.fromfile(path, dtype="<u8")
        os.unlink(path)
    if sk_ends is None:                # sketches made when needed
        return [Shingles(values[a:b]) for a, b in zip([0, *ends[:-1]], ends)]
    return [Shingles(values[a:b], blob[c:d]) for a, b, c, d in
            zip([0, *ends[:-1]], ends, [0, *sk_ends[:-1]], sk_ends)]


def _flat_sets(sh: list, path: Optional[str] = None, with_sketches: bool = True,
               values: Any = None) -> tuple:
    """Rows' shingle sets and sketches (`sh`: their Shingles) as (values, ends, sketches,
    their ends): a few large objects, which pass between processes far faster than a small
    one per row.
    With `path`, the values are written to that file and stand as its path: the run's
    process reads them from the page cache, not through the pool's pipe and pickles.
    Without sketches (the workers packed the records' metas, which hold them), they are
    b"" and their ends None. `values`: the sets one after another, when the caller has
    them so."""
    sets = [x.set for x in sh]
    if values is None:
        values = np.concatenate(sets) if sets else np.empty(0, np.uint64)
    if path is not None:
        values.astype("<u8", copy=False).tofile(path)
        values = path
    ends = np.cumsum([len(x) for x in sets], dtype=np.int64).tolist()
    if not with_sketches:
        return values, ends, b"", None
    sketches = [x.sketch for x in sh]
    return values, ends, b"".join(sketches), np.cumsum([len(x) for x in sketches]).tolist()


def dedup(inputs: Union[str, Iterable[str]], **options: Any) -> Iterator[dict]:
    """The rows of `inputs` (JSONL, CSV or Parquet files) that are not near-duplicates of a
    row kept before them, in input order: the greedy rule of `add_unique`.

    Options: `text_field` ("text"), `id_field` (default: "file:row"), `fingerprint_field`
    (hex or int fingerprints instead of texts), `k` (3), `scheme`, `width` (64), `index`
    (a directory: keep the index, so later runs remove what duplicates this one's rows),
    `against` (a reference index: rows near any of its records are removed, nothing is
    added to it), `fmt`, `jobs` (above 1: worker processes reading plain JSON lines files in
    parts, else fingerprinting threads), `on_error` ("stop", "skip" or
    a callable taking the BadLine). `mode="components"` keeps one row per connected
    component of the near-duplicate graph instead, chosen by `keep` ("first", "longest"
    text, or the row with the largest value of a column); `drop_all=True` keeps none of a
    component's rows (either implies components).
    """
    for d in decisions(inputs, **options):
        if d.kept:
            yield d.row
