"""The HTTP API of `simindex serve`: a Starlette application over one open Index.

Each worker process builds its own application and opens the index once (LMDB lets every
process read at once; writers take turns on its write lock). Queries run on the event loop
(microseconds, no I/O wait); writes and large batches run in a worker thread so that an
fsync never stalls the queries of other connections. A write is answered after it commits,
so an acknowledged write survives kill -9 like any committed one.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
import json
import os
from dataclasses import dataclass, field
from functools import partial
from typing import Any, AsyncIterator, Awaitable, Callable, Optional

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from ..errors import (
    ClosedError, CorruptError, DiskFullError, Error, InputError, ParameterError, StorageError,
)
from ..index import Index
from ..results import Match
from . import bodies
from .bodies import BadRequest
from .openapi import document
from .page import page

MAX_BODY = 8 << 20          # bytes of one request body
MAX_BATCH = 10_000          # fingerprints or records of one batch request
INLINE_BATCH = 64           # larger query batches leave the event loop (query_many drops the GIL)


@dataclass
class Settings:
    """What one worker needs to serve an index (the CLI hands it to each worker)."""
    path: str
    token: Optional[str] = None
    readonly: bool = False
    max_body: int = MAX_BODY
    max_batch: int = MAX_BATCH
    workers: int = 1

    def to_env(self) -> str:
        """The settings as one environment value for spawned workers (token excluded: the
        workers read it from its file or variable themselves)."""
        return json.dumps({"path": self.path, "readonly": self.readonly,
                           "max_body": self.max_body, "max_batch": self.max_batch,
                           "workers": self.workers})


class JSON(JSONResponse):
    """JSON answers: compact, UTF-8, bytes values (from msgpack meta) as base64 text."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=False, separators=(",", ":"),
                          default=_default).encode("utf-8")


def _default(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, (set, frozenset, tuple)):
        return list(v)
    raise TypeError(f"{type(v).__name__} is not JSON")


def _id(v: Any) -> Any:
    """An id as JSON: bytes ids (only the Python API stores them) as UTF-8 text, like the CLI."""
    return v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v


@dataclass
class Service:
    """One worker's open index and the rules it serves it by."""
    settings: Settings
    index: Optional[Index] = None
    writes: Any = None                   # anyio.CapacityLimiter(1): one writer thread
    hexes: str = "016x"
    page: bytes = field(default=b"")

    @property
    def idx(self) -> Index:
        if self.index is None:
            raise ClosedError("the index is not open (the server is starting or stopping)")
        return self.index

    def match(self, m: Match) -> dict[str, Any]:
        return {"id": _id(m.id), "fingerprint": format(m.fingerprint, self.hexes),
                "distance": m.distance, "meta": m.meta}

    def matches(self, ms: list[Match]) -> list[dict[str, Any]]:
        return [self.match(m) for m in ms]


Handler = Callable[[Service, Request], Awaitable[Any]]


def _error(status: int, message: str, field_: Optional[str] = None,
           headers: Optional[dict[str, str]] = None) -> Response:
    return JSON(BadRequest(message, field_, status).answer(), status, headers=headers)


def endpoint(svc: Service, fn: Handler, *, write: bool = False,
             auth: bool = True) -> Callable[[Request], Awaitable[Response]]:
    """A route handler: the token check, the read-only rule, and every error as JSON."""
    async def handle(request: Request) -> Response:
        token = svc.settings.token
        if auth and token is not None:
            given = request.headers.get("authorization", "")
            scheme, _, value = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    value.strip().encode(), token.encode()):
                return _error(401, "a bearer token is required (Authorization: Bearer <token>)"
                              if not given else "the bearer token is wrong", None,
                              {"WWW-Authenticate": 'Bearer realm="simindex"'})
        if write and svc.settings.readonly:
            return _error(403, "this server is read-only (started with --readonly)")
        try:
            out = await fn(svc, request)
        except BadRequest as e:
            return JSON(e.answer(), e.status)
        except DiskFullError as e:
            return _error(507, f"the index's disk is full: {e}")
        except CorruptError as e:
            return _error(500, f"the index is damaged: {e}")
        except (StorageError, ClosedError) as e:
            return _error(503, str(e))
        except (InputError, ParameterError) as e:   # a rule the body checks did not foresee
            return _error(400, str(e))
        except Error as e:
            return _error(500, str(e))
        return out if isinstance(out, Response) else JSON(out)
    return handle


async def _body(svc: Service, request: Request) -> dict[str, Any]:
    """The request's JSON object, read up to --max-body bytes (413 beyond)."""
    limit = svc.settings.max_body
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(f"the body is {declared} bytes; this server takes at most {limit} "
                         f"(start it with a larger --max-body)", status=413)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"the body is over {limit} bytes, the most this server takes "
                             f"(start it with a larger --max-body)", status=413)
        chunks.append(chunk)
    return bodies.json_body(b"".join(chunks))


def _fingerprint_of(svc: Service, obj: dict[str, Any], where: str = "") -> int:
    """The fingerprint a body gives: `fingerprint`, or the index's fingerprint of `text`."""
    fname = f"{where}.fingerprint" if where else "fingerprint"
    tname = f"{where}.text" if where else "text"
    has_fp, has_text = "fingerprint" in obj, "text" in obj
    if has_fp == has_text:
        raise BadRequest("give exactly one of fingerprint and text", where or None)
    if has_fp:
        return bodies.fingerprint(obj["fingerprint"], svc.idx.width, fname)
    return _text_fp(svc, bodies.text(obj["text"], tname), tname)


def _text_fp(svc: Service, text: str, field_: str) -> int:
    try:
        return svc.idx.fingerprint(text)
    except InputError as e:
        raise BadRequest(str(e), field_) from None


async def _write(svc: Service, fn: Callable[[], Any]) -> Any:
    """Run a write in this worker's writer thread (commits fsync; the loop goes on)."""
    return await anyio.to_thread.run_sync(fn, limiter=svc.writes)


# ------------------------------------------------------------------ reads
async def health(svc: Service, request: Request) -> Any:
    return {"status": "ok" if svc.index is not None else "starting", "pid": os.getpid()}


async def stats(svc: Service, request: Request) -> Any:
    s = await anyio.to_thread.run_sync(svc.idx.stats)
    s["server"] = {"workers": svc.settings.workers, "readonly": svc.settings.readonly,
                   "max_body": svc.settings.max_body, "max_batch": svc.settings.max_batch,
                   "auth": svc.settings.token is not None, "path": svc.settings.path}
    return s


async def query(svc: Service, request: Request) -> Any:
    obj = bodies.fields(await _body(svc, request), "", (), ("fingerprint", "text", "k"))
    idx = svc.idx
    fp = _fingerprint_of(svc, obj)
    k = bodies.radius(obj.get("k"), idx.k)
    return {"fingerprint": format(fp, svc.hexes), "matches": svc.matches(idx.query(fp, k))}


async def query_batch(svc: Service, request: Request) -> Any:
    obj = bodies.fields(await _body(svc, request), "", ("fingerprints",), ("k",))
    idx = svc.idx
    raw = bodies.array(obj["fingerprints"], "fingerprints", svc.settings.max_batch)
    width = idx.width
    fps = [bodies.fingerprint(v, width, f"fingerprints[{i}]") for i, v in enumerate(raw)]
    k = bodies.radius(obj.get("k"), idx.k)
    if len(fps) > INLINE_BATCH:
        results = await anyio.to_thread.run_sync(partial(idx.query_many, fps, k))
    else:
        results = idx.query_many(fps, k) if fps else []
    return {"results": [svc.matches(ms) for ms in results]}


async def search(svc: Service, request: Request) -> Any:
    """go-simstore's simd: GET /search?sig=<hex> answers a JSON array of the ids found."""
    sig = request.query_params.get("sig")
    if sig is None:
        raise BadRequest("is required (GET /search?sig=<hex fingerprint>)", "sig")
    fp = bodies.fingerprint(sig, svc.idx.width, "sig")
    return [_id(m.id) for m in svc.idx.query(fp)]


def _path_id(request: Request) -> Any:
    raw = request.path_params["id"]
    kind = request.query_params.get("type", "str")
    if kind == "int":
        if not raw.isdigit():
            raise BadRequest(f"{raw[:40]!r} is not a non-negative integer", "id")
        return bodies.record_id(int(raw), "id")
    if kind != "str":
        raise BadRequest(f"must be str or int, got {kind[:20]!r}", "type")
    return bodies.record_id(raw, "id")


async def get_record(svc: Service, request: Request) -> Any:
    rid = _path_id(request)
    rec = svc.idx.get(rid)
    if rec is None:
        return _error(404, f"no record has id {rid!r}", "id")
    return {"id": _id(rec.id), "fingerprint": format(rec.fingerprint, svc.hexes),
            "meta": rec.meta}


# ------------------------------------------------------------------ writes
async def add(svc: Service, request: Request) -> Any:
    obj = bodies.fields(await _body(svc, request), "", ("id",), ("fingerprint", "text", "meta"))
    rid = bodies.record_id(obj["id"], "id")
    fp = _fingerprint_of(svc, obj)
    meta = bodies.meta(obj.get("meta"), "meta")
    await _write(svc, partial(svc.idx.add, rid, fp, meta))
    return {"id": rid, "fingerprint": format(fp, svc.hexes)}


async def add_batch(svc: Service, request: Request) -> Any:
    obj = bodies.fields(await _body(svc, request), "", ("records",), ("replace",))
    raw = bodies.array(obj["records"], "records", svc.settings.max_batch)
    replace = bodies.flag(obj.get("replace", True), "replace")
    items = []
    for i, r in enumerate(raw):
        where = f"records[{i}]"
        r = bodies.fields(r, where, ("id",), ("fingerprint", "text", "meta"))
        items.append((bodies.record_id(r["id"], f"{where}.id"), _fingerprint_of(svc, r, where),
                      bodies.meta(r.get("meta"), f"{where}.meta")))
    if items:
        try:
            await _write(svc, partial(svc.idx.add_many, items, replace=replace))
        except InputError as e:
            if replace:
                raise
            return _error(409, str(e), "records")      # replace=false and the id exists
    return {"added": len(items)}


async def add_unique(svc: Service, request: Request) -> Any:
    obj = bodies.fields(await _body(svc, request), "", ("id",),
                        ("fingerprint", "text", "meta", "k"))
    idx = svc.idx
    rid = bodies.record_id(obj["id"], "id")
    fp = _fingerprint_of(svc, obj)
    meta = bodies.meta(obj.get("meta"), "meta")
    k = bodies.radius(obj.get("k"), idx.k)
    found = await _write(svc, partial(idx.add_unique, rid, fp, meta, k))
    return {"added": not found, "id": rid, "fingerprint": format(fp, svc.hexes),
            "matches": svc.matches(found)}


async def remove(svc: Service, request: Request) -> Any:
    rid = _path_id(request)
    removed = await _write(svc, partial(svc.idx.remove, rid))
    if not removed:
        return _error(404, f"no record has id {rid!r}", "id")
    return {"removed": True, "id": rid}


# ------------------------------------------------------------------ the application
def create_app(settings: Settings) -> Starlette:
    """The application of one worker; the index opens at startup and closes (flushed) at
    shutdown, after the server has finished the requests in flight."""
    svc = Service(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        svc.writes = anyio.CapacityLimiter(1)
        svc.index = Index(settings.path, create=False, readonly=settings.readonly)
        svc.hexes = f"0{svc.index.width // 4}x"
        try:
            yield
        finally:
            index, svc.index = svc.index, None
            index.close()

    async def openapi(_svc: Service, request: Request) -> Any:
        return document(svc.index.width if svc.index is not None else 64)

    async def home(_svc: Service, request: Request) -> Any:
        return HTMLResponse(page())

    def route(path: str, fn: Handler, methods: list[str], **kw: bool) -> Route:
        return Route(path, endpoint(svc, fn, **kw), methods=methods)

    routes = [
        route("/", home, ["GET"], auth=False),
        route("/health", health, ["GET"], auth=False),
        route("/openapi.json", openapi, ["GET"], auth=False),
        route("/stats", stats, ["GET"]),
        route("/query", query, ["POST"]),
        route("/query/batch", query_batch, ["POST"]),
        route("/search", search, ["GET"]),
        route("/records/{id:path}", get_record, ["GET"]),
        route("/records/{id:path}", remove, ["DELETE"], write=True),
        route("/add", add, ["POST"], write=True),
        route("/add/batch", add_batch, ["POST"], write=True),
        route("/add-unique", add_unique, ["POST"], write=True),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(404, f"no endpoint {request.url.path} (see /openapi.json)")

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return _error(405, f"{request.method} is not allowed on {request.url.path}")

    async def crashed(request: Request, exc: Exception) -> Response:
        return _error(500, f"internal error ({type(exc).__name__}); see the server's log")

    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: not_found, 405: not_allowed, 500: crashed})


def from_environment() -> Starlette:
    """The application of a worker spawned by `simindex serve` (uvicorn's factory)."""
    raw = json.loads(os.environ["SIMINDEX_SERVE"])
    token_file = os.environ.get("SIMINDEX_TOKEN_FILE")
    token = read_token(token_file) if token_file else os.environ.get("SIMINDEX_TOKEN") or None
    return create_app(Settings(token=token, **raw))


def read_token(path: str) -> str:
    """The bearer token in a file (its first line, surrounding whitespace removed)."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ParameterError(f"cannot read the token file {path}: {e}") from None
    if not token:
        raise ParameterError(f"the token file {path} is empty")
    return token
