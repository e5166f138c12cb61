"""The similarity check of a run: each row's shingles (as the text pass hashes them), the
sets of rows already judged spilled to disk so memory does not grow with the input, and the
comparison of a row with a match: exactly against rows of this run, through the stored
sketch against records of earlier runs."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Optional

import numpy as np

from ..errors import InputError
from ..signatures import _text
from ..signatures.fingerprints import WORD_SCHEMES, fingerprint, pass_args, schemes
from ..signatures.similarity import estimate, shingle_set


class Shingles:
    """A row's shingles for the similarity check: the pass's shingle hashes, made into the
    sorted distinct set, and that set's sketch (stored with a kept record), when first
    needed."""

    __slots__ = ("_raw", "_set", "_sketch")

    def __init__(self, raw: np.ndarray) -> None:
        self._raw: Optional[np.ndarray] = raw
        self._set: Optional[np.ndarray] = None
        self._sketch: Optional[bytes] = None

    @classmethod
    def of_set(cls, exact: Any) -> "Shingles":
        """Shingles of a set already sorted and distinct."""
        sh = cls(None)                       # type: ignore[arg-type]
        sh._set = exact
        return sh

    @property
    def set(self) -> np.ndarray:
        if self._set is None:
            assert self._raw is not None
            self._set = _text.sorted_set(self._raw)
            self._raw = None
        return self._set

    @property
    def sketch(self) -> bytes:
        if self._sketch is None:
            self._sketch = _text.sketch_of_set(self.set)
        return self._sketch


def batch_signatures(args: tuple) -> list:
    """One part of a batch: per text, its fingerprint (with its Shingles when `checked`),
    or the InputError message of a text that has none."""
    texts, scheme, width, checked = args
    out: list = []
    if scheme in WORD_SCHEMES:
        codes, counts, raws = _text.signatures(
            texts, schemes[scheme].shingle_width, shingles=checked,
            **pass_args(scheme, width))
        words = width // 64
        fps = codes[:, 0].tolist() if words == 1 else [
            int.from_bytes(row.astype(">u8").tobytes(), "big") for row in codes]
        for i, fp in enumerate(fps):
            if not counts[i]:
                out.append(f"text has no tokens under scheme {scheme!r} (empty, or no word "
                           f"characters): it has no fingerprint")
            elif checked:
                out.append((fp, Shingles(raws[i])))                # type: ignore[index]
            else:
                out.append(fp)
        return out
    for t in texts:
        try:
            fp = fingerprint(t, scheme=scheme, width=width)
            if checked:
                out.append((fp, Shingles.of_set(shingle_set(t, scheme))))
            else:
                out.append(fp)
        except InputError as e:
            out.append(str(e))
    return out


class Spill:
    """Shingle sets of this run's rows, on disk so memory does not grow with the input: one
    temporary file holds the sets, another the sorted (position, offset, count) of each,
    searched by bisection. Positions must be put in increasing order."""

    _ENTRY = np.dtype([("key", "<u8"), ("offset", "<u8"), ("count", "<u8")])

    def __init__(self, scratch: str) -> None:
        self.fds = []
        for _ in range(2):
            fd, path = tempfile.mkstemp(prefix="shingles-", dir=scratch)
            os.unlink(path)
            self.fds.append(fd)
        self.end = 0              # bytes of sets written
        self.entries = 0          # entries in the index file
        self.last = -1

    @staticmethod
    def key(pos: list) -> int:
        return (pos[0] << 40) | pos[1]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def put(self, pos: list, exact: np.ndarray) -> None:
        key = self.key(pos)
        if key <= self.last:
            return                      # already there
        data = np.ascontiguousarray(exact, dtype=np.uint64).tobytes()
        os.pwrite(self.fds[0], data, self.end)
        entry = np.array([(key, self.end, len(exact))], dtype=self._ENTRY).tobytes()
        os.pwrite(self.fds[1], entry, self.entries * self._ENTRY.itemsize)
        self.end += len(data)
        self.entries += 1
        self.last = key

    def mark(self) -> tuple:
        """Where the spill stands: rewind() to it forgets every set put since."""
        return self.end, self.entries, self.last

    def rewind(self, mark: tuple) -> None:
        self.end, self.entries, self.last = mark

    def get(self, pos: Any) -> Optional[np.ndarray]:
        """The set put at `pos`, or None."""
        try:
            key = self.key(pos)
        except (TypeError, IndexError):
            return None
        size = self._ENTRY.itemsize
        lo, hi = 0, self.entries
        while lo < hi:
            mid = (lo + hi) // 2
            e = np.frombuffer(os.pread(self.fds[1], size, mid * size), dtype=self._ENTRY)[0]
            if int(e["key"]) < key:
                lo = mid + 1
            elif int(e["key"]) > key:
                hi = mid
            else:
                raw = os.pread(self.fds[0], 8 * int(e["count"]), int(e["offset"]))
                return np.frombuffer(raw, dtype=np.uint64)
        return None


class Check:
    """The similarity check of a run: `measure` ("jaccard", or "containment": the share of
    the judged row's shingles found in the other) at least `t`. Rows of this run are
    compared exactly (the sets of rows judged in earlier batches wait in a Spill); records
    of earlier runs and of a reference through the sketch (and set size) they store."""

    def __init__(self, t: float, measure: str, token: bytes, scratch: Optional[str]) -> None:
        self.t, self.measure, self.token = t, measure, token
        # without a scratch directory (a caller that holds the run's sets itself), no spill
        self.spill = Spill(scratch) if scratch is not None else None

    def close(self) -> None:
        if self.spill is not None:
            self.spill.close()

    def keep(self, pos: list, exact: np.ndarray) -> None:
        """Keep the shingle set of a row judged at `pos` for later exact checks (a run
        with a spill)."""
        assert self.spill is not None
        self.spill.put(pos, exact)

    def mark(self) -> Optional[tuple]:
        """A mark of the spill (see Spill.mark), or None without one."""
        return self.spill.mark() if self.spill is not None else None

    def rewind(self, mark: Optional[tuple]) -> None:
        """Forget the sets kept since `mark` (a decision made again from its start)."""
        if self.spill is not None and mark is not None:
            self.spill.rewind(mark)

    def recall(self, meta: Any, sketch: Optional[tuple]) -> Any:
        """A stored record's shingles: its exact set when this run judged its row, else the
        (sketch, set size or None) stored with it, else None (a record without them cannot
        be checked)."""
        if is_mine(meta, self.token) and self.spill is not None:
            exact = self.spill.get(meta[1])
            if exact is not None:
                return exact
        return sketch

    def sketches(self, mine: tuple, theirs: Optional[tuple]) -> bool:
        """Whether a row known by the (sketch, set size) its record keeps passes against a
        record's (sketch, set size), as a later run would judge it (None: unknown,
        passes)."""
        if theirs is None:
            return True
        return estimate(self.measure, mine[0], mine[1], theirs[0], theirs[1]) >= self.t

    def __call__(self, a: Shingles, b: Any, symmetric: bool = False) -> tuple:
        """(passes, similarity, evidence) of row `a` against `b`: Shingles or an exact set
        (exact), a (sketch, size) pair (estimated), or None (unknown: passes). Symmetric
        containment divides by the smaller set."""
        if b is None:
            return True, None, None
        if isinstance(b, tuple):
            sim = estimate(self.measure, a.sketch, len(a.set), b[0], b[1], symmetric)
            evidence = "sketch"
        else:
            x = a.set
            y = b.set if isinstance(b, Shingles) else b
            inter = _text.intersection_size(x, y)
            if self.measure == "jaccard":
                union = len(x) + len(y) - inter
                sim = inter / union if union else 1.0
            else:
                base = min(len(x), len(y)) if symmetric else len(x)
                sim = inter / base if base else 1.0
            evidence = "exact"
        return sim >= self.t, round(sim, 4), evidence


def is_mine(meta: Any, token: bytes) -> bool:
    return isinstance(meta, list) and len(meta) == 2 and meta[0] == token
