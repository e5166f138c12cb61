"""What the index hands back: Record and Match, and the `where` filter callers may pass.

Queries build their Match objects in the core (registered here with set_match_type), so a
query makes no intermediate Python object per match.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Union

from ._query import set_match_type
from ._records import split_record
from .codec import decode_id, unpack
from ..errors import InputTypeError

Id = Union[str, bytes, int]


class Record(NamedTuple):
    """A stored document: its id, fingerprint and meta value."""
    id: Id
    fingerprint: int
    meta: Any = None


class Match(NamedTuple):
    """A stored document within the asked distance of a query fingerprint."""
    id: Id
    fingerprint: int
    distance: int
    meta: Any = None


set_match_type(Match, unpack)      # queries get their Match objects from the core


class TextMatch(Match):
    """A Match of a text call (query_text, add_unique_text): also `similarity`, the stored
    text's to the asked one (Jaccard, or the index's measure), estimated from the sketch its
    record keeps (None: a record stored without one, by `add`). As a tuple it is the Match:
    equal to it, and unpacked as (id, fingerprint, distance, meta)."""

    similarity: Optional[float] = None      # (a class default: _make gives it)

    def __new__(cls, id: Id, fingerprint: int, distance: int, meta: Any = None,
                similarity: Optional[float] = None) -> "TextMatch":
        self = super().__new__(cls, id, fingerprint, distance, meta)
        self.similarity = similarity
        return self

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, similarity={self.similarity!r})"

    def __reduce__(self) -> tuple:
        return TextMatch, (*self, self.similarity)

    def _replace(self, **changes: Any) -> "TextMatch":
        similarity = changes.pop("similarity", self.similarity)
        return TextMatch(*Match._replace(self, **changes), similarity=similarity)


def json_id(id_: Id) -> Union[str, int]:
    """An id as JSON holds it: bytes ids as UTF-8 text, undecodable bytes as backslash
    escapes (the CLI's output and the HTTP API's answers)."""
    return id_.decode("utf-8", "backslashreplace") if isinstance(id_, bytes) else id_


def match_of(hit: tuple) -> Match:
    """A Match from the core's (distance, fingerprint, seq, id, meta bytes or None)."""
    dist, fp, _seq, id_, meta = hit
    return Match(id_, fp, dist, None if meta is None else unpack(meta, "meta value"))


def record_of(value: Optional[bytes], words: int = 1) -> Optional[Record]:
    """The Record of a stored record value (None for None); `words`: 64-bit words per
    fingerprint."""
    if value is None:
        return None
    fp, idk, mb = split_record(value, words)
    return Record(decode_id(idk), fp, unpack(mb, "meta value"))


def check_where(where: object) -> None:
    if not callable(where):
        raise InputTypeError(f"where must be callable, got {type(where).__name__}")


def kept_where(matches: list, where: Optional[Callable[[Match], bool]]) -> list:
    """The matches `where(match)` accepts (all of them without one)."""
    if where is None:
        return matches
    check_where(where)
    return [m for m in matches if where(m)]


def kept_where_many(results: list, where: Optional[Callable[[int, Match], bool]]) -> list:
    """Per query i, the matches `where(i, match)` accepts."""
    if where is None:
        return results
    check_where(where)
    return [[m for m in ms if where(i, m)] for i, ms in enumerate(results)]
