"""Which shards a record or a query reaches, and the fan-out of a query to shard servers."""

from __future__ import annotations

import numpy as np
import ray as _ray

from ..errors import Error
from ..engine import ledgers
from ..engine.plan import Plan


def fetch(refs):
    """ray.get, with a simindex error (or an OSError) raised in an actor or task re-raised
    as itself (not wrapped in a RayTaskError carrying the remote traceback)."""
    try:
        return _ray.get(refs)
    except _ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, (Error, OSError)):
            raise e.cause from None
        raise


def owners(plan: Plan, fps: np.ndarray) -> np.ndarray:
    """(shards, n) bools: shard s holds an entry of record i in some table."""
    return plan.permuter.shard_owners(fps)


def reach(plan: Plan, queries: np.ndarray) -> np.ndarray:
    """(shards, n) bools: shard s holds part of some table's prefix range of query i."""
    return plan.permuter.shard_reach(queries)


def scan(plan: Plan, shards: list, queries: np.ndarray, k: int, nledgers: int) -> tuple:
    """Candidates of every query from the shard servers it reaches, all scans finished:
    (qidx, seqs, distances, applied): applied (n, nledgers), per query the lowest local
    seq of each ledger applied by the shards it reached."""
    r = reach(plan, queries)
    calls = []
    for s, server in enumerate(shards):
        idx = np.nonzero(r[s])[0]
        if len(idx):
            calls.append((idx, server.scan.remote(queries[idx], k)))
    return ledgers.gather([(idx, got) for (idx, _), got in
                           zip(calls, fetch([ref for _, ref in calls]))], len(queries), nledgers)


def resolve(servers: list, queries: np.ndarray, qidx: np.ndarray, seqs: np.ndarray,
            dists: np.ndarray, applied: np.ndarray, k: int, here=None, txn=None) -> list:
    """Each query's matches from route.scan's candidates, every ledger server resolving
    its own (all at once), merged by (distance, seq). `here`: the calling ledger server
    itself, whose part runs in-process (an actor cannot wait for its own calls), in its
    write transaction `txn` when it holds one."""
    n = len(servers)
    parts = ledgers.split(qidx, seqs, dists, n)
    calls = {}
    for ledger, server in enumerate(servers):
        if here is None or ledger != here.ledger:
            calls[ledger] = server.resolve.remote(
                queries, *parts[ledger], np.ascontiguousarray(applied[:, ledger]), k)
    mine = None if here is None else here.resolve(
        queries, *parts[here.ledger], np.ascontiguousarray(applied[:, here.ledger]), k, txn)
    got = dict(zip(calls, fetch(list(calls.values()))))
    if mine is not None:
        got[here.ledger] = mine
    if n == 1:
        return got[0]
    return ledgers.merge([got[ledger] for ledger in range(n)])
