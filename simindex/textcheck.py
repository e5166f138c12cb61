"""The similarity check of an index's text calls: `query_text` and `add_unique_text` with a
threshold ("Jaccard >= t") find candidates within a radius of bits, then keep only those
whose stored sketch passes the threshold.

Only an index that keeps each text's sketch with its record (under minhash-v1, or
calibrated for a threshold) takes a threshold. The radius: the calibration's k when the
index has one for this measure and a threshold at most t (a pair at a higher similarity
differs in fewer bits); else, for minhash-v1 and Jaccard, the model's k at the
calibration's target recall (or DEFAULT_RECALL); else the caller must give k. A candidate
stored without a sketch (by `add`, which has no text) cannot be checked and counts on its
distance alone, as `simindex dedup` counts it.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

from .signatures import _text
from .engine.codec import stored_sketch
from .engine.results import TextMatch, match_of
from .errors import ParameterError
from .signatures.fingerprints import DEFAULT_SCHEME
from .radius import DEFAULT_RECALL, DEFAULT_SCHEME as SIMILARITY_SCHEME, model_k
from .signatures.similarity import estimate, fingerprint_and_set
from .bands import BAND_RADIUS, band_hits, band_recall, is_band_scheme
from .scheme_names import lsh_shape


class Hit(NamedTuple):
    """A record the core found, as it finds it (meta as stored bytes, or None)."""
    distance: int
    fingerprint: int
    seq: int
    id: Any
    meta: Optional[bytes]


class TextCheck(NamedTuple):
    """A threshold `t` on `measure` ("jaccard" or "containment"), searched at radius `k`
    (with `bands` > 0, among the records that share one of that many bands' keys: see
    simindex/bands.py)."""
    k: int
    t: float
    measure: str
    bands: int = 0

    def similar(self, sketch: bytes, size: int, hits: list, fp: int = 0) -> list:
        """TextMatches of the core's hits (distance, fingerprint, seq, id, meta bytes) of a
        query `fp` whose stored text passes against a text of this sketch and shingle
        count."""
        return [TextMatch(*match_of(h), similarity=_rounded(sim))
                for h, sim in self._judged(sketch, size, hits, fp)]

    def passing(self, sketch: bytes, size: int, hits: list, fp: int = 0) -> list:
        """The core's hits (distance, fingerprint, seq, id, meta bytes) of a query `fp`
        whose stored text passes against a text of this sketch and shingle count."""
        return [h for h, _sim in self._judged(sketch, size, hits, fp)]

    def _judged(self, sketch: bytes, size: int, hits: list, fp: int) -> list:
        """(hit, estimated similarity or None) of the hits that pass, each estimated once."""
        found = band_hits(fp, hits, self.bands) if self.bands else hits
        return [(h, sim) for h, sim in zip(found, similarities(found, sketch, size,
                                                                 self.measure))
                if sim is None or sim >= self.t]


def similarities(hits: list, sketch: bytes, size: int, measure: str = "jaccard") -> list:
    """Per hit, its stored text's similarity to a text of this sketch and shingle count,
    estimated from their sketches (None for a record stored without one)."""
    out: list = []
    for h in hits:
        theirs = stored_sketch(h[4])
        out.append(None if theirs is None else
                   estimate(measure, sketch, size, theirs[0], theirs[1]))
    return out


def _rounded(sim: Optional[float]) -> Optional[float]:
    return None if sim is None else round(sim, 4)     # as dedup reports it


def text_matches(hits: list, sketch: bytes, size: int, measure: str = "jaccard") -> list:
    """TextMatches of the core's hits of a text of this sketch and shingle count: each
    with its stored text's similarity (see similarities), rounded to 4 places."""
    return [TextMatch(*match_of(h), similarity=_rounded(sim))
            for h, sim in zip(hits, similarities(hits, sketch, size, measure))]


def keeps_sketches(scheme: Optional[str], calibration: Optional[dict]) -> bool:
    """Whether the text calls store each text's sketch with its record: under the
    similarity schemes (minhash-v1, minhash-lsh-v1), or in an index calibrated for a
    threshold."""
    return scheme == SIMILARITY_SCHEME or is_band_scheme(scheme) or calibration is not None


def sketch_of(shingle_set: Any) -> tuple:
    """(sketch, shingle count) of a shingle set, as a record keeps them."""
    return _text.sketch_of_set(shingle_set), len(shingle_set)


def text_sketch(text: str, scheme: Optional[str], width: int) -> tuple:
    """(fingerprint, (sketch, shingle count)) of `text` under a scheme, from one pass."""
    fp, shingle_set = fingerprint_and_set(text, scheme or DEFAULT_SCHEME, width)
    return fp, sketch_of(shingle_set)


def text_check(scheme: Optional[str], width: int, index_k: int,
               calibration: Optional[dict], min_similarity: Any,
               k: Optional[int]) -> Optional[TextCheck]:
    """The check a text call makes: None when it has no threshold (none given and no
    calibration), else the threshold and the radius that finds it (see the module's
    docstring). `k`, when given, is the radius (already checked against the index's)."""
    if min_similarity is None and calibration is None:
        return None
    if not keeps_sketches(scheme, calibration):
        raise ParameterError(
            f"the index keeps no text sketches to check a threshold against (scheme "
            f"{scheme}, no calibration): make it with Index(path, calibration="
            f"simindex.calibrate(sample_texts, t)) or scheme='minhash-v1'")
    measure = calibration["measure"] if calibration is not None else "jaccard"
    if min_similarity is None:
        t = float(calibration["min_similarity"])       # type: ignore[index]
    elif isinstance(min_similarity, bool) or not isinstance(min_similarity, (int, float)) \
            or not 0 < min_similarity <= 1:
        raise ParameterError(f"min_similarity must be a similarity in (0, 1], got "
                             f"{min_similarity!r}")
    else:
        t = float(min_similarity)
    shape = lsh_shape(scheme)
    if k is not None:             # beyond the index's k, a band index's search
        return TextCheck(k, t, measure, shape[0] if shape is not None and k > index_k else 0)
    if shape is not None:
        bands, rows = shape
        recall = calibration["recall"] if calibration is not None else DEFAULT_RECALL
        if measure == "jaccard" and band_recall(rows, t, bands) < recall and (
                calibration is None or t < calibration["min_similarity"]):
            raise ParameterError(
                f"Jaccard >= {t:g} at recall {recall:g} needs fewer rows per band than this "
                f"index's {rows} ({bands} bands of {rows} find a pair at {t:g} with "
                f"probability {band_recall(rows, t, bands):.4f}): pass a k to search by "
                f"distance, or make an index for this threshold")
        return TextCheck(BAND_RADIUS, t, measure, bands)
    if calibration is not None and t >= calibration["min_similarity"]:
        return TextCheck(min(calibration["k"], index_k), t, measure)
    if scheme == SIMILARITY_SCHEME and measure == "jaccard":
        recall = calibration["recall"] if calibration is not None else DEFAULT_RECALL
        need = model_k(width, t, recall)
        if need > index_k:
            raise ParameterError(
                f"Jaccard >= {t:g} at recall {recall:g} needs k={need} at {width} bits; this "
                f"index's tables reach k={index_k} (pass a smaller k to search less, or make "
                f"the index for this threshold)")
        return TextCheck(need, t, measure)
    assert calibration is not None            # keeps_sketches: minhash-v1 or calibrated
    raise ParameterError(
        f"no radius is known for {measure} >= {t:g}: the index was calibrated for {measure} "
        f">= {calibration['min_similarity']:g} (pass k, or make an index for {t:g} with "
        f"Index(path, calibration=simindex.calibrate(sample_texts, {t:g})))")


def lowest_threshold(scheme: Optional[str], width: int, index_k: int,
                     calibration: Optional[dict]) -> Optional[float]:
    """The least threshold text_check finds a radius for without k (0.0: every one; None:
    none, a caller must give k): the radius shrinks as the threshold grows, so that is the
    boundary, found to the float."""
    def known(t: float) -> bool:
        try:
            text_check(scheme, width, index_k, calibration, t, None)
            return True
        except ParameterError:
            return False
    if not known(1.0):
        return None
    if known(5e-324):
        return 0.0
    lo, hi = 5e-324, 1.0              # not known at lo, known at hi
    while True:
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            return hi
        if known(mid):
            hi = mid
        else:
            lo = mid
