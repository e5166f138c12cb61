"""The HTTP API of `simindex serve`: the endpoints, over one open Index per worker process.

Each worker opens the index once at startup (LMDB lets every process read at once; writers
take turns on its write lock) and closes it at shutdown, after the requests in flight.
Queries run on the event loop (microseconds, no I/O wait); writes run in the worker's one
writer thread, so an fsync never stalls other connections' queries. A write is answered
after it commits: an acknowledged write survives kill -9 like any committed one.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from urllib.parse import unquote_to_bytes
from typing import Any, Callable, Optional, Union

from ..errors import (
    ClosedError, CorruptError, DiskFullError, Error, IdExistsError, InputError, ParameterError,
    StorageError,
)
from ..index import Index
from ..engine.results import Match, TextMatch, json_id
from ..textcheck import lowest_threshold
from . import bodies, docs
from .asgi import (
    Answer, Call, Disconnected, Receive, Route, Routes, Scope, Send, error, send_answer,
    to_json,
)
from .bodies import BadRequest
from .openapi import document
from .page import page

MAX_BODY = 8 << 20          # bytes of one request body
MAX_BATCH = 10_000          # fingerprints or records of one batch request
INLINE_BATCH = 1_000        # larger query batches run in a thread (query_many drops the GIL);
                            # smaller ones take under ~2 ms, less than the hop to a thread

log = logging.getLogger("simindex.server")


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


def _unauthorized(given: Optional[bytes]) -> Answer:
    return error(401, "the bearer token is wrong" if given else
                 "a bearer token is required (Authorization: Bearer <token>)",
                 headers=[(b"www-authenticate", b'Bearer realm="simindex"')])


class Api:
    """The ASGI application of one worker: routes, the token, the read-only rule, and every
    error answered as JSON naming what is wrong."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.token = settings.token.encode() if settings.token is not None else None
        self.index: Optional[Index] = None
        self.hexes = "016x"
        self.width = 64
        self.k = 0
        self.floor: Union[float, None, bool] = False   # openapi's, once it is asked for
        self.writer: Optional[ThreadPoolExecutor] = None
        self.routes = Routes()
        for method, path, handler, kw in [
            ("POST", "/query", self.query, {}),
            ("POST", "/query/batch", self.query_batch, {}),
            ("GET", "/search", self.search, {}),
            ("GET", "/records/{id}", self.get_record, {}),
            ("DELETE", "/records/{id}", self.remove, {"write": True}),
            ("POST", "/add", self.add, {"write": True}),
            ("POST", "/add/batch", self.add_batch, {"write": True}),
            ("POST", "/add-unique", self.add_unique, {"write": True}),
            ("GET", "/stats", self.stats, {}),
            ("GET", "/health", self.health, {"auth": False}),
            ("GET", "/openapi.json", self.openapi, {"auth": False}),
            ("GET", "/", self.home, {"auth": False}),
            ("GET", "/docs", self.docs_page, {"auth": False}),
            ("GET", "/docs/{file}", self.docs_file, {"auth": False}),
        ]:
            self.routes.add(method, path, Route(handler, **kw))

    # -------------------------------------------------------------- ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self.http(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.open()
                except Exception as e:               # noqa: BLE001 - reported to uvicorn
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def open(self) -> None:
        s = self.settings
        self.index = Index(s.path, create=False, readonly=s.readonly)
        self.width, self.k = self.index.width, self.index.k
        self.hexes = f"0{self.width // 4}x"
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="simindex-writer")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.shutdown(wait=True)
        index, self.index = self.index, None
        if index is not None:
            index.close()

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        route, tail, answer = self.routes.find(method, scope["path"])
        if route is not None:
            call = Call(scope, receive, self.settings.max_body, tail)
            if route.auth and self.token is not None:
                given = call.header(b"authorization")
                if given is None or given[:7].lower() != b"bearer " or \
                        not hmac.compare_digest(given[7:].strip(), self.token):
                    answer = _unauthorized(given)
            if answer is None and route.write and self.settings.readonly:
                answer = error(403, "this server is read-only (started with --readonly)")
            if answer is None:
                try:
                    out = await route.handler(call)
                except Disconnected:
                    return
                except BadRequest as e:
                    answer = Answer(e.status, e.answer())
                except Exception as e:                # noqa: BLE001 - answered as JSON
                    answer = self.failure(e, scope)
                else:
                    if not isinstance(out, Answer):
                        await send_answer(send, 200, to_json(out), head=method == "HEAD")
                        return
                    answer = out
        assert answer is not None
        body = answer.body if answer.body is not None else to_json(answer.payload)
        await send_answer(send, answer.status, body, answer.content_type, answer.headers,
                          head=method == "HEAD")

    @staticmethod
    def failure(e: Exception, scope: Scope) -> Answer:
        """The answer to an error a handler raised: what it means for the client."""
        if isinstance(e, DiskFullError):
            return error(507, f"the index's disk is full: {e}")
        if isinstance(e, CorruptError):
            return error(500, f"the index is damaged: {e}")
        if isinstance(e, (StorageError, ClosedError)):
            return error(503, str(e))
        if isinstance(e, IdExistsError):     # an insert-if-new or replace=false: the id
            return error(409, str(e), "id")      # names another record
        if isinstance(e, (InputError, ParameterError)):   # a rule the checks did not foresee
            return error(400, str(e))
        if isinstance(e, Error):
            return error(500, str(e))
        log.exception("%s %s failed", scope["method"], scope["path"])
        return error(500, f"internal error ({type(e).__name__}); see the server's log")

    # -------------------------------------------------------------- helpers
    @property
    def idx(self) -> Index:
        if self.index is None:
            raise ClosedError("the index is not open (the server is starting or stopping)")
        return self.index

    def matches(self, ms: list[Match]) -> list[dict[str, Any]]:
        hexes = self.hexes
        out = [{"id": json_id(m.id), "fingerprint": format(m.fingerprint, hexes),
                "distance": m.distance, "meta": m.meta} for m in ms]
        for o, m in zip(out, ms):
            if isinstance(m, TextMatch):     # a text's answer: its similarity too
                o["similarity"] = m.similarity
        return out

    def source_of(self, obj: dict[str, Any], where: str = "") -> tuple:
        """(fingerprint, None) or (None, text) of a body: exactly one of `fingerprint` and
        `text`, checked (a text is fingerprinted by the index's text call that takes it)."""
        has_fp, has_text = "fingerprint" in obj, "text" in obj
        if has_fp == has_text:
            raise BadRequest("give exactly one of fingerprint and text", where or None)
        if has_fp:
            return bodies.fingerprint(obj["fingerprint"], self.width,
                                      f"{where}.fingerprint" if where else "fingerprint"), None
        return None, bodies.text(obj["text"], f"{where}.text" if where else "text")

    def text_record(self, text: str, meta: Any, rid: Any, where: str = "") -> tuple:
        """(fingerprint, meta to store) of a text body (Index.text_record)."""
        try:
            return self.idx.text_record(text, meta, rid)
        except InputError as e:            # a string, but no token in it: 422
            raise BadRequest(str(e), f"{where}.text" if where else "text", status=422) \
                from None

    async def write(self, fn: Callable[[Index], Any]) -> Any:
        """fn(index) in this worker's writer thread (its commit fsyncs; the loop goes on)."""
        return await asyncio.get_running_loop().run_in_executor(self.writer, self._write, fn)

    def _write(self, fn: Callable[[Index], Any]) -> Any:
        """fn(index); a handle that refuses writes since a write to disk failed (a full
        disk) is opened again first, so writes resume once the disk has room (the reopen
        replays what was committed)."""
        idx = self.index       # (None here: a reopen failed; the writer runs while open)
        if idx is None or idx.failed or idx.readonly != self.settings.readonly:
            self.reopen()
        return fn(self.idx)

    def reopen(self) -> None:
        """Open the index again for writing. When that fails too (the disk still full: the
        open catches the tables up), the index is opened read-only, so reads go on, and the
        next write tries again."""
        old, self.index = self.index, None
        if old is not None:
            old.close()
        s = self.settings
        try:
            self.index = Index(s.path, create=False, readonly=s.readonly)
        except Error:
            try:
                self.index = Index(s.path, create=False, readonly=True)
            except Error:
                pass                  # 503 until a write opens it
            raise

    @staticmethod
    async def json(call: Call, required: tuple[str, ...],
                   optional: tuple[str, ...] = ()) -> dict[str, Any]:
        return bodies.fields(bodies.json_body(await call.body()), "", required, optional)

    def path_id(self, call: Call) -> Any:
        """The id at the end of /records/{id}; ?type=int makes it an integer id. A path
        that no id can have names no record: 404, saying why."""
        raw = call.tail
        given = call.scope.get("raw_path")
        if given is not None and b"/records/" in given:
            # the server decodes %-escapes leniently ("%ff" reads as U+FFFD): a path whose
            # bytes are not UTF-8 names no id
            try:
                unquote_to_bytes(given.split(b"/records/", 1)[1]).decode("utf-8")
            except UnicodeDecodeError as e:
                raise BadRequest(f"no record has this id: it is not valid UTF-8 once its "
                                 f"%-escapes are decoded ({e.reason} at byte {e.start})",
                                 "id", status=404) from None
        kind = call.param("type")
        kind = "str" if kind is None else kind
        if kind not in ("str", "int"):
            raise BadRequest(f"must be str or int, got {kind[:20]!r}", "type")
        if kind == "int":
            if not (raw.isascii() and raw.isdigit()):
                raise BadRequest(f"no record has the integer id {raw[:40]!r}: it is not "
                                 f"written in decimal digits", "id", status=404)
            if len(raw) > 20:
                raise BadRequest(f"no record has the integer id {raw[:12]}... ({len(raw)} "
                                 f"digits): int ids are in [0, 2**64)", "id", status=404)
        try:
            return bodies.record_id(int(raw) if kind == "int" else raw, "id")
        except BadRequest as e:
            raise BadRequest(f"no record has this id: {e.message}", "id", status=404) \
                from None

    # -------------------------------------------------------------- reads
    def text_call(self, obj: dict[str, Any], method: Callable[..., Any], k: Optional[int],
                  *args: Any) -> Callable[[Index], Any]:
        """A text body's call to an Index text method, of the index it is given (which
        judges by a similarity threshold: the body's min_similarity, or the index's
        calibration)."""
        ms = bodies.similarity(obj.get("min_similarity"))

        def run(idx: Index) -> Any:
            try:
                return method(idx, *args, k=k, min_similarity=ms)
            except ParameterError as e:
                raise BadRequest(str(e), "min_similarity" if ms is not None else "k") from None
            except IdExistsError:
                raise                            # 409, as failure() answers it
            except InputError as e:
                raise BadRequest(str(e), "text", status=422) from None
        return run

    def check_similarity(self, obj: dict[str, Any]) -> None:
        if "min_similarity" in obj and "text" not in obj:
            raise BadRequest("needs text: the check compares the texts' shingles",
                             "min_similarity")

    async def query(self, call: Call) -> Any:
        obj = await self.json(call, (), ("fingerprint", "text", "k", "min_similarity"))
        idx = self.idx
        self.check_similarity(obj)
        fp, text = self.source_of(obj)
        k = bodies.radius(obj.get("k"), self.k)
        if text is not None:
            fp, found = self.text_call(obj, Index._query_text, k, text)(idx)
        else:
            found = idx.query(fp, k)
        return {"fingerprint": format(fp, self.hexes), "matches": self.matches(found)}

    async def query_batch(self, call: Call) -> Any:
        obj = await self.json(call, ("fingerprints",), ("k",))
        idx = self.idx
        raw = bodies.array(obj["fingerprints"], "fingerprints", self.settings.max_batch)
        width = self.width
        fps = [bodies.fingerprint(v, width, f"fingerprints[{i}]") for i, v in enumerate(raw)]
        k = bodies.radius(obj.get("k"), self.k)
        if not fps:
            results = []
        elif len(fps) > INLINE_BATCH:
            results = await asyncio.get_running_loop().run_in_executor(
                None, partial(idx.query_many, fps, k))
        else:
            results = idx.query_many(fps, k)
        return {"results": [self.matches(ms) for ms in results]}

    async def search(self, call: Call) -> Any:
        """go-simstore's simd: GET /search?sig=<hex> answers a JSON array of the ids found."""
        sig = call.param("sig")
        if sig is None:
            raise BadRequest("is required (GET /search?sig=<hex fingerprint>)", "sig")
        return [json_id(m.id) for m in self.idx.query(bodies.fingerprint(sig, self.width, "sig"))]

    async def get_record(self, call: Call) -> Any:
        rid = self.path_id(call)
        rec = self.idx.get(rid)
        if rec is None:
            return error(404, f"no record has id {rid!r}", "id")
        return {"id": json_id(rec.id), "fingerprint": format(rec.fingerprint, self.hexes),
                "meta": rec.meta}

    async def stats(self, call: Call) -> Any:
        s = await asyncio.get_running_loop().run_in_executor(None, self.idx.stats)
        st = self.settings
        s["server"] = {"workers": st.workers, "readonly": st.readonly, "max_body": st.max_body,
                       "max_batch": st.max_batch, "auth": st.token is not None, "path": st.path}
        return s

    async def health(self, call: Call) -> Any:
        return {"status": "ok" if self.index is not None else "starting", "pid": os.getpid()}

    async def openapi(self, call: Call) -> Any:
        self.idx                              # 503 until the index is open
        if self.floor is False:
            idx = self.idx
            self.floor = lowest_threshold(idx.scheme, idx.width, idx.k, idx.calibration)
        return document(self.width, self.k, self.settings.token is not None, self.idx.scheme,
                        self.floor)

    async def home(self, call: Call) -> Any:
        return Answer(200, body=page().encode("utf-8"), content_type=b"text/html; charset=utf-8")

    async def docs_page(self, call: Call) -> Any:
        if not docs.available():
            return error(404, docs.MISSING)
        return Answer(200, body=docs.PAGE.encode("utf-8"),
                      content_type=b"text/html; charset=utf-8")

    async def docs_file(self, call: Call) -> Any:
        got = docs.file(call.tail)
        if got is None:
            return error(404, docs.MISSING if not docs.available() else
                         f"no file {call.tail!r} on the API page")
        return Answer(200, body=got[0], content_type=got[1],
                      headers=[(b"cache-control", b"max-age=86400")])

    # -------------------------------------------------------------- writes
    async def add(self, call: Call) -> Any:
        obj = await self.json(call, ("id",), ("fingerprint", "text", "meta"))
        rid = bodies.record_id(obj["id"], "id")
        fp, text = self.source_of(obj)
        meta = bodies.meta(obj.get("meta"), "meta")
        if text is not None:   # its sketch is kept as add_text keeps it
            fp, meta = self.text_record(text, meta, rid)
        await self.write(lambda idx: idx.add(rid, fp, meta))
        return {"id": rid, "fingerprint": format(fp, self.hexes)}

    async def add_batch(self, call: Call) -> Any:
        obj = await self.json(call, ("records",), ("replace",))
        raw = bodies.array(obj["records"], "records", self.settings.max_batch)
        replace = bodies.flag(obj.get("replace", True), "replace")
        items = []
        for i, r in enumerate(raw):
            where = f"records[{i}]"
            r = bodies.fields(r, where, ("id",), ("fingerprint", "text", "meta"))
            rid = bodies.record_id(r["id"], f"{where}.id")
            fp, text = self.source_of(r, where)
            meta = bodies.meta(r.get("meta"), f"{where}.meta")
            if text is not None:
                fp, meta = self.text_record(text, meta, rid, where)
            items.append((rid, fp, meta))
        if items:
            try:
                await self.write(lambda idx: idx.add_many(items, replace=replace))
            except IdExistsError as e:       # replace=false and the id exists
                return error(409, str(e), "records")
        return {"added": len(items)}

    async def add_unique(self, call: Call) -> Any:
        obj = await self.json(call, ("id",), ("fingerprint", "text", "meta", "k",
                                              "min_similarity"))
        self.check_similarity(obj)
        rid = bodies.record_id(obj["id"], "id")
        fp, text = self.source_of(obj)
        meta = bodies.meta(obj.get("meta"), "meta")
        k = bodies.radius(obj.get("k"), self.k)
        if text is not None:
            fp, found = await self.write(self.text_call(obj, Index._add_unique_text, k, rid,
                                                        text, meta))
        else:
            found = await self.write(lambda idx: idx.add_unique(rid, fp, meta, k))
        return {"added": not found, "id": rid, "fingerprint": format(fp, self.hexes),
                "matches": self.matches(found)}

    async def remove(self, call: Call) -> Any:
        rid = self.path_id(call)
        if not await self.write(lambda idx: idx.remove(rid)):
            return error(404, f"no record has id {rid!r}", "id")
        return {"removed": True, "id": rid}


def create_app(settings: Settings) -> Api:
    """The ASGI application of one worker (the index opens at lifespan startup)."""
    return Api(settings)


def from_environment() -> Api:
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
