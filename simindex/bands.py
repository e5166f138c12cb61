"""MinHash LSH band search: an index of minhash-lsh-v1 band keys finds the records that share
at least one band's key with a query, and the similarity check decides among them.

A minhash-lsh-v1 code is b band keys of 32 bits (b = 8, 16, 24 or 32: 256 to 1024 bits;
see its scheme). The index holds it under the plan of b blocks of 32 bits with one block per table:
each table is one band, keyed by that band's key, and a probe of a table is an exact-key
lookup. Its Hamming radius k = b - 1 is true but beside the point; its text calls search
at radius BAND_RADIUS (every distance), which returns exactly the records sharing a band,
so a query costs b lookups plus the records that share a band, whatever the size of the
index.

A pair at Jaccard similarity J shares a given band with probability J**r (r rows per band)
and at least one of b with 1 - (1 - J**r)**b (the S-curve), for every corpus.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .engine.results import Match
from .values import words_to_ints
from .errors import ParameterError
from .scheme_names import LSH_ROWS, lsh_bands

KEY_BITS = 32                    # bits of a band's key
BAND_RADIUS = 1024               # the search radius of the text calls: every distance
BANDS = tuple(LSH_ROWS)          # the band counts of the minhash-lsh-v1 family


def band_width(bands: int) -> int:
    """Bits of a code of `bands` band keys."""
    return KEY_BITS * bands


def band_plan(scheme: Optional[str], width: Optional[int], k: Optional[int],
              blocks: Optional[int], prefix_blocks: Optional[int]) -> tuple:
    """(width, k, blocks, prefix_blocks) of a new index of a minhash-lsh-v1 scheme: its one
    plan, a table per band; any other value given raises ParameterError."""
    bands = lsh_bands(scheme) or 8
    want = {"width": band_width(bands), "k": bands - 1, "blocks": bands, "prefix_blocks": 1}
    given = {"width": width, "k": k, "blocks": blocks, "prefix_blocks": prefix_blocks}
    for name, value in given.items():
        if value is not None and value != want[name]:
            raise ParameterError(
                f"an index of {scheme} band keys has {name}={want[name]} (a table per band: "
                f"width {want['width']}, k {want['k']}, blocks {bands}, prefix_blocks 1), "
                f"not {name}={value!r}")
    return want["width"], want["k"], bands, 1


def band_recall(rows: int, t: float, bands: int = 8) -> float:
    """P(a pair at Jaccard similarity t shares one of `bands` bands of `rows` rows)."""
    return 1.0 - (1.0 - t ** rows) ** bands


def rows_for(t: float, recall: float, bands: int = 8) -> Optional[int]:
    """The most rows per band (fewest candidates) whose S-curve of `bands` bands finds a
    pair at exactly t with probability `recall`, or None when even one row per band does
    not."""
    best = None
    for rows in LSH_ROWS[bands]:
        if band_recall(rows, t, bands) >= recall:
            best = rows
    return best


def is_band_scheme(scheme: Optional[str]) -> bool:
    """Whether `scheme` names a minhash-lsh-v1 scheme."""
    return lsh_bands(scheme) is not None


def is_band_index(scheme: Optional[str], plan: Any) -> bool:
    """Whether an index of this scheme and plan searches by bands: a minhash-lsh-v1 scheme
    under the plan of a table per band."""
    bands = lsh_bands(scheme)
    return bands is not None and (plan.width, plan.k, plan.blocks, plan.prefix_blocks,
                                  plan.flips) == (band_width(bands), bands - 1, bands, 1, 0)


_KEY_MASK = (1 << KEY_BITS) - 1


def shares_band(a: int, b: int, bands: int) -> bool:
    """Whether two minhash-lsh-v1 codes of `bands` bands share a band's key."""
    x = a ^ b
    return any((x >> (KEY_BITS * t)) & _KEY_MASK == 0 for t in range(bands))


def band_hits(fp: int, hits: list, bands: int) -> list:
    """The hits of a query at BAND_RADIUS (Matches, or the core's (distance, fingerprint,
    ...) tuples) in an index of `bands` bands that share a band's key with it: what the
    tables return, and of records no shard has applied yet (searched by distance alone)
    the same. A hit within bands - 1 bits shares one (pigeonhole)."""
    k = bands - 1
    if hits and isinstance(hits[0], Match):
        return [m for m in hits if m.distance <= k or shares_band(fp, m.fingerprint, bands)]
    return [h for h in hits if h[0] <= k or shares_band(fp, h[1], bands)]


def band_hits_many(queries: np.ndarray, found: list, bands: int) -> list:
    """band_hits of each query of an (n, words) array (a batch's answers at BAND_RADIUS);
    a query without hits keeps its empty list (most queries: only those with hits have
    their codes made ints)."""
    out = list(found)
    hit = [i for i, hits in enumerate(found) if hits]
    if hit:
        for i, fp in zip(hit, words_to_ints(queries[hit])):
            out[i] = band_hits(fp, found[i], bands)
    return out
