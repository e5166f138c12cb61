"""What a dedup run judges by, settled before its first row: its input files, its options
checked, the radius (given, or calibrated on the input's first rows), the index and the
reference it reads, and the token that names the run in the records it keeps."""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any, Iterable, Optional, Union

from ..engine._layout import MANIFEST
from ..errors import InputError, ParameterError
from ..index import Index
from ..bands import BAND_RADIUS
from ..scheme_names import lsh_rows
from ..radius import DEFAULT_RECALL, SAMPLE_ROWS, Calibration, calibrate
from ..radius import DEFAULT_SCHEME as SIMILARITY_SCHEME
from ..signatures import _text
from ..signatures.fingerprints import DEFAULT_SCHEME
from .rows import format_of, open_bytes, read_rows

# what a run reads to choose its radius when none is given: the model decides k, the
# sample the width (its pairs within k, the cost of each step)
RUN_SAMPLE_ROWS, RUN_SAMPLE_BYTES = 1000, 2 << 20
MODES = ("greedy", "components")
DEFAULT_K = 3


def run_token(inputs: list, text_field: str, id_field: Optional[str],
              fingerprint_field: Optional[str], judging: str = "") -> bytes:
    """8 bytes naming a run: its inputs (absolute paths), the fields it reads and how it
    judges (`judging`: its mode, k and check). A re-run of the same command has the same
    token (see the module's docstring); one that judges otherwise is another run."""
    h = hashlib.blake2b(digest_size=8)
    for part in [*map(os.path.abspath, inputs), text_field, id_field or "",
                 fingerprint_field or "", judging]:
        h.update(part.encode("utf-8", "surrogateescape") + b"\0")
    return h.digest()


def input_files(inputs: Union[str, Iterable[str]]) -> list:
    """The files of a run's inputs, in order: each file as given, and each directory's
    files of a known format (by extension; hidden ones left out) in name order: a directory
    of shards reads as the shards one after another."""
    paths = [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs)
    out = []
    for p in map(os.fspath, paths):
        if not os.path.isdir(p):
            out.append(p)
            continue
        names = sorted(n for n in os.listdir(p) if not n.startswith((".", "_")) and
                       os.path.isfile(os.path.join(p, n)) and _known_format(n))
        if not names:
            raise ParameterError(f"{p}: the directory holds no .jsonl, .csv or .parquet "
                                 f"file (optionally .gz)")
        out += [os.path.join(p, n) for n in names]
    return out


def _known_format(name: str) -> bool:
    try:
        format_of(name)
    except ParameterError:
        return False
    return True


def check_options(mode: Optional[str], keep: str, drop_all: bool, jobs: int,
                  min_similarity: Optional[float], recall: Optional[float],
                  on_error: Any) -> str:
    """The mode a run's options choose, each option checked (ParameterError naming it)."""
    if mode is None:
        mode = "components" if drop_all or keep != "first" else "greedy"
    if mode not in MODES:
        raise ParameterError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    if mode == "greedy" and (keep != "first" or drop_all):
        raise ParameterError("keep and drop_all choose among a component's rows: they need "
                             "mode='components'")
    if not isinstance(keep, str) or not keep:
        raise ParameterError(f"keep must be 'first', 'longest' or a column name, got {keep!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ParameterError(f"jobs must be an int >= 1, got {jobs!r}")
    if min_similarity is not None and (isinstance(min_similarity, bool) or not isinstance(
            min_similarity, (int, float)) or not 0 < min_similarity <= 1):
        raise ParameterError(f"min_similarity must be a similarity in (0, 1], got "
                             f"{min_similarity!r}")
    if recall is not None and (isinstance(recall, bool) or not isinstance(
            recall, (int, float)) or not 0 < recall < 1):
        raise ParameterError(f"recall must be a share in (0, 1), got {recall!r}")
    if on_error not in ("stop", "skip") and not callable(on_error):
        raise ParameterError(f"on_error must be 'stop', 'skip' or a callable, got "
                             f"{on_error!r}")
    return mode


def choose_radius(paths: list, new: bool, *, k: Optional[int], scheme: Optional[str],
                  width: Optional[int], min_similarity: Optional[float],
                  recall: Optional[float], measure: str, fmt: Optional[str],
                  text_field: str, fingerprint_field: Optional[str],
                  time_budget: Optional[float], summary: Any, bands: bool = True) -> tuple:
    """(calibration or None, the shingle sets it made, scheme, width, empty) of a run: for
    a new index with a similarity threshold and no k, the radius calibrated on the input's
    first rows (RUN_SAMPLE_ROWS or RUN_SAMPLE_BYTES), the band search weighed too unless
    the run names its scheme or not `bands`; `empty` when there is none to calibrate on
    because the input holds no row (the run then judges nothing, and must not make the
    index at a radius it never chose)."""
    cal = None
    made: dict = {}           # rows the calibration already read: their shingle sets
    if new:
        bands = bands and scheme is None
        if min_similarity is not None and scheme is None and fingerprint_field is None:
            scheme = SIMILARITY_SCHEME      # fingerprints read from a column are not
        if min_similarity is not None and k is None and fingerprint_field is None:
            cal, made = calibrate_with_sets(       # no scheme named: the bands weighed too
                paths, min_similarity, fmt=fmt, text_field=text_field, recall=recall,
                scheme=None if bands else scheme, width=width, measure=measure,
                sample=RUN_SAMPLE_ROWS,
                sample_bytes=RUN_SAMPLE_BYTES, sample_truth=False, time_budget=time_budget,
                bands=bands)
            if cal is None:
                return None, made, scheme, width, True
            summary.calibration = cal
            scheme, width = cal.scheme, cal.width
    return cal, made, scheme, width, False


def open_indexes(index: str, against: Optional[str], new: bool, cal: Optional[Calibration], *,
                 k: Optional[int], scheme: Optional[str], width: Optional[int],
                 min_similarity: Optional[float], measure: str, summary: Any) -> tuple:
    """(index, reference or None, k, threshold, measure) of a run: a new index is made for
    k (default DEFAULT_K, or the calibration's); an existing one is asked at k, which must
    not exceed its own, and keeps its calibration (and so the threshold it judges by).
    Batches commit without fsync: the caller's flush at the end makes them durable."""
    idx = ref = None
    try:
        idx = Index(index, k=(cal.k if cal is not None else DEFAULT_K if k is None else k)
                    if new else None, scheme=scheme, width=width, sync=False,
                    calibration=cal.stored() if cal is not None else None,
                    expected=cal.expected_rows if cal is not None else None)
        stored = idx.calibration
        if stored is not None:
            if min_similarity is not None and (min_similarity != stored["min_similarity"] or
                                               measure != stored["measure"]):
                raise ParameterError(
                    f"the index {index} was calibrated for {stored['measure']} >= "
                    f"{stored['min_similarity']:g}; give that threshold (or none) so this "
                    f"run judges as the earlier ones did")
            min_similarity, measure = stored["min_similarity"], stored["measure"]
        if against is not None:
            if not os.path.exists(os.path.join(against, MANIFEST)):
                raise ParameterError(f"the reference index {against} does not exist (no "
                                     f"simindex index there)")
            ref = Index(against, readonly=True)
            how = matching_reference(idx, min_similarity, measure)
            if ref.width != idx.width:
                raise ParameterError(f"the reference index {against} holds {ref.width}-bit "
                                     f"fingerprints, this run {idx.width}-bit ones; {how}")
            if (idx.bands or ref.bands) and ref.scheme != idx.scheme:
                raise ParameterError(f"the reference index {against} holds {ref.scheme} "
                                     f"fingerprints, this run {idx.scheme} ones: a band "
                                     f"search compares band keys of one scheme only; {how}")
            if ref.k < idx.k:
                raise ParameterError(f"the reference index {against} finds up to k="
                                     f"{ref.k}, this run needs k={idx.k}; {how}")
        if idx.bands is not None and min_similarity is None:
            raise ParameterError(f"the index {index} holds {idx.scheme} band keys, which "
                                 f"find candidates for a similarity check: give "
                                 f"--min-similarity")
        kk = idx.k if k is None else k
        if kk > idx.k:
            raise ParameterError(f"k ({kk}) is above the index's k ({idx.k})")
        if idx.bands is not None and k is None:
            kk = BAND_RADIUS              # every record that shares a band with a row
    except BaseException:
        if ref is not None:
            ref.close()
        if idx is not None:
            idx.close()
        raise
    banded = kk == BAND_RADIUS and idx.bands is not None
    summary.radius = {"scheme": idx.scheme or DEFAULT_SCHEME, "width": idx.width,
                      "k": None if banded else kk,
                      "min_similarity": min_similarity, "measure": measure,
                      "expected_recall": stored["expected_recall"]
                      if stored is not None and (kk == stored["k"] or banded) else None,
                      "bands": idx.bands if banded else None}
    return idx, ref, kk, min_similarity, measure


def matching_reference(idx: Index, min_similarity: Optional[float], measure: str) -> str:
    """How to make a reference index a run with this index can take: the command that
    makes one of its scheme, width and k (and threshold) from the reference's rows."""
    flags = f"--scheme {idx.scheme or DEFAULT_SCHEME} --width {idx.width}"
    if idx.bands is None:
        flags += f" --k {idx.k}"
    if min_similarity is not None:
        flags += f" --min-similarity {min_similarity:g}"
        if measure != "jaccard":
            flags += " --containment"
    return (f"make a reference this run can take from the reference's rows with `simindex "
            f"build NEW_REFERENCE REFERENCE_ROWS {flags}` (or `simindex dedup REFERENCE_ROWS "
            f"--output REFERENCE_KEPT.jsonl --index NEW_REFERENCE {flags}`, which keeps the "
            f"reference's distinct rows only), then give --against NEW_REFERENCE")


def judging(mode: str, k: int, measure: str, min_similarity: Optional[float],
            width: int) -> str:
    """How a run judges, as its token records it. A band search (k = BAND_RADIUS, every
    distance) is recorded as k = the index's width, which stays the same across versions
    (k=256 for 8 bands), so a run again resumes what its index kept."""
    if k == BAND_RADIUS:
        k = width
    return f"{mode} k={k} {measure} >= {min_similarity}" if min_similarity is not None \
        else f"{mode} k={k}"


def calibrate_inputs(paths: list, t: float, *, fmt: Optional[str] = None,
                     text_field: str = "text", recall: Optional[float] = None,
                     scheme: Optional[str] = None, width: Optional[int] = None,
                     measure: str = "jaccard", sample: int = SAMPLE_ROWS,
                     sample_bytes: Optional[int] = None, sample_truth: bool = True,
                     time_budget: Optional[float] = None, bands: bool = True) -> Calibration:
    """The calibration (`simindex.calibrate`) of input files from their first `sample`
    texts (and at most `sample_bytes` of text, if given), for the rows the files hold
    (estimated; rows without a text are left to the run itself to report)."""
    cal = calibrate_with_sets(paths, t, fmt=fmt, text_field=text_field, recall=recall,
                              scheme=scheme, width=width, measure=measure, sample=sample,
                              sample_bytes=sample_bytes, sample_truth=sample_truth,
                              time_budget=time_budget, bands=bands)[0]
    if cal is None:
        raise ParameterError("the input holds no row to calibrate on")
    return cal


def calibrate_with_sets(paths: list, t: float, *, fmt: Optional[str], text_field: str,
                      recall: Optional[float], scheme: Optional[str], width: Optional[int],
                      measure: str, sample: int, sample_bytes: Optional[int],
                      sample_truth: bool, time_budget: Optional[float] = None,
                      bands: bool = True) -> tuple:
    """calibrate_inputs, and for minhash-v1 the shingle set its pass made of each sampled
    row, by position, which the run need not make again; (None, {}) when the input holds
    no row at all."""
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 2:
        raise ParameterError(f"sample must be an int >= 2, got {sample!r}")
    texts: list = []
    where: list = []
    read = rows_read = 0
    limit = sample_bytes if sample_bytes is not None else float("inf")
    for p, path in enumerate(paths):
        for row in read_rows(path, fmt, lambda e: None):
            rows_read += 1
            text = row.data.get(text_field)
            if isinstance(text, str):
                texts.append(text)
                where.append((p, row.number))
                read += len(text)
            if len(texts) >= sample or (read >= limit and len(texts) >= 2):
                break
        if len(texts) >= sample or (read >= limit and len(texts) >= 2):
            break
    if not texts and not rows_read:
        return None, {}                  # no row at all: nothing to judge
    if not texts:
        raise ParameterError(f"no row of the input has a text in the column "
                             f"\"{text_field}\" to calibrate on: name the column that holds "
                             f"the texts (--text-field), or give k (--k)")
    rows = estimate_rows(paths, len(texts), read)
    made: dict = {}
    sets = seconds = None
    if (scheme or SIMILARITY_SCHEME) == "minhash-v1" or lsh_rows(scheme) is not None:
        start = time.perf_counter()
        _, counts, sets = _text.signatures(texts, 3, shingles=True, distinct=True)
        assert sets is not None
        seconds = time.perf_counter() - start
        made = {w: x for w, x, c in zip(where, sets, counts) if c}
    try:
        cal = calibrate(texts, t, recall=DEFAULT_RECALL if recall is None else recall,
                        scheme=scheme, measure=measure, expected_rows=rows,
                        widths=None if width is None else [width],
                        sample_truth=sample_truth, sets=sets, pass_seconds=seconds,
                        time_budget=time_budget, bands=bands)
    except InputError as e:
        raise ParameterError(f"cannot calibrate on the input's first rows: {e}") from None
    return cal, made


COUNT_BYTES = 64 << 20          # the bytes of a JSON lines file whose lines are counted


def estimate_rows(paths: list, sample_rows: int, sample_bytes: int) -> int:
    """How many rows the inputs hold: a Parquet file's own count, plain JSON lines files'
    lines (counted in their first COUNT_BYTES in all, the rest in proportion to their
    size: a large input is not read twice), else about the file's bytes (a gzip file's
    stored size, modulo 4 GiB) over the sample's bytes per row."""
    total = 0
    per_row = max(sample_bytes / max(sample_rows, 1), 1.0)
    budget = COUNT_BYTES            # bytes of JSON lines still to count
    counted = [0, 0]                # bytes and lines of JSON lines counted
    for path in paths:
        try:
            if path.endswith((".parquet", ".pq")):
                import pyarrow.parquet as pq
                total += pq.ParquetFile(path).metadata.num_rows
                continue
            if not path.endswith(".gz") and path.endswith((".jsonl", ".json", ".ndjson")):
                lines = read = 0
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    while read < budget:
                        chunk = f.read(min(16 << 20, budget - read))
                        if not chunk:
                            break
                        lines += chunk.count(b"\n")
                        read += len(chunk)
                budget -= read
                counted[0] += read
                counted[1] += lines
                if read < size:        # the rest as the lines counted so far run
                    lines += int((size - read) * (counted[1] / counted[0] if counted[1]
                                                  else 1 / per_row))
                total += max(lines, 1)
                continue
            size = os.path.getsize(path)
            if path.endswith(".gz") and size >= 4:
                with open(path, "rb") as f:
                    f.seek(-4, 2)
                    size = max(size, int.from_bytes(f.read(4), "little"))
            total += int(size / per_row)
        except (OSError, ImportError, ValueError):
            total += sample_rows
    return max(total, sample_rows)


PROGRESS_SAMPLE = 1 << 20       # bytes of the first input read to size its rows


def rows_about(paths: list, fmt: Optional[str] = None) -> int:
    """About how many rows the inputs hold, for a progress bar's total: estimate_rows,
    with the bytes per row of the first lines of the first input that is not Parquet."""
    for path in paths:
        if format_of(path, fmt) == "parquet":
            continue
        try:
            with open_bytes(path) as f:
                head = f.read(PROGRESS_SAMPLE)
        except OSError:
            continue
        return estimate_rows(paths, max(head.count(b"\n"), 1), max(len(head), 1))
    return estimate_rows(paths, 1, 1)
