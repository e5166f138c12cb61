"""Map tasks that turn input partitions into columns: id keys, fingerprints, packed metas."""

import os

import ray

from ..engine.codec import encode_records
from ..errors import BadLine, Error, InputError
from ..signatures.fingerprints import fingerprint
from ..inputs import read_items
from ..engine.plan import Plan
from . import route
from .route import fetch

# records per map task's chunk of an iterable and per ledger call: the grain of Ray's tasks
# and objects (the ledger commits each call as one records/ transaction)
PART_RECORDS = 1 << 18


def _columns(items, plan, width):
    """(id keys, fps, metas, owners): owners[s] marks the records with a key in shard s.
    fps: (n,) uint64 at width 64, (n, width/64) above."""
    idks, fps, metas = encode_records(items, None, width)
    return idks, fps, metas, (None if plan is None else route.owners(Plan(**plan), fps))


@ray.remote
def parse_file(path, scheme, fmt=None, fp_format="hex", chunk=PART_RECORDS, plan=None,
               width=64):
    """Chunks (id keys, fps, metas, owners) of one TSV/JSONL file, and the first bad line
    or None. Fingerprints are `width` bits (hex of up to width/4 digits), texts are
    fingerprinted with `scheme`; with `plan` (Plan keyword arguments) each chunk says which
    shards its records go to. The chunks hold every good line before the bad one, so a
    caller can commit exactly what a single-process build would have.
    """
    chunks, items, error = [], [], None
    try:
        for item in read_items([path], fmt, fp_format, width=width):
            try:
                fp = item.fingerprint if item.text is None else \
                    fingerprint(item.text, scheme=scheme, width=width)
            except Error as e:
                raise BadLine(item.where, str(e)) from None
            items.append((item.id, fp, item.meta))
            if len(items) >= chunk:
                chunks.append(_columns(items, plan, width))
                items = []
    except BadLine as e:
        error = e
    if items:
        chunks.append(_columns(items, plan, width))
    return chunks, error


@ray.remote
def encode(items, offset, plan=None, width=64):
    """Columns of a list of (id, fp) or (id, fp, meta) tuples (checked like add_many)."""
    try:
        return _columns(items, plan, width)
    except InputError as e:
        raise type(e)(f"in the records from number {offset} on: {e}") from None


def partitions(inputs, scheme, fmt=None, fp_format="hex", chunk=PART_RECORDS, plan=None,
               width=64):
    """Object refs of every input partition, in input order: a list of file paths is parsed
    one task per file; any other iterable of records is cut into chunks encoded by tasks.
    Fingerprints are `width` bits."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    inputs = iter(inputs)
    first = next(inputs, None)
    if first is None:
        return []
    if isinstance(first, (str, os.PathLike)):
        # tasks run in other working directories (and on other nodes): absolute paths
        return [("file", parse_file.remote(os.path.abspath(os.fspath(p)), scheme, fmt,
                                           fp_format, chunk, plan, width))
                for p in [first, *inputs]]
    refs, batch, n = [], [first], 0
    for item in inputs:
        batch.append(item)
        if len(batch) >= chunk:
            refs.append(("items", encode.remote(batch, n, plan, width)))
            n += len(batch)
            batch = []
    if batch:
        refs.append(("items", encode.remote(batch, n, plan, width)))
    return refs


def collect(ref):
    """([(id keys, fps, metas, owners), ...], first bad line or None) of one partition."""
    kind, r = ref
    got = fetch(r)               # bad input raises the error a single process gives
    return got if kind == "file" else ([got], None)
