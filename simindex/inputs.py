"""Record input for the command-line tools: TSV and JSON lines, plain or gzip, checked line
by line so a bad line is reported as `file:line: reason` and nothing of it is written."""

import gzip
import json
import sys
import zlib
from typing import Any, NamedTuple, Optional

from .engine.codec import encode_id, pack_meta

from .values import MAX_FP, check_fp, check_wide_fp
from .errors import BadLine, InputError

MAX_LINE = 16 << 20
FORMATS = ("tsv", "jsonl")
FP_FORMATS = ("hex", "dec", "int64")


class Item(NamedTuple):
    """One parsed input record: a fingerprint, or a text to fingerprint."""
    id: Any
    fingerprint: Optional[int]
    text: Optional[str]
    meta: Any
    where: str


def hex_fp(s: str, width: int = 64) -> Optional[int]:
    """The int of 1 to width/4 hex digits after an optional 0x, or None: the one hex rule
    of the CLI's inputs, dedup's fingerprint columns and the HTTP API (no sign, space or _,
    which int() alone would take)."""
    body = s[2:] if s[:2] in ("0x", "0X") else s
    if 0 < len(body) <= width // 4 and body.isascii() and body.isalnum():
        try:
            return int(body, 16)
        except ValueError:             # letters past f
            return None
    return None


def parse_fp(s, fp_format="hex", width=64):
    """A fingerprint from its text form; raises ValueError with the rule."""
    s = s.strip()
    if fp_format == "hex":
        v = hex_fp(s, width)
        if v is None:
            raise ValueError(f"fingerprint {s!r:.40} is not 1-{width // 4} hex digits "
                             f"({width} bits at most)")
        return v
    try:
        v = int(s, 10)
    except ValueError:
        raise ValueError(f"fingerprint {s!r:.40} is not a decimal integer") from None
    if fp_format == "int64":
        if width != 64:
            raise ValueError(f"--fp-format int64 holds 64-bit fingerprints; this index has "
                             f"width {width}")
        if not -(1 << 63) <= v < (1 << 63):
            raise ValueError(f"fingerprint {v} is outside the signed 64-bit range")
        return v & MAX_FP
    if not 0 <= v < 1 << width:
        raise ValueError(f"fingerprint {v} is out of range: it must be in [0, 2**{width})")
    return v


def check_id(id_):
    """An id read from a file or a request, by the rules every reader applies alike (build,
    query, dedup on one machine and on Ray, the server): a non-empty string without a tab
    or a line break (ids are written in TSV and line-based outputs), of at most 510 bytes
    of valid UTF-8, or an integer in [0, 2**64). InputError names the rule broken."""
    if isinstance(id_, bool) or not isinstance(id_, (str, int)):
        raise InputError(f"id must be a string or a non-negative integer, got {id_!r:.40}")
    if isinstance(id_, str):
        if not id_:
            raise InputError("id is empty")
        if "\t" in id_ or "\n" in id_ or "\r" in id_:
            raise InputError(f"id {id_!r:.40} contains a tab or a line break")
    encode_id(id_)                    # its length, its Unicode, an int's range
    return id_


def _check_id(id_):
    try:
        return check_id(id_)
    except InputError as e:
        raise ValueError(str(e)) from None


def _check_meta(meta):
    pack_meta(meta)                  # raises InputError naming the problem
    return meta


def parse_line(line, fmt, fp_format, where, width=64):
    """One Item from one decoded line; raises BadLine."""
    try:
        if fmt == "tsv":
            parts = line.split("\t")
            if len(parts) < 2:
                raise ValueError("expected id<TAB>fingerprint[<TAB>json-meta]")
            if len(parts) > 3:
                raise ValueError(f"expected at most 3 tab-separated fields, got {len(parts)}")
            meta = None
            if len(parts) == 3 and parts[2].strip():
                try:
                    meta = json.loads(parts[2])
                except ValueError as e:
                    raise ValueError(f"meta is not valid JSON: {e}") from None
            return Item(_check_id(parts[0]), parse_fp(parts[1], fp_format, width), None,
                        _check_meta(meta), where)
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise ValueError(f"not valid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise ValueError("a JSON line must be an object")
        if "id" not in obj:
            raise ValueError('missing field "id"')
        extra = set(obj) - {"id", "fingerprint", "text", "meta"}
        if extra:
            raise ValueError(f"unknown field(s) {sorted(extra)}")
        id_ = _check_id(obj["id"])
        if ("fingerprint" in obj) == ("text" in obj):
            raise ValueError('give exactly one of "fingerprint" and "text"')
        if "text" in obj:
            if not isinstance(obj["text"], str):
                raise ValueError('"text" must be a string')
            return Item(id_, None, obj["text"], _check_meta(obj.get("meta")), where)
        fp = obj["fingerprint"]
        if isinstance(fp, str):
            fp = parse_fp(fp, fp_format, width)
        elif isinstance(fp, int) and not isinstance(fp, bool):
            fp = parse_fp(str(fp), "int64") if fp_format == "int64" else \
                check_fp(fp) if width == 64 else check_wide_fp(fp, width)
        else:
            raise ValueError(f"fingerprint {fp!r:.40} must be a hex string or an integer")
        return Item(id_, fp, None, _check_meta(obj.get("meta")), where)
    except RecursionError:
        raise BadLine(where, "JSON nested too deeply") from None
    except ValueError as e:
        raise BadLine(where, str(e)) from None


def open_input(path):
    """A binary stream for a path or "-" (stdin); .gz files are decompressed."""
    if path == "-":
        if sys.stdin is None:
            raise OSError("standard input is closed")
        stream = sys.stdin.buffer
        name = "<stdin>"
    else:
        stream = open(path, "rb")
        name = path
    head = stream.peek(2)[:2] if hasattr(stream, "peek") else b""
    if head == b"\x1f\x8b" or (path != "-" and path.endswith(".gz")):
        stream = gzip.GzipFile(fileobj=stream)
    return name, stream


def read_items(paths, fmt=None, fp_format="hex", max_line=MAX_LINE, on_error=None, width=64):
    """Yield Items from every input in order; a bad line raises BadLine, or with
    `on_error(badline)` given, is reported to it and skipped."""
    for path in paths:
        try:
            name, stream = open_input(path)
        except OSError as e:
            raise BadLine(path, f"cannot read: {e.strerror or e}") from None
        try:
            line_fmt = fmt
            for n, raw in enumerate(_lines(stream, max_line, name), 1):
                where = f"{name}:{n}"
                try:
                    if isinstance(raw, BadLine):
                        raise raw
                    if b"\0" in raw:
                        raise BadLine(where, "line contains a NUL byte")
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        raise BadLine(where, f"invalid UTF-8 at byte {e.start}") from None
                    line = line.rstrip("\r\n")
                    if n == 1 and line.startswith("\ufeff"):
                        line = line[1:]                     # a UTF-8 byte order mark
                    if not line.strip():
                        continue
                    if line_fmt is None:
                        line_fmt = "jsonl" if line.lstrip().startswith("{") else "tsv"
                    yield parse_line(line, line_fmt, fp_format, where, width)
                except BadLine as e:
                    if on_error is None:
                        raise
                    on_error(e)
        except (OSError, EOFError, zlib.error) as e:
            raise BadLine(name, f"cannot read: {e}") from None
        finally:
            if path != "-":
                stream.close()


def _lines(stream, max_line, name):
    n = 0
    while True:
        raw = stream.readline(max_line + 1)
        if not raw:
            return
        n += 1
        if len(raw) > max_line and not raw.endswith(b"\n"):
            yield BadLine(f"{name}:{n}", f"line is longer than the limit ({max_line} bytes)")
            while raw and not raw.endswith(b"\n"):          # skip the rest of it
                raw = stream.readline(max_line + 1)
            continue
        yield raw
