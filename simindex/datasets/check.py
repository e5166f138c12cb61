"""The similarity check of a run: each row's shingles (as the text pass hashes them), the
sets of rows already judged spilled to disk so memory does not grow with the input, and the
comparison of a row with a match: exactly against rows of this run, through the stored
sketch against records of earlier runs."""

from __future__ import annotations

import mmap
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Optional

import numpy as np

from ..errors import InputError
from ..signatures import _text
from ..signatures.fingerprints import WORD_SCHEMES, fingerprint, pass_args, schemes
from ..signatures.similarity import estimate, shingle_set
from ..values import words_to_ints


class Shingles:
    """A row's shingles for the similarity check: the sorted distinct set of its shingle
    hashes, and that set's sketch (stored with a kept record)."""

    __slots__ = ("set", "_sketch")

    def __init__(self, exact: np.ndarray, sketch: Optional[bytes] = None) -> None:
        self.set = exact
        self._sketch = sketch

    @classmethod
    def of_set(cls, exact: Any) -> "Shingles":
        """Shingles of a set already sorted and distinct (its sketch made when needed)."""
        return cls(exact)

    @property
    def sketch(self) -> bytes:
        if self._sketch is None:
            self._sketch = _text.sketch_of_set(self.set)
        return self._sketch


def batch_signatures(args: tuple) -> list:
    """One part of a batch: per text, its fingerprint (with its Shingles when `checked`),
    or the InputError message of a text that has none."""
    return text_signatures(*args)[0]


def text_signatures(texts: list, scheme: str, width: int, checked: bool,
                    sketched: bool = True) -> tuple:
    """(batch_signatures of the texts, and with `checked` their shingle sets one after
    another in one array when the text pass left them so, else None). The sets' sketches
    are made now, or when `sketched` is False, when first asked for."""
    out: list = []
    if scheme in WORD_SCHEMES:
        sketches: Optional[list] = [] if checked and sketched else None
        codes, counts, raws = _text.signatures(
            texts, schemes[scheme].shingle_width, shingles=checked, distinct=checked,
            sketches=sketches, **pass_args(scheme, width))
        fps = words_to_ints(codes)
        if not checked and counts.all():
            return fps, None                   # every text had tokens
        sets: list = [] if raws is None else raws
        for i, fp in enumerate(fps):
            if not counts[i]:
                out.append(f"text has no tokens under scheme {scheme!r} (empty, or no word "
                           f"characters): it has no fingerprint")
            elif checked:
                out.append((fp, Shingles(sets[i], None if sketches is None else
                                         sketches[i])))
            else:
                out.append(fp)
        return out, _one_array(sets) if checked else None
    for t in texts:
        try:
            fp = fingerprint(t, scheme=scheme, width=width)
            if checked:
                out.append((fp, Shingles.of_set(shingle_set(t, scheme))))
            else:
                out.append(fp)
        except InputError as e:
            out.append(str(e))
    return out, None


def _one_array(sets: list) -> Optional[np.ndarray]:
    """The array a text pass's sets are views of, in order, when they are all of it (the
    texts it read without the interpreter: _text.signatures), else None."""
    if not sets:
        return np.empty(0, np.uint64)
    base = sets[0].base
    if type(base) is np.ndarray and base.ndim == 1 and sum(map(len, sets)) == len(base) \
            and all(x.base is base for x in sets):
        return base
    return None


class Spill:
    """Shingle sets of this run's rows, on disk so memory does not grow with the input: one
    temporary file holds the sets' values one after another, two more each set's position
    key (ascending) and where its values end; the keys are searched through a map of their
    file. Positions must be put in increasing order. Sets put since the last flush (at
    most PENDING of them, or PENDING_BYTES) wait in memory and are written together, by a
    thread of the spill's own while the run goes on (until that write is done, its sets
    are read from memory, and the files only up to what earlier writes completed)."""

    PENDING = 4096
    PENDING_BYTES = 16 << 20
    ROOM = (1 << 16, 1 << 12)     # the files' first sizes, in values and in sets

    def __init__(self, scratch: str) -> None:
        self.fds: list = []
        for _ in range(3):                 # values, keys, ends
            fd, path = tempfile.mkstemp(prefix="shingles-", dir=scratch)
            os.unlink(path)
            self.fds.append(fd)
        self.values = 0           # values written
        self.entries = 0          # sets written
        self.last = -1
        self._pending: dict = {}  # key -> set, not yet written (in key order)
        self._pending_bytes = 0   # the memory they hold (a view holds its whole base array)
        self._bases: set = set()  # ids of the arrays pending sets are views of
        # the files' sizes, in values and in sets: grown ahead, by half again at least, so
        # their maps are made again a few times in a run, not at every batch
        self._room = (0, 0)
        self._keys: Any = None    # the keys and ends files, mapped whole (a set's values
        self._ends: Any = None    # are read from their file: no page of it stays mapped)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="simindex-spill")
        self._writing: Any = None # the write in flight (a Future), or None
        self._written: dict = {}  # its sets, by key
        self._upto = (0, 0)       # (values, entries) the files hold once it is done
        self._ready = (0, 0)      # (values, entries) the files hold, complete

    @staticmethod
    def key(pos: list) -> int:
        return (pos[0] << 40) | pos[1]

    def close(self) -> None:
        # nothing reads the spill once closed: an error of its last write does not matter
        if self._writing is not None:
            wait([self._writing])
        self._writing = None
        self._writer.shutdown()
        self._keys = self._ends = None     # maps close when no array holds them
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def _wait(self) -> None:
        """Wait for the write in flight (its error raised here)."""
        if self._writing is not None:
            writing, self._writing, self._written = self._writing, None, {}
            writing.result()
            self._ready = self._upto

    def put(self, pos: list, exact: np.ndarray) -> None:
        key = self.key(pos)
        if key <= self.last:
            return                      # already there
        self._pending[key] = exact
        base = exact.base
        if type(base) is not np.ndarray:
            self._pending_bytes += 8 * len(exact)
        elif id(base) not in self._bases:     # a batch's or part's sets: counted once
            self._bases.add(id(base))
            self._pending_bytes += base.nbytes
        self.last = key
        if len(self._pending) >= self.PENDING or self._pending_bytes >= self.PENDING_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write the pending sets and their keys and ends."""
        n = len(self._pending)
        if not n:
            return
        self._wait()                    # one write in flight at most, in order
        sets = list(self._pending.values())
        keys = np.fromiter(self._pending.keys(), dtype="<u8", count=n)
        ends = self.values + np.cumsum(np.fromiter(map(len, sets), dtype=np.int64, count=n))
        self._grow(int(ends[-1]), self.entries + n)
        self._writing = self._writer.submit(_write_sets, self.fds, sets, keys, ends,
                                            self.values, self.entries)
        self._written = self._pending
        self.values = int(ends[-1])
        self.entries += n
        self._upto = (self.values, self.entries)
        self._pending = {}
        self._pending_bytes = 0
        self._bases = set()

    def _grow(self, values: int, entries: int) -> None:
        """Files (sparse) that hold at least this many values and sets (no write is in
        flight)."""
        room_v, room_e = self._room
        if values > room_v:
            room_v = max(values, room_v + room_v // 2, self.ROOM[0])
            os.ftruncate(self.fds[0], 8 * room_v)
        if entries > room_e:
            room_e = max(entries, room_e + room_e // 2, self.ROOM[1])
            for fd in self.fds[1:]:
                os.ftruncate(fd, 8 * room_e)
        self._room = (room_v, room_e)

    def mark(self) -> tuple:
        """Where the spill stands: rewind() to it forgets every set put since."""
        self.flush()
        return self.values, self.entries, self.last

    def rewind(self, mark: tuple) -> None:
        if not self._pending and (self.values, self.entries, self.last) == tuple(mark):
            return                      # nothing put since: the write in flight holds
                                        # sets from before the mark only, and goes on
        self._wait()                    # no set put since the mark is found in flight
        self._pending = {}
        self._pending_bytes = 0
        self._bases = set()
        self.values, self.entries, self.last = mark
        self._ready = (min(self._ready[0], self.values), min(self._ready[1], self.entries))

    def _find(self, pos: Any) -> Any:
        """The pending set put at `pos`, or the place of its written set, or None."""
        try:
            key = self.key(pos)
        except (TypeError, IndexError):
            return None
        exact = self._pending.get(key)
        if exact is None:
            exact = self._written.get(key)
        if exact is not None:
            return exact
        if not self.entries or key > self.last:
            return None
        if self._writing is not None and self._writing.done():
            self._wait()
        # not pending nor in flight: written before, if at all
        values, entries = self._ready
        if not entries:
            return None
        if self._keys is None or len(self._keys) != self._room[1]:
            self._keys, self._ends = (
                np.frombuffer(mmap.mmap(fd, 8 * self._room[1], prot=mmap.PROT_READ), "<u8")
                for fd in self.fds[1:])
        # a uint64: no cast of the keys
        i = int(self._keys[:entries].searchsorted(np.uint64(key)))
        if i == entries or int(self._keys[i]) != key:
            return None
        return i

    def holds(self, pos: Any) -> bool:
        """Whether a set was put at `pos`."""
        return self._find(pos) is not None

    def get(self, pos: Any) -> Optional[np.ndarray]:
        """The set put at `pos`, or None."""
        i = self._find(pos)
        if i is None or not isinstance(i, int):
            return i
        start = int(self._ends[i - 1]) if i else 0
        end = int(self._ends[i])
        if end == start:
            return np.empty(0, dtype=np.uint64)
        data = os.pread(self.fds[0], 8 * (end - start), 8 * start)
        if len(data) != 8 * (end - start):
            raise OSError(f"the shingle sets' file ends short ({len(data)} of "
                          f"{8 * (end - start)} bytes read)")
        return np.frombuffer(data, "<u8")


def _write_sets(fds: list, sets: list, keys: np.ndarray, ends: np.ndarray, values: int,
                entries: int) -> None:
    """Write sets (their values after the first `values`), their keys and their ends
    (after the first `entries`) to a Spill's files."""
    _pwrite_all(fds[0], np.concatenate(sets).astype("<u8", copy=False), 8 * values)
    _pwrite_all(fds[1], keys, 8 * entries)
    _pwrite_all(fds[2], ends.astype("<u8"), 8 * entries)


def _pwrite_all(fd: int, data: Any, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


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

    def stored(self, a: Shingles, meta: Any, sketch: Optional[tuple]) -> tuple:
        """(passes, similarity, evidence, the record's shingles) of row `a` against a stored
        record: exactly when this run judged the record's row (its set is read only when
        the set sizes allow the similarity asked: the intersection is at most the smaller
        set, the union at least the larger), else through its (sketch, set size)."""
        if sketch is not None and is_mine(meta, self.token) and self.spill is not None \
                and self._beyond(len(a.set), sketch[1]) and self.spill.holds(meta[1]):
            return False, None, "exact", None
        theirs = self.recall(meta, sketch)
        return (*self(a, theirs), theirs)

    def _beyond(self, x: int, y: int) -> bool:
        """Whether sets of x and y shingles are too unlike in size to pass."""
        if self.measure == "jaccard":
            return max(x, y) > 0 and min(x, y) / max(x, y) < self.t
        return x > 0 and min(x, y) / x < self.t

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
