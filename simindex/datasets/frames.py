"""`simindex.dedup` of data held in memory: a list of dicts, a pandas or polars DataFrame, a
pyarrow Table, a Hugging Face `Dataset` or `IterableDataset`. The columns a run reads (the
text, and the id, fingerprint or keep column when named) are written to a scratch JSON lines
file and judged by the file run itself, so the rules and answers are the CLI's; the kept
rows are then taken from the caller's own object, which keeps its columns, types, index and
(for a `Dataset`) its features."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from contextlib import closing
from typing import Any, Iterator

import msgspec
import numpy as np

from ..errors import BadLine, Error, ParameterError
from .reports import ANNOTATIONS, GroupSizes
from .run import decisions, few_collections
from .run import dedup as dedup_files

CHUNK = 8192                 # rows whose columns are read from the caller's object at a time
ROW_ID = "simindex_row"      # the id column of a run without id_field: each row's position
_PLAIN = (str, int, float, bool, type(None))     # values written as they are


def dedup(data: Any, *, annotate: bool = False, **options: Any) -> Any:
    """The rows of `data` that are not near-duplicates of a row kept before them (the
    options and rules are `simindex dedup`'s: `text_field`, `id_field`, `k`,
    `min_similarity`, `mode`, `keep`, `index`, `against`, `jobs`, `on_error`, ...).

    `data` in memory (a list of dicts, a pandas or polars DataFrame, a pyarrow Table, a
    `datasets.Dataset` or `IterableDataset`) gives back the same kind holding the kept rows,
    or with `annotate=True` every row read, with the columns of `--annotate` added (a
    removed row's match, distance, group, group size, similarity and evidence). Without
    `id_field`, a row's id (and a removed row's `simindex_duplicate_of`) is its position.
    A bad row (text missing or not text, ...) is named by its position ("row 7").

    `data` naming files (a path, or a list of paths) gives an iterator of the kept rows as
    dicts, read from the files (JSONL, CSV or Parquet)."""
    if _are_files(data):
        if annotate:
            raise ParameterError("annotate=True is for data in memory; for files use "
                                 "`simindex dedup --annotate`")
        return dedup_files(data, **options)
    kind = kind_of(data)
    for name in ("fmt", "reserved", "summary"):
        if name in options:
            raise ParameterError(f"{name}= is not an option of a run on data in memory")
    if annotate:
        clash = [c for c in ANNOTATIONS if c in kind.columns()]
        if clash:
            raise ParameterError(f"the data already has the column {clash[0]!r} that "
                                 f"annotate=True adds")
    with few_collections():
        verdicts = _judged(kind, options)
    if not annotate:
        return kind.take([p for p, d in verdicts if d.kept])
    return kind.annotated([p for p, _ in verdicts], _annotations([d for _, d in verdicts]))


def _are_files(data: Any) -> bool:
    if isinstance(data, (str, os.PathLike)):
        return True
    return isinstance(data, (list, tuple)) and bool(data) and \
        all(isinstance(x, (str, os.PathLike)) for x in data)


def _judged(kind: "_Kind", options: dict) -> list:
    """(position, Decision) of every row read, in order, judged by the file run on a scratch
    JSON lines file of the columns it reads."""
    text_field = options.get("text_field", "text")
    fields = [text_field] + [options[f] for f in ("id_field", "fingerprint_field")
                             if options.get(f) is not None]
    keep = options.get("keep", "first")
    if keep not in ("first", "longest"):
        fields.append(keep)
    fields = list(dict.fromkeys(fields))
    for f in fields:
        if not isinstance(f, str):
            raise ParameterError(f"a column is named by a string, not {f!r}")
    columns = kind.columns()
    missing = [f for f in fields if f not in columns]
    if missing and not kind.open_columns:
        raise ParameterError(f"the data has no column {missing[0]!r} (its columns: "
                             f"{', '.join(map(str, columns)) or 'none'})")
    twice = [f for f in fields if columns.count(f) > 1]
    if twice:
        raise ParameterError(f"the data has two columns named {twice[0]!r}")
    positions = options.get("id_field") is None
    if positions:
        if options.get("index") is not None:
            raise ParameterError("with index=, give id_field: a row's position is no id "
                                 "across calls (the next call's row 0 would be another)")
        options = dict(options, id_field=ROW_ID)
    odd: dict = {}                      # position -> why a value was written as null
    on_error = options.get("on_error", "stop")
    if callable(on_error):
        options = dict(options, on_error=lambda e: on_error(_placed(e, odd)))
    scratch = tempfile.mkdtemp(prefix="simindex-data-")
    try:
        path = os.path.join(scratch, "rows.jsonl")
        _write_rows(kind, fields, positions, path, odd)
        out = []
        try:
            with closing(decisions(path, **options)) as judged:
                for d in judged:           # the row's columns are the caller's: not kept
                    out.append((_position(d.where), d._replace(row={})))
        except BadLine as e:
            raise _placed(e, odd) from None
        except Error as e:              # a rule broken by a row (an id taken): named by it
            e.args = (_rows_named(str(e), path), *e.args[1:])
            raise
        return out
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _rows_named(message: str, path: str) -> str:
    """A message with the scratch file's places ("path:7") as the rows' positions."""
    return re.sub(re.escape(path) + r":(\d+)", lambda m: f"row {int(m.group(1)) - 1}",
                  message)


def _write_rows(kind: "_Kind", fields: list, positions: bool, path: str, odd: dict) -> None:
    encode = msgspec.json.Encoder().encode
    at = 0
    with open(path, "wb", buffering=1 << 20) as f:
        for columns in kind.chunks(fields):
            n = len(columns[fields[0]]) if fields else 0
            lines = []
            for i in range(n):
                row = {}
                for name in fields:
                    v = columns[name][i]
                    if isinstance(v, np.generic):  # numpy's scalars, as Python's
                        v = v.item()
                    if isinstance(v, _NotARow):
                        odd[at + i] = f"the row is a {type(v.row).__name__}, not a mapping"
                        v = None
                    elif type(v) not in _PLAIN:
                        odd.setdefault(at + i, f'field "{name}" holds a {type(v).__name__}, '
                                               f'not a string or a number')
                        v = None
                    row[name] = v
                if positions:
                    row[ROW_ID] = at + i
                try:
                    lines.append(encode(row))
                except (UnicodeEncodeError, TypeError, OverflowError) as e:
                    odd.setdefault(at + i, f"a value holds text that is not valid Unicode "
                                           f"({e.reason})" if isinstance(e, UnicodeEncodeError)
                                   else f"a value cannot be read: {e}")
                    lines.append(encode({k: at + i if k == ROW_ID else None for k in row}))
            lines.append(b"")
            f.write(b"\n".join(lines))
            at += n


def _position(where: str) -> int:
    """The position of a row in the data from its place in the scratch file ("file:row")."""
    return int(where.rsplit(":", 1)[1]) - 1


def _placed(e: BadLine, odd: dict) -> BadLine:
    """A bad row's error named by its position in the data (and the true type of a value
    written as null)."""
    try:
        pos = _position(e.where)
    except (ValueError, IndexError):
        return e
    return BadLine(f"row {pos}", odd.get(pos, e.reason))


def _annotations(judged: list) -> dict:
    """The --annotate columns of judged rows (Decisions, in order), as lists."""
    groups = GroupSizes()
    for d in judged:
        groups.add(d)
    values = [(d.match, d.distance, d.cluster, groups.size(d.cluster), d.similarity,
               d.evidence) for d in judged]
    return {name: [v[c] for v in values] for c, name in enumerate(ANNOTATIONS)}


class _Kind:
    """One kind of data in memory: its columns read in chunks, and the same kind made of
    some of its rows."""

    open_columns = False     # rows may each hold other columns (a list of dicts)

    def __init__(self, data: Any) -> None:
        self.data = data

    def columns(self) -> list:
        raise NotImplementedError

    def chunks(self, fields: list) -> Iterator[dict]:
        """{field: values} of CHUNK rows at a time, in order."""
        raise NotImplementedError

    def take(self, positions: list) -> Any:
        raise NotImplementedError

    def annotated(self, positions: list, columns: dict) -> Any:
        """The rows at `positions` with `columns` (lists in step with them) added."""
        raise NotImplementedError


class _Dicts(_Kind):
    open_columns = True

    def __init__(self, data: Any) -> None:
        super().__init__(list(data))

    def columns(self) -> list:
        return list(dict.fromkeys(k for r in self.data if isinstance(r, Mapping) for k in r))

    def chunks(self, fields: list) -> Iterator[dict]:
        for at in range(0, len(self.data), CHUNK):
            rows = self.data[at:at + CHUNK]
            yield {f: [r.get(f) if isinstance(r, Mapping) else _NotARow(r) for r in rows]
                   for f in fields}

    def take(self, positions: list) -> list:
        return [self.data[p] for p in positions]

    def annotated(self, positions: list, columns: dict) -> list:
        names = list(columns)
        return [dict(self.data[p], **{n: columns[n][i] for n in names})
                for i, p in enumerate(positions)]


class _NotARow:
    """The value read from a list element that is not a mapping (reported as its type)."""

    def __init__(self, row: Any) -> None:
        self.row = row


class _Arrow(_Kind):
    def columns(self) -> list:
        return list(self.data.column_names)

    def chunks(self, fields: list) -> Iterator[dict]:
        for at in range(0, self.data.num_rows, CHUNK):
            part = self.data.slice(at, CHUNK)
            yield {f: part.column(f).to_pylist() for f in fields}

    def take(self, positions: list) -> Any:
        import pyarrow as pa
        return self.data.take(pa.array(positions, pa.int64()))

    def annotated(self, positions: list, columns: dict) -> Any:
        import pyarrow as pa
        out = self.take(positions)
        for name, values in columns.items():
            out = out.append_column(name, pa.array(values))
        return out


class _Pandas(_Kind):
    def columns(self) -> list:
        return list(self.data.columns)

    def chunks(self, fields: list) -> Iterator[dict]:
        for at in range(0, len(self.data), CHUNK):
            part = self.data.iloc[at:at + CHUNK]
            yield {f: part[f].tolist() for f in fields}

    def take(self, positions: list) -> Any:
        return self.data.iloc[positions]

    def annotated(self, positions: list, columns: dict) -> Any:
        out = self.data.iloc[positions].copy()
        for name, values in columns.items():
            out[name] = _pandas_column(values, out.index)
        return out


def _pandas_column(values: list, index: Any) -> Any:
    import pandas as pd
    return pd.Series(values, index=index, dtype="object" if any(
        v is None for v in values) else None)


class _Polars(_Kind):
    def columns(self) -> list:
        return list(self.data.columns)

    def chunks(self, fields: list) -> Iterator[dict]:
        for at in range(0, self.data.height, CHUNK):
            part = self.data.slice(at, CHUNK)
            yield {f: part.get_column(f).to_list() for f in fields}

    def take(self, positions: list) -> Any:
        import polars as pl
        return self.data[pl.Series(positions, dtype=pl.Int64)] if positions else \
            self.data.clear()

    def annotated(self, positions: list, columns: dict) -> Any:
        import polars as pl
        return self.take(positions).with_columns(
            [pl.Series(name, values, strict=False) for name, values in columns.items()])


class _Dataset(_Kind):
    def columns(self) -> list:
        return list(self.data.column_names)

    def chunks(self, fields: list) -> Iterator[dict]:
        part = self.data.select_columns(fields)
        for at in range(0, len(part), CHUNK):
            yield part[at:at + CHUNK]

    def take(self, positions: list) -> Any:
        return self.data.select(positions)

    def annotated(self, positions: list, columns: dict) -> Any:
        out = self.take(positions)
        for name, values in columns.items():
            out = out.add_column(name, values)
        return out


class _IterableDataset(_Kind):
    """A streaming dataset: read once to judge it; what is given back is the stream again,
    filtered by position (the source must give the same rows in the same order)."""

    def columns(self) -> list:
        names = self.data.column_names
        if names is None:
            raise ParameterError("the IterableDataset does not know its columns (give it "
                                 "features, or resolve them with ds._resolve_features())")
        return list(names)

    def chunks(self, fields: list) -> Iterator[dict]:
        yield from self.data.select_columns(fields).iter(batch_size=CHUNK)

    def take(self, positions: list) -> Any:
        wanted = set(positions)
        return self.data.filter(lambda _, i: i in wanted, with_indices=True)

    def annotated(self, positions: list, columns: dict) -> Any:
        names = list(columns)

        def add(row: dict, i: int) -> dict:     # i: the row's place in the filtered stream
            return {n: columns[n][i] for n in names}
        return self.take(positions).map(add, with_indices=True)


# (module, classes, _Kind) of the libraries' data (subclasses too: a GeoDataFrame is one)
_KINDS = [("pandas", ("DataFrame",), _Pandas), ("polars", ("DataFrame",), _Polars),
          ("pyarrow", ("Table", "RecordBatch"), _Arrow), ("datasets", ("Dataset",), _Dataset),
          ("datasets", ("IterableDataset",), _IterableDataset)]


def kind_of(data: Any) -> _Kind:
    """The _Kind of data in memory; anything else is a ParameterError naming its type."""
    name = type(data).__name__
    for module, names, kind in _KINDS:
        lib = sys.modules.get(module)      # a library not imported holds none of the data
        if lib is not None:
            for cls in names:
                found = getattr(lib, cls, None)
                if isinstance(found, type) and isinstance(data, found):
                    return kind(data)
    ray = sys.modules.get("ray.data")
    if ray is not None and isinstance(data, getattr(ray, "Dataset", ())):
        raise ParameterError(f"a Ray {name} is judged on Ray: simindex.distributed.dedup(data, "
                             f"...) gives back a Ray Dataset of the kept rows")
    if isinstance(data, (list, tuple)) or (hasattr(data, "__iter__") and
                                           not isinstance(data, (str, bytes, Mapping))):
        rows = _Dicts(data)
        if rows.data and not any(isinstance(r, Mapping) for r in rows.data):
            raise ParameterError(f"dedup takes rows as mappings (dicts); the "
                                 f"{name} holds {type(rows.data[0]).__name__}s")
        return rows
    raise ParameterError(f"dedup takes files (a path or a list of paths) or data in memory "
                         f"(a list of dicts, a pandas or polars DataFrame, a pyarrow Table, "
                         f"a datasets.Dataset or IterableDataset), not a {name}")

