"""Request bodies of the HTTP API: JSON in, checked values out, every error naming its field.

A handler calls `parse(body, Schema)`; a BadRequest carries the status (400 or 413), the
field (`fingerprints[3]`, `records[0].id`) and the rule it broke, for a JSON error answer.
"""

from __future__ import annotations

import decimal
import json
from typing import Any, Optional

from ..engine.codec import pack_meta
from ..errors import InputError
from ..inputs import check_id, hex_fp



class BadRequest(Exception):
    """A request the API refuses: `status` (4xx), `field` (or None) and `message`."""

    def __init__(self, message: str, field: Optional[str] = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.status = status

    def answer(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.message}
        if self.field is not None:
            out["field"] = self.field
        return out


def json_body(raw: bytes) -> Any:
    """The JSON value of a request body (an object is required by every endpoint)."""
    if not raw.strip():
        raise BadRequest("the request has no body; send a JSON object")
    try:
        value = _DECODER.decode(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRequest("the body is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise BadRequest(f"the body is not JSON: {e.msg} at line {e.lineno} column "
                         f"{e.colno}") from None
    except RecursionError:
        raise BadRequest("the body is nested too deeply") from None
    if not isinstance(value, dict):
        raise BadRequest(f"the body must be a JSON object, got {_kind(value)}")
    return value


def _constant(name: str) -> Any:
    raise BadRequest(f"the body is not JSON: {name} is not a JSON value")


class HugeInteger:
    """A JSON integer longer than any field takes (MAX_DIGITS): kept as its digits, so
    that the field's own check refuses it by name (Python's int() stops at 4,300)."""

    __slots__ = ("text", "digits")

    def __init__(self, text: str, digits: int) -> None:
        self.text = text            # as the body wrote it
        self.digits = digits        # of its integer value

    def __repr__(self) -> str:
        return f"{self.text[:12]}... (an integer of {self.digits} digits)"


MAX_DIGITS = 310                    # 2**1024 has 309


def _integer(digits: str) -> Any:
    return int(digits) if len(digits) <= MAX_DIGITS else \
        HugeInteger(digits, len(digits.lstrip("-")))


class Number(float):
    """A JSON number with a fraction or an exponent, with its text: JSON Schema counts
    2.0 and 1e3 as integers, so an integer field takes one whose exact value is whole."""

    __slots__ = ("text",)
    text: str


def _number(text: str) -> Number:
    n = Number(text)
    n.text = text
    return n


def integral(v: Any) -> Any:
    """A JSON number with a whole exact value as an int (2.0, 1e3, 1.0e20 exactly); any
    other value as it is."""
    if type(v) is Number:
        exact = decimal.Decimal(v.text)
        if exact == exact.to_integral_value():
            if exact.adjusted() >= MAX_DIGITS:
                return HugeInteger(v.text, exact.adjusted() + 1)
            return int(exact)
    return v


# NaN and Infinity are not JSON; integers too long for any field are kept as digits
_DECODER = json.JSONDecoder(parse_constant=_constant, parse_int=_integer,
                            parse_float=_number)


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if type(v) is HugeInteger:
        return f"an integer of {v.digits} digits"
    if type(v) is Number:
        return f"the number {v.text}"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "an array", dict: "an object"}.get(type(v), type(v).__name__)


def fields(obj: Any, where: str, required: tuple[str, ...],
           optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """`obj` as a dict after checking it is an object with exactly these fields."""
    if not isinstance(obj, dict):
        raise BadRequest(f"must be a JSON object, got {_kind(obj)}", where or None)
    for name in obj:
        if name not in required and name not in optional:
            allowed = ", ".join(required + optional)
            raise BadRequest(f"unknown field {name!r} (this endpoint takes {allowed})",
                             _join(where, name))
    for name in required:
        if name not in obj:
            raise BadRequest("is required", _join(where, name))
    for name, value in obj.items():
        if value is None and name != "meta":     # only a meta value may be null
            raise BadRequest("must not be null (leave the field out for its default)",
                             _join(where, name))
    return obj


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def fingerprint(v: Any, width: int, field: str) -> int:
    """A fingerprint from a hex string (1 to width/4 digits, an optional 0x) or a JSON
    integer in [0, 2**width)."""
    v = integral(v)
    if type(v) is str:
        fp = hex_fp(v, width)              # surrounding spaces are refused, as simd does
        if fp is not None:
            return fp
        raise BadRequest(f"{v[:70]!r} is not a fingerprint: write 1-{width // 4} hex "
                         f"digits ({width} bits)", field)
    if isinstance(v, int) and not isinstance(v, bool):
        if not 0 <= v < 1 << width:
            raise BadRequest(f"{v} is out of range: a fingerprint of this index is in "
                             f"[0, 2**{width})", field)
        return v
    if type(v) is HugeInteger:
        raise BadRequest(f"{v!r} is out of range: a fingerprint of this index is in "
                         f"[0, 2**{width})", field)
    raise BadRequest(f"must be a hex string or an integer, got {_kind(v)}", field)


def record_id(v: Any, field: str) -> Any:
    """A record id: a non-empty string or an integer in [0, 2**64)."""
    v = integral(v)
    if type(v) is HugeInteger:
        raise BadRequest(f"{v!r} is out of range: int ids must be in [0, 2**64)", field)
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise BadRequest(f"must be a string or an integer, got {_kind(v)}", field)
    if isinstance(v, str) and not v:
        raise BadRequest("is empty", field)
    try:
        return check_id(v)
    except InputError as e:
        raise BadRequest(str(e), field) from None


META_INTEGERS = (-(1 << 63), (1 << 64) - 1)   # what msgpack stores as an integer


def meta(v: Any, field: str) -> Any:
    """A meta value, checked to pack (size limit) before anything is written. A number of
    whole value (2.0 too, as JSON Schema counts) must lie in META_INTEGERS."""
    bad = _bad_number(v, field)
    if bad is not None:
        raise BadRequest(f"{bad[1]!r} is out of range: whole numbers in meta are in "
                         f"[-2**63, 2**64)", bad[0])
    try:
        pack_meta(v)
    except InputError as e:
        raise BadRequest(str(e), field) from None
    return v


def _bad_number(v: Any, where: str) -> Optional[tuple]:
    """(field, value) of the first whole number outside META_INTEGERS in a JSON value."""
    lo, hi = META_INTEGERS
    stack = [(v, where)]
    while stack:
        x, at = stack.pop()
        t = type(x)
        if t is Number:
            x = integral(x)          # whole: an int or a HugeInteger (1e999 too)
            t = type(x)
        if t is HugeInteger or (t is int and not lo <= x <= hi):
            return at, x
        if t is dict:
            stack.extend((y, f"{at}.{k}") for k, y in reversed(list(x.items())))
        elif t is list:
            stack.extend((y, f"{at}[{i}]") for i, y in reversed(list(enumerate(x))))
    return None


def radius(v: Any, k_max: int, field: str = "k") -> Optional[int]:
    """An optional query radius: an integer between 0 and the index's k."""
    if v is None:
        return None
    v = integral(v)
    if type(v) is HugeInteger:
        raise BadRequest(f"{v!r} is outside 0..{k_max}", field)
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"must be an integer, got {_kind(v)}", field)
    if not 0 <= v <= k_max:
        raise BadRequest(f"{v} is outside 0..{k_max}: the index finds matches up to its k "
                         f"({k_max}) bits", field)
    return v


def similarity(v: Any, field: str = "min_similarity") -> Optional[float]:
    """An optional similarity threshold: a number in (0, 1]."""
    if v is None:
        return None
    if type(v) is HugeInteger:
        raise BadRequest(f"{v!r} is outside (0, 1]", field)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadRequest(f"must be a number, got {_kind(v)}", field)
    if not 0 < v <= 1:
        raise BadRequest(f"{v!r:.40} is outside (0, 1]", field)
    return float(v)


def text(v: Any, field: str) -> str:
    if not isinstance(v, str):
        raise BadRequest(f"must be a string, got {_kind(v)}", field)
    return v


def array(v: Any, field: str, limit: int) -> list:
    """A JSON array of at most `limit` items (413 beyond it)."""
    if not isinstance(v, list):
        raise BadRequest(f"must be an array, got {_kind(v)}", field)
    if len(v) > limit:
        raise BadRequest(f"has {len(v)} items; this server takes at most {limit} per request "
                         f"(split the batch, or start it with a larger --max-batch)", field,
                         status=413)
    return v


def flag(v: Any, field: str) -> bool:
    if not isinstance(v, bool):
        raise BadRequest(f"must be true or false, got {_kind(v)}", field)
    return v
