"""Distributed build: map tasks parse input partitions, the cluster's actors write them."""

from __future__ import annotations

import os
import time
from typing import Any, Optional, Union

from ..engine import manifest
from ..index import Index
from .cluster import Cluster
from .connection import connect, release
from .parts import collect, partitions


def build(index_path: Union[str, os.PathLike], inputs: Any, *, shards: Optional[int] = None,
          k: Optional[int] = None, blocks: Optional[int] = None, scheme: Optional[str] = None,
          address: Optional[str] = None, fmt: Optional[str] = None,
          fp_format: str = "hex", prefix_blocks: Optional[int] = None,
          width: Optional[int] = None, ledgers: Optional[int] = None) -> dict:
    """Create (or extend) the index at `index_path` from `inputs` on Ray.

    `inputs` is a list of TSV/JSONL files (plain or gzip; one parse task each) or any
    iterable of (id, fingerprint) / (id, fingerprint, meta). A new index gets `shards`
    (default 16), `k` (3), `blocks`, `prefix_blocks`, `scheme` and `width` (64, 128 or
    256; hex fingerprints in files then take up to width/4 digits); an existing one keeps
    its own (parameters given must match). Records commit in input order, so the result is what
    `simindex.Index(...).add_many` would build, and it opens with simindex.Index. A bad
    line or record raises its error after every record before it (in input order) is
    committed, as `simindex build` does. `ledgers` splits a new index's records over that
    many ledgers (see Cluster). Returns {"records", "seconds"}.
    """
    start = time.perf_counter()
    path = os.fspath(index_path)
    # an index of several ledgers opens read-only on one machine: enough to check it
    split = os.path.exists(os.path.join(path, manifest.NAME)) and \
        manifest.read(path).ledgers > 1
    with Index(path, k=k, blocks=blocks, shards=shards, scheme=scheme,
               prefix_blocks=prefix_blocks, width=width, readonly=split) as idx:
        scheme, width = idx.scheme, idx.width  # create it, or check the parameters agree
        plan = {"k": idx.k, "blocks": idx.blocks, "shards": idx.shards,
                "prefix_blocks": idx.prefix_blocks, "width": width}
    started = connect(address)
    added = 0
    try:
        with Cluster(index_path, ledgers=ledgers) as cluster:
            # map tasks parse and route (which shards each record goes to) in parallel;
            # the driver commits their chunks in input order
            for ref in partitions(inputs, scheme, fmt, fp_format, plan=plan, width=width):
                chunks, error = collect(ref)
                for idks, fps, metas, owners in chunks:
                    cluster.add_columns(idks, fps, metas, owners)
                    added += len(idks)
                if error is not None:
                    raise error
    finally:
        release(started)
    return {"records": added, "seconds": time.perf_counter() - start}
