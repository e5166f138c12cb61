"""All near-duplicate pairs and groups of a data set too big for one machine (the paper's
batch mode): per table, partition the permuted keys by prefix, join within partitions."""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
import ray

from ..engine import environments, ledgers, manifest, records
from ..engine.codec import decode_id
from ..errors import ParameterError
from ..signatures.fingerprints import DEFAULT_SCHEME
from ..engine.pairs import group_pairs, join_table
from ..engine.plan import DEFAULT_K, Plan, default_plan
from ..engine.shard import entry_order
from ..engine.transactions import TxnRunner
from .connection import connect, release
from .route import fetch
from .parts import collect, partitions


CHUNK = 1 << 20        # records per map partition of a stored index


@ray.remote
def _index_records(path, words, sums, nledgers=1):
    """(positions, fps, ids) of the live records of a stored index, in insertion order
    (`sums`: its manifest's record_sums), global seqs over its ledgers."""
    envs = [environments.open_records(path, readonly=True, sync=True, sums=sums, ledger=j)
            for j in range(nledgers)]
    txns = TxnRunner(path, envs, what=f"index {path}")
    try:
        if nledgers == 1:
            return txns.read_txn(envs[0], lambda txn: records.live(txn, words))
        with txns.snapshot() as ltxns:
            return ledgers.live(ltxns, words)
    finally:
        txns.close(sync=False)


@ray.remote
def split_keys(fps, positions, table, plan_args, pbits):
    """Map: one table's keys of a partition, cut into 2**pbits parts by leading bits (of
    the first word: wide keys are (n, words) arrays sorted and joined by it). `positions`:
    the records' positions, or an int, the first of consecutive ones."""
    if isinstance(positions, int):
        positions = np.arange(positions, positions + len(fps), dtype=np.uint64)
    keys = Plan(**plan_args).permuter.keys(table, fps)
    if not pbits:
        return keys, positions
    first = keys if keys.ndim == 1 else keys[:, 0]
    part = (first >> np.uint64(64 - pbits)).astype(np.int64)
    return tuple((keys[part == p], positions[part == p]) for p in range(1 << pbits))


@ray.remote
def join_keys(table, k, plan_args, *parts):
    """Reduce: the pairs of one prefix partition of one table, not found by earlier tables."""
    keys = np.concatenate([p[0] for p in parts])
    pos = np.concatenate([p[1] for p in parts])
    return join_table(Plan(**plan_args), table, keys, pos, k)


def _sources(source, k, blocks, fmt, fp_format, width):
    """(k, Plan arguments, [(positions ref, fps ref)], position -> id) of an index or of
    inputs (`width`-bit fingerprints; a plan not given is find_all's for their number)."""
    if isinstance(source, (str, os.PathLike)) and \
            os.path.exists(os.path.join(os.fspath(source), manifest.NAME)):
        path = os.path.abspath(os.fspath(source))
        m = manifest.read(path)
        m.check_same(width=width)
        k = _check_k(m.k if k is None else k, m.k)
        if blocks is not None and blocks != m.blocks:
            raise ParameterError(f"blocks={blocks} was given, but the index at {path} has "
                                 f"blocks={m.blocks}")
        seqs, fps, ids = fetch(_index_records.remote(path, m.width // 64, m.record_sums,
                                                     m.ledgers))
        names = dict(zip(seqs.tolist(), ids))
        parts = [(ray.put(seqs[i:i + CHUNK]), ray.put(fps[i:i + CHUNK]))
                 for i in range(0, len(seqs), CHUNK)]
        # the index's own tables: a smaller k needs no more flips than the index's
        return k, {"k": k, "blocks": m.blocks, "prefix_blocks": m.plan.prefix_blocks,
                   "width": m.width}, parts, names.__getitem__
    width = 64 if width is None else width
    Plan(k=0, blocks=1, width=width)              # the width's check (one table: cheap)
    k = _check_k(DEFAULT_K if k is None else k, width - 1)
    parts, ids, n = [], [], 0
    for ref in partitions(source, DEFAULT_SCHEME, fmt, fp_format, width=width):
        chunks, error = collect(ref)
        if error is not None:
            raise error
        for idks, fps, _metas, _owners in chunks:
            parts.append((ray.put(np.arange(n, n + len(fps), dtype=np.uint64)), ray.put(fps)))
            ids.extend(decode_id(x) for x in idks)
            n += len(fps)
    prefix_blocks = None
    if blocks is None and width != 64:
        blocks, prefix_blocks = default_plan(k, max(n, 1), width=width)
    return k, {"k": k, "blocks": blocks, "prefix_blocks": prefix_blocks, "width": width}, \
        parts, ids.__getitem__


def _check_k(k, most):
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= most:
        raise ParameterError(f"k must be an int between 0 and {most}, got {k!r}")
    return k


def _pair_positions(source, k, blocks, partitions_, fmt, fp_format, width):
    k, args, parts, name = _sources(source, k, blocks, fmt, fp_format, width)
    if not parts:
        return np.empty(0, np.uint64), np.empty(0, np.uint64), np.empty(0, np.uint16), name
    plan = Plan(shards=1, **args)
    args = dict(args, blocks=plan.blocks, prefix_blocks=plan.prefix_blocks, shards=1)
    if partitions_ is None:
        partitions_ = 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))
    # a pair's prefixes may differ in flipped bits, so a plan with flips joins whole tables
    pbits = 0 if plan.flips else \
        min(max(partitions_ - 1, 0).bit_length(), min(plan.prefix_bits), 16)
    joins = []
    for t in range(plan.ntables):
        # one ref per prefix part of each input partition: a part moves only to its join
        splits = [split_keys.options(num_returns=1 << pbits).remote(f, p, t, args, pbits)
                  for p, f in parts]
        if not pbits:
            splits = [[s] for s in splits]
        for p in range(1 << pbits):
            joins.append(join_keys.remote(t, k, args, *[s[p] for s in splits]))
    a, b, d = [], [], []
    for x, y, z in fetch(joins):
        a.append(x)
        b.append(y)
        d.append(z)
    if not a:
        return np.empty(0, np.uint64), np.empty(0, np.uint64), np.empty(0, np.uint16), name
    a, b, d = np.concatenate(a), np.concatenate(b), np.concatenate(d)
    order = entry_order(a, b)
    return a[order], b[order], d[order], name


def pairs(source: Any, *, k: Optional[int] = None, blocks: Optional[int] = None,
          partitions: Optional[int] = None, address: Optional[str] = None,
          fmt: Optional[str] = None, fp_format: str = "hex",
          width: Optional[int] = None) -> list:
    """Every pair within k bits, once: [(id_a, id_b, distance)], a before b.

    `source` is a stored index (its live records, a added before b; k defaults to the
    index's, `width` is its own) or inputs as for build(): files or an iterable of (id,
    fingerprint[, meta]) of `width` bits (default 64) (pairs of input records, a earlier
    in the input; k defaults to 3; at width 128 or 256 without `blocks`, find_all's plan
    for their number). Each table's keys are cut into `partitions` prefix ranges (default:
    twice the cluster's CPUs), each joined by one task.
    """
    started = connect(address)
    try:
        a, b, d, name = _pair_positions(source, k, blocks, partitions, fmt, fp_format, width)
        return [(name(x), name(y), int(z)) for x, y, z in zip(a.tolist(), b.tolist(), d.tolist())]
    finally:
        release(started)


def clusters(source: Any, *, k: Optional[int] = None, blocks: Optional[int] = None,
             partitions: Optional[int] = None, address: Optional[str] = None,
             fmt: Optional[str] = None, fp_format: str = "hex",
             width: Optional[int] = None) -> list:
    """Groups of records linked by pairs within k bits (connected components of size >= 2),
    each in input (or insertion) order, groups in order of their first record."""
    started = connect(address)
    try:
        a, b, _d, name = _pair_positions(source, k, blocks, partitions, fmt, fp_format,
                                         width)
    finally:
        release(started)
    return group_pairs((x, y, name(x), name(y)) for x, y in zip(a.tolist(), b.tolist()))
