"""verify(): check every environment's pages, every record, every slab, and every table
against records/.

LMDB aborts the process on a cursor step onto a damaged page, so the pages of the snapshot
are walked with plain file reads first (simindex/engine/lmdbfile.py: their structure and the order
of their keys); an environment with damaged pages is reported and not read through LMDB.
Then every record is read with its checksum and every id entry must lead to the record that
holds it; every slab is read with its checksum, and each shard's entries of each table are
compared with what the records say they must be.
"""

from __future__ import annotations

import os

import numpy as np

from . import ledgers, lmdbfile
from ._slabs import read_run
from ._layout import DB_IDS, DB_SEQS, DB_SLABS, ledger_dir, shard_dir
from ._records import records_lookup, records_problems
from .codec import encode_ids
from .records import tail
from ..errors import CorruptError
from .shard import load_state, runs_of


def problems(store) -> list:
    """What is wrong with the index of `store` (a list of str; [] when it is sound)."""
    plan = store.plan
    nl = store.nledgers
    found = []
    with store.snapshot() as txns:
        # the pages of these snapshots stay unreused while they are open
        for txn in txns:
            f = os.path.join(txn.env.path, lmdbfile.DATA_MDB)
            meta = lmdbfile.read_meta(f, txn.id)
            if meta is not None:              # None: a newer commit raced past it
                found += lmdbfile.walk(f, meta)
        if found:
            return found
        ltxns, stxns = txns[:nl], txns[nl:]
        words = plan.words
        for rtxn in ltxns:
            found += records_problems(rtxn, DB_IDS, DB_SEQS, words)
        if found:
            return found
        parts = [tail(rtxn, 0, 0, words) for rtxn in ltxns]
        for rtxn, (seqs, _) in zip(ltxns, parts):
            n_ids = rtxn.entries(DB_IDS)
            if n_ids != len(seqs):
                found.append(f"{os.path.basename(rtxn.env.path)}: {n_ids} ids but "
                             f"{len(seqs)} records")
        if nl > 1:
            found += _misplaced(ltxns, parts, words)
        seqs = np.concatenate([ledgers.to_global(p[0], n, nl) for n, p in enumerate(parts)])
        fps = np.concatenate([p[1] for p in parts])
        owner, local = ledgers.to_local(seqs, nl)
        for s, txn in enumerate(stxns):
            try:
                applied, runs, _ = load_state(txn, plan.ntables)
                if nl > 1:
                    sel = local <= ledgers.load_applied(txn, nl)[owner]
                else:
                    sel = seqs <= np.uint64(applied)
            except CorruptError as e:
                found.append(f"{shard_dir(s)}: {e}")
                continue
            for t in range(plan.ntables):
                keys = plan.permuter.keys(t, np.ascontiguousarray(fps[sel]))
                mine = plan.shard_of_keys(keys) == np.uint64(s)
                want = _sorted_pairs(keys[mine], seqs[sel][mine])
                parts = []
                for run, count in runs_of(runs, t):
                    try:
                        part = read_run(txn, DB_SLABS, run, count, True, words - 1)
                        parts.append((part[0] if words == 1 else
                                      np.column_stack([part[0], part[2]]), part[1]))
                    except CorruptError as e:
                        found.append(f"{shard_dir(s)} table {t}: {e}")
                empty = np.empty((0,) if words == 1 else (0, words), np.uint64)
                gk = np.concatenate([p[0] for p in parts]) if parts else empty
                gs = np.concatenate([p[1] for p in parts]) if parts else np.empty(0, np.uint64)
                live = np.isin(gs, seqs)
                have = _sorted_pairs(gk[live], gs[live])
                if not np.array_equal(have, want):
                    found.append(
                        f"{shard_dir(s)} table {t}: holds {len(have)} live entries "
                        f"for {len(want)} records, {len(np.setdiff1d(want, have))} missing, "
                        f"{len(np.setdiff1d(have, want))} wrong")
    return found


def files(path: str) -> list:
    """What is wrong with the data files of the index at `path` (a list of str), read with
    plain file reads, never through LMDB: for an index too damaged to open."""
    from . import manifest
    try:
        m = manifest.read(path)
    except CorruptError as e:
        return [str(e)]
    found = []
    for sub in [ledger_dir(n) for n in range(m.ledgers)] + \
            [shard_dir(s) for s in range(m.shards)]:
        found += lmdbfile.problems(os.path.join(path, sub))
    return found


def _misplaced(ltxns, parts, words):
    """A ledger's records whose ids belong to another ledger (get() would not find them)."""
    found = []
    for n, (txn, (seqs, _)) in enumerate(zip(ltxns, parts)):
        ids = records_lookup(txn, DB_SEQS, seqs, words)[1]
        home = ledgers.ledger_of(encode_ids(ids), len(ltxns))
        wrong = np.flatnonzero(home != n)
        if len(wrong):
            found.append(f"{ledger_dir(n)}: {len(wrong)} records whose ids belong to another "
                         f"ledger (the first: {ids[int(wrong[0])]!r:.80})")
    return found


def _sorted_pairs(keys, seqs):
    """(key, seq) rows sorted, as one structured array for exact comparison (a wide key's
    words are fields k0, k1, ...)."""
    keys = keys[:, None] if keys.ndim == 1 else keys
    names = [f"k{w}" for w in range(keys.shape[1])]
    out = np.empty(len(keys), dtype=[(n, "<u8") for n in names] + [("s", "<u8")])
    for w, n in enumerate(names):
        out[n] = keys[:, w]
    out["s"] = seqs
    return np.sort(out, order=names + ["s"])

