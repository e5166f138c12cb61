"""`simindex dedup` on Ray: the rows kept and the reports of the one-machine run, with the
work spread over tasks and only counts passing through the driver.

Stages (each a set of Ray tasks; a task lost with its worker is run again from its inputs):
1. read: per input file, its rows fingerprinted (with their shingle sets when a similarity
   threshold judges), and each row's nearest record of the index and the reference;
2. join: every pair of rows within k bits, by the block-permutation join of `pairs` (with
   band keys, a table per band: the pairs that share a band's key);
3. verify: each pair's similarity check, the pairs cut by the file of their earlier row;
4. components: the connected components of the verified pairs (components.py);
5. resolve: per partition of components, the decision of each member (the greedy rule
   in input order, or the components rule), exactly as the one-machine run decides;
6. assemble and write: per file, every row's decision, the group sizes (a reduce by
   cluster id when --annotate or --clusters asks for them), and its part of each output.
The driver then adds the kept rows to --index (if given) and publishes the outputs, each
a directory of part files renamed into place whole: a run's output is complete or absent.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
import zlib
from types import SimpleNamespace
from typing import Any, Iterable, Optional, Union

import numpy as np
import ray

from ..bands import band_plan
from ..datasets.check import Check, Shingles
from ..datasets.publish import distinct, publish, temporary_dir
from ..datasets.reports import ANNOTATIONS, id_key, removed_line
from ..datasets.rows import (
    Row, RowWriter, format_of, json_line, lines_as_read, open_bytes, read_rows,
)
from ..datasets.rules import (
    components_outside, greedy_outside, greedy_verdict, held, id_taken, matches, near_pairs,
    outside_verdict, sketched, verdict_of_group,
)
from ..datasets.parts import parts_of, splittable
from ..datasets.run import BATCH, BatchReader, Summary, part_work
from ..datasets.settings import (
    check_options, choose_radius, input_files, judging, open_indexes, run_token,
)
from ..engine import manifest
from ..engine.codec import Packed, encode_ids, pack_meta, stored_sketch, unpack_sketched
from ..engine.plan import Plan, default_plan
from ..errors import BadLine, InputError, ParameterError
from ..index import Index
from ..radius import MEASURES
from ..signatures.fingerprints import scheme_name
from ..values import words_array
from .batch import join_keys, split_keys
from .connection import connect, release
from .components import components
from .route import fetch

_U64 = np.uint64
_PARQUET_GROUP = 65536            # rows the one-machine Parquet writer infers its schema from
_EVIDENCE = (None, "exact", "sketch")
# what an output folder holds: part files, and the temporary files of killed write tasks
_PART = re.compile(r"part-\d{5}\.\w+|\.part-\d{5}\.\w+\.\w+\.tmp")


class _Job(SimpleNamespace):
    """What every task of one run needs to know (sent with each task)."""


def _check_of(job: _Job) -> Optional[Check]:
    """The run's similarity check in a task (its sets at hand: no spill), or None."""
    if job.check is None:
        return None
    t, measure, token = job.check
    return Check(t, measure, token, None)


def _fps_array(fps: list, width: int) -> np.ndarray:
    if width == 64:
        return np.array(fps, dtype=_U64)
    return words_array(fps, width)


def _fp_int(fps: np.ndarray, i: int) -> int:
    row = fps[i]
    if fps.ndim == 1:
        return int(row)
    out = 0
    for w in row.tolist():
        out = (out << 64) | w
    return out


@ray.remote(num_returns=4)
def _read(job: _Job, p: int, path: str, shown: str) -> tuple:
    """Stage 1, one file: (fingerprints, counts and bad rows, the other columns, the shingle
    sets or None). Rows go in batches; only their columns stay."""
    summary = Summary()
    bad: list = []
    run = BatchReader([path], job.fmt, job.text_field, job.id_field, job.fingerprint_field,
                      job.keep, None, "stop" if job.stop else bad.append, summary,
                      SimpleNamespace(width=job.width, scheme=job.scheme),
                      job.check is not None, reserved=ANNOTATIONS if job.annotate else ())
    run.files = [(p, path, shown)]
    fps: list = []
    rest: dict = {"numbers": [], "ids": [], "ranks": [], "best": [], "mine": []}
    sets: list = []
    error = None
    outside = _Outside(job) if job.index is not None or job.against is not None else None
    if outside is None and format_of(path, job.fmt) == "jsonl" and splittable(path):
        return _read_parts(job, run, p, path, shown)
    try:
        for batch in run._batches():
            fps += [g.fp for g in batch]
            rest["numbers"] += [g.row.number for g in batch]
            rest["ids"] += [g.id for g in batch]
            rest["ranks"] += [g.rank for g in batch]
            if job.check is not None:
                sets += [g.sh.set for g in batch]
            if outside is not None and batch:
                best, mine = outside(batch)
            else:
                best, mine = [None] * len(batch), [False] * len(batch)
            rest["best"] += best
            rest["mine"] += mine
    except BadLine as e:
        error = e
    finally:
        if outside is not None:
            outside.close()
    rest["numbers"] = np.array(rest["numbers"], dtype=np.int64)
    rest["mine"] = np.array(rest["mine"], dtype=bool)
    flat = None
    if job.check is not None:
        flat = (np.concatenate(sets) if sets else np.empty(0, _U64),
                np.cumsum([0] + [len(x) for x in sets], dtype=np.int64))
    info = {"rows": summary.rows, "skipped": bad, "error": error, "good": len(fps)}
    return _fps_array(fps, job.width), info, rest, flat


def _read_parts(job: _Job, run: BatchReader, p: int, path: str, shown: str) -> tuple:
    """_read of a JSON lines file without an index or a reference to look rows up in: its
    parts read as the one-machine run reads them (part_work: in columns where the rows
    allow; no sketches, which only records need), to the same columns."""
    settings = dict(run.settings(), preparing=None, scratch=None, sketches=False)
    rows = 0
    bad: list = []
    error = None
    fps: list = []
    numbers: list = []
    ids: list = []
    ranks: list = []
    values: list = []              # each part's shingle sets, one after another
    ends: list = []                # where each row's set ends in them
    base = 0
    for part, lines in parts_of(path, digests=False):
        counted, good, got_ids, got_fps, got_ranks, flat, bads, _ = part_work(
            settings, lines, part.first, p, shown)
        rows += counted
        if bads and job.stop:
            error = BadLine(bads[0][1], bads[0][2])
            break
        bad += [BadLine(where, reason) for _, where, reason in bads]
        fps += got_fps
        numbers += good
        ids += [f"{shown}:{n}" for n in good] if got_ids is None else got_ids
        ranks += [None] * len(good) if got_ranks is None else got_ranks
        if flat is not None:
            values.append(flat[0])
            ends += [base + e for e in flat[1]]
            base += len(flat[0])
    rest = {"numbers": np.array(numbers, dtype=np.int64), "ids": ids, "ranks": ranks,
            "best": [None] * len(fps), "mine": np.zeros(len(fps), dtype=bool)}
    sets = None
    if job.check is not None:
        sets = (np.concatenate(values) if values else np.empty(0, _U64),
                np.array([0] + ends, dtype=np.int64))
    info = {"rows": rows, "skipped": bad, "error": error, "good": len(fps)}
    return _fps_array(fps, job.width), info, rest, sets


class _Outside:
    """Each row's nearest record of the index (records of earlier runs) and the reference,
    by the mode's rule; this run's own records are judged with its rows instead."""

    def __init__(self, job: _Job) -> None:
        self.job = job
        self.check = _check_of(job)
        self.idx = Index(job.index, readonly=True) if job.index is not None else None
        self.ref = Index(job.against, readonly=True) if job.against is not None else None

    def close(self) -> None:
        for x in (self.idx, self.ref):
            if x is not None:
                x.close()

    def __call__(self, batch: list) -> tuple:
        """([best], [mine]) of a batch of good rows."""
        job, check = self.job, self.check
        q = [g.fp for g in batch]
        stored = matches(self.idx, q, job.k, check) if self.idx is not None else [[]] * len(q)
        refs = matches(self.ref, q, job.k, check) if self.ref is not None else [[]] * len(q)
        rule = greedy_outside if job.mode == "greedy" else components_outside
        best, mine = [], []
        for g, st, rf in zip(batch, stored, refs):
            pos = [g.p, g.row.number]
            b, m = rule(st, rf, g.sh, pos, job.token, check, **(
                {"own": False} if job.mode == "greedy" else {}))
            best.append(b)
            mine.append(m)
        return best, mine


def _block_of(offsets: np.ndarray, g: np.ndarray) -> np.ndarray:
    return np.searchsorted(offsets, g, side="right") - 1


def _set_of(sets: tuple, i: int) -> np.ndarray:
    """Row i's shingle set from a file's (concatenated sets, offsets)."""
    flat, offs = sets
    return flat[offs[i]:offs[i + 1]]


@ray.remote
def _verify(job: _Job, pairs: tuple, offsets: np.ndarray, sets: list) -> tuple:
    """Stage 3, one join task's pairs: the links that pass the check, as (a, b, distance,
    similarity, evidence code) with a < b, cut by the file of a; and (a, b) for the
    components. `sets`: per file, a ref of its shingle sets (fetched when a pair needs
    them)."""
    a, b, d = pairs
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    sim = np.full(len(lo), np.nan)
    ev = np.zeros(len(lo), dtype=np.int8)
    check = _check_of(job)
    if check is not None and len(lo):
        fa, fb = _block_of(offsets, lo), _block_of(offsets, hi)
        got: dict = {}
        ok = np.zeros(len(lo), dtype=bool)
        for f in np.unique(np.concatenate([fa, fb])).tolist():
            got[f] = ray.get(sets[f])
        for j in range(len(lo)):
            x = _set_of(got[fb[j]], int(hi[j] - offsets[fb[j]]))
            y = _set_of(got[fa[j]], int(lo[j] - offsets[fa[j]]))
            if job.mode == "greedy":       # the later row judged against the earlier one
                passed, s, how = check(Shingles.of_set(x), y)
            else:
                passed, s, how = check(Shingles.of_set(y), Shingles.of_set(x), symmetric=True)
            ok[j] = passed
            sim[j] = np.nan if s is None else s
            ev[j] = _EVIDENCE.index(how)
        lo, hi, d, sim, ev = lo[ok], hi[ok], d[ok], sim[ok], ev[ok]
    fa = _block_of(offsets, lo)
    return ((lo, hi),) + tuple((lo[fa == f], hi[fa == f], d[fa == f], sim[fa == f], ev[fa == f])
                               for f in range(len(offsets) - 1))


@ray.remote
def _labels(star: tuple, offsets: np.ndarray) -> Any:
    """Stage 4's result, one chunk of star edges: (node, label) per file of the node."""
    label, node = star
    nodes = np.concatenate([node, label])
    labels = np.concatenate([label, label])
    f = _block_of(offsets, nodes)
    out = tuple((nodes[f == b], labels[f == b]) for b in range(len(offsets) - 1))
    return out if len(out) > 1 else out[0]


@ray.remote
def _route(offset: int, parts: int, nlabels: int, fps: np.ndarray, rest: dict,
           sets: Optional[tuple], *pieces: Any) -> Any:
    """One file's members of components and its links (by their earlier row), cut by the
    partition of their component's label. `pieces`: `nlabels` (node, label) pieces of
    stage 4, then the file's links from each task of stage 3."""
    labels, edges = pieces[:nlabels], pieces[nlabels:]
    n = len(rest["ids"])
    label = np.full(n, -1, dtype=np.int64)
    for nodes, lbls in labels:
        label[(nodes - _U64(offset)).astype(np.int64)] = lbls.astype(np.int64)
    lo = np.concatenate([e[0] for e in edges]) if edges else np.empty(0, _U64)
    cols: list = [np.concatenate([e[c] for e in edges]) for c in range(1, 5)] if edges else \
        [np.empty(0, _U64), np.empty(0, np.uint16), np.empty(0), np.empty(0, np.int8)]
    elabel = label[(lo - _U64(offset)).astype(np.int64)]
    out: list = []
    for r in range(parts):
        mine = np.flatnonzero((label >= 0) & (label % parts == r)).tolist()
        members: dict = {"g": np.array(mine, dtype=np.int64) + offset, "label": label[mine],
                         "ids": [rest["ids"][i] for i in mine],
                         "fps": fps[mine], "ranks": [rest["ranks"][i] for i in mine],
                         "best": [rest["best"][i] for i in mine],
                         "sets": None if sets is None else [_set_of(sets, i) for i in mine]}
        e = elabel % parts == r
        out.append((members, (lo[e], *[c[e] for c in cols])))
    return tuple(out) if parts > 1 else out[0]


@ray.remote
def _resolve(job: _Job, offsets: np.ndarray, *parts: Any) -> Any:
    """Stage 5, one partition of components (its members and links from every file): each
    member's decision, cut by file."""
    g = np.concatenate([m["g"] for m, _ in parts]) if parts else np.empty(0, np.int64)
    nfiles = len(offsets) - 1
    if not len(g):
        empty: tuple = tuple(([], []) for _ in range(nfiles))
        return empty if nfiles > 1 else empty[0]
    label = np.concatenate([m["label"] for m, _ in parts])
    ids = [x for m, _ in parts for x in m["ids"]]
    fps = np.concatenate([m["fps"] for m, _ in parts])
    ranks = [x for m, _ in parts for x in m["ranks"]]
    best = [x for m, _ in parts for x in m["best"]]
    sets: Any = [x for m, _ in parts for x in m["sets"]] if job.check is not None and \
        job.mode == "components" else None
    order = np.lexsort((g, label))          # components apart, each in input order
    e = [np.concatenate([x[1][c] for x in parts]) for c in range(5)]
    decided: list = [None] * len(g)
    starts = np.flatnonzero(np.r_[True, label[order][1:] != label[order][:-1]])
    ends = np.r_[starts[1:], len(g)]
    links: dict = {}                        # later row -> [(earlier row, d, sim, ev)]
    for a, b, d, sim, ev in zip(e[0].tolist(), e[1].tolist(), e[2].tolist(), e[3].tolist(),
                                e[4].tolist()):
        links.setdefault(b, []).append((a, d, None if sim != sim else sim, _EVIDENCE[ev]))
    pos_of = dict(zip(g.tolist(), range(len(g))))
    ints = _IntFps(fps)
    check = _check_of(job)
    for s0, s1 in zip(starts.tolist(), ends.tolist()):
        group = order[s0:s1].tolist()       # local indexes, in input order
        if job.mode == "greedy":
            kept: set = set()
            for i in group:
                gi = int(g[i])
                top = best[i]
                for a, d, sim, how in links.get(gi, ()):
                    j = pos_of[a]
                    if j in kept and (top is None or (d, 1 + a) < top[:2]):
                        top = (d, 1 + a, ids[j], False, sim, how)
                if top is None:
                    kept.add(i)
                    decided[i] = (True, None, None, False, ids[i], None, None)
                else:
                    decided[i] = (False, *greedy_verdict(top))
        else:
            verdict: dict = {}
            earlier = {i: best[i] for i in group if best[i] is not None}
            verdict_of_group(group, earlier, ids, ints, ranks, job.keep, job.drop_all, check,
                             lambda i: Shingles.of_set(sets[i]), verdict)
            for i in group:
                decided[i] = _decision(verdict.get(i), ids[i])
    fb = _block_of(offsets, g.astype(_U64))
    got = []
    for f in range(nfiles):
        mine = np.flatnonzero(fb == f)
        got.append((g[mine].tolist(), [decided[i] for i in mine]))
    return tuple(got) if nfiles > 1 else got[0]


class _IntFps:
    """Rows of a fingerprint array read as ints (what the one-machine rules compare)."""

    def __init__(self, fps: np.ndarray) -> None:
        self.fps = fps

    def __getitem__(self, i: int) -> int:
        return _fp_int(self.fps, i)


def _decision(v: Any, id_: Any) -> tuple:
    """(kept, match, distance, reference, cluster, similarity, evidence) of a verdict."""
    if v is None or not isinstance(v, tuple):
        return (True, None, None, False, id_, None, None)
    return (False,) + tuple(v)


def _fetch(refs: Any) -> Any:
    """fetch(), with an error a task raised from bad input or a failed write (ValueError
    too, as the one-machine run raises it) re-raised as itself."""
    try:
        return fetch(refs)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, ValueError):
            raise e.cause from None
        raise


def _hash_key(key: tuple, parts: int) -> int:
    """The reduce partition of a cluster key (the same in every process)."""
    return zlib.crc32(repr(key).encode("utf-8", "backslashreplace")) % parts


@ray.remote
def _assemble(job: _Job, p: int, offset: int, fps: np.ndarray, rest: dict,
              sets: Any, *resolved: tuple) -> tuple:
    """Stage 6, one file: every good row's decision, the records its kept rows add to the
    index, its kept rows' ids and its share of the group sizes (each per reduce
    partition)."""
    n = len(rest["ids"])
    decided: list = [None] * n
    for gs, ds in resolved:
        for g, d in zip(gs, ds):
            decided[g - offset] = d
    ids, best = rest["ids"], rest["best"]
    adds = []
    kept = 0
    for i in range(n):
        if decided[i] is None:                       # alone: judged by the records only
            b = best[i]
            if b is None:
                decided[i] = (True, None, None, False, ids[i], None, None)
            else:
                decided[i] = (False, *(greedy_verdict(b) if job.mode == "greedy" else
                                       outside_verdict(b)))
        if decided[i][0]:
            kept += 1
            if job.adding and not rest["mine"][i]:
                pos = [p, int(rest["numbers"][i])]
                meta: Any = [job.token, pos]
                if job.check is not None:
                    sh = Shingles.of_set(_set_of(sets, i))
                    meta = Packed(pack_meta(meta, None, (sh.sketch, len(sh.set))))
                adds.append((ids[i], _fp_int(fps, i), meta))
    kept_ids: list = [[] for _ in range(job.reduces)]
    rows = [i for i, d in enumerate(decided) if d[0]]
    keys = encode_ids([ids[i] for i in rows])      # records' keys: 1 and "1" apart
    for i, key, c in zip(rows, keys, map(zlib.crc32, keys)):
        kept_ids[c % job.reduces].append((key, offset + i, ids[i]))
    pieces: list = [({}, []) for _ in range(job.reduces if job.sizes else 0)]
    if job.sizes:
        for i, d in enumerate(decided):
            key = id_key(d[4])
            counts, needed = pieces[_hash_key(key, job.reduces)]
            if not d[0]:
                c = counts.setdefault(key, [0, False, offset + i, d[4]])
                c[0] += 1
                c[1] |= id_key(ids[i]) == key
            if job.annotate or not d[0]:
                needed.append(key)
    return (decided, {"adds": adds, "kept": kept, "removed": n - kept}, *kept_ids, *pieces)


@ray.remote
def _repeats(*pieces: list) -> Optional[tuple]:
    """(position, id) of the first kept row, in input order, whose id an earlier kept row
    holds too (in one reduce partition of ids, by their records' keys), or None."""
    seen: set = set()
    first = None
    for key, g, id_ in sorted((x for p in pieces for x in p), key=lambda x: x[1]):
        if key in seen and (first is None or g < first[0]):
            first = (g, id_)
            break
        seen.add(key)
    return first


@ray.remote
def _sizes(files: int, *pieces: tuple) -> Any:
    """The group sizes of one reduce partition's cluster keys, answered to each file that
    needs them: size (removed rows, and the head unless it was removed too) and the
    position of the group's first removed row."""
    total: dict = {}
    for counts, _ in pieces:
        for key, (c, head_gone, first, cid) in counts.items():
            t = total.setdefault(key, [0, False, first, cid])
            t[0] += c
            t[1] |= head_gone
            t[2] = min(t[2], first)
    out = []
    for _, needed in pieces:
        out.append({key: ((total[key][0] + (0 if total[key][1] else 1), total[key][2])
                          if key in total else (1, None)) for key in needed})
    return tuple(out) if files > 1 else out[0]


def _written(row: Any, decision: tuple, job: _Job) -> Optional[list]:
    """The columns of a row as its output writes it, or None when it writes nothing."""
    if job.annotate:
        return list(row.data) + [c for c in ANNOTATIONS if c not in row.data]
    return list(row.data) if decision[0] else None


@ray.remote
def _first_written(job: _Job, path: str, shown: str, decided: list, rest: dict,
                   columns: Optional[list], most: int) -> tuple:
    """(the columns of the first row the file writes to the output unless `columns` are
    known, or None; with a Parquet output, the schema Arrow gives the first `most` rows it
    writes, and their count)."""
    numbers = rest["numbers"]
    rows: list = []
    i = 0
    for row in read_rows(path, job.fmt, lambda e: None, shown):
        if i >= len(numbers) or len(rows) >= most:
            break
        if row.number != numbers[i]:
            continue
        got = _written(row, decided[i], job)
        if got is not None:
            columns = columns or got
            if job.out_fmt != "parquet":
                break
            data = row.data
            if job.annotate:              # the added columns' values (a size's type: int)
                d = decided[i]
                data = dict(data, **dict(zip(ANNOTATIONS, (d[1], d[2], d[4], 1, d[5], d[6]))))
            rows.append({c: data.get(c) for c in columns})
        i += 1
    schema = None
    if rows:
        import pyarrow as pa
        schema = pa.Table.from_pylist(rows).schema
    return columns, schema, len(rows)


def _rows_again(job: _Job, path: str, shown: str) -> Iterable[Row]:
    """The rows of a file as _write reads them again: from a JSON lines file into a JSON
    lines output without annotations, each row its line's bytes, nothing decoded (the read
    stage judged the lines, and a kept row is written as read); else read_rows'."""
    if job.annotate or job.out_fmt != "jsonl" or format_of(path, job.fmt) != "jsonl":
        yield from read_rows(path, job.fmt, lambda e: None, shown)
        return
    with open_bytes(path) as f:
        for n, raw in enumerate(f, 1):
            yield Row(None, n, f"{shown}:{n}", json_line(raw, n))


def _kept_lines(job: _Job, path: str, shown: str, numbers: np.ndarray, decided: list,
                out: RowWriter, removed: Any) -> bool:
    """_write's reading of a JSON lines file into a JSON lines output without annotations:
    its parts' kept lines written as read, a part at a time, and removed(i, "file:row") of
    each removed row; False (nothing done) for other files and outputs."""
    if job.annotate or job.out_fmt != "jsonl" or format_of(path, job.fmt) != "jsonl" or \
            not splittable(path):
        return False
    numbers = numbers.tolist()
    i = 0
    for part, lines in parts_of(path, digests=False):
        first, end = part.first, part.first + len(lines)
        kept = []
        while i < len(numbers) and numbers[i] < end:
            n = numbers[i]
            if decided[i][0]:
                kept.append(n)
            else:
                removed(i, f"{shown}:{n}")
            i += 1
        out.write_many(lines_as_read(lines, first, kept))
    return True


@ray.remote
def _write(job: _Job, p: int, path: str, shown: str, offset: int, decided: list, rest: dict,
           columns: Optional[list], schema: Any, *answers: dict) -> None:
    """Stage 6, one file: its part of each output, written into the run's temporary
    directories (each part renamed into place there when complete)."""
    sizes: dict = {}
    for a in answers:
        sizes.update(a)
    numbers = rest["numbers"]
    name = f"part-{p:05d}"
    out = RowWriter(os.path.join(job.tmp["output"], f"{name}.{job.out_fmt}"), job.out_fmt,
                    columns, schema)
    gone = RowWriter(os.path.join(job.tmp["removed"], f"{name}.jsonl"), "jsonl") \
        if "removed" in job.tmp else None
    heads: list = []
    members: list = []
    writers = [w for w in (out, gone) if w is not None]

    def removed(i: int, where: str) -> None:
        _, match, distance, reference, cluster, sim, how = decided[i]
        id_ = rest["ids"][i]
        if gone is not None:
            gone.write(removed_line(id_, where, match, distance, reference, sim, how,
                                    job.radius))
        if "clusters" in job.tmp:
            key = id_key(cluster)
            size, first = sizes[key]
            if first == offset + i:
                heads.append({"id": cluster, "cluster": cluster, "size": size})
            if id_key(id_) != key:
                members.append({"id": id_, "cluster": cluster, "size": size})
    try:
        i = 0
        for row in (() if _kept_lines(job, path, shown, numbers, decided, out, removed)
                    else _rows_again(job, path, shown)):
            if i >= len(numbers) or row.number != numbers[i]:
                continue                       # a bad row, skipped when first read
            kept, match, distance, reference, cluster, sim, how = decided[i]
            if not kept:
                removed(i, row.where)
            if job.annotate:
                clash = [c for c in ANNOTATIONS if c in row.data]
                if clash:
                    raise InputError(f"{row.where}: the row already has the column "
                                     f"{clash[0]!r} that --annotate adds")
                data = dict(row.data)
                data.update(zip(ANNOTATIONS, (match, distance, cluster,
                                              sizes[id_key(cluster)][0], sim, how)))
                out.write(data)
            elif kept:
                out.write(row.written)
            i += 1
        if "clusters" in job.tmp and (heads or members):
            w = RowWriter(os.path.join(job.tmp["clusters"], f"{name}.jsonl"), "jsonl")
            writers.append(w)
            for line in heads + members:
                w.write(line)
        for w in writers:
            if w.count:
                w.commit()
            else:
                w.abort()
    except BaseException:
        for w in writers:
            w.abort()
        raise


class _Stages:
    """With `into` (a dict), each stage's wall time and the bytes of the objects it made,
    waited for at the end of the stage (a benchmark's view; runs without it overlap the
    stages as Ray schedules them)."""

    def __init__(self, into: Optional[dict]) -> None:
        self.into = into
        self.last = time.perf_counter()

    def done(self, name: str, refs: list) -> None:
        if self.into is None:
            return
        flat = [r for x in refs for r in (x if isinstance(x, (list, tuple)) else [x])]
        if flat:
            ray.wait(flat, num_returns=len(flat), fetch_local=False)
        where = ray.experimental.get_object_locations(flat) if flat else {}
        now = time.perf_counter()
        self.into[name] = {"seconds": now - self.last, "objects": len(flat),
                           "bytes": sum(w.get("object_size") or 0 for w in where.values())}
        self.last = now


def _refs(got: Any, n: int) -> list:
    """A task's returns as a list (Ray gives a single ref, not a list, for one)."""
    return list(got) if n > 1 else [got]


def _prepare_dir(path: str, what: str) -> tuple:
    """(the temporary folder a run writes `path`'s parts into, its lock fd); `path` must be
    a new folder or an earlier run's parts (with what killed write tasks of that run may
    have left beside them)."""
    path = os.path.abspath(path)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ParameterError(f"{what} {path} is a file: with Ray, the outputs are "
                                 f"directories of part files")
        other = [n for n in os.listdir(path) if not _PART.fullmatch(n)]
        if other:
            raise ParameterError(f"{what} {path} holds {other[0]!r}, not only part files "
                                 f"of an earlier run: give a new directory")
    parent, name = os.path.split(path)
    if not os.path.isdir(parent):
        raise ParameterError(f"cannot write {what} {path}: the folder {parent} does not "
                             f"exist")
    # a name of this run's own: a task of a failed run never writes into a later one's;
    # what killed runs left is removed
    return temporary_dir(parent, f".{name}.simindex-partial-")


def _tidy(tmp: str) -> None:
    """Remove from a run's finished part folder what is not a part: its lock, and the
    temporary files of write tasks killed and run again."""
    for n in os.listdir(tmp):
        if not _PART.fullmatch(n) or n.startswith("."):
            os.unlink(os.path.join(tmp, n))


def dedup(inputs: Union[str, Iterable[str]], output: str, *, removed: Optional[str] = None,
          clusters: Optional[str] = None, annotate: bool = False,
          output_format: Optional[str] = None, address: Optional[str] = None,
          partitions: Optional[int] = None, text_field: str = "text",
          id_field: Optional[str] = None, fingerprint_field: Optional[str] = None,
          k: Optional[int] = None, scheme: Optional[str] = None, width: Optional[int] = None,
          index: Optional[str] = None, against: Optional[str] = None,
          mode: Optional[str] = None, keep: str = "first", drop_all: bool = False,
          min_similarity: Optional[float] = None, recall: Optional[float] = None,
          containment: bool = False, time_budget: Optional[float] = None,
          fmt: Optional[str] = None, on_error: Any = "stop",
          summary: Optional[Summary] = None, timings: Optional[dict] = None) -> Summary:
    """`simindex dedup` on the Ray cluster at `address` (None: a local one): the same rows
    kept, the same removed rows with the same matches, as `simindex.dedup` with these
    options, written as directories of part files (one per input file that keeps rows,
    `part-NNNNN.<format>`, in input order): `output`, and `removed` and `clusters` when
    given. Each directory appears whole when the run completes, or not at all; the kept
    rows are added to `index` (when given) before. Returns the run's Summary.

    The inputs, `index` and `against` must be at the same paths on every node (a shared
    filesystem, or one machine). `partitions`: reduce partitions of each stage (default:
    twice the cluster's CPUs). `timings`: a dict that receives each stage's wall time and
    the bytes of the objects it made (each stage then waits for the one before).
    """
    paths = input_files(inputs)
    mode = check_options(mode, keep, drop_all, 1, min_similarity, recall, on_error)
    if scheme is not None:
        scheme = scheme_name(scheme)
    measure = MEASURES[1] if containment else MEASURES[0]
    if partitions is not None and (isinstance(partitions, bool) or
                                   not isinstance(partitions, int) or partitions < 1):
        raise ParameterError(f"partitions must be an int >= 1, got {partitions!r}")
    out_fmt = format_of(paths[0], output_format or fmt) if paths else "jsonl"
    summary = summary if summary is not None else Summary()
    tmp: dict = {}
    locks: list = []                # fds of the run's temporary folders' locks
    scratch = idx = ref = None
    started = False
    try:
        distinct({"--output": output, "--removed": removed, "--clusters": clusters})
        for what, path in (("output", output), ("removed", removed), ("clusters", clusters)):
            if path is not None:
                tmp[what], fd = _prepare_dir(path, f"--{what}")
                locks.append(fd)
        scratch, fd = temporary_dir(tempfile.gettempdir(), "simindex-dedup-")
        locks.append(fd)
        where = index if index is not None else os.path.join(scratch, "index")
        new = not os.path.exists(os.path.join(where, manifest.NAME))
        cal, _, scheme, width, empty = choose_radius(
            paths, new, k=k, scheme=scheme, width=width, min_similarity=min_similarity,
            recall=recall, measure=measure, fmt=fmt, text_field=text_field,
            fingerprint_field=fingerprint_field, time_budget=time_budget, summary=summary)
        if empty:                      # no row: judged against a scratch index, not kept
            index, where = None, os.path.join(scratch, "index")
        idx, ref, kk, min_similarity, measure = open_indexes(
            where, against, new, cal, k=k, scheme=scheme, width=width,
            min_similarity=min_similarity, measure=measure, summary=summary)
        # the newest record the tasks' queries see, at least: what other writers admit
        # after it is checked when the kept rows are added
        since = idx._admit(lambda adm: adm.last_seq) if index is not None else 0
        token = run_token(paths, text_field, id_field, fingerprint_field,
                          judging(mode, kk, measure, min_similarity, idx.width))
        started = connect(address)
        parts = partitions or 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))
        job = _Job(fmt=fmt, text_field=text_field, id_field=id_field,
                   fingerprint_field=fingerprint_field, keep=keep, drop_all=drop_all,
                   stop=on_error == "stop", width=idx.width, scheme=idx.scheme, k=kk,
                   mode=mode, token=token, bands=idx.bands is not None and kk > idx.k,
                   check=None if min_similarity is None else (float(min_similarity),
                                                              measure, token),
                   index=os.path.abspath(where) if len(idx) else None,
                   against=None if against is None else os.path.abspath(against),
                   annotate=annotate, sizes=annotate or clusters is not None,
                   adding=index is not None,
                   reduces=parts, radius=summary.radius, tmp=tmp, out_fmt=out_fmt)
        _run(job, paths, parts, idx if index is not None else None, since, summary,
             on_error, _Stages(timings))
        idx.flush()
        moves = [(tmp[what], os.path.abspath(path)) for what, path in
                 (("output", output), ("removed", removed), ("clusters", clusters))
                 if path is not None]
        for d, _ in moves:
            _tidy(d)
        publish(moves)              # every output folder at its path, or none
        tmp.clear()
        return summary
    finally:
        for d in tmp.values():
            shutil.rmtree(d, ignore_errors=True)
        for x in (ref, idx):
            if x is not None:
                x.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        for fd in locks:
            os.close(fd)
        release(started)


def _run(job: _Job, paths: list, parts: int, idx: Optional[Index], since: int,
         summary: Summary, on_error: Any, stages: _Stages) -> None:
    """Every stage of a run on Ray; the kept rows added to `idx` (the run's --index, or
    None) unless another writer admitted a near-copy of one after seq `since`."""
    files = len(paths)
    # tasks run in other working directories: absolute paths, rows named as given
    reads: Any = [_read.remote(job, p, os.path.abspath(path), path)
                  for p, path in enumerate(paths)]
    fps, rest, sets = [r[0] for r in reads], [r[2] for r in reads], [r[3] for r in reads]
    grouped = job.check is not None and job.mode == "components"   # decide needs the sets
    stages.done("read", reads)
    counts: list = []
    for info in fetch([r[1] for r in reads]):
        summary.rows += info["rows"]
        for e in info["skipped"]:
            summary.skipped += 1
            if callable(on_error):
                on_error(e)
        if info["error"] is not None:
            raise info["error"]
        counts.append(info["good"])
    offsets = np.cumsum([0] + counts).astype(_U64)
    total = int(offsets[-1])
    # stage 2: every pair within k, by the join of `pairs`
    joins = []
    # the join's inputs (each table's keys cut by prefix), kept only to be counted: a run
    # without timings lets each table's go once its joins hold them
    shuffled: Optional[list] = [] if stages.into is not None else None
    if total > 1:
        if job.bands:                  # a table per band: the pairs that share its key
            width, k, blocks, prefix = band_plan(job.scheme, None, None, None, None)
            plan = Plan(k=k, blocks=blocks, prefix_blocks=prefix, shards=1, width=width)
        elif job.width == 64:
            plan = Plan(k=job.k, shards=1)
        else:
            blocks, prefix = default_plan(job.k, total, width=job.width)
            plan = Plan(k=job.k, blocks=blocks, prefix_blocks=prefix, shards=1,
                        width=job.width)
        args = {"k": plan.k, "blocks": plan.blocks, "prefix_blocks": plan.prefix_blocks,
                "shards": 1, "width": job.width}
        pbits = 0 if plan.flips else \
            min(max(parts - 1, 0).bit_length(), min(plan.prefix_bits), 16)
        for t in range(plan.ntables):
            splits = [_refs(split_keys.options(num_returns=1 << pbits).remote(
                fps[f], int(offsets[f]), t, args, pbits), 1 << pbits)
                for f in range(files) if counts[f]]
            if shuffled is not None:
                shuffled += splits
            for q in range(1 << pbits):
                joins.append(join_keys.remote(t, job.k, args, *[s[q] for s in splits]))
    stages.done("join", joins + (shuffled or []))
    del shuffled
    # stage 3: the links that pass the check, cut by the file of their earlier row
    verified = [_refs(_verify.options(num_returns=1 + files).remote(job, j, offsets, sets),
                      1 + files) for j in joins]
    stages.done("check", verified)
    # stage 4: components of the links
    stars = components([v[0] for v in verified], parts)
    labels = [_refs(_labels.options(num_returns=files).remote(s, offsets), files)
              for s in stars]
    stages.done("components", labels)
    # stage 5: members and links routed to their component's partition, then decided
    routes = [_refs(_route.options(num_returns=parts).remote(
        int(offsets[f]), parts, len(labels), fps[f], rest[f],
        sets[f] if grouped else None, *[lb[f] for lb in labels],
        *[v[1 + f] for v in verified]), parts) for f in range(files)]
    resolved = [_refs(_resolve.options(num_returns=files).remote(
        job, offsets, *[routes[f][r] for f in range(files)]), files) for r in range(parts)]
    stages.done("decide", resolved)
    # stage 6: every row's decision, the group sizes, the parts of the outputs
    n_out = 2 + parts + (parts if job.sizes else 0)
    assembled = [_refs(_assemble.options(num_returns=n_out).remote(
        job, f, int(offsets[f]), fps[f], rest[f],
        sets[f] if job.check is not None and job.adding else None,
        *[resolved[r][f] for r in range(parts)]),
        n_out) for f in range(files)]
    repeats = [_repeats.remote(*[assembled[f][2 + q] for f in range(files)])
               for q in range(parts)]
    sizes = [_refs(_sizes.options(num_returns=files).remote(
        files, *[assembled[f][2 + parts + q] for f in range(files)]), files)
        for q in range(parts)] if job.sizes else []
    stages.done("assemble", assembled + sizes + repeats)
    twice = [r for r in fetch(repeats) if r is not None]
    if twice:
        at, id_ = min(twice, key=lambda r: r[0])
        f = int(_block_of(offsets, np.array([at], dtype=_U64))[0])
        number = int(fetch(rest[f])["numbers"][at - int(offsets[f])])
        raise id_taken(f"{paths[f]}:{number}", id_, True)
    columns, schema = _first_rows(job, paths, assembled, rest)
    writes = [_write.remote(job, f, os.path.abspath(paths[f]), paths[f], int(offsets[f]),
                            assembled[f][0], rest[f], columns, schema,
                            *[sizes[q][f] for q in range(len(sizes))])
              for f in range(files)]
    try:
        _fetch(writes)                 # every part written before a record is added
    except BaseException:
        for w in writes:
            ray.cancel(w, force=True)
        ray.wait(writes, num_returns=len(writes), timeout=60)
        raise
    stages.done("write", writes)
    if idx is not None:
        _admit(idx, since, job, paths, [assembled[f][1] for f in range(files)])
    for f in range(files):
        got = fetch(assembled[f][1])
        summary.kept += got["kept"]
        summary.removed += got["removed"]
    stages.done("index", [])


def _first_rows(job: _Job, paths: list, assembled: list, rest: list) -> tuple:
    """(columns, Parquet schema) of the one-machine output file: the first row's columns,
    and the types Arrow infers from the first rows it writes (a row group's worth)."""
    columns = None
    schemas: list = []
    n = 0
    for f, path in enumerate(paths):
        got, schema, m = _fetch(_first_written.remote(
            job, os.path.abspath(path), path, assembled[f][0], rest[f], columns,
            _PARQUET_GROUP - n))
        columns = columns or got
        if schema is not None:
            schemas.append(schema)
        n += m
        if columns is not None and (job.out_fmt != "parquet" or n >= _PARQUET_GROUP):
            break
    if not schemas:
        return columns, None
    import pyarrow as pa
    return columns, pa.unify_schemas(schemas, promote_options="permissive")


def _admit(idx: Index, since: int, job: _Job, paths: list, counted: list) -> None:
    """Add the kept rows' records (each file's, from its counts `counted`) in one records
    write transaction, after making sure no other writer admitted a near-copy of one of
    them since the run's queries (records after seq `since`): a run that would keep such a
    row adds nothing and raises, as its outputs are already written."""
    check = _check_of(job)

    def admit(adm: Any) -> None:
        seqs, others = adm.since(since)
        given: set = set()
        for ref in counted:
            adds = fetch(ref)["adds"]
            for s in range(0, len(adds), BATCH):
                part = adds[s:s + BATCH]
                fps = idx.queries([a[1] for a in part])
                if len(seqs):
                    _refuse_admitted(adm, idx, since, part, fps, others, job, check, paths)
                idkeys = encode_ids([a[0] for a in part])
                for a, idk in zip(part, idkeys):
                    if idk in given or adm.stored(idk):
                        raise id_taken(_place(a[2], paths), a[0], idk in given)
                    given.add(idk)
                adm.put(idkeys, fps, [pack_meta(a[2], a[0]) for a in part])
    idx._admit(admit)


def _refuse_admitted(adm: Any, idx: Index, since: int, part: list, fps: np.ndarray,
                     others: np.ndarray, job: _Job, check: Optional[Check],
                     paths: list) -> None:
    """Raise when a record admitted after seq `since` by another writer is a near-copy of
    one of `part`'s kept rows (within k, and passing the check by the sketches)."""
    n = len(fps)
    near = sorted({a for a, b in near_pairs(idx, np.concatenate([fps, others]), job.k)
                   if a < n <= b})
    if not near:
        return
    for i, hits in zip(near, held(idx, fps[near], adm.hits(fps[near], job.k), job.k)):
        mine = stored_sketch(pack_meta(part[i][2])) if check is not None else None
        # others' records only: not those this admission put for earlier parts
        for m, sketch in sketched([[h for h in hits if since < h[2] <= adm.last_seq]])[0]:
            if check is None or mine is None or check.sketches(mine, sketch):
                raise ParameterError(
                    f"{_place(part[i][2], paths)}: another writer added {m.id!r:.80} to the "
                    f"index while this run ran, a near-copy of this row, which the run "
                    f"would keep: nothing was added to the index and no output was "
                    f"published; run it again to judge the rows against it")


def _place(meta: Any, paths: list) -> str:
    """The "file:row" of a kept row from the meta its record keeps (the run's token and
    the row's position)."""
    if isinstance(meta, Packed):
        meta = unpack_sketched(bytes(meta))[0]
    p, number = meta[1]
    return f"{paths[p]}:{number}"
