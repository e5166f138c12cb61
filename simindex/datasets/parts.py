"""JSON lines files read in parts by worker processes: a file is cut at line ends into parts
of about PART_BYTES, each part is handed to a worker by its byte range and digest (the
worker reads, checks and fingerprints its lines on its own core) and its lines stay in the
run's process, which builds the part's rows again, in input order, when the worker's
result comes back."""

from __future__ import annotations

import collections
import os
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterator, NamedTuple

import xxhash

from ..errors import Error, InputError
from .rows import GZIP_MAGIC

PART_BYTES = 4 << 20


class Part(NamedTuple):
    """A byte range of a file holding whole lines: `first` is the number of its first line
    in the file, `lines` how many lines it holds, `digest` the digest() of its bytes as the
    run's process read them."""
    path: str
    start: int
    size: int
    first: int
    lines: int
    digest: int


def digest(data: bytes) -> int:
    """The XXH3 digest of a part's bytes: a worker that reads other bytes than the run's
    process (the file changed between their reads) tells by it."""
    return xxhash.xxh3_64_intdigest(data)


def splittable(path: str) -> bool:
    """Whether a file can be read in parts: a plain file (gzip streams cannot be cut)."""
    try:
        with open(path, "rb") as f:
            return f.read(2) != GZIP_MAGIC and os.path.isfile(path)
    except OSError:
        return False


def lines_of(data: bytes) -> list:
    """The lines of a part's bytes, without their newlines (a last line may lack one)."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return lines


def parts_of(path: str, digests: bool = True) -> Iterator[tuple]:
    """(Part, its lines_of) of a file, in order; a line longer than PART_BYTES makes a part
    of its own. Without `digests` (no other process reads the parts), each digest is 0."""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        offset, line = 0, 1
        while offset < size:
            data = os.pread(fd, PART_BYTES, offset)
            found = b"\n" in data
            while not found and offset + len(data) < size:
                more = os.pread(fd, PART_BYTES, offset + len(data))
                if not more:
                    break
                found = b"\n" in more
                data += more
            if offset + len(data) < size:
                data = data[:data.rfind(b"\n") + 1]
            if not data:
                return                   # the file shrank while it was read
            lines = lines_of(data)
            yield Part(path, offset, len(data), line, len(lines),
                       digest(data) if digests else 0), lines
            offset += len(data)
            line += len(lines)


def read_part(part: Part, shown: str) -> list:
    """A part's lines, as a worker reads them; InputError when they are not the bytes the
    run's process read (`shown`: the file's name in the error)."""
    chunks = []
    with open(part.path, "rb", buffering=0) as f:
        at = 0
        while at < part.size:          # a read returns at most about 2 GiB
            chunk = os.pread(f.fileno(), part.size - at, part.start + at)
            if not chunk:
                break
            chunks.append(chunk)
            at += len(chunk)
    data = b"".join(chunks)
    if len(data) != part.size or digest(data) != part.digest:
        raise InputError(f"{shown}: the file changed while it was read (lines {part.first} "
                         f"to {part.first + part.lines - 1})")
    return lines_of(data)


def in_order(pool: Any, work: Callable[[Any], Any], jobs: Iterator[tuple],
             ahead: int) -> Iterator[tuple]:
    """(Part, its lines, work's result) of each (Part, its lines, work's argument) of `jobs`,
    in order, with up to `ahead` parts in the pool's workers at once. A worker that dies
    (killed, out of memory) is an Error."""
    waiting: collections.deque = collections.deque()
    try:
        for part, data, arg in jobs:
            waiting.append((part, data, _submit(pool, work, arg)))
            if len(waiting) > ahead:
                part_, data_, fut = waiting.popleft()
                yield part_, data_, _result(fut, part_)
        while waiting:
            part_, data_, fut = waiting.popleft()
            yield part_, data_, _result(fut, part_)
    finally:
        for _, _, fut in waiting:
            fut.cancel()


def _submit(pool: Any, work: Callable[[Any], Any], arg: Any) -> Any:
    try:
        return pool.submit(work, arg)
    except BrokenProcessPool as e:
        raise Error(f"a worker process of the run ended: {e}") from None


def _result(fut: Any, part: Part) -> Any:
    try:
        return fut.result()
    except BrokenProcessPool as e:
        raise Error(f"the worker process reading {part.path} from byte {part.start} "
                    f"ended: {e}") from None
