"""Dataset rows for `simindex dedup`: JSON lines and CSV (plain or gzip) and Parquet (with
pyarrow), read as dicts one at a time and written to a temporary name that is renamed into
place only when complete, so a failed or killed run never leaves a partial output."""

from __future__ import annotations

import csv
import functools
import gzip
import io
import itertools
import json
import os
import queue
import threading
import zlib
from typing import Any, Callable, Iterator, NamedTuple, Optional

import msgspec

from ..errors import BadLine, ParameterError
from ..engine.codec import pack_meta
from ..inputs import Item, check_id, parse_fp
from .publish import publish, temporary_file

FORMATS = ("jsonl", "csv", "parquet")
MAX_FIELD = 64 << 20          # CSV fields up to 64 MiB (documents can be long)
READ_BUFFER = 1 << 16        # bytes read at a time from an input, and written to an output
WRITE_BUFFER = 1 << 20
_BOM = "\ufeff".encode("utf-8")
# msgspec decodes what the json module decodes, to equal objects, several times faster; it
# refuses the rest (NaN, lone surrogate escapes, invalid UTF-8), which the json module reads
_fast_json = msgspec.json.Decoder().decode


class JsonRow(dict):
    """A JSON line's object, with the line it was read from (UTF-8, without its newline): a
    JSON lines output writes the line back as it was (every column as read, and no time
    spent encoding it again)."""

    __slots__ = ("line",)
    line: bytes


class Row(NamedTuple):
    """One input row: its columns (a dict, or where a run asks for lines its JSON line's
    bytes), its 1-based number in its file, "file:row", and when read for a run that
    writes lines back, its JSON line as read."""
    data: Any
    number: int
    where: str
    line: Optional[bytes] = None

    @property
    def written(self) -> Any:
        """What an output writes of the row: its JSON line as read, else its columns."""
        return self.data if self.line is None else self.line


def format_of(path: str, fmt: Optional[str] = None) -> str:
    """The format of a path: `fmt` when given, else from its extension (.jsonl, .json,
    .ndjson, .csv, .parquet, each optionally .gz except Parquet)."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ParameterError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
        return fmt
    name = path[:-3] if path.endswith(".gz") else path
    ext = os.path.splitext(name)[1].lower()
    if ext in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    if ext in (".csv",):
        return "csv"
    if ext in (".parquet", ".pq"):
        return "parquet"
    raise ParameterError(f"{path}: cannot tell the format from the extension (.jsonl, .csv, "
                         f".parquet, optionally .gz); give --format")


def _pyarrow():
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet as pq
    except ImportError:
        raise ParameterError("Parquet needs pyarrow: pip install 'simindex[parquet]'") from None
    return pq


GZIP_MAGIC = b"\x1f\x8b"        # the first bytes of a gzip stream


def open_bytes(path: str):
    """A file's bytes, read through gzip when they begin with its magic bytes."""
    raw: Any = open(path, "rb", buffering=READ_BUFFER)
    head = raw.peek(2)[:2]
    return gzip.GzipFile(fileobj=raw) if head == GZIP_MAGIC else raw


def _open_text(path: str):
    """A file's text; a byte that is not UTF-8 reads as a surrogate escape, for the reader
    to report with its row (never an error that stops the file)."""
    return io.TextIOWrapper(open_bytes(path), encoding="utf-8", errors="surrogateescape",
                            newline="")


def _not_utf8(cells: Any) -> Optional[str]:
    """Why a row's text cells hold bytes that are not UTF-8 (surrogate escapes), or None."""
    for c in cells:
        if not c.isascii():
            try:
                c.encode("utf-8")
            except UnicodeEncodeError as e:
                return f"invalid UTF-8: byte 0x{ord(c[e.start]) - 0xDC00:02x}"
    return None


def read_rows(path: str, fmt: Optional[str] = None,
              on_error: Optional[Callable[[BadLine], None]] = None,
              shown: Optional[str] = None, lines: bool = False) -> Iterator[Row]:
    """The rows of one file, in order. A row that breaks the format raises BadLine naming
    the file and row, or with `on_error` given is passed to it and skipped; an unreadable
    file raises BadLine naming the file. `shown`: the file's name in rows' places and in
    errors (default: `path`). `lines`: rows of JSON lines carry their line (json_row)."""
    fmt = format_of(path, fmt)
    name = path if shown is None else shown
    try:
        if fmt == "parquet":
            rows = _parquet_rows(path, name)
        elif fmt == "jsonl":
            rows = _jsonl_rows(path, name, lines)
        else:
            rows = _csv_rows(path, name)
        for row in rows:
            if isinstance(row, BadLine):
                if on_error is None:
                    raise row
                on_error(row)
            else:
                yield row
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        raise BadLine(name, f"cannot read: {getattr(e, 'strerror', None) or e}") from None


def _jsonl_rows(path, name, lines=False):
    with open_bytes(path) as f:
        for n, raw in enumerate(f, 1):
            row = json_row(raw, n, name, lines)
            if row is not None:
                yield row


def json_row(raw: bytes, n: int, name: str, lines: bool = False) -> Any:
    """Line n of a JSON lines file (its bytes, with or without its newline) as a Row, a
    BadLine saying what is wrong with it, or None for a blank line. The Row's columns are
    a JsonRow, or with `lines` a dict and the Row carries the line (json_line): a
    run that writes lines back asks for them so, and no copy of the dict is made."""
    try:
        obj = _fast_json(raw)          # the common line, never decoded to a str
    except (msgspec.MsgspecError, ValueError, RecursionError):
        obj = None
    if type(obj) is not dict:          # anything else: as the json module reads it
        obj = _slow_json(raw, n, name)
        if obj is None or type(obj) is BadLine:
            return obj
    if lines:
        return Row(obj, n, f"{name}:{n}", json_line(raw, n))
    row = JsonRow(obj)
    row.line = json_line(raw, n)
    return Row(row, n, f"{name}:{n}")


def json_line(raw: bytes, n: int) -> bytes:
    """Line n of a JSON lines file as an output writes it back: without its newline (nor,
    on line 1, a byte order mark)."""
    if n == 1 and raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    return raw.rstrip(b"\r\n")


def lines_as_read(lines: list, first: int, numbers: list) -> list:
    """json_line of each line numbered in `numbers` (increasing) of some lines of a JSON
    lines file, the first of them numbered `first`: without a call per line."""
    out = [lines[n - first].rstrip(b"\r\n") for n in numbers]
    if out and numbers[0] == 1:
        out[0] = json_line(out[0], 1)
    return out


@functools.lru_cache(maxsize=16)
def _columns_decoder(fields: tuple) -> Callable[[bytes], Any]:
    """A decoder of a JSON object's values of `fields` only, as a struct (None for a field
    it lacks); the other values are checked as JSON and skipped, never built."""
    names = [(f"c{i}", object, None) for i in range(len(fields))]
    struct = msgspec.defstruct("Columns", names, rename=dict(
        (f"c{i}", f) for i, f in enumerate(fields)))
    return msgspec.json.Decoder(struct).decode


def json_columns(lines: list, fields: tuple) -> Optional[list]:
    """The values of `fields` in each of some JSON lines (their bytes), a list per field
    (None where a line lacks the field), read with no dict per line: when every line is
    a JSON object of valid UTF-8 that the fast decoder reads (as json_row does), else None:
    the caller reads them row by row (json_row), which says what is wrong with each."""
    decode = _columns_decoder(fields)
    try:
        if not all(map(bytes.isascii, lines)):
            for line in lines:
                line.decode("utf-8")   # the skipped values are not checked for it
        got = [decode(line) for line in lines]
    except (msgspec.MsgspecError, ValueError, RecursionError):
        return None
    return [[getattr(g, f"c{i}") for g in got] for i in range(len(fields))]


def _slow_json(raw: bytes, n: int, name: str) -> Any:
    """A line the fast decoder refused, read by the json module (which also accepts NaN,
    lone surrogate escapes and numbers beyond a double's range): its object, a BadLine
    saying what is wrong with it, or None for a blank line."""
    where = f"{name}:{n}"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return BadLine(where, f"invalid UTF-8: byte 0x{raw[e.start]:02x} at byte {e.start} "
                              f"of the line")
    if n == 1 and line.startswith("\ufeff"):
        line = line[1:]
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as e:
        return BadLine(where, f"not valid JSON: {e}")
    if not isinstance(obj, dict):
        return BadLine(where, "a JSON line must be an object")
    return obj


def _csv_rows(path, name):
    csv.field_size_limit(MAX_FIELD)
    with _open_text(path) as f:
        # strict: a quote left open is an error at the line where it runs out, never
        # the rows after it read as part of its field
        reader = csv.reader(f, strict=True)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise BadLine(f"{name}:1", f"not valid CSV: {e}") from None
        if header and header[0].startswith("\ufeff"):
            header[0] = header[0][1:]
        if len(set(header)) != len(header):
            raise BadLine(f"{name}:1", f"the header repeats a column: {header}")
        bad = _not_utf8(header)
        if bad:
            raise BadLine(f"{name}:1", f"the header: {bad}")
        while True:
            n = reader.line_num + 1
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                end = reader.line_num
                yield BadLine(f"{name}:{n}", f"not valid CSV: {e}" + (
                    f" at line {end} (a quoted field opened in this row runs on; lines {n} "
                    f"to {end} are one bad row)" if end > n else ""))
                continue
            if not cells:
                continue
            if len(cells) != len(header):
                yield BadLine(f"{name}:{n}", f"{len(cells)} fields, the header has "
                                             f"{len(header)}")
                continue
            bad = _not_utf8(cells)
            if bad:
                yield BadLine(f"{name}:{n}", bad)
                continue
            yield Row(dict(zip(header, cells)), n, f"{name}:{n}")


def _parquet_rows(path, name):
    pq = _pyarrow()
    try:
        f = pq.ParquetFile(path)
    except Exception as e:          # pyarrow raises its own types for damaged files
        raise BadLine(name, f"not a readable Parquet file: {e}") from None
    n = 0
    for batch in f.iter_batches(batch_size=4096):
        for obj in batch.to_pylist():
            n += 1
            yield Row(obj, n, f"{name}:{n}")


class _Behind:
    """Bytes written to a stream by a thread of its own, in order, with at most DEPTH
    chunks waiting: the caller goes on while the kernel copies them (the write releases
    the GIL). A write's error is raised by the next write() or by wait()."""

    DEPTH = 2

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.error: Optional[BaseException] = None
        self.chunks: queue.Queue = queue.Queue(self.DEPTH)
        self.thread = threading.Thread(target=self._run, name="simindex-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            chunk = self.chunks.get()
            if chunk is None:
                return
            if self.error is None:
                try:
                    self.stream.write(chunk)
                except BaseException as e:      # noqa: B902 - handed to the caller
                    self.error = e

    def write(self, chunk: bytes) -> None:
        if self.error is not None:
            raise self.error
        self.chunks.put(chunk)

    def wait(self) -> None:
        """Every chunk written (or the first error raised), and the thread ended."""
        self.chunks.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


def _line_of(row: Any) -> bytes:
    """A row's JSON line: the line it was read from (a JsonRow's, or a line given as
    bytes), else its columns encoded."""
    if type(row) is bytes:
        return row
    if type(row) is JsonRow:
        return row.line
    return json.dumps(row, ensure_ascii=False).encode("utf-8")


class RowWriter:
    """Rows written to `path` in a format, through a temporary file in the same directory
    (publish.temporary_file) that commit() renames into place (fsynced first); finish()
    and publish.publish() do the same in two steps, for outputs published together;
    abort() removes it. `columns`: the CSV header (default: the first row's keys);
    `schema`: a Parquet file's Arrow schema (default: what Arrow infers from the first
    rows)."""

    def __init__(self, path: str, fmt: str, columns: Optional[list] = None,
                 schema: Any = None) -> None:
        self.path = path
        self.fmt = format_of(path, fmt)
        self.columns = columns
        self.schema = schema
        self.count = 0
        fd, self.tmp = temporary_file(path)
        self._lock: Optional[int] = os.dup(fd)     # the file's lock, held until release()
        self._raw = os.fdopen(fd, "wb", buffering=WRITE_BUFFER)
        self._rows: list = []           # Parquet: buffered into row groups
        self._pq_writer: Any = None
        self._text: Any = None          # CSV: the text stream
        self._bytes: Any = None         # JSON lines and CSV: the (gzipped) byte stream
        self._gz: Optional[gzip.GzipFile] = None
        self._csv: Optional[csv.DictWriter] = None
        self._behind: Optional[_Behind] = None     # JSON lines written by write_many
        if self.fmt == "parquet":
            _pyarrow()
        else:
            if path.endswith(".gz"):
                self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0)
            self._bytes = self._gz or self._raw
            if self.fmt == "csv":
                self._text = io.TextIOWrapper(self._bytes, encoding="utf-8", newline="")

    def write(self, row: Any) -> None:
        """Write a row: its columns, or (to JSON lines only) a JSON line's bytes as read."""
        if type(row) is bytes and self.fmt != "jsonl":
            raise TypeError(f"a row given as its JSON line's bytes cannot be written as "
                            f"{self.fmt}")
        self.count += 1
        if self.fmt == "jsonl":
            line = _line_of(row) + b"\n"
            (self._behind or self._bytes).write(line)
        elif self.fmt == "csv":
            if self._csv is None:
                if self.columns is None:
                    self.columns = list(row)
                self._csv = csv.DictWriter(self._text, fieldnames=self.columns,
                                           lineterminator="\n", extrasaction="raise")
                self._csv.writeheader()
            self._csv.writerow(row)
        else:
            self._rows.append(row)
            if len(self._rows) >= 65536:
                self._flush_parquet()

    def write_many(self, rows: list) -> None:
        """write() of each row, in order (JSON lines in one write, made by a thread of the
        writer's own while the caller goes on)."""
        if self.fmt != "jsonl":
            for row in rows:
                self.write(row)
            return
        if not rows:
            return
        self.count += len(rows)
        if self._behind is None:
            self._behind = _Behind(self._bytes)
        try:                                  # rows that are their lines' bytes
            chunk = b"\n".join(itertools.chain(rows, (b"",)))
        except TypeError:
            chunk = b"\n".join([*map(_line_of, rows), b""])
        self._behind.write(chunk)

    def _flush_parquet(self):
        import pyarrow as pa
        pq = _pyarrow()
        table = pa.Table.from_pylist(self._rows, schema=self.schema)
        if self._pq_writer is None:
            self._pq_writer = pq.ParquetWriter(self._raw, table.schema)
        self._pq_writer.write_table(table)
        self._rows = []

    def commit(self) -> None:
        """Finish the file, fsync it and rename it to its path."""
        self.finish()
        publish([(self.tmp, self.path)])
        self.release()

    def release(self) -> None:
        """Let go of the temporary file's lock (once it is published or removed: until
        then, another run would take it for a killed run's)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def finish(self) -> None:
        """Finish the file at its temporary name: written, fsynced and closed."""
        if self._behind is not None:
            behind, self._behind = self._behind, None
            behind.wait()
        if self.fmt == "parquet":
            if self._rows:
                self._flush_parquet()
            if self._pq_writer is None:
                self._empty_parquet()
            self._pq_writer.close()
        else:
            if self.fmt == "csv":
                if self._csv is None and self.columns:
                    csv.writer(self._text, lineterminator="\n").writerow(self.columns)
                self._text.flush()
                self._text.detach()
            if self._gz is not None:
                self._gz.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()

    def _empty_parquet(self):
        import pyarrow as pa
        pq = _pyarrow()
        schema = self.schema or pa.schema([(c, pa.string()) for c in (self.columns or [])])
        self._pq_writer = pq.ParquetWriter(self._raw, schema)

    def abort(self) -> None:
        """Drop the temporary file: the path keeps what it held before."""
        if self._behind is not None:
            behind, self._behind = self._behind, None
            try:
                behind.wait()
            except (OSError, ValueError):
                pass
        try:
            self._raw.close()
        except OSError:
            pass
        try:
            os.unlink(self.tmp)
        except OSError:
            pass
        self.release()


def row_items(paths: list, fmt: Optional[str], text_field: str, id_field: Optional[str],
              fingerprint_field: Optional[str] = None, meta_field: Optional[str] = None,
              on_error: Optional[Callable[[BadLine], None]] = None,
              width: int = 64) -> Iterator[Item]:
    """The Items `simindex build` adds from dataset rows (JSON lines, CSV or Parquet, as
    dedup reads them): a row's id and text (or fingerprint) from the columns named (without
    `id_field`, the row's "FILE:ROW", as dedup names it), its meta from `meta_field` (none
    without it); its other columns are not stored. A row without them is a BadLine, raised
    or given to `on_error`."""
    for path in paths:
        for row in read_rows(path, fmt, on_error):
            try:
                data = row.data
                if id_field is None:
                    id_ = check_id(row.where)
                elif id_field not in data:
                    raise ValueError(f'id field "{id_field}" is missing')
                else:
                    id_ = check_id(data[id_field])
                meta = data.get(meta_field) if meta_field is not None else None
                if meta is not None:
                    pack_meta(meta)            # InputError names what it cannot hold
                if fingerprint_field is not None:
                    fp = data.get(fingerprint_field)
                    if isinstance(fp, str):
                        fp = parse_fp(fp, "hex", width)
                    elif isinstance(fp, int) and not isinstance(fp, bool):
                        fp = parse_fp(str(fp), "int", width)
                    else:
                        raise ValueError(f'fingerprint field "{fingerprint_field}" is '
                                         f'missing or not a hex string or an integer')
                    yield Item(id_, fp, None, meta, row.where)
                    continue
                text = data.get(text_field)
                if not isinstance(text, str):
                    raise ValueError(f'text field "{text_field}" is missing or not text '
                                     f'(got {type(text).__name__})')
                yield Item(id_, None, text, meta, row.where)
            except ValueError as e:
                bad = BadLine(row.where, str(e))
                if on_error is None:
                    raise bad from None
                on_error(bad)
