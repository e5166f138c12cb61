"""Deduplicating datasets: rows of JSONL, CSV or Parquet files judged in input order against
everything kept before, in this run and (with a kept index) in earlier runs.

The rule is the crawler's (`Index.add_unique`): a row is kept when no kept row is within k
bits of its fingerprint, and a removed row names the kept one it matched. There is no
chaining: a row within k of a removed row only is kept.

Rows go in batches: fingerprints (in worker processes with jobs > 1), one query_many of the
batch against the index (and the reference index), the batch's own pairs (find_all), then
the kept rows are added in one atomic add_many. Each kept record's meta holds the run's
token and the row's position, which makes a re-run of a killed run give the output of an
uninterrupted one: a record this run's earlier process kept at the same position is the row
itself, and records it kept at later positions are not yet "before" the row.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional, Union

from . import manifest
from .codec import check_fp, check_wide_fp
from .errors import BadLine, Error, InputError, ParameterError
from .fingerprints import DEFAULT_SCHEME, fingerprint
from .index import Index
from .inputs import parse_fp
from .pairs import find_all
from .rows import Row, read_rows
from .similarity import jaccard, shingle_set, sketch, sketch_jaccard

BATCH = 4096              # rows judged together: one query_many, one add_many
MODES = ("greedy", "components")
DEFAULT_K = 3


class Decision(NamedTuple):
    """What dedup decided for one input row."""
    row: dict                       # the row's columns, as read
    id: Any                         # its id (the --id-field value, or "file:row")
    where: str                      # "file:row"
    fingerprint: int
    kept: bool
    match: Any = None               # removed: the id of the kept record it matched
    distance: Optional[int] = None  # removed: the distance to that record
    reference: bool = False         # removed: the match is in the --against index
    cluster: Any = None             # the id its group is known by: its kept row's (or,
                                    # with drop_all, the row that would have been kept)
    similarity: Optional[float] = None  # removed, with min_similarity: the Jaccard of the
                                        # match (exact, or a sketch estimate), if checked


class Summary:
    """Counts of a run (also printed by the CLI)."""

    def __init__(self) -> None:
        self.rows = 0
        self.kept = 0
        self.removed = 0
        self.skipped = 0
        self.start = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def __str__(self) -> str:
        secs = self.seconds
        rate = self.rows / secs if secs > 0 else 0.0
        return (f"rows in {self.rows}, kept {self.kept}, removed {self.removed}, skipped "
                f"{self.skipped}, in {secs:.2f} s ({rate:,.0f} rows/s)")


def run_token(inputs: list, text_field: str, id_field: Optional[str],
              fingerprint_field: Optional[str]) -> bytes:
    """8 bytes naming a run: its inputs (absolute paths) and the fields it reads. A re-run
    of the same command has the same token (see the module's docstring)."""
    h = hashlib.blake2b(digest_size=8)
    for part in [*map(os.path.abspath, inputs), text_field, id_field or "",
                 fingerprint_field or ""]:
        h.update(part.encode("utf-8", "surrogateescape") + b"\0")
    return h.digest()


def _fingerprint_texts(args: tuple) -> list:
    """Worker: fingerprints of texts (with their shingle sets when `shingled`), or the
    InputError message of each that has none."""
    texts, scheme, width, shingled = args
    out: list = []
    for t in texts:
        try:
            fp = fingerprint(t, scheme=scheme, width=width)
            out.append((fp, shingle_set(t, scheme)) if shingled else fp)
        except InputError as e:
            out.append(str(e))
    return out


def _similar(a: Any, b: Any, t: float) -> tuple:
    """(passes, similarity) of two rows' shingle sets (arrays: exact) or sketches (bytes:
    estimated); a side without either cannot be checked and passes."""
    if a is None or b is None:
        return True, None
    if isinstance(a, bytes) or isinstance(b, bytes):
        sim = sketch_jaccard(a if isinstance(a, bytes) else sketch(a),
                             b if isinstance(b, bytes) else sketch(b))
    else:
        sim = jaccard(a, b)
    return sim >= t, round(sim, 4)


def _sim(a: Optional[bytes], b: Optional[bytes]) -> Optional[float]:
    """The sketch estimate of two rows' similarity for a report (None when unknown)."""
    if a is None or b is None:
        return None
    return round(sketch_jaccard(a, b), 4)


def _stored_sketch(meta: Any) -> Optional[bytes]:
    """The sketch a dedup run stored in a record's meta, if any."""
    if isinstance(meta, list) and len(meta) == 3 and isinstance(meta[2], bytes):
        return meta[2]
    return None


class _Judge:
    """The greedy decision of batches of rows against an index and a reference."""

    def __init__(self, idx: Index, ref: Optional[Index], k: int, token: bytes,
                 min_similarity: Optional[float] = None) -> None:
        self.idx, self.ref, self.k, self.token = idx, ref, k, token
        self.t = min_similarity

    def meta(self, pos: list, sh: Any) -> list:
        """The meta of a kept record: the run token, the row's position, and with
        min_similarity the sketch of its shingles."""
        return [self.token, pos] if self.t is None else [self.token, pos, sketch(sh)]

    def batch(self, rows: list, ids: list, fps: list, positions: list,
              sh: Optional[list] = None) -> list:
        """Decisions for one batch, its kept rows added to the index (atomically). `sh`:
        the rows' shingle sets (with min_similarity)."""
        t = self.t
        sh = sh if sh is not None else [None] * len(rows)
        k, token = self.k, self.token
        stored = self.idx.query_many(fps, k=k)
        refs = self.ref.query_many(fps, k=k) if self.ref is not None else None
        earlier: dict = {}
        for a, b in (find_all(fps, k=k, width=self.idx.width) if len(fps) > 1 else []):
            earlier.setdefault(b, []).append(a)
        out: list = []
        kept_here: dict = {}           # batch position -> True for kept rows
        adds = []
        for i, (row, id_, fp, pos) in enumerate(zip(rows, ids, fps, positions)):
            best = None                # (distance, order, id, reference, similarity)
            mine = False
            for m in stored[i]:
                meta = m.meta
                if isinstance(meta, list) and len(meta) in (2, 3) and meta[0] == token:
                    if meta[1] == pos:
                        mine = True    # kept by this run's earlier (killed) process
                        continue
                    if meta[1] > pos:
                        continue       # kept later in this run's order: not before it
                if best is not None and (m.distance, 0) >= best[:2]:
                    continue
                ok, sim = (True, None) if t is None else \
                    _similar(sh[i], _stored_sketch(meta), t)
                if ok:
                    best = (m.distance, 0, m.id, False, sim)
            for m in refs[i] if refs is not None else ():
                if best is not None and (m.distance, -1) >= best[:2]:
                    break
                ok, sim = (True, None) if t is None else \
                    _similar(sh[i], _stored_sketch(m.meta), t)
                if ok:
                    best = (m.distance, -1, m.id, True, sim)
                    break
            for j in earlier.get(i, ()):
                if kept_here.get(j):
                    d = _distance(fps[i], fps[j])
                    if best is not None and (d, 1 + j) >= best[:2]:
                        continue
                    ok, sim = (True, None) if t is None else _similar(sh[i], sh[j], t)
                    if ok:
                        best = (d, 1 + j, ids[j], False, sim)
            if best is None:
                kept_here[i] = True
                if not mine:
                    adds.append((id_, fp, self.meta(pos, sh[i])))
                out.append(Decision(row, id_, "", fp, True, cluster=id_))
            else:
                out.append(Decision(row, id_, "", fp, False, best[2], best[0], best[3],
                                    best[2], best[4]))
        if adds:
            self.add(adds)
        return out

    def add(self, adds: list) -> None:
        """Add kept rows' records, refusing an id that already names a record: adding it
        would replace (and so lose) that record."""
        try:
            self.idx.add_many(adds, replace=False)
        except InputError as e:
            raise ParameterError(f"a kept row's {e}: ids must be unique, across runs "
                                 f"too") from None


def _distance(a: int, b: int) -> int:
    return bin(a ^ b).count("1")


def decisions(inputs: Union[str, Iterable[str]], *, text_field: str = "text",
              id_field: Optional[str] = None, fingerprint_field: Optional[str] = None,
              k: Optional[int] = None, scheme: Optional[str] = None,
              width: Optional[int] = None, index: Optional[str] = None,
              against: Optional[str] = None, mode: Optional[str] = None, keep: str = "first",
              drop_all: bool = False, min_similarity: Optional[float] = None,
              fmt: Optional[str] = None, jobs: int = 1,
              on_error: Union[str, Callable[[BadLine], None]] = "stop",
              summary: Optional[Summary] = None) -> Iterator[Decision]:
    """A Decision for every row of `inputs`, in input order (see `dedup`)."""
    paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    paths = [os.fspath(p) for p in paths]
    if mode is None:
        mode = "components" if drop_all or keep != "first" else "greedy"
    if mode not in MODES:
        raise ParameterError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if mode == "greedy" and (keep != "first" or drop_all):
        raise ParameterError("keep and drop_all choose among a component's rows: they need "
                             "mode='components'")
    if not isinstance(keep, str) or not keep:
        raise ParameterError(f"keep must be 'first', 'longest' or a column name, got {keep!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ParameterError(f"jobs must be an int >= 1, got {jobs!r}")
    if min_similarity is not None and (isinstance(min_similarity, bool) or not isinstance(
            min_similarity, (int, float)) or not 0 < min_similarity <= 1):
        raise ParameterError(f"min_similarity must be a Jaccard similarity in (0, 1], got "
                             f"{min_similarity!r}")
    if on_error not in ("stop", "skip") and not callable(on_error):
        raise ParameterError(f"on_error must be 'stop', 'skip' or a callable, got "
                             f"{on_error!r}")
    summary = summary if summary is not None else Summary()
    pool = scratch = ref = idx = None
    try:
        if jobs > 1 and (fingerprint_field is None or min_similarity is not None):
            pool = ProcessPoolExecutor(jobs)
            pool.submit(int).result()    # its workers fork now, before an index is open
        if index is None:
            scratch = tempfile.mkdtemp(prefix="simindex-dedup-")
            index = os.path.join(scratch, "index")
        # a new index is made for k (default DEFAULT_K); an existing one is asked at k,
        # which must not exceed its own
        new = not os.path.exists(os.path.join(index, manifest.NAME))
        # batches commit without fsync; the flush at the end makes them durable before
        # the caller renames its outputs into place (a killed process loses nothing)
        idx = Index(index, k=(DEFAULT_K if k is None else k) if new else None, scheme=scheme,
                    width=width, sync=False)
        if against is not None:
            ref = Index(against, readonly=True)
            if ref.width != idx.width:
                raise ParameterError(f"the reference index {against} holds {ref.width}-bit "
                                     f"fingerprints, this run {idx.width}-bit ones")
            if ref.k < idx.k:
                raise ParameterError(f"the reference index {against} finds up to k="
                                     f"{ref.k}, this run needs k={idx.k}")
        kk = idx.k if k is None else k
        if kk > idx.k:
            raise ParameterError(f"k ({kk}) is above the index's k ({idx.k})")
        run = _Run(paths, fmt, text_field, id_field, fingerprint_field, keep, pool, on_error,
                   summary, idx, min_similarity is not None)
        judge = _Judge(idx, ref, kk, run_token(paths, text_field, id_field,
                                               fingerprint_field), min_similarity)
        if mode == "greedy":
            for batch in run.batches():
                yield from run.judged(batch, judge)
        else:
            yield from _components(run, judge, drop_all)
        idx.flush()
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if ref is not None:
            ref.close()
        if idx is not None:
            idx.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


class _Good(NamedTuple):
    """A row that passed its checks: file number, the Row, its id, fingerprint, and the
    value the keep policy ranks it by."""
    p: int
    row: Row
    id: Any
    fp: Any          # None until the batch's texts are fingerprinted
    rank: Any
    sh: Any = None   # the shingle set (with min_similarity)


class _Run:
    """The inputs of one run read in fingerprinted batches of good rows."""

    def __init__(self, paths: list, fmt: Optional[str], text_field: str,
                 id_field: Optional[str], fingerprint_field: Optional[str], keep: str,
                 pool: Any, on_error: Any, summary: Summary, idx: Index,
                 shingled: bool = False) -> None:
        self.paths, self.fmt = paths, fmt
        self.text_field, self.id_field, self.fingerprint_field = \
            text_field, id_field, fingerprint_field
        self.keep, self.pool, self.on_error, self.summary = keep, pool, on_error, summary
        self.width, self.scheme = idx.width, idx.scheme or DEFAULT_SCHEME
        self.shingled = shingled      # shingle sets too (min_similarity needs the texts)

    def rows(self, again: bool = False) -> Iterator[tuple]:
        """(file number, Row) of every input row, in order; a row that breaks its file's
        format goes to on_error (reading `again`, it is skipped silently)."""
        def bad(e: BadLine) -> None:
            if not again:
                self.summary.rows += 1
                _bad(e, self.on_error, self.summary)
        for p, path in enumerate(self.paths):
            for row in read_rows(path, self.fmt, None if self.on_error == "stop" else bad):
                yield p, row

    def batches(self) -> Iterator[list]:
        """Lists of _Good rows, BATCH rows read at a time; bad rows go to on_error."""
        rows: list = []
        for pr in self.rows():
            rows.append(pr)
            if len(rows) >= BATCH:
                yield self.prepare(rows)
                rows = []
        if rows:
            yield self.prepare(rows)

    def prepare(self, rows: list) -> list:
        """The good rows of a batch of (file number, Row), fingerprinted."""
        summary, width = self.summary, self.width
        good: list = []
        texts: list = []
        for p, row in rows:
            summary.rows += 1
            try:
                id_ = _row_id(row, self.id_field)
                text = None
                fp = None
                if self.fingerprint_field is not None:
                    fp = _row_fp(row, self.fingerprint_field, width)
                if fp is None or self.shingled:
                    text = row.data.get(self.text_field)
                    if not isinstance(text, str):
                        raise BadLine(row.where, f'text field "{self.text_field}" is missing '
                                                 f'or not text (got {type(text).__name__})')
                    texts.append(text)
                good.append(_Good(p, row, id_, fp, self.rank(row, text)))
            except BadLine as e:
                _bad(e, self.on_error, summary)
        if texts:
            fps = _fingerprints(texts, self.scheme, width, self.pool, self.shingled)
            out = []
            for g, fp in zip(good, fps):
                if isinstance(fp, str):
                    _bad(BadLine(g.row.where, fp), self.on_error, summary)
                elif self.shingled:
                    out.append(g._replace(fp=fp[0] if g.fp is None else g.fp, sh=fp[1]))
                else:
                    out.append(g._replace(fp=fp))
            good = out
        return good

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

    def judged(self, good: list, judge: _Judge) -> Iterator[Decision]:
        """The greedy decisions of a batch of good rows."""
        if not good:
            return
        out = judge.batch([g.row.data for g in good], [g.id for g in good],
                          [g.fp for g in good], [[g.p, g.row.number] for g in good],
                          [g.sh for g in good])
        for g, d in zip(good, out):
            d = d._replace(where=g.row.where)
            self.count(d)
            yield d

    def count(self, d: Decision) -> None:
        if d.kept:
            self.summary.kept += 1
        else:
            self.summary.removed += 1


def _components(run: _Run, judge: _Judge, drop_all: bool) -> Iterator[Decision]:
    """Connected components of the near-duplicate graph of the run's rows (links within k,
    chains included), each joined by any record of the index or the reference within k of
    a member. A component with such a record keeps none of its rows; otherwise it keeps its
    best row by the keep policy (all of them go with drop_all, when it has two or more).

    Three passes: read and fingerprint every row (keeping its id, position, fingerprint and
    rank in memory) and query the index and the reference; join the rows (find_all) and
    group them; read the rows again and decide. Kept rows are then added to the index.
    """
    idx, ref, k, token = judge.idx, judge.ref, judge.k, judge.token
    ids: list = []
    fps: list = []
    pos: list = []
    ranks: list = []
    sketches: list = []                    # with min_similarity: each row's sketch
    t = judge.t
    earlier: dict = {}                     # row -> (distance, id, fingerprint, reference,
                                           #         similarity)
    present: set = set()                   # rows this run's killed process already added
    for good in run.batches():
        if not good:
            continue
        base = len(ids)
        q = [g.fp for g in good]
        stored = idx.query_many(q, k=k)
        refs = ref.query_many(q, k=k) if ref is not None else [[]] * len(q)
        for i, g in enumerate(good):
            ids.append(g.id)
            fps.append(g.fp)
            pos.append([g.p, g.row.number])
            ranks.append(g.rank)
            sk = sketch(g.sh) if t is not None else None
            sketches.append(sk)
            best = None
            for m, isref in [(m, False) for m in stored[i]] + [(m, True) for m in refs[i]]:
                meta = m.meta
                if not isref and isinstance(meta, list) and len(meta) in (2, 3) and \
                        meta[0] == token:
                    if meta[1] == pos[-1]:
                        present.add(base + i)
                    continue               # this run's own records: judged again here
                if best is not None and (m.distance > best[0] or m.distance == best[0]
                                         and not isref):
                    continue
                ok, sim = (True, None) if t is None else \
                    _similar(sk, _stored_sketch(meta), t)
                if ok:
                    best = (m.distance, m.id, m.fingerprint, isref, sim)
            if best is not None:
                earlier[base + i] = best
    n = len(ids)
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for a, b in (find_all(fps, k=k, width=run.width) if n > 1 else []):
        if t is not None and not _similar(sketches[a], sketches[b], t)[0]:
            continue                       # near in bits, not in shingles
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    members: dict = {}
    for i in range(n):
        members.setdefault(find(i), []).append(i)
    # per row: None (kept, alone) or (match id, distance, reference, cluster id)
    verdict: list = [None] * n
    for group in members.values():
        outside = [earlier[i] for i in group if i in earlier]
        if outside:
            first = min(outside, key=lambda e: e[0])
            for i in group:
                d, mid, mfp, isref, sim = earlier.get(i, first)
                verdict[i] = (mid, _distance(fps[i], mfp), isref, mid,
                              sim if i in earlier else _sim(sketches[i], None))
            continue
        if len(group) == 1:
            continue
        best = group[0] if run.keep == "first" else \
            max(group, key=lambda i: (ranks[i], -i))
        for i in group:
            if i != best:
                verdict[i] = (ids[best], _distance(fps[i], fps[best]), False, ids[best],
                              _sim(sketches[i], sketches[best]))
        if drop_all:
            other = next(i for i in group if i != best)
            verdict[best] = (ids[other], _distance(fps[best], fps[other]), False, ids[best],
                             _sim(sketches[best], sketches[other]))
        else:
            verdict[best] = ids[best]          # kept, the head of its group
    adds: list = []
    i = 0
    for p, row in run.rows(again=True):
        if i >= n or [p, row.number] != pos[i]:
            continue                       # a bad row, skipped in the first pass
        v = verdict[i]
        if v is None or not isinstance(v, tuple):
            d = Decision(row.data, ids[i], row.where, fps[i], True, cluster=ids[i])
            if i not in present:
                adds.append((ids[i], fps[i], [token, pos[i]] if t is None else
                             [token, pos[i], sketches[i]]))
                if len(adds) >= BATCH:
                    judge.add(adds)
                    adds = []
        else:
            d = Decision(row.data, ids[i], row.where, fps[i], False, *v)
        run.count(d)
        yield d
        i += 1
    if adds:
        judge.add(adds)


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
    if isinstance(v, int) and not 0 <= v < 1 << 64:
        raise BadLine(row.where, f"id {v} is out of range: int ids must be in [0, 2**64)")
    return v


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
    """_fingerprint_texts of a batch, in `pool`'s processes when given (in 16 parts, so
    workers stay busy while one takes a long text)."""
    if pool is None:
        return _fingerprint_texts((texts, scheme, width, shingled))
    step = max(64, -(-len(texts) // 16))
    parts = [texts[i:i + step] for i in range(0, len(texts), step)]
    out: list = []
    for got in pool.map(_fingerprint_texts, [(p, scheme, width, shingled) for p in parts]):
        out += got
    return out


def dedup(inputs: Union[str, Iterable[str]], **options: Any) -> Iterator[dict]:
    """The rows of `inputs` (JSONL, CSV or Parquet files) that are not near-duplicates of a
    row kept before them, in input order: the greedy rule of `add_unique`.

    Options: `text_field` ("text"), `id_field` (default: "file:row"), `fingerprint_field`
    (hex or int fingerprints instead of texts), `k` (3), `scheme`, `width` (64), `index`
    (a directory: keep the index, so later runs remove what duplicates this one's rows),
    `against` (a reference index: rows near any of its records are removed, nothing is
    added to it), `fmt`, `jobs` (fingerprinting processes), `on_error` ("stop", "skip" or
    a callable taking the BadLine). `mode="components"` keeps one row per connected
    component of the near-duplicate graph instead, chosen by `keep` ("first", "longest"
    text, or the row with the largest value of a column); `drop_all=True` keeps none of a
    component's rows (either implies components).
    """
    for d in decisions(inputs, **options):
        if d.kept:
            yield d.row
