"""Map tasks that turn input partitions into columns: id keys, fingerprints, packed metas."""

import os

import numpy as np
import ray

from ..codec import decode_id
from ..errors import Error, InputError, InputTypeError
from ..fingerprints import fingerprint
from ..index import records_of
from ..inputs import BadLine, read_items
from ..store import RECORD_CHUNK


@ray.remote
def parse_file(path, scheme, fmt=None, fp_format="hex", chunk=RECORD_CHUNK):
    """Chunks (id keys, fps, metas) of one TSV/JSONL file, and the first bad line or None.

    Texts are fingerprinted with `scheme`. The chunks hold every good line before the
    bad one, so a caller can commit exactly what a single-process build would have.
    """
    chunks, items, error = [], [], None
    try:
        for item in read_items([path], fmt, fp_format):
            try:
                fp = item.fingerprint if item.text is None else fingerprint(item.text, scheme)
            except Error as e:
                raise BadLine(item.where, str(e)) from None
            items.append((item.id, fp, item.meta))
            if len(items) >= chunk:
                chunks.append(records_of(items))
                items = []
    except BadLine as e:
        error = e
    if items:
        chunks.append(records_of(items))
    return chunks, error


@ray.remote
def encode(items, offset):
    """Columns of a list of (id, fp) or (id, fp, meta) tuples (checked like add_many)."""
    try:
        return records_of(items)
    except (InputError, InputTypeError) as e:
        raise type(e)(f"in the records from number {offset} on: {e}") from None


def partitions(inputs, scheme, fmt=None, fp_format="hex", chunk=RECORD_CHUNK):
    """Object refs of every input partition, in input order: a list of file paths is parsed
    one task per file; any other iterable of records is cut into chunks encoded by tasks."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    inputs = iter(inputs)
    first = next(inputs, None)
    if first is None:
        return []
    if isinstance(first, (str, os.PathLike)):
        return [("file", parse_file.remote(os.fspath(p), scheme, fmt, fp_format, chunk))
                for p in [first, *inputs]]
    refs, batch, n = [], [first], 0
    for item in inputs:
        batch.append(item)
        if len(batch) >= chunk:
            refs.append(("items", encode.remote(batch, n)))
            n += len(batch)
            batch = []
    if batch:
        refs.append(("items", encode.remote(batch, n)))
    return refs


def collect(ref):
    """([(id keys, fps, metas), ...], first bad line or None) of one partition ref."""
    kind, r = ref
    try:
        got = ray.get(r)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, Error):
            raise e.cause from None         # bad input: the error a single process gives
        raise
    return got if kind == "file" else ([got], None)


def ids_of(idkeys):
    return [decode_id(k) for k in idkeys]


def concat(chunks):
    """One (id keys, fps) over chunks."""
    keys = [k for c in chunks for k in c[0]]
    fps = np.concatenate([c[1] for c in chunks]) if chunks else np.empty(0, np.uint64)
    return keys, fps
