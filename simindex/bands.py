"""MinHash LSH band search: an index of minhash-lsh-v1 band keys finds the records that share
at least one band's key with a query, and the similarity check decides among them.

A minhash-lsh-v1 code is 8 band keys of 32 bits (see its scheme). The index holds it under
the plan of 8 blocks of 32 bits with one block per table: each table is one band, keyed by
that band's key, and a probe of a table is an exact-key lookup. Its Hamming radius k = 7 is
true but beside the point; its text calls search at radius BAND_RADIUS (every distance),
which returns exactly the records sharing a band, so a query costs 8 lookups plus the
records that share a band, whatever the size of the index.

A pair at Jaccard similarity J shares a given band with probability J**r (r rows per band)
and at least one of 8 with 1 - (1 - J**r)**8 (the S-curve), for every corpus.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .engine.results import Match
from .values import words_to_ints
from .errors import ParameterError
from .signatures.fingerprints import LSH_BANDS
from .scheme_names import LSH_ROWS, lsh_rows

BAND_WIDTH = 256                 # bits of a minhash-lsh-v1 code
BAND_K = LSH_BANDS - 1           # the plan's k: 7 differing bits leave a block whole
BAND_RADIUS = BAND_WIDTH         # the search radius of the text calls: every distance
KEY_BITS = BAND_WIDTH // LSH_BANDS


def band_plan(scheme: Optional[str], width: Optional[int], k: Optional[int],
              blocks: Optional[int], prefix_blocks: Optional[int]) -> tuple:
    """(width, k, blocks, prefix_blocks) of a new index of a minhash-lsh-v1 scheme: its one
    plan, a table per band; any other value given raises ParameterError."""
    want = {"width": BAND_WIDTH, "k": BAND_K, "blocks": LSH_BANDS, "prefix_blocks": 1}
    given = {"width": width, "k": k, "blocks": blocks, "prefix_blocks": prefix_blocks}
    for name, value in given.items():
        if value is not None and value != want[name]:
            raise ParameterError(
                f"an index of {scheme} band keys has {name}={want[name]} (a table per band: "
                f"width {BAND_WIDTH}, k {BAND_K}, blocks {LSH_BANDS}, prefix_blocks 1), "
                f"not {name}={value!r}")
    return BAND_WIDTH, BAND_K, LSH_BANDS, 1


def band_recall(rows: int, t: float) -> float:
    """P(a pair at Jaccard similarity t shares a band) under `rows` rows per band."""
    return 1.0 - (1.0 - t ** rows) ** LSH_BANDS


def rows_for(t: float, recall: float) -> Optional[int]:
    """The most rows per band (fewest candidates) whose S-curve finds a pair at exactly t
    with probability `recall`, or None when even one row per band does not."""
    best = None
    for rows in LSH_ROWS:
        if band_recall(rows, t) >= recall:
            best = rows
    return best


def is_band_scheme(scheme: Optional[str]) -> bool:
    """Whether `scheme` names a minhash-lsh-v1 scheme."""
    return lsh_rows(scheme) is not None


def is_band_index(scheme: Optional[str], plan: Any) -> bool:
    """Whether an index of this scheme and plan searches by bands: a minhash-lsh-v1 scheme
    under the plan of a table per band."""
    return is_band_scheme(scheme) and (plan.width, plan.k, plan.blocks, plan.prefix_blocks,
                                       plan.flips) == (BAND_WIDTH, BAND_K, LSH_BANDS, 1, 0)


_KEY_MASK = (1 << KEY_BITS) - 1


def shares_band(a: int, b: int) -> bool:
    """Whether two minhash-lsh-v1 codes share a band's key."""
    x = a ^ b
    return any((x >> (KEY_BITS * t)) & _KEY_MASK == 0 for t in range(LSH_BANDS))


def band_hits(fp: int, hits: list) -> list:
    """The hits of a query at BAND_RADIUS (Matches, or the core's (distance, fingerprint,
    ...) tuples) that share a band's key with it: what the tables return, and of records no
    shard has applied yet (searched by distance alone) the same. A hit within BAND_K bits
    shares one (pigeonhole)."""
    if hits and isinstance(hits[0], Match):
        return [m for m in hits if m.distance <= BAND_K or shares_band(fp, m.fingerprint)]
    return [h for h in hits if h[0] <= BAND_K or shares_band(fp, h[1])]


def band_hits_many(queries: np.ndarray, found: list) -> list:
    """band_hits of each query of an (n, words) array (a batch's answers at BAND_RADIUS)."""
    return [band_hits(fp, hits) for fp, hits in zip(words_to_ints(queries), found)]
