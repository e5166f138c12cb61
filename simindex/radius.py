"""A radius from the data: the signature width and the k that find near-duplicates at a
similarity threshold ("Jaccard >= t"), with the recall and the cost of each choice.

For minhash-v1 the model decides: two texts' bits differ with probability (1 - J) / 2, so a
pair at exactly J = t lies within k bits of w with probability P(Binomial(w, (1 - t) / 2)
<= k), and every pair above t with more. The k chosen at each width is the least whose
probability reaches the target recall; that holds for every pair, whatever the corpus. For
the simhash schemes no such model exists: k is the least that finds the target share of
the sample's own pairs at or above t.

The sample (the first rows of the input) then measures what the model cannot know: how
many of its pairs at or above t each k finds (with a one-sided Clopper-Pearson lower bound
at 95%; pairs that share a document are not independent, so read it as a guide), how many
pairs lie within k bits (the candidates the exact check must read), and the time of each
step, from which the width of least estimated time is chosen.
"""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

from .signatures import _text
from .errors import InputError, ParameterError
from .signatures.fingerprints import (
    WORD_SCHEMES, pass_args, scheme_name, scheme_width, schemes,
)
from .engine.plan import SEEK_NS, default_plan, query_cost
from .bands import BANDS, KEY_BITS, band_recall, band_width, rows_for
from .scheme_names import LSH_ROWS, lsh_name, lsh_rows, lsh_shape
from .signatures.similarity import shingle_set

DEFAULT_SCHEME = "minhash-v1"     # the scheme a similarity threshold gets unless told
DEFAULT_RECALL = 0.99
SAMPLE_ROWS = 2000                # rows the calibration reads by default
MODEL_ROWS = 1_000_000            # rows a calibration without a sample is made for
CONFIDENCE = 0.95
MEASURES = ("jaccard", "containment")


class Choice(NamedTuple):
    """One row of a calibration's table: a width, its k, and what that costs."""
    width: int
    k: int
    model_recall: Optional[float]   # P(a pair at exactly t is found), minhash-v1 only
    pairs: int                      # sample pairs at or above t
    found: int                      # ... within k bits
    recall_low: Optional[float]     # lower confidence bound of found / pairs
    candidates: float               # pairs within k bits per row, at the expected size
    query_us: float                 # estimated search time per row
    seconds: float                  # estimated time of the whole run
    capped: bool = False            # k lowered below the recall's to fit the time budget
    scheme: Optional[str] = None    # its scheme: the calibration's, or minhash-lsh-v1's
                                    # band search (k is then its plan's, see bands.py)

    def reached(self, measure: str) -> float:
        """The recall this k is expected to reach: the model's (Jaccard), else the
        sample's."""
        if self.model_recall is not None and measure == "jaccard":
            return self.model_recall
        return self.found / self.pairs if self.pairs else 0.0


class Calibration(NamedTuple):
    """The signature and radius chosen for a threshold, and the evidence behind them."""
    scheme: str
    width: int
    k: int
    min_similarity: float
    measure: str                    # "jaccard" or "containment"
    recall: float                   # the target
    expected_recall: float          # the model's (minhash-v1, Jaccard) or the sample's
    sample_rows: int
    expected_rows: int
    table: tuple                    # of Choice, one per width weighed
    time_budget: Optional[float] = None     # seconds the run may take, if capped

    @property
    def chosen(self) -> Choice:
        return next(c for c in self.table if c.width == self.width and
                    (c.scheme or self.scheme) == self.scheme)

    def stored(self) -> dict:
        """What an index keeps of it, so that later runs judge alike."""
        return {"scheme": self.scheme, "width": self.width, "k": self.k,
                "min_similarity": self.min_similarity, "measure": self.measure,
                "recall": self.recall, "expected_recall": self.expected_recall}

    def describe(self) -> str:
        """One line for a summary."""
        c = self.chosen
        sample = (f"{c.found}/{c.pairs} sample pairs found" if c.pairs else
                  "the model's, at the threshold" if c.model_recall is not None else
                  "no sample pair at the threshold")
        if 0 < c.pairs < BOUND_PAIRS and c.model_recall is not None:
            sample += (f": too few for the sample to bound the recall (all of "
                       f"{BOUND_PAIRS} found would bound it at 0.95), so the model's")
        capped = (f"; k is capped by the time budget of {self.time_budget:g} s, below the "
                  f"{self.recall:g} recall asked for" if c.capped else "")
        shape = lsh_shape(self.scheme)
        search = f"{shape[0]} bands of {shape[1]} rows" if shape is not None else f"k={self.k}"
        return (f"{self.measure} >= {self.min_similarity:g}: {self.scheme} {self.width} "
                f"bits, {search}, expected recall {self.expected_recall:.4f} ({sample}), "
                f"estimated {c.seconds:.3g} s{capped}")


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    lp, lq = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                          + i * lp + (n - i) * lq)
    return min(total, 1.0)


def model_recall(width: int, k: int, t: float) -> float:
    """The share of pairs at exactly Jaccard t that minhash-v1 puts within k of w bits."""
    return binomial_cdf(k, width, (1.0 - t) / 2.0)


def model_k(width: int, t: float, recall: float) -> int:
    """The least k whose model recall at Jaccard t reaches `recall` (at most width - 1)."""
    for k in range(width):
        if model_recall(width, k, t) >= recall:
            return k
    return width - 1


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (Lentz's continued fraction)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _betainc(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(1000):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-12:
            break
    return front * (f - 1.0)


# sample pairs whose every one found bounds the recall at 0.95 (at CONFIDENCE): fewer say
# little (1 pair found bounds it at 0.05), and the model's recall stands for them
BOUND_PAIRS = 59


def recall_lower_bound(found: int, pairs: int, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper-Pearson lower bound of a share found/pairs (0 without pairs): the p
    at which P(X >= found) = 1 - confidence, X ~ Binomial(pairs, p)."""
    if pairs == 0 or found == 0:
        return 0.0
    alpha = 1.0 - confidence
    if found == pairs:
        return alpha ** (1.0 / pairs)
    lo, hi = 0.0, found / pairs
    for _ in range(50):      # P(X >= found | p) = I_p(found, pairs - found + 1) grows with p
        mid = (lo + hi) / 2
        if _betainc(found, pairs - found + 1, mid) < alpha:
            lo = mid
        else:
            hi = mid
    return lo


def _check_threshold(t: Any) -> float:
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 1:
        raise ParameterError(f"min_similarity must be a similarity in (0, 1], got {t!r}")
    return float(t)


def _check_recall(r: Any) -> float:
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 < r < 1:
        raise ParameterError(f"recall must be a share in (0, 1), got {r!r}")
    return float(r)


COMMON = 32          # a hash bucket in more sample sets than this is common (see sample_pairs)
# A candidate in a run: its record's read and the exact check's call, then a merge of the two
# sorted sets (the merge measured on a 2-core VM: 8.4 us for two sets of 2,000 shingles; a
# candidate of 118 shingles costs a run ~10 us: tools/candidate_cost.py, on rows that no
# benchmark reports on)
CHECK_NS, CHECK_NS_PER_SHINGLE = 9500.0, 2.1
# A band search's cost per band and row in a run: the lookup of the row's key in the band's
# table and the write of its entry (tools/candidate_cost.py: ~1.2 us at 20,000 rows; on
# 300,000 random codes added to an index ~0.9 us a lookup and ~0.6 us a write)
BAND_NS = 1500.0


def sample_pairs(sets: Sequence[np.ndarray], t: float, measure: str = "jaccard") -> tuple:
    """(i, j) arrays of every pair i < j of shingle sets (sorted distinct hashes) whose
    similarity is at least t: Jaccard |A & B| / |A | B|, or containment |A & B| / |B|, B
    the later set (the share of the row a greedy run judges that is found in the earlier).

    A pair needs |A & B| >= m, with m = t * max(|A|, |B|) for Jaccard and t * |B| for
    containment. Hashes are counted in 2**20 buckets; a sparse product over the buckets in
    at most COMMON sets bounds what two sets share there, and h(A), A's hashes in common
    buckets, bounds the rest by min(h(A), h(B)). Pairs whose bound reaches m are measured
    exactly: those the product links, and those of sets whose common hashes alone could
    reach it (boilerplate-heavy ones)."""
    import scipy.sparse as sp
    n = len(sets)
    if n < 2:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    sizes = np.array([len(x) for x in sets], dtype=np.int64)
    rows_of = np.repeat(np.arange(n), sizes)
    cols = (np.concatenate(sets) >> np.uint64(44)).astype(np.int64) if sizes.sum() else \
        np.empty(0, np.int64)
    X = sp.csr_matrix((np.ones(len(cols), np.int32), (rows_of, cols)), shape=(n, 1 << 20))
    df = np.bincount(X.indices, minlength=1 << 20)
    common = df[X.indices] > COMMON
    entry_rows = np.repeat(np.arange(n), np.diff(X.indptr))
    h = np.bincount(entry_rows, weights=np.where(common, X.data, 0),
                    minlength=n).astype(np.int64)
    X.data = np.where(common, 0, X.data)
    X.eliminate_zeros()
    XT = X.T.tocsr()
    jaccard_ = measure == "jaccard"

    def need(i, j):
        return t * (np.maximum(sizes[i], sizes[j]) if jaccard_ else sizes[j]) - 1e-9
    cand: set = set()
    for start in range(0, n, 512):
        inter = (X[start:start + 512] @ XT).tocoo()
        i, j = inter.row + start, inter.col
        keep = j > i
        i, j, a = i[keep], j[keep], inter.data[keep]
        keep = a + np.minimum(h[i], h[j]) >= need(i, j)
        cand.update(zip(i[keep].tolist(), j[keep].tolist()))
    # pairs the product does not link: the later set's common hashes alone reach m
    for j in np.flatnonzero(h >= t * sizes - 1e-9).tolist():
        i = np.flatnonzero(np.minimum(h[:j], h[j]) >= need(np.arange(j), j))
        cand.update((x, j) for x in i.tolist())
    out_i, out_j = [], []
    for x, y in sorted(cand):
        inter_xy = _text.intersection_size(sets[x], sets[y])
        base = (sizes[x] + sizes[y] - inter_xy) if jaccard_ else sizes[y]
        if inter_xy >= t * max(base, 1) - 1e-9:
            out_i.append(x)
            out_j.append(y)
    return np.array(out_i, dtype=np.int64), np.array(out_j, dtype=np.int64)


_POP8 = np.array([bin(x).count("1") for x in range(256)], dtype=np.uint8)


def pair_distances(codes: np.ndarray) -> np.ndarray:
    """The (n, n) Hamming distances of codes given as (n, words) uint64."""
    n = len(codes)
    out = np.zeros((n, n), dtype=np.uint16)
    for q in range(codes.shape[1]):
        col = codes[:, q]
        for start in range(0, n, 256):
            x = col[start:start + 256, None] ^ col[None, :]
            if hasattr(np, "bitwise_count"):
                out[start:start + 256] += np.bitwise_count(x)
            else:
                out[start:start + 256] += _POP8[x.view(np.uint8)].reshape(
                    x.shape + (8,)).sum(axis=2, dtype=np.uint16)
    return out


def _sample(texts: list, scheme: str, widths: list, sets: Optional[list] = None,
            seconds: Optional[float] = None) -> tuple:
    """(shingle sets, {width: codes as (n, words) uint64}, seconds per text of the pass)
    of the sample: minhash-v1's codes come from the sets of one pass (or from `sets`, made
    by the caller's pass of `seconds`)."""
    from .signatures.fingerprints import fingerprint
    start = time.perf_counter()
    if sets is not None and (scheme == "minhash-v1" or lsh_rows(scheme) is not None):
        start -= seconds or 0.0
    elif scheme in WORD_SCHEMES:
        sets = _text.signatures(texts, schemes[scheme].shingle_width, shingles=True,
                                distinct=True)[2]
        assert sets is not None
    else:
        sets = [shingle_set(x, scheme) for x in texts]
    codes = {}
    for w in widths:
        if scheme == "minhash-v1":
            codes[w] = _text.minhash_codes(sets, w // 64)
        elif scheme in WORD_SCHEMES:
            codes[w] = _text.signatures(texts, schemes[scheme].shingle_width,
                                        **pass_args(scheme, w))[0]
        else:
            words = w // 64
            fps = [fingerprint(x, scheme=scheme, width=w) for x in texts]
            codes[w] = np.array([[(f >> (64 * (words - 1 - q))) & ((1 << 64) - 1)
                                  for q in range(words)] for f in fps], dtype=np.uint64)
    return sets, codes, (time.perf_counter() - start) / max(len(texts), 1)


def calibrate(texts: Sequence[str], min_similarity: float, *,
              recall: float = DEFAULT_RECALL, scheme: Optional[str] = None,
              measure: str = "jaccard", expected_rows: Optional[int] = None,
              widths: Optional[Sequence[int]] = None,
              sample_truth: bool = True, sets: Optional[list] = None,
              pass_seconds: Optional[float] = None,
              time_budget: Optional[float] = None, bands: bool = True) -> Calibration:
    """The width and k of least estimated time that reach `recall` at `min_similarity`
    (see the module's docstring), from a sample of texts. `expected_rows`: the rows of the
    whole input (default: the sample's), for the cost of the search and the check.
    `sample_truth=False` skips measuring the sample's own pairs where the model alone
    decides (minhash-v1 and Jaccard); elsewhere they are always measured. `sets`: the
    texts' shingle sets (sorted distinct xxh3-64 hashes) when the caller has them, made in
    `pass_seconds`. With no texts (a crawl that has none yet), minhash-v1 and Jaccard are
    calibrated from the model alone, for `expected_rows` (default MODEL_ROWS) rows.
    `time_budget`: the seconds the whole run may take; a width whose k would take longer
    gets the largest k that fits (the Choice is then `capped`, its recall below the
    target), and when every width is capped the one of highest expected recall is chosen.
    With no scheme named and Jaccard, `bands` also weighs the band search of
    minhash-lsh-v1 (see simindex/bands.py: its rows per band are the most whose S-curve
    reaches the recall at the threshold), whose cost per row does not grow with the rows."""
    t = _check_threshold(min_similarity)
    recall = _check_recall(recall)
    if time_budget is not None and (isinstance(time_budget, bool) or not isinstance(
            time_budget, (int, float)) or not time_budget > 0):
        raise ParameterError(f"time_budget must be a number of seconds > 0, got "
                             f"{time_budget!r}")
    if expected_rows is not None and (isinstance(expected_rows, bool) or not isinstance(
            expected_rows, int) or expected_rows < 1):
        raise ParameterError(f"expected_rows must be a number of rows >= 1, got "
                             f"{expected_rows!r}")
    if widths is not None and not list(widths):
        raise ParameterError("widths must name at least one width")
    bands = bands and scheme is None          # a scheme named is the one searched with
    scheme = scheme_name(DEFAULT_SCHEME if scheme is None else scheme)
    if measure not in MEASURES:
        raise ParameterError(f"measure must be one of {', '.join(MEASURES)}, got {measure!r}")
    texts = [x for x in texts]
    fixed = lsh_shape(scheme)
    if fixed is not None:
        return _band_calibration(texts, fixed, t, recall, measure, expected_rows, widths,
                                 sample_truth, sets, pass_seconds, time_budget)
    weigh_bands = bands and scheme == "minhash-v1" and measure == "jaccard"
    shapes = _band_shapes(t, recall, widths) if weigh_bands else []
    # the widths of band codes alone (512 to 1024 bits) ask for those band searches only
    band_only = {band_width(b) for b in BANDS} - set(schemes[scheme].widths) \
        if weigh_bands else set()
    widths = [w for w in (schemes[scheme].widths if widths is None else widths)
              if w not in band_only]
    if not widths and not shapes:
        raise ParameterError(f"no band search of the widths asked reaches a recall of "
                             f"{recall:g} at {t:g}")
    if not texts:
        if scheme != "minhash-v1" or measure != "jaccard":
            raise InputError(f"calibrating {scheme} for {measure} needs a sample of texts; "
                             f"only minhash-v1 and Jaccard have a model to go without")
        return _model_calibration(t, recall, expected_rows or MODEL_ROWS, widths,
                                  time_budget, shapes)
    n = len(texts)
    rows = max(n, expected_rows or n)
    for w in widths:
        scheme_width(scheme, w)
    sets, codes, pass_s = _sample(texts, scheme, widths, sets, pass_seconds)
    minhash = scheme == "minhash-v1"
    if sample_truth or not minhash or measure != "jaccard":
        pi, pj = sample_pairs(sets, t, measure)
    else:
        pi = pj = np.empty(0, np.int64)
    # the exact check's cost per candidate pair, from the model (not a timing: the same
    # sample must choose the same width on any run)
    mean_set = float(np.mean([len(x) for x in sets])) if sets else 0.0
    check_s = (CHECK_NS + 2 * mean_set * CHECK_NS_PER_SHINGLE) * 1e-9
    table = []
    upper = np.triu_indices(n, 1)
    for w in widths:
        dist = pair_distances(codes[w])
        true_d = np.sort(dist[pi, pj]) if len(pi) else np.empty(0, np.uint16)
        within_d = np.sort(dist[upper])
        if minhash:
            k = model_k(w, t, recall)
            if measure == "containment" and len(true_d):
                k = max(k, _sample_k(true_d, recall))
        else:
            k = _sample_k(true_d, recall) if len(true_d) else 0

        related_d = _related_distances(sets, dist, k)

        def choice(k: int, capped: bool = False) -> Choice:
            found = int(np.searchsorted(true_d, k, side="right"))
            within = int(np.searchsorted(within_d, k, side="right"))
            related = int(np.searchsorted(related_d, k, side="right"))
            candidates = _per_row(related, within - related, n, rows)
            m, p = default_plan(k, expected=max(rows // 2, 1), width=w)
            query_ns = query_cost(k, m, max(rows // 2, 1), None, p, w)
            seconds = rows * (pass_s + query_ns * 1e-9 + candidates * check_s)
            return Choice(w, k, model_recall(w, k, t) if minhash else None, len(true_d),
                          found, recall_lower_bound(found, len(true_d)) if len(true_d)
                          else None, candidates, query_ns / 1000, seconds, capped, scheme)
        table.append(_within_budget(choice, min(k, w - 1), time_budget))
    for b, r in shapes:
        table.append(_band_within_budget(
            lambda r_, capped, b=b: _band_choice(sets, b, r_, t, pi, pj, rows, pass_s,
                                                 check_s, capped), b, r, time_budget))
    return _chosen(table, scheme, t, measure, recall, n, rows, time_budget)


def _band_shapes(t: float, recall: float, widths: Optional[Sequence[int]]) -> list:
    """(bands, rows) of each band search that reaches `recall` at t: per band count, the
    most rows per band that does (its width among `widths` when they are given)."""
    out = []
    for b in BANDS:
        r = rows_for(t, recall, b)
        if r is not None and (widths is None or band_width(b) in widths):
            out.append((b, r))
    return out


def _band_within_budget(choice: Any, bands: int, r: int, budget: Optional[float]) -> Choice:
    """choice(r, False), or with a budget it exceeds, choice(r', True) of the fewest rows
    per band r' > r (fewer candidates, less recall) that fits it (the most when none
    does)."""
    c = choice(r, False)
    if budget is None or c.seconds <= budget:
        return c
    for more in range(r + 1, LSH_ROWS[bands][-1] + 1):
        c = choice(more, True)
        if c.seconds <= budget:
            break
    return c if c.capped else choice(r, True)


def _band_calibration(texts: list, shape: tuple, t: float, recall: float, measure: str,
                      expected_rows: Optional[int], widths: Optional[Sequence[int]],
                      sample_truth: bool, sets: Optional[list], pass_seconds: Optional[float],
                      budget: Optional[float]) -> Calibration:
    """calibrate() for a minhash-lsh-v1 scheme the caller named: its one band search, with
    the bands and rows per band the name gives (its recall is the S-curve's at t, whatever
    asked)."""
    bands, r = shape
    scheme = lsh_name(r, bands)
    width = band_width(bands)
    if measure != "jaccard":
        raise ParameterError(f"{scheme} finds candidates at a Jaccard similarity; a "
                             f"{measure} threshold needs minhash-v1's search by distance")
    if widths is not None and list(widths) != [width]:
        raise ParameterError(f"{scheme} makes {width}-bit fingerprints, not "
                             f"{', '.join(map(str, widths))}")
    if not texts:
        rows = expected_rows or MODEL_ROWS
        return _chosen([_model_band_choice(bands, r, t, rows)], scheme, t, measure, recall, 0,
                       rows, budget)
    n = len(texts)
    rows = max(n, expected_rows or n)
    sets, _, pass_s = _sample(texts, scheme, [], sets, pass_seconds)
    pi, pj = sample_pairs(sets, t, measure) if sample_truth else \
        (np.empty(0, np.int64), np.empty(0, np.int64))
    mean_set = float(np.mean([len(x) for x in sets])) if sets else 0.0
    check_s = (CHECK_NS + 2 * mean_set * CHECK_NS_PER_SHINGLE) * 1e-9
    choice = _band_choice(sets, bands, r, t, pi, pj, rows, pass_s, check_s)   # as named
    return _chosen([choice], scheme, t, measure, recall, n, rows, budget)


GROUP_PAIRS = 64    # rows of one band key whose pairs are listed one by one


def band_pairs(codes: np.ndarray) -> tuple:
    """(i, j, more) of minhash-lsh-v1 codes ((n, words) uint64, two bands a word): the
    arrays of the pairs i < j that share a band's key, each pair once, and `more`, the
    pairs of keys shared by more than GROUP_PAIRS rows, counted (once per band) but not
    listed."""
    found: set = set()
    more = 0
    for b in range(2 * codes.shape[1]):
        word = codes[:, b // 2]
        keys = (word >> np.uint64(32)) if b % 2 == 0 else (word & np.uint64(0xFFFFFFFF))
        order = np.argsort(keys, kind="stable")
        ks = keys[order]
        starts = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
        ends = np.r_[starts[1:], len(ks)]
        for a, e in zip(starts[ends - starts > 1].tolist(), ends[ends - starts > 1].tolist()):
            if e - a > GROUP_PAIRS:
                more += (e - a) * (e - a - 1) // 2
                continue
            group = sorted(order[a:e].tolist())
            found.update((x, y) for n_, x in enumerate(group) for y in group[n_ + 1:])
    pairs = sorted(found)
    return (np.array([p[0] for p in pairs], dtype=np.int64),
            np.array([p[1] for p in pairs], dtype=np.int64), more)


RELATED = 0.2       # a sample pair this similar is a near-copy's, not a chance meeting


def _per_row(related: int, chance: int, n: int, rows: int) -> float:
    """The candidates a row meets among the rows before it in an input of `rows` rows, from
    the sample's (n rows) pairs a search proposes: pairs of related texts (Jaccard >=
    RELATED) come with a row's near-copies, whose number per row does not grow with the
    input; the others are chance meetings, a share of every pair, which does."""
    if n < 2:
        return 0.0
    return related / n + chance / (n * (n - 1) / 2) * (rows - 1) / 2


def _related_distances(sets: list, dist: np.ndarray, k: int) -> np.ndarray:
    """The sorted distances of the sample's related pairs (Jaccard >= RELATED) within k."""
    i, j = np.nonzero(np.triu(dist <= k, 1))
    return np.sort(np.array([dist[x, y] for x, y in zip(i.tolist(), j.tolist())
                             if _jaccard(sets[x], sets[y]) >= RELATED], dtype=np.int64))


def candidates_per_row(sets: list, i: np.ndarray, j: np.ndarray, rows: int,
                       more: int = 0) -> float:
    """_per_row of the sample pairs (i, j) a search proposes, and `more` pairs of one band
    key shared by many rows, counted as related (copies: a band key is R MinHash values
    the rows share), as the search by distance counts such rows' pairs."""
    related = sum(1 for x, y in zip(i.tolist(), j.tolist())
                  if _jaccard(sets[x], sets[y]) >= RELATED)
    return _per_row(related + more, len(i) - related, len(sets), rows)


def _jaccard(a: np.ndarray, b: np.ndarray) -> float:
    inter = _text.intersection_size(a, b)
    return inter / max(len(a) + len(b) - inter, 1)


def _share_band(codes: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Whether codes i and j (rows of an (n, words) uint64 array) share a band's key."""
    x = codes[i] ^ codes[j]
    lo, hi = x & np.uint64(0xFFFFFFFF), x >> np.uint64(32)
    return ((lo == 0) | (hi == 0)).any(axis=1)


def _band_choice(sets: list, bands: int, r: int, t: float, pi: np.ndarray, pj: np.ndarray,
                 rows: int, pass_s: float, check_s: float, capped: bool = False) -> Choice:
    """The band search's row of a calibration: `bands` bands of `r` rows, its S-curve's
    recall at t; its candidates per row are the sample's pairs that share a band
    (candidates_per_row) and the 32-bit collisions of the rows' keys, its search a lookup
    per band."""
    codes = _text.minhash_codes(sets, bands // 2, r)
    found = int(_share_band(codes, pi, pj).sum()) if len(pi) else 0
    bi, bj, more = band_pairs(codes)
    candidates = candidates_per_row(sets, bi, bj, rows, more) + \
        (rows - 1) / 2 * bands / 2.0 ** KEY_BITS
    query_ns = bands * BAND_NS
    seconds = rows * (pass_s + query_ns * 1e-9 + candidates * check_s)
    return Choice(band_width(bands), bands - 1, band_recall(r, t, bands), len(pi), found,
                  recall_lower_bound(found, len(pi)) if len(pi) else None, candidates,
                  query_ns / 1000, seconds, capped, lsh_name(r, bands))


def _model_band_choice(bands: int, r: int, t: float, rows: int) -> Choice:
    """The band search's row of a calibration without a sample: unrelated texts share no
    band but by a 32-bit collision."""
    candidates = (rows - 1) / 2 * bands / 2.0 ** KEY_BITS
    query_ns = bands * BAND_NS
    return Choice(band_width(bands), bands - 1, band_recall(r, t, bands), 0, 0, None,
                  candidates, query_ns / 1000, rows * (query_ns + candidates * CHECK_NS) * 1e-9,
                  False, lsh_name(r, bands))


def _within_budget(choice: Any, k: int, budget: Optional[float]) -> Choice:
    """choice(k), or with a budget it exceeds, choice(k') of the largest k' < k that fits
    it (k' = 0 when none does), marked capped."""
    c = choice(k)
    if budget is None or c.seconds <= budget:
        return c
    lo, hi = 0, k - 1                  # the estimated time grows with k: bisect
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if choice(mid).seconds <= budget:
            lo = mid
        else:
            hi = mid - 1
    return choice(lo, capped=True)


def _chosen(table: list, scheme: str, t: float, measure: str, recall: float, n: int,
            rows: int, budget: Optional[float]) -> Calibration:
    """The calibration of the width (or band search) of least estimated time among those
    whose k reaches the recall (of highest expected recall when the budget capped every
    width)."""
    full = [c for c in table if not c.capped]
    best = min(full, key=lambda c: (c.seconds, c.width)) if full else \
        max(table, key=lambda c: (c.reached(measure), -c.seconds, -c.width))
    return Calibration(best.scheme or scheme, best.width, best.k, t, measure, recall,
                       best.reached(measure), n, rows, tuple(table), budget)


def _model_calibration(t: float, recall: float, rows: int, widths: list,
                       budget: Optional[float] = None, shapes: Sequence = ()) -> Calibration:
    """calibrate() without a sample: minhash-v1's k from the model, and the width of least
    estimated time taking unrelated texts as sharing no shingle (their bits differ with
    probability 1/2) and the pass's time as the same at every width."""
    table = []
    for w in widths:
        scheme_width("minhash-v1", w)

        def choice(k: int, capped: bool = False) -> Choice:
            candidates = binomial_cdf(k, w, 0.5) * (rows - 1) / 2
            m, p = default_plan(k, expected=max(rows // 2, 1), width=w)
            query_ns = query_cost(k, m, max(rows // 2, 1), None, p, w)
            seconds = rows * (query_ns + candidates * CHECK_NS) * 1e-9
            return Choice(w, k, model_recall(w, k, t), 0, 0, None, candidates,
                          query_ns / 1000, seconds, capped, "minhash-v1")
        table.append(_within_budget(choice, model_k(w, t, recall), budget))
    table += [_model_band_choice(b, r, t, rows) for b, r in shapes]
    return _chosen(table, "minhash-v1", t, "jaccard", recall, 0, rows, budget)


def _sample_k(sorted_distances: np.ndarray, recall: float) -> int:
    """The least k that finds `recall` of pairs with these (sorted) distances."""
    need = max(1, math.ceil(recall * len(sorted_distances)))
    return int(sorted_distances[need - 1])
