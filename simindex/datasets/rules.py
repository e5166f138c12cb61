"""The rules that decide a row: its nearest stored record under the greedy and the
components rule, and the verdicts of a group of rows. The one-machine run and the Ray run
(simindex.distributed.dedup) both decide by them, so they decide alike."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..bands import band_hits_many
from ..engine.codec import encode_ids, unpack_sketched
from ..engine.pairs import find_all
from ..engine.results import Match
from ..errors import IdExistsError
from ..index import Index
from .check import Check, is_mine


def matches(index: Index, fps: list, k: int, check: Optional[Check]) -> list:
    """Per fingerprint, its (Match, stored sketch or None) in `index`: with a check, the
    sketches kept with the records' meta (by dedup's kept rows and the text calls)."""
    if check is None:
        return [[(m, None) for m in ms] for ms in index.query_many(fps, k=k)]
    return sketched(index._hits_many(fps, k=k))


def near_pairs(index: Index, fps: Any, k: int) -> list:
    """The pairs (i, j), i < j, of fingerprints (ints, or an (n, words) array) within k as
    `index` searches: above its k (a band index's search), those sharing a band."""
    return pairs_as_searched(search_shape(index), fps, k)


def search_shape(index: Index) -> tuple:
    """What near_pairs needs of an index, as plain values a worker process can take: its
    k, blocks, prefix blocks and width."""
    return index.k, index.blocks, index.prefix_blocks, index.width


def pairs_as_searched(shape: tuple, fps: Any, k: int) -> list:
    """near_pairs of an index of this search_shape."""
    index_k, blocks, prefix_blocks, width = shape
    if len(fps) < 2:
        return []
    if k > index_k:
        return find_all(fps, k=index_k, blocks=blocks, prefix_blocks=prefix_blocks,
                        width=width, radius=k)
    return find_all(fps, k=k, width=width)


def held(index: Index, queries: Any, hits: list, k: int) -> list:
    """The core's hits of each query (an (n, words) array) as `index` searches at k: above
    its k (a band index's search), those sharing a band (records no shard has applied yet
    are searched by distance alone)."""
    return hits if k <= index.k else band_hits_many(queries, hits, index.blocks)


def sketched(hits: list) -> list:
    """The core's hits of each query (distance, fingerprint, seq, id, meta bytes) as
    matches() gives them: (Match, stored sketch or None)."""
    out = []
    for row_hits in hits:
        if not row_hits:
            out.append(row_hits)           # most rows: the core's empty list as it is
            continue
        row = []
        for dist, fp, _seq, id_, mb in row_hits:
            meta, sketch = unpack_sketched(mb)
            row.append((Match(id_, fp, dist, meta), sketch))
        out.append(row)
    return out


def greedy_outside(stored: list, refs: Any, sh: Any, pos: list, token: bytes,
                   check: Optional[Check], own: bool = True) -> tuple:
    """(best, mine) of one row under the greedy rule, from its (Match, sketch) lists in the
    index and the reference: best is (distance, order, id, reference, similarity, evidence)
    of the nearest record that passes the check (a reference's first at its distance, order
    -1, before the index's, order 0), or None; mine, whether this run already added the row
    itself. This run's records at earlier positions count as matches when `own`, else they
    are left to the caller (which judges this run's rows itself)."""
    best = None
    mine = False
    for m, sketch in stored:
        meta = m.meta
        if is_mine(meta, token):
            if meta[1] == pos:
                mine = True        # kept by this run's earlier (killed) process
                continue
            if meta[1] > pos or not own:
                continue           # kept later in this run's order: not before it
        if best is not None and (m.distance, 0) >= best[:2]:
            continue
        ok, sim, how = (True, None, None) if check is None else \
            check.stored(sh, meta, sketch)[:3]
        if ok:
            best = (m.distance, 0, m.id, False, sim, how)
    for m, sketch in refs:                 # a reference's records: by their sketches
        if best is not None and (m.distance, -1) >= best[:2]:
            break
        ok, sim, how = (True, None, None) if check is None else check(sh, sketch)
        if ok:
            best = (m.distance, -1, m.id, True, sim, how)
            break
    return best, mine


def components_outside(stored: list, refs: list, sh: Any, pos: list,
                       token: bytes, check: Optional[Check]) -> tuple:
    """(best, mine) of one row for the components mode: best is its nearest record of the
    index or the reference that passes the check, as (distance, id, fingerprint, reference,
    similarity, evidence, the record's shingles for later checks), or None (a reference's
    wins a tie); mine, whether this run already added the row itself. This run's own
    records are judged again with the run's rows, not here."""
    best = None
    mine = False
    for (m, sketch), isref in [(x, False) for x in stored] + [(x, True) for x in refs]:
        meta = m.meta
        if not isref and is_mine(meta, token):
            if meta[1] == pos:
                mine = True
            continue               # this run's own records: judged again here
        if best is not None and (m.distance > best[0] or m.distance == best[0]
                                 and not isref):
            continue
        if check is None:
            ok, sim, how, theirs = True, None, None, None
        elif isref:
            ok, sim, how, theirs = (*check(sh, sketch), sketch)
        else:
            ok, sim, how, theirs = check.stored(sh, meta, sketch)
        if ok:
            best = (m.distance, m.id, m.fingerprint, isref, sim, how, theirs)
    return best, mine


def verdict_of_group(group: list, earlier: dict, ids: Any, fps: Any, ranks: Any, keep: str,
                     drop_all: bool, check: Optional[Check], shingles: Callable,
                     verdict: Any) -> None:
    """The components mode's decision for one group of rows (positions in input order),
    into `verdict`: per row None (kept, alone), its own id (kept, the head of its group)
    or (match id, distance, reference, cluster id, similarity, evidence). `earlier`: rows'
    nearest outside records (components_outside); `shingles(i)`: row i's Shingles."""
    outside = [earlier[i] for i in group if i in earlier]
    if outside:
        first = min(outside, key=lambda e: e[0])
        for i in group:
            if i in earlier:
                verdict[i] = outside_verdict(earlier[i])
                continue
            d, mid, mfp, isref, _, _, theirs = first
            ok, sim, how = (True, None, None) if check is None else \
                check(shingles(i), theirs)
            if ok:
                verdict[i] = (mid, distance(fps[i], mfp), isref, mid, sim, how)
        return
    if len(group) == 1:
        return
    best = group[0] if keep == "first" else max(group, key=lambda i: (ranks[i], -i))
    head = shingles(best) if check is not None else None
    gone = []
    for i in group:
        if i == best:
            continue
        ok, sim, how = (True, None, None) if check is None else check(shingles(i), head)
        if ok:
            verdict[i] = (ids[best], distance(fps[i], fps[best]), False, ids[best], sim, how)
            gone.append(i)
    if not gone:
        return                             # nothing passed against the head: all stay
    if drop_all:
        other = gone[0]
        sim, how = (None, None) if check is None else \
            check(head, shingles(other))[1:]      # type: ignore[arg-type]
        verdict[best] = (ids[other], distance(fps[best], fps[other]), False, ids[best],
                         sim, how)
    else:
        verdict[best] = ids[best]          # kept, the head of its group


def greedy_verdict(best: tuple) -> tuple:
    """(match, distance, reference, cluster, similarity, evidence) of a row the greedy rule
    removes for `best` (distance, order, id, reference, similarity, evidence)."""
    d, _, mid, isref, sim, how = best
    return mid, d, isref, mid, sim, how


def outside_verdict(best: tuple) -> tuple:
    """The same of a row the components rule removes for its own nearest outside record
    (components_outside's best)."""
    d, mid, _, isref, sim, how, _ = best
    return mid, d, isref, mid, sim, how


def id_taken(where: str, id_: Any, twice: bool) -> IdExistsError:
    """The error of a row to keep whose id an earlier kept row holds (`twice`), or a record
    of the index: adding it would replace that record."""
    why = "is given twice (an earlier row to keep has it)" if twice else \
        "already names a record of the index"
    return IdExistsError(f"{where}: the id {id_!r:.80} of a row to keep {why}: ids must be "
                         f"unique, across runs too", id_)


def taken_row(e: IdExistsError, adds: list, idkeys: list, adm: Any, places: list,
              ids: list, token: bytes) -> IdExistsError:
    """id_taken of the row of a batch whose id the records put refused with `e`: the first
    of the rows `adds` holding that id when the index has it (given twice when this run's
    record: an earlier batch kept it), else the second (kept twice in the batch)."""
    bad = encode_ids([e.id])[0]
    hold = [i for i in adds if idkeys[i] == bad]
    if not hold:
        return e
    if adm.stored(bad) or len(hold) < 2:
        return id_taken(places[hold[0]], ids[hold[0]], is_mine(adm.meta(bad), token))
    return id_taken(places[hold[1]], ids[hold[1]], True)


def distance(a: int, b: int) -> int:
    return bin(a ^ b).count("1")
