"""The ASGI plumbing of the HTTP API: exact-path routes, bodies read within a size limit,
JSON answers, errors as JSON.

It is ours rather than a framework's because the framework was the cost: measured in one
process, a /search through Starlette's router and request objects took 29.5 us, of which
the query is 5; the same handler on this layer takes 12 (Starlette's hello world: 15).
uvicorn stays the server: HTTP parsing, worker processes and signals.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional
from urllib.parse import unquote_plus

from .bodies import BadRequest

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def _default(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, (set, frozenset, tuple)):
        return list(v)
    raise TypeError(f"{type(v).__name__} is not JSON")


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                            default=_default)


def _finite(v: Any) -> Any:
    """`v` with NaN and infinite floats (JSON has none) as null."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def to_json(value: Any) -> bytes:
    """Compact UTF-8 JSON; bytes (msgpack meta) as {"base64": ...}, NaN as null."""
    try:
        return _ENCODER.encode(value).encode("utf-8")
    except ValueError:
        return _ENCODER.encode(_finite(value)).encode("utf-8")


@dataclass
class Answer:
    """An answer other than a 200 JSON value: a status, a JSON payload or raw bytes."""
    status: int
    payload: Any = None
    body: Optional[bytes] = None
    content_type: bytes = b"application/json"
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


def error(status: int, message: str, field_: Optional[str] = None,
          headers: Optional[list[tuple[bytes, bytes]]] = None) -> Answer:
    return Answer(status, BadRequest(message, field_, status).answer(), headers=headers or [])


class Disconnected(Exception):
    """The client went away before its request body arrived."""


class Call:
    """One request: its scope, and its body on demand (within the size limit)."""
    __slots__ = ("scope", "receive", "max_body", "tail")

    def __init__(self, scope: Scope, receive: Receive, max_body: int, tail: str = "") -> None:
        self.scope = scope
        self.receive = receive
        self.max_body = max_body
        self.tail = tail                     # what a prefix route leaves of the path

    def header(self, name: bytes) -> Optional[bytes]:
        for k, v in self.scope["headers"]:
            if k == name:
                return v
        return None

    def param(self, name: str) -> Optional[str]:
        """A query-string parameter, decoded (`?name` alone is ""); given twice, 400."""
        key = name.encode()
        found = [part[len(key) + 1:] for part in self.scope["query_string"].split(b"&")
                 if part == key or part.startswith(key + b"=")]
        if len(found) > 1:
            raise BadRequest(f"is given {len(found)} times; give it once", name)
        return unquote_plus(found[0].decode("latin-1")) if found else None

    async def body(self) -> bytes:
        limit = self.max_body
        declared = self.header(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BadRequest(f"the body is {int(declared)} bytes; this server takes at most "
                             f"{limit} (start it with a larger --max-body)", status=413)
        chunks = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise Disconnected()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BadRequest(f"the body is over {limit} bytes, the most this server "
                                 f"takes (start it with a larger --max-body)", status=413)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)


Handler = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    """A handler and its rules: `write` (refused by a read-only server) and `auth`."""
    handler: Handler
    write: bool = False
    auth: bool = True


class Routes:
    """Exact paths, and prefixes whose rest of the path is a parameter (/records/{id})."""

    def __init__(self) -> None:
        self.exact: dict[str, dict[str, Route]] = {}
        self.prefixes: dict[str, dict[str, Route]] = {}
        self.params: dict[str, str] = {}     # prefix -> its parameter, as "{id}"

    def add(self, method: str, path: str, route: Route) -> None:
        if path.endswith("}") and "{" in path:
            at = path.rindex("{")
            self.prefixes.setdefault(path[:at], {})[method] = route
            self.params[path[:at]] = path[at:]
        else:
            self.exact.setdefault(path, {})[method] = route

    def find(self, method: str, path: str) -> tuple[Optional[Route], str, Optional[Answer]]:
        """(route, tail of the path, None), or (None, "", the 404 or 405 answer)."""
        methods = self.exact.get(path)
        tail = ""
        if methods is None:
            for prefix, ms in self.prefixes.items():
                if path.startswith(prefix) and len(path) > len(prefix):
                    methods, tail = ms, path[len(prefix):]
                    break
            else:
                return None, "", error(404, f"no endpoint {path[:200]} (see /openapi.json)")
        route = methods.get("GET" if method == "HEAD" else method)
        if route is None:
            allow = ", ".join(sorted(methods)).encode()
            return None, "", error(405, f"{method} is not allowed on {path[:200]}",
                                   headers=[(b"allow", allow)])
        return route, tail, None

    def described(self) -> set[tuple[str, str]]:
        """Every (path, method) served, paths as in the OpenAPI document."""
        out = {(p, m) for p, ms in self.exact.items() for m in ms}
        return out | {(p + self.params[p], m) for p, ms in self.prefixes.items() for m in ms}


async def send_answer(send: Send, status: int, body: bytes,
                      content_type: bytes = b"application/json",
                      headers: Optional[list[tuple[bytes, bytes]]] = None,
                      head: bool = False) -> None:
    out = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    if headers:
        out.extend(headers)
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": b"" if head else body})
