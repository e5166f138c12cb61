"""The OpenAPI 3.1 description of the HTTP API, served at /openapi.json."""

from __future__ import annotations

from typing import Any, Optional

from .._version import __version__


def _obj(required: list[str], props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": props,
            "additionalProperties": False, **extra}


def _json(schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"content": {"application/json": {"schema": schema}}}
    if description:
        out["description"] = description
    return out


def _op(summary: str, ok: dict[str, Any], body: Any = None, *, errors: tuple[int, ...] = (400,),
        params: Any = None, auth: bool = True) -> dict[str, Any]:
    responses: dict[str, Any] = {"200": _json(ok, "OK")}
    text = {400: "Bad input; `field` names the value", 401: "Missing or wrong bearer token",
            403: "The server is read-only", 404: "No such record", 409: "An id exists",
            413: "Body or batch over the server's limit",
            422: "A text with no token to fingerprint; `field` names it",
            503: "The index is unavailable (starting or stopping)",
            507: "The index's disk is full"}
    for code in errors + ((401,) if auth else ()):
        responses[str(code)] = _json({"$ref": "#/components/schemas/Error"}, text[code])
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True, **_json(body)}
    if params:
        op["parameters"] = params
    if not auth:
        op["security"] = []
    return op


def document(width: int, k: int, auth: bool, scheme: Optional[str] = None,
             floor: Optional[float] = 0.0) -> dict[str, Any]:
    """The API of a server whose index holds `width`-bit fingerprints of `scheme` and finds
    matches up to `k` bits; `auth`: whether it asks for a bearer token; `floor`: the least
    min_similarity it takes without k (None: none, see textcheck.lowest_threshold)."""
    digits = width // 4
    hexfp = {"type": "string", "pattern": f"^(0[xX])?[0-9a-fA-F]{{1,{digits}}}$",
             "description": f"1-{digits} hex digits"}
    fp = {"oneOf": [hexfp, {"type": "integer", "minimum": 0, "maximum": (1 << width) - 1}]}
    rid = {"oneOf": [{"type": "string", "minLength": 1, "maxLength": 510,
                      "pattern": "^[^\t\n\r]+$",
                      "description": "at most 510 bytes of UTF-8, without a tab or a line "
                                     "break"},
                     {"type": "integer", "minimum": 0, "maximum": (1 << 64) - 1}]}
    radius = {"type": "integer", "minimum": 0, "maximum": k,
              "description": "at most the index's k (its default)"}
    ref = {n: {"$ref": f"#/components/schemas/{n}"}
           for n in ("Match", "Fingerprint", "Id", "Meta")}
    # any JSON value whose whole numbers msgpack stores as integers
    meta = {"anyOf": [
        {"type": ["null", "boolean", "string"]},
        {"type": "integer", "minimum": -(1 << 63), "maximum": (1 << 64) - 1},
        {"type": "number", "not": {"type": "integer"}},
        {"type": "array", "items": ref["Meta"]},
        {"type": "object", "additionalProperties": ref["Meta"]}]}
    matches = {"type": "array", "items": ref["Match"]}
    text = {"type": "string",
            "description": "a text; one the index's scheme finds no token in answers 422"}
    source = {"fingerprint": ref["Fingerprint"], "text": text}
    similar = {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
               "description": "with text: only records whose stored text is this similar "
                              "(Jaccard of shingles, or containment in an index calibrated "
                              "for it; default: the index's calibration)"}
    one_source = [{"required": ["fingerprint"]}, {"required": ["text"]}]
    # min_similarity judges texts, and below the floor only at a given k
    judged: dict[str, Any] = {"oneOf": [
        {"required": ["fingerprint"],
         "not": {"anyOf": [{"required": ["text"]}, {"required": ["min_similarity"]}]}},
        {"required": ["text"], "not": {"required": ["fingerprint"]}}]}
    judging = {} if floor is None else {"min_similarity": similar}   # None: no sketches
    if floor is not None and floor > 0:
        judged["if"] = {"required": ["min_similarity"],
                        "properties": {"min_similarity": {"exclusiveMaximum": floor}}}
        judged["then"] = {"required": ["k"]}
    id_param = [{"name": "id", "in": "path", "required": True,
                 "schema": {"type": "string", "minLength": 1},
                 "description": "an id no record can have (with type=int, not in decimal "
                                "digits; over 510 bytes) answers 404"},
                {"name": "type", "in": "query", "required": False,
                 "schema": {"enum": ["str", "int"], "default": "str"},
                 "description": "int: the id is an integer id"}]
    record = {"type": "object", "properties": {"id": ref["Id"], "fingerprint": ref["Fingerprint"],
                                               "meta": {}}}
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "simindex", "version": __version__,
                 "description": "An exact near-duplicate index of simhash fingerprints: every "
                                "stored fingerprint within k bits of a query, nothing else."},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Fingerprint": fp, "Id": rid, "Meta": meta,
                "Match": _obj(["id", "fingerprint", "distance"], {
                    "id": ref["Id"], "fingerprint": {"type": "string"},
                    "distance": {"type": "integer"}, "meta": {},
                    "similarity": {
                        "type": ["number", "null"], "minimum": 0, "maximum": 1,
                        "description": "A text body's answers only: the stored text's "
                                       "similarity to it, estimated from the sketch its record "
                                       "keeps (null: a record stored without one)"}}),
                "Error": {"type": "object", "required": ["error"], "properties": {
                    "error": {"type": "string"}, "field": {"type": "string"}}},
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/": {"get": {"summary": "The web page: the index's figures and a search box "
                                     "(?q=TEXT-OR-HEX&as=auto|text|fingerprint&k=K runs a "
                                     "search on load)", "security": [],
                          "responses": {"200": {"description": "HTML", "content": {
                              "text/html": {"schema": {"type": "string"}}}}}}},
            "/openapi.json": {"get": _op("This description", {"type": "object"}, errors=(),
                                         auth=False)},
            "/docs": {"get": {"summary": "A page to try every operation (Swagger UI, served "
                                         "from the swagger-ui-py package)", "security": [],
                              "responses": {"200": {"description": "HTML", "content": {
                                  "text/html": {"schema": {"type": "string"}}}},
                                  "404": {"description": "swagger-ui-py is not installed"}}}},
            "/docs/{file}": {"get": {
                "summary": "One of the page's files (its script, style and icon)",
                "security": [],
                "parameters": [{"name": "file", "in": "path", "required": True,
                                "schema": {"type": "string", "enum": [
                                    "swagger-ui-bundle.js", "swagger-ui.css",
                                    "favicon-32x32.png"]}}],
                "responses": {"200": {"description": "The file"},
                              "404": {"description": "Not one of the page's files"}}}},
            "/health": {"get": _op("Liveness", {"type": "object"}, errors=(), auth=False)},
            "/stats": {"get": _op("The index's counts, parameters and bytes on disk",
                                  {"type": "object"}, errors=())},
            "/query": {"post": _op(
                "Stored fingerprints within k bits of one fingerprint or text",
                _obj(["fingerprint", "matches"], {"fingerprint": {"type": "string"},
                                                  "matches": matches}),
                _obj([], {**source, "k": radius, **judging}, **judged),
                errors=(400, 422))},
            "/query/batch": {"post": _op(
                "query for each fingerprint of a batch",
                _obj(["results"], {"results": {"type": "array", "items": matches}}),
                _obj(["fingerprints"], {"fingerprints": {"type": "array", "items": fp},
                                        "k": radius}), errors=(400, 413))},
            "/search": {"get": _op(
                "go-simstore simd compatibility: the ids within the index's k",
                {"type": "array", "items": ref["Id"]}, params=[
                    {"name": "sig", "in": "query", "required": True, "schema": hexfp}])},
            "/records/{id}": {
                "get": _op("The stored record of an id", record, params=id_param,
                           errors=(400, 404)),
                "delete": _op("Remove the record of an id", {"type": "object"},
                              params=id_param, errors=(400, 403, 404, 507))},
            "/add": {"post": _op(
                "Store a fingerprint (or a text's) under an id, replacing any earlier record",
                {"type": "object"},
                _obj(["id"], {"id": ref["Id"], **source, "meta": ref["Meta"]}, oneOf=one_source),
                errors=(400, 403, 422, 507))},
            "/add/batch": {"post": _op(
                "Store many records in one atomic commit",
                {"type": "object"}, _obj(["records"], {
                    "records": {"type": "array", "items": _obj(
                        ["id"], {"id": ref["Id"], **source, "meta": ref["Meta"]},
                        oneOf=one_source)},
                    "replace": {"type": "boolean", "default": True}}),
                errors=(400, 403, 409, 413, 422, 507))},
            "/add-unique": {"post": _op(
                "Store it only when nothing is within k bits; answers what is (atomic)",
                _obj(["added", "id", "fingerprint", "matches"], {
                    "added": {"type": "boolean"}, "id": ref["Id"],
                    "fingerprint": {"type": "string"}, "matches": matches}),
                _obj(["id"], {"id": ref["Id"], **source, "meta": ref["Meta"], "k": radius,
                              **judging}, **judged),
                errors=(400, 403, 409, 422, 507))},
        },
    }
    return doc if auth else _without_auth(doc)


def _without_auth(doc: dict[str, Any]) -> dict[str, Any]:
    """The document of a server without a token: no security scheme and no 401 answers."""
    doc.pop("security")
    doc["components"].pop("securitySchemes")
    for ops in doc["paths"].values():
        for op in ops.values():
            op.pop("security", None)
            op["responses"].pop("401", None)
    return doc
