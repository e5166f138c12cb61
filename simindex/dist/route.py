"""Which shards a record or a query reaches, and the fan-out of a query to shard servers."""

import numpy as np
import ray as _ray

from ..errors import Error


def fetch(refs):
    """ray.get, with a simindex error raised in an actor or task re-raised as itself (not
    wrapped in a RayTaskError carrying the remote traceback)."""
    try:
        return _ray.get(refs)
    except _ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, Error):
            raise e.cause from None
        raise


def shard_lead(plan, keys):
    """The shard owning each permuted key: its leading `shard_bits` bits."""
    if not plan.shard_bits:
        return np.zeros(len(keys), dtype=np.int64)
    return (keys >> np.uint64(64 - plan.shard_bits)).astype(np.int64)


def owners(plan, fps):
    """(shards, n) bools: shard s holds an entry of record i in some table."""
    out = np.zeros((plan.shards, len(fps)), dtype=bool)
    for t in range(plan.ntables):
        lead = shard_lead(plan, plan.core.keys(t, fps))
        out[lead, np.arange(len(fps))] = True
    return out


def reach(plan, queries):
    """(shards, n) bools: shard s holds part of some table's prefix range of query i."""
    out = np.zeros((plan.shards, len(queries)), dtype=bool)
    shard = np.arange(plan.shards)[:, None]
    for t in range(plan.ntables):
        mask = np.uint64(plan.core.prefix_mask(t))
        lo = plan.core.keys(t, queries) & mask
        hi = lo | ~mask
        out |= (shard_lead(plan, lo)[None, :] <= shard) & (shard <= shard_lead(plan, hi)[None, :])
    return out


def scan(plan, shards, queries, k):
    """Candidates of every query from the shard servers it reaches, all scans finished:
    (qidx, seqs, distances, per-query lowest applied seq of the scanned shards)."""
    r = reach(plan, queries)
    calls = []
    for s, server in enumerate(shards):
        idx = np.nonzero(r[s])[0]
        if len(idx):
            calls.append((idx, server.scan.remote(queries[idx], k)))
    applied = np.full(len(queries), np.iinfo(np.uint64).max, dtype=np.uint64)
    qs, ss, ds = [], [], []
    for (idx, _), (qi, sq, d, a) in zip(calls, fetch([ref for _, ref in calls])):
        applied[idx] = np.minimum(applied[idx], np.uint64(a))
        qs.append(idx[qi.astype(np.int64)].astype(np.uint64))
        ss.append(sq)
        ds.append(d)
    if not calls:
        empty = np.empty(0, dtype=np.uint64)
        return empty, empty, np.empty(0, dtype=np.uint8), applied
    return np.concatenate(qs), np.concatenate(ss), np.concatenate(ds), applied
