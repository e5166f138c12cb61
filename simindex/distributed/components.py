"""Connected components of a graph too large for one process, by alternating large-star and
small-star steps over Ray tasks (Kiveris et al., "Connected Components in MapReduce and
Beyond", SoCC 2014): each step hash-partitions the edges by node, rewires every node's
neighbours to the smallest node it sees, and stops when a pair of steps changes nothing. Every
node then links straight to the smallest node of its component, its label.

A step is a pure function of the previous step's edges, so a task lost with its worker
is run again by Ray from its inputs; no process holds every edge.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from .route import fetch

_U64 = np.uint64


def _unique_pairs(x: np.ndarray, y: np.ndarray) -> tuple:
    """The distinct (x, y) pairs, sorted by x then y."""
    if not len(x):
        return x, y
    order = np.lexsort((y, x))
    x, y = x[order], y[order]
    keep = np.ones(len(x), dtype=bool)
    keep[1:] = (x[1:] != x[:-1]) | (y[1:] != y[:-1])
    return x[keep], y[keep]


@ray.remote
def _scatter(edges: tuple, parts: int) -> tuple:
    """Map: the undirected edges (lo, hi) of one chunk as directed edges, both ways, cut by
    their source node into `parts` partitions."""
    lo, hi = edges
    src = np.concatenate([lo, hi])
    dst = np.concatenate([hi, lo])
    part = src % _U64(parts)
    out = tuple((src[part == q], dst[part == q]) for q in range(parts))
    return out if parts > 1 else out[0]


@ray.remote(num_returns=2)
def _star(kind: str, *pieces: tuple) -> tuple:
    """Reduce: one partition's large-star or small-star step; returns its new undirected
    edges (lo < hi) and whether it changed any."""
    src = np.concatenate([p[0] for p in pieces]) if pieces else np.empty(0, _U64)
    dst = np.concatenate([p[1] for p in pieces]) if pieces else np.empty(0, _U64)
    if kind == "small":
        below = dst < src                   # each node's smaller neighbours
        src, dst = src[below], dst[below]
    src, dst = _unique_pairs(src, dst)
    if not len(src):
        empty = np.empty(0, _U64)
        return (empty, empty), False
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])
    counts = np.diff(np.r_[starts, len(src)])
    low = np.minimum(np.minimum.reduceat(dst, starts), src[starts])
    m = np.repeat(low, counts)              # per edge: the smallest node its source sees
    if kind == "large":
        up = dst > src                      # rewire the larger neighbours to m
        changed = bool(np.any(up & (m != src)))
        return (m[up], dst[up]), changed
    # small: every smaller neighbour and the node itself link to m
    changed = bool(np.any(counts > 1))
    heads = src[starts]
    lo = np.concatenate([m, low])
    hi = np.concatenate([dst, heads])
    keep = lo != hi
    lo, hi = lo[keep], hi[keep]
    return (np.minimum(lo, hi), np.maximum(lo, hi)), changed


def components(chunks: list, parts: int) -> list:
    """Refs of `parts` chunks of star edges (label, node): every node of an edge of `chunks`
    (refs of (lo, hi) uint64 arrays), linked to the smallest node of its component."""
    state = list(chunks)
    if not state:
        return []
    while True:
        changed = False
        for kind in ("large", "small"):
            got: Any = [_scatter.options(num_returns=parts).remote(c, parts) for c in state]
            maps: list = [[m] for m in got] if parts == 1 else got
            outs: Any = [_star.remote(kind, *[m[q] for m in maps]) for q in range(parts)]
            state = [o[0] for o in outs]
            changed |= any(fetch([o[1] for o in outs]))
        if not changed:
            return state
