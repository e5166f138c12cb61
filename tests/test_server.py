"""`simindex serve`: a real server (uvicorn workers in subprocesses) on 127.0.0.1, real HTTP
clients (httpx, raw sockets, curl), a real headless browser. Answers are checked against
the brute-force oracle and the library; bad input must answer 4xx JSON naming the field;
SIGTERM finishes what is in flight; kill -9 loses no acknowledged write."""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import simindex
from conftest import brute, fp_of
from textpairs import pair_at, pairs_within

pytestmark = pytest.mark.timeout(300)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`simindex serve PATH` in its own process group, stopped at the end of the test."""

    def __init__(self, path, *args, workers=2, env=None, wait=True):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(os.path.dirname(path), f"serve-{self.port}.log"), "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simindex", "serve", path, "--port", str(self.port),
             "--workers", str(workers), "--log-level", "warning", *args],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **(env or {})})
        self.workers = workers
        if wait:
            self.wait_ready()

    def wait_ready(self):
        """Until every worker has answered /health (each answers with its pid)."""
        pids = set()
        deadline = time.monotonic() + 60
        while len(pids) < self.workers:
            assert self.proc.poll() is None, f"server exited: {self.output()}"
            assert time.monotonic() < deadline, f"server not ready: {self.output()}"
            try:
                with httpx.Client(base_url=self.url, timeout=5) as c:   # a new connection
                    pids.add(c.get("/health").json()["pid"])
            except httpx.TransportError:
                time.sleep(0.1)

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def client(self, **kw):
        return httpx.Client(base_url=self.url, timeout=60, **kw)

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig) if sig == signal.SIGKILL else \
                self.proc.send_signal(sig)
            self.proc.wait(timeout)
        if sig != signal.SIGKILL:      # uvicorn's workers end with their parent
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()
        return self.proc.returncode


@pytest.fixture
def serve(tmp_path):
    started = []

    def start(path, *args, **kw):
        s = Server(str(path), *args, **kw)
        started.append(s)
        return s
    yield start
    for s in started:
        s.stop(signal.SIGKILL)


def read_answer(sock):
    """One HTTP/1.1 answer (head and a Content-Length body) read from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head = data.split(b"\r\n\r\n")[0]
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    while len(data) < len(head) + 4 + length:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    return data


def hexfp(fp, width):
    return format(fp, f"0{width // 4}x")


def planted(width, k, n=300, seed=1):
    """n spread records plus, around one base, a record at every distance 0..k+1 (bits
    packed at the top, at the bottom, and spread), first and last bit included."""
    rng = random.Random(seed)
    stored = {f"r{i}": fp_of(i, width) for i in range(n)}
    base = fp_of(10_000, width)
    for d in range(k + 2):
        for name, bits in (("top", range(d)), ("bottom", range(width - d, width)),
                           ("spread", rng.sample(range(width), d))):
            fp = base
            for b in bits:
                fp ^= 1 << b
            stored[f"{name}{d}"] = fp
    return stored, base


# ------------------------------------------------------------------ answers
@pytest.mark.parametrize("width,k", [(64, 3), (128, 8), (256, 16), (1024, 31)])
def test_queries_equal_the_brute_force_at_every_width(tmp_path, serve, width, k):
    stored, base = planted(width, k)
    path = tmp_path / "idx"
    with simindex.Index(str(path), k=k, width=width) as idx:
        idx.add_many(list(stored.items()))
    s = serve(path)
    queries = [base, base ^ 1, base ^ (1 << (width - 1)), fp_of(5, width) ^ 3,
               fp_of(777_777, width)]
    with s.client() as c:
        for q in queries:
            want = brute(stored, q, k)
            got = c.post("/query", json={"fingerprint": hexfp(q, width)}).json()
            assert {m["id"]: m["distance"] for m in got["matches"]} == want
            assert [m["distance"] for m in got["matches"]] == sorted(want.values())
            for m in got["matches"]:
                assert int(m["fingerprint"], 16) == stored[m["id"]]
            assert sorted(c.get("/search", params={"sig": hexfp(q, width)}).json()) == \
                sorted(want)
            small = c.post("/query", json={"fingerprint": q, "k": 1}).json()   # JSON integer
            assert {m["id"] for m in small["matches"]} == set(brute(stored, q, 1))
        batch = c.post("/query/batch", json={"fingerprints": [hexfp(q, width)
                                                              for q in queries * 30]}).json()
        assert [{m["id"]: m["distance"] for m in ms} for ms in batch["results"]] == \
            [brute(stored, q, k) for q in queries * 30]       # 150: the threaded path too
        st_ = c.get("/stats").json()
        assert (st_["count"], st_["width"], st_["k"]) == (len(stored), width, k)


def test_text_add_get_remove_and_add_unique_agree_with_the_library(tmp_path, serve):
    path = tmp_path / "idx"
    simindex.Index(str(path), k=3).close()
    s = serve(path)
    text = ("Crawlers and data pipelines must tell, for each new document, whether a near-copy "
            "was seen before, over billions of documents, without quadratic work. The answer is "
            "a simhash per document and a set of block permutation tables that find every "
            "stored fingerprint within a few bits of a query.")
    with s.client() as c:
        r = c.post("/add", json={"id": "doc", "text": text, "meta": {"lang": "en"}})
        assert r.status_code == 200, r.text
        fp = int(r.json()["fingerprint"], 16)
        assert fp == simindex.fingerprint(text)
        assert c.get("/records/doc").json() == {"id": "doc", "fingerprint": hexfp(fp, 64),
                                                "meta": {"lang": "en"}}
        near = c.post("/query", json={"text": text.upper() + " ok"}).json()
        assert [m["id"] for m in near["matches"]] == ["doc"]
        # add-if-novel: a near-copy is refused and named, a new text goes in
        dup = c.post("/add-unique", json={"id": "copy", "text": text + " ok"}).json()
        assert (dup["added"], [m["id"] for m in dup["matches"]]) == (False, ["doc"])
        assert c.get("/records/copy").status_code == 404
        new = c.post("/add-unique", json={"id": 7, "fingerprint": hexfp(~fp & (2**64 - 1), 64),
                                          "meta": [1, 2]}).json()
        assert (new["added"], new["matches"]) == (True, [])
        # an add-if-novel never replaces: the id of a record that is not near answers 409
        taken = c.post("/add-unique", json={"id": "doc", "text": "Something else entirely."})
        assert taken.status_code == 409 and "never replaces" in taken.json()["error"]
        assert c.get("/records/doc").json()["meta"] == {"lang": "en"}
        assert c.get("/records/7", params={"type": "int"}).json()["meta"] == [1, 2]
        assert c.get("/records/7").status_code == 404            # the string "7" is not 7
        batch = [{"id": f"https://a.example/{i}", "fingerprint": fp_of(i)} for i in range(50)]
        assert c.post("/add/batch", json={"records": batch}).json() == {"added": 50}
        got = c.get("/records/https://a.example/3").json()
        assert int(got["fingerprint"], 16) == fp_of(3)
        again = c.post("/add/batch", json={"records": batch[:2], "replace": False})
        assert again.status_code == 409 and "https://a.example/0" in again.json()["error"]
        assert c.delete("/records/doc").json() == {"removed": True, "id": "doc"}
        assert c.delete("/records/doc").status_code == 404
        assert c.post("/query", json={"text": text}).json()["matches"] == []
    s.stop()
    with simindex.Index(str(path)) as idx:                    # what the server wrote
        assert len(idx) == 51 and idx.get(7).meta == [1, 2] and idx.get("doc") is None


# ------------------------------------------------------------------ bad input
BAD = [
    ("POST", "/query", b'{"fingerprint": "xyz"}', 400, "fingerprint"),
    ("POST", "/query", b'{"fingerprint": "1234567890abcdef0"}', 400, "fingerprint"),
    ("POST", "/query", b'{"fingerprint": -1}', 400, "fingerprint"),
    ("POST", "/query", b'{"fingerprint": "f_f"}', 400, "fingerprint"),
    ("POST", "/query", b'{"fingerprint": " ff"}', 400, "fingerprint"),
    ("POST", "/query", b'{"fingerprint": "-1"}', 400, "fingerprint"),
    ("POST", "/query", b'{"fingerprint": "0x"}', 400, "fingerprint"),
    ("POST", "/query", b'{"fingerprint": 18446744073709551616}', 400, "fingerprint"),
    ("POST", "/query", b'{"fingerprint": 1.5}', 400, "fingerprint"),
    ("POST", "/query", b'{"fingerprint": true}', 400, "fingerprint"),
    ("POST", "/query", b'{"fingerprint": "ff", "k": 4}', 400, "k"),
    ("POST", "/query", b'{"fingerprint": "ff", "k": "2"}', 400, "k"),
    ("POST", "/query", b'{"fingerprnt": "ff"}', 400, "fingerprnt"),
    ("POST", "/query", b'{"fingerprint": "ff", "text": "a b"}', 400, None),
    ("POST", "/query", b'{}', 400, None),
    ("POST", "/query", b'{"text": "  ... "}', 422, "text"),        # a string, but no token
    ("POST", "/query", b'{"text": 5}', 400, "text"),
    ("POST", "/query", b'{"fingerprint": "ff"', 400, None),
    ("POST", "/query", b'[1, 2]', 400, None),
    ("POST", "/add", b'{"id": "a", "fingerprint": 1, "meta": NaN}', 400, None),
    ("POST", "/query", b'', 400, None),
    ("POST", "/query", b'\xff\xfe{}', 400, None),
    ("POST", "/query", b'[' * 100_000, 400, None),
    ("POST", "/query/batch", b'{"fingerprints": "ff"}', 400, "fingerprints"),
    ("POST", "/query/batch", b'{"fingerprints": ["ff", "zz"]}', 400, "fingerprints[1]"),
    ("POST", "/query/batch", json.dumps({"fingerprints": ["1"] * 11}).encode(), 413,
     "fingerprints"),
    ("POST", "/add", b'{"fingerprint": "ff"}', 400, "id"),
    ("POST", "/add", b'{"id": "", "fingerprint": "ff"}', 400, "id"),
    ("POST", "/add", b'{"id": -3, "fingerprint": "ff"}', 400, "id"),
    ("POST", "/add", b'{"id": [1], "fingerprint": "ff"}', 400, "id"),
    ("POST", "/add", json.dumps({"id": "x" * 600, "fingerprint": "ff"}).encode(), 400, "id"),
    ("POST", "/add/batch", b'{"records": [{"id": 1, "fingerprint": "ff"}, {"id": 2}]}', 400,
     "records[1]"),
    ("POST", "/add/batch", b'{"records": [{"id": 1, "fingerprint": "ff", "x": 1}]}', 400,
     "records[0].x"),
    ("POST", "/add/batch", b'{"records": [5]}', 400, "records[0]"),
    ("POST", "/add/batch", b'{"records": [], "replace": "no"}', 400, "replace"),
    ("POST", "/add-unique", b'{"id": "a", "fingerprint": "ff", "k": -1}', 400, "k"),
    # integers longer than Python converts (4,300 digits) are refused by the field they are in
    ("POST", "/query", b'{"fingerprint": ' + b"9" * 5000 + b'}', 400, "fingerprint"),
    ("POST", "/query", b'{"fingerprint": "ff", "k": ' + b"9" * 5000 + b'}', 400, "k"),
    ("POST", "/query", b'{"fingerprint": "ff", "k": -' + b"9" * 5000 + b'}', 400, "k"),
    ("POST", "/add", b'{"id": ' + b"9" * 5000 + b', "fingerprint": 1}', 400, "id"),
    ("POST", "/add", b'{"id": 1, "fingerprint": 1, "meta": {"a": [1, ' + b"9" * 5000 + b']}}',
     400, "meta.a[1]"),
    ("POST", "/query/batch", b'{"fingerprints": [1, ' + b"9" * 5000 + b']}', 400,
     "fingerprints[1]"),
    ("POST", "/add/batch", b'{"records": [{"id": 1, "fingerprint": ' + b"9" * 5000 + b'}]}',
     400, "records[0].fingerprint"),
    ("POST", "/query", b'{"text": "a b c d", "min_similarity": ' + b"9" * 5000 + b'}', 400,
     "min_similarity"),
    # a path no id can have names no record
    ("GET", "/records/" + "9" * 5000 + "?type=int", b'', 404, "id"),
    ("GET", "/records/%C2%B2?type=int", b'', 404, "id"),          # a digit int() refuses
    ("GET", "/records/" + "x" * 600, b'', 404, "id"),
    ("DELETE", "/records/abc?type=int", b'', 404, "id"),
    ("GET", "/records/abc?type=int&type=str", b'', 400, "type"),
    ("GET", "/records/abc?type=", b'', 400, "type"),
    ("POST", "/add", b'{"id": 1, "fingerprint": 1, "meta": [1e20]}', 400, "meta[0]"),
    # null is not a value of any field but meta
    ("POST", "/query", b'{"fingerprint": "ff", "k": null}', 400, "k"),
    ("POST", "/query", b'{"fingerprint": null}', 400, "fingerprint"),
    ("POST", "/add", b'{"id": null, "fingerprint": "ff"}', 400, "id"),
    ("GET", "/search", b'', 400, "sig"),
    ("GET", "/search?sig=0xZZ", b'', 400, "sig"),
    ("GET", "/records/abc?type=float", b'', 400, "type"),
    ("GET", "/records/abc?type=int", b'', 404, "id"),
    ("GET", "/no/such/endpoint", b'', 404, None),
    ("DELETE", "/query", b'', 405, None),
]


def test_text_calls_judge_by_the_similarity_threshold(tmp_path, serve):
    """A calibrated index served: text bodies are judged at its threshold (or the body's
    min_similarity), as the library's text calls judge them."""
    rng = random.Random(4)
    a, b, _ = pair_at(rng, 0.8, n=60)
    cal = simindex.calibrate([], 0.7)
    # a pair within the radius, below the threshold: both go in
    (far_a, far_b), = pairs_within(rng, cal, 1, 0.45)
    path = tmp_path / "idx"
    simindex.Index(str(path), calibration=cal).close()
    s = serve(path)
    with s.client() as c:
        assert c.post("/add", json={"id": "a", "text": a}).status_code == 200
        assert c.post("/add/batch", json={"records": [{"id": "f", "text": far_a}]}).json() \
            == {"added": 1}
        dup = c.post("/add-unique", json={"id": "b", "text": b}).json()
        assert (dup["added"], [m["id"] for m in dup["matches"]]) == (False, ["a"])
        assert c.post("/add-unique", json={"id": "g", "text": far_b}).json()["added"]
        assert [m["id"] for m in c.post("/query", json={"text": b}).json()["matches"]] == ["a"]
        # a text's answers give the similarity its sketch estimates, as query_text does
        (m,) = c.post("/query", json={"text": b}).json()["matches"]
        with simindex.Index(str(path), readonly=True) as idx:
            assert m["similarity"] == idx.query_text(b)[0].similarity >= 0.7
            fp = format(idx.fingerprint(b), "032x")
        assert dup["matches"][0]["similarity"] == m["similarity"]
        assert all("similarity" not in x for x in
                   c.post("/query", json={"fingerprint": fp}).json()["matches"])
        assert c.post("/query", json={"text": b, "min_similarity": 0.95}).json()["matches"] \
            == []
        for body, field in [({"fingerprint": "0" * 32, "min_similarity": 0.8}, "min_similarity"),
                            ({"text": b, "min_similarity": 0}, "min_similarity"),
                            ({"text": b, "min_similarity": "high"}, "min_similarity"),
                            ({"text": b, "min_similarity": 0.3}, "min_similarity")]:
            r = c.post("/query", json=body)
            assert (r.status_code, r.json()["field"]) == (400, field), r.text
    s.stop()
    with simindex.Index(str(path), readonly=True) as idx:
        assert sorted(r.id for r in [idx.get("a"), idx.get("f"), idx.get("g")]) == \
            ["a", "f", "g"]
        assert idx.get("b") is None


def test_bad_input_answers_4xx_json_naming_the_field_never_500(tmp_path, serve):
    path = tmp_path / "idx"
    with simindex.Index(str(path), k=3) as idx:
        idx.add("a", 0xFF)
    s = serve(path, "--max-batch", "10", "--max-body", "200000", workers=1)
    with s.client() as c:
        for method, url, body, status, field in BAD:
            r = c.request(method, url, content=body)
            assert r.status_code == status, (url, body[:60], r.status_code, r.text)
            out = r.json()
            assert isinstance(out["error"], str) and out["error"], (url, body[:60])
            assert out.get("field") == field, (url, body[:60], out)
        # a path whose bytes are not UTF-8 names no id (not "\ufffd\ufffd")
        r = c.get("/records/%ff%fe")
        assert r.status_code == 404 and "not valid UTF-8" in r.json()["error"]
        # the number 1.5 as an id is named in JSON's words; a tab or a line break in an id
        # is refused as build refuses it
        r = c.post("/add", json={"id": 1.5, "fingerprint": "ff"})
        assert r.status_code == 400 and "got the number 1.5" in r.json()["error"]
        r = c.post("/add", json={"id": "a\tb", "fingerprint": "ff"})
        assert r.status_code == 400 and "tab or a line break" in r.json()["error"]
        big = c.post("/add", content=b'{"id": "a", "meta": "' + b"x" * 300_000 + b'"}')
        assert big.status_code == 413 and "200000" in big.json()["error"]
        # a body announced too large is refused from its header, before it is read
        with socket.create_connection(("127.0.0.1", s.port)) as raw:
            raw.sendall(b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n{")
            answer = read_answer(raw)
        assert answer.startswith(b"HTTP/1.1 413") and b"--max-body" in answer
    assert s.proc.poll() is None
    assert "Traceback" not in s.output()
    with simindex.Index(str(path)) as idx:
        assert len(idx) == 1


JSONS = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) |
                     st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=3) |
                     st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
FIELDS = ["id", "fingerprint", "fingerprints", "text", "meta", "k", "records", "replace"]


def test_random_bodies_never_get_a_500(tmp_path, serve):
    path = tmp_path / "idx"
    simindex.Index(str(path), k=3).close()
    s = serve(path, workers=1)
    endpoints = ["/query", "/query/batch", "/add", "/add/batch", "/add-unique"]
    with s.client() as c:
        @settings(max_examples=150, deadline=None)
        @given(st.sampled_from(endpoints), st.dictionaries(st.sampled_from(FIELDS), JSONS,
                                                           max_size=4))
        def check(url, body):
            r = c.post(url, json=body)
            assert r.status_code < 500, (url, body, r.text)
            assert r.status_code == 200 or "error" in r.json()
        check()
    assert "Traceback" not in s.output()


# ------------------------------------------------------------------ security and limits
def test_whole_numbers_written_with_a_fraction_or_exponent_are_integers(tmp_path, serve):
    """JSON Schema counts 2.0 and 1e3 as integers, so the integer fields take them."""
    path = tmp_path / "idx"
    simindex.Index(str(path), k=3).close()
    s = serve(path, workers=1)
    with s.client() as c:
        r = c.post("/add", content=b'{"id": 2.0, "fingerprint": 1e3, "meta": {"x": 2.5}}')
        assert r.json() == {"id": 2, "fingerprint": format(1000, "016x")}, r.text
        assert c.get("/records/2", params={"type": "int"}).json()["meta"] == {"x": 2.5}
        r = c.post("/query", content=b'{"fingerprint": 1000.000, "k": 1.0e0}')
        assert [m["id"] for m in r.json()["matches"]] == [2]
        r = c.post("/query", content=b'{"fingerprint": 1000.5}')
        assert (r.status_code, r.json()["field"]) == (400, "fingerprint")
    s.stop()


def schemathesis_run(url, seed, cwd, *args):
    """`schemathesis run` over the server's own OpenAPI document (bounded, fixed seed): a
    request the document allows is answered as README says, one it forbids is refused
    with a 4xx, nothing gets a 500, and every answer matches its declared schema."""
    st = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    if not os.path.exists(st):
        st = shutil.which("schemathesis")
    assert st, "schemathesis is in the test extra"
    return subprocess.run(
        [st, "--config-file", os.path.join(os.path.dirname(__file__), "schemathesis.toml"),
         "run", f"{url}/openapi.json", "--checks", "all", "--max-examples", "40",
         "--seed", str(seed), "--workers", "1", "--phases", "coverage,fuzzing,stateful",
         "--no-color", *args], capture_output=True, text=True, timeout=600, cwd=cwd)


@pytest.mark.parametrize("calibrated", [False, True])
def test_the_openapi_document_says_exactly_what_the_server_takes(tmp_path, serve, calibrated):
    """Fuzzed from its own document: a simhash index without a token, and a calibrated
    minhash index (min_similarity has a floor) behind a token."""
    path = tmp_path / "idx"
    cal = simindex.calibrate([], 0.8) if calibrated else None
    with simindex.Index(str(path), k=None if calibrated else 3, calibration=cal) as idx:
        idx.add_many([(f"r{i}", fp_of(i)) for i in range(20)] if not calibrated else [])
    env, args = ({"SIMINDEX_TOKEN": "sekrit"}, ["-H", "Authorization: Bearer sekrit"]) \
        if calibrated else ({}, [])
    s = serve(path, workers=1, env=env)
    run = schemathesis_run(s.url, 7, tmp_path, *args)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "No issues found" in run.stdout
    s.stop()


def test_a_bearer_token_guards_everything_but_health_page_and_openapi(tmp_path, serve):
    path = tmp_path / "idx"
    simindex.Index(str(path), k=3).close()
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    s = serve(path, "--token-file", str(token_file))
    with s.client() as c:
        for url in ("/health", "/", "/openapi.json"):
            assert c.get(url).status_code == 200
        r = c.get("/stats")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert "required" in r.json()["error"]
        assert c.get("/stats", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert c.post("/add", json={"id": "a", "fingerprint": "1"}).status_code == 401
        ok = {"Authorization": "Bearer s3cret-token"}
        assert c.get("/stats", headers=ok).json()["server"]["auth"] is True
        assert c.post("/add", json={"id": "a", "fingerprint": "1"}, headers=ok).status_code == 200
    s.stop()
    # the environment variable works too, and a token is never a command-line argument
    s = serve(path, env={"SIMINDEX_TOKEN": "from-env"}, workers=1)
    with s.client() as c:
        assert c.get("/stats").status_code == 401
        assert c.get("/stats", headers={"Authorization": "Bearer from-env"}).status_code == 200
    r = subprocess.run([sys.executable, "-m", "simindex", "serve", str(path), "--token", "x"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--token" in r.stderr


def test_a_host_other_machines_reach_needs_a_token(tmp_path):
    path = tmp_path / "idx"
    simindex.Index(str(path), k=3).close()
    r = subprocess.run([sys.executable, "-m", "simindex", "serve", str(path), "--host",
                        "0.0.0.0"], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "SIMINDEX_TOKEN"})
    assert r.returncode == 2 and "--insecure" in r.stderr and "0.0.0.0" in r.stderr


def test_readonly_serves_queries_and_refuses_writes(tmp_path, serve):
    path = tmp_path / "idx"
    with simindex.Index(str(path), k=3) as idx:
        idx.add("a", 0xF0)
    s = serve(path, "--readonly", workers=1)
    with s.client() as c:
        assert [m["id"] for m in c.post("/query", json={"fingerprint": "f1"}).json()[
            "matches"]] == ["a"]
        for url, body in (("/add", {"id": "b", "fingerprint": "1"}),
                          ("/add-unique", {"id": "b", "fingerprint": "1"}),
                          ("/add/batch", {"records": []})):
            r = c.post(url, json=body)
            assert r.status_code == 403 and "read-only" in r.json()["error"]
        assert c.delete("/records/a").status_code == 403


def test_clear_errors_for_a_missing_index_and_a_missing_extra(tmp_path):
    r = subprocess.run([sys.executable, "-m", "simindex", "serve", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no simindex index at" in r.stderr and "nope" in r.stderr
    assert "Traceback" not in r.stderr and "create=False" not in r.stderr
    path = tmp_path / "idx"
    simindex.Index(str(path), k=3).close()
    hide = ("import sys; sys.modules['uvicorn'] = None; from simindex.cli import main; "
            f"sys.exit(main(['serve', {str(path)!r}]))")
    r = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "simindex[server]" in r.stderr and "Traceback" not in r.stderr


def test_openapi_describes_every_route(tmp_path, serve):
    path = tmp_path / "idx"
    simindex.Index(str(path), k=3, width=128).close()
    s = serve(path, workers=1)
    with s.client() as c:
        doc = c.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    described = {(p, m.upper()) for p, ops in doc["paths"].items() for m in ops}
    from simindex.server.app import Settings, create_app
    routes = create_app(Settings(path=str(path))).routes.described()
    assert described == routes
    fp = doc["components"]["schemas"]["Fingerprint"]["oneOf"][0]["pattern"]
    assert "{1,32}" in fp                                    # this index's width


# ------------------------------------------------------------------ processes and signals
def test_concurrent_add_if_novel_admits_exactly_one_per_group(tmp_path, serve):
    """16 clients over 2 workers race add-unique on groups of near-identical fingerprints
    (all within k of each other), mixed with queries: one admitted per group, no error."""
    path = tmp_path / "idx"
    simindex.Index(str(path), k=3).close()
    s = serve(path)
    rng = random.Random(3)
    groups = 40
    bases = [rng.getrandbits(64) for _ in range(groups)]
    jobs = [(g, v) for g in range(groups) for v in range(8)]
    rng.shuffle(jobs)
    admitted, errors = [], []
    lock = threading.Lock()

    def client(part):
        with httpx.Client(base_url=s.url, timeout=60) as c:
            for g, v in part:
                fp = bases[g] ^ (1 << v if v else 0)           # within 2 bits of each other
                try:
                    r = c.post("/add-unique", json={"id": f"g{g}v{v}", "fingerprint": fp})
                    q = c.post("/query", json={"fingerprint": bases[g]})
                    if r.status_code != 200 or q.status_code != 200:
                        raise AssertionError(r.text + q.text)
                    if r.json()["added"]:
                        with lock:
                            admitted.append(g)
                except Exception as e:                          # noqa: BLE001
                    with lock:
                        errors.append(repr(e))
    threads = [threading.Thread(target=client, args=(jobs[i::16],)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(admitted) == list(range(groups))


def test_sigterm_stops_a_single_worker_server_with_status_0(tmp_path, serve):
    path = tmp_path / "idx"
    simindex.Index(str(path), k=3).close()
    s = serve(path, workers=1)
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(60) == 0, s.output()
    assert "Traceback" not in s.output()


def test_sigterm_finishes_the_request_in_flight_then_exits(tmp_path, serve):
    path = tmp_path / "idx"
    simindex.Index(str(path), k=3).close()
    s = serve(path)
    body = json.dumps({"records": [{"id": i, "fingerprint": fp_of(i)}
                                   for i in range(2000)]}).encode()
    conn = socket.create_connection(("127.0.0.1", s.port))
    conn.sendall(b"POST /add/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body[:1000])
    time.sleep(0.5)                        # the request has begun: its body is half sent
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    with pytest.raises(httpx.TransportError):          # no new connection is served
        httpx.get(s.url + "/health", timeout=5)
    conn.sendall(body[1000:])
    answer = read_answer(conn)
    conn.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert answer.endswith(b'{"added":2000}')
    assert s.proc.wait(60) == 0
    with simindex.Index(str(path)) as idx:
        assert len(idx) == 2000 and idx.get(1999).fingerprint == fp_of(1999)


def test_kill_9_during_a_write_load_loses_no_acknowledged_write(tmp_path, serve):
    path = tmp_path / "idx"
    simindex.Index(str(path), k=3).close()
    s = serve(path)
    acked, stop = [], threading.Event()
    lock = threading.Lock()

    def writer(w):
        with httpx.Client(base_url=s.url, timeout=30) as c:
            i = 0
            while not stop.is_set():
                rid = f"w{w}-{i}"
                fp = fp_of(w * 1_000_000 + i)
                try:
                    if i % 3 == 2:
                        r = c.post("/add/batch", json={"records": [
                            {"id": f"{rid}-{j}", "fingerprint": fp ^ (j << 40)}
                            for j in range(20)]})
                        done = [(f"{rid}-{j}", fp ^ (j << 40)) for j in range(20)]
                    elif i % 3 == 1:
                        r = c.post("/add-unique", json={"id": rid, "fingerprint": fp})
                        done = [(rid, fp)] if r.status_code == 200 and r.json()["added"] else []
                    else:
                        r = c.post("/add", json={"id": rid, "fingerprint": fp, "meta": i})
                        done = [(rid, fp)]
                except httpx.TransportError:
                    return
                if r.status_code == 200:
                    with lock:
                        acked.extend(done)
                i += 1
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    time.sleep(2.5)
    s.stop(signal.SIGKILL)
    stop.set()
    for t in threads:
        t.join()
    assert len(acked) > 50
    with simindex.Index(str(path)) as idx:
        for rid, fp in acked:
            rec = idx.get(rid)
            assert rec is not None and rec.fingerprint == fp, rid
        sample = random.Random(1).sample(acked, 50)
        for rid, fp in sample:
            assert rid in {m.id for m in idx.query(fp, 0)}
        assert idx.verify() == []


# ------------------------------------------------------------------ the web page
BAR = (214, 39, 40)          # the page's distance bars (#d62728): 20 px + 20 px per bit


def screenshot(url, out):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "the web page test needs Chromium (apt-get install chromium)"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--force-device-scale-factor=1", "--window-size=1000,900",
                    "--virtual-time-budget=10000", f"--screenshot={out}", url],
                   check=True, capture_output=True, timeout=120)
    from PIL import Image
    return np.asarray(Image.open(out).convert("RGB"))


def bars(img):
    """The (top row, width in px) of each solid bar of the bar colour, top to bottom."""
    mask = np.all(img == BAR, axis=2)
    rows = np.nonzero(mask.any(axis=1))[0]
    found = []
    for y in rows:
        if found and y == found[-1][1] + 1:
            found[-1][1] = y
        else:
            found.append([y, y])
    return [(y0, int(mask[(y0 + y1) // 2].sum())) for y0, y1 in found]


def test_the_web_page_renders_the_near_duplicates_of_a_fingerprint(tmp_path, serve):
    path = tmp_path / "idx"
    base = 0x1F2E3D4C5B6A7988
    with simindex.Index(str(path), k=3) as idx:
        idx.add_many([(f"far{i}", fp_of(i)) for i in range(100)])
        idx.add_many([("same", base), ("one", base ^ 1), ("two", base ^ 0x300),
                      ("three", base ^ (1 << 63) ^ 6), ("four", base ^ 0xF0)])
        idx.add(2**64 - 1, base ^ 0xFF00, meta={"n": 2**64 - 2})
    s = serve(path, workers=1)
    img = screenshot(f"{s.url}/?q={base:016x}", tmp_path / "found.png")
    # four rows in distance order, each bar as wide as its distance says
    assert [w for _y, w in bars(img)] == [20, 40, 60, 80]
    # an id and a meta number beyond 2**53 are shown exactly
    dom = subprocess.run([shutil.which("chromium"), "--headless", "--no-sandbox",
                          "--disable-gpu", "--virtual-time-budget=10000", "--dump-dom",
                          f"{s.url}/?q={base ^ 0xFF00:016x}"],
                         capture_output=True, text=True, timeout=120).stdout
    assert "18446744073709551615" in dom and '{"n":18446744073709551614}' in dom
    # the figures are on screen too: the page showed /stats before the search
    dom = subprocess.run([shutil.which("chromium"), "--headless", "--no-sandbox",
                          "--disable-gpu", "--virtual-time-budget=10000", "--dump-dom",
                          f"{s.url}/?q={base:016x}"],
                         capture_output=True, text=True, timeout=120).stdout
    assert "106" in dom and "4 near-duplicates of the fingerprint" in dom
    img = screenshot(f"{s.url}/?q={base ^ 0xFFFF:016x}", tmp_path / "none.png")
    assert bars(img) == []
    dom = subprocess.run([shutil.which("chromium"), "--headless", "--no-sandbox",
                          "--disable-gpu", "--virtual-time-budget=10000", "--dump-dom",
                          f"{s.url}/?q=the+quick+brown+fox&as=text"],
                         capture_output=True, text=True, timeout=120).stdout
    assert "No near-duplicates of the text" in dom


def test_the_api_page_lets_a_browser_try_every_operation(tmp_path, serve):
    """/docs: Swagger UI from the installed package (no CDN), reading /openapi.json, linked
    from the search page; its files only, nothing else of the disk."""
    path = tmp_path / "idx"
    simindex.Index(str(path), k=3).close()
    s = serve(path)
    with s.client() as c:
        page = c.get("/docs")
        assert page.status_code == 200 and "/docs/swagger-ui-bundle.js" in page.text
        js = c.get("/docs/swagger-ui-bundle.js")
        assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
        assert "SwaggerUIBundle" in js.text
        for bad in ("/docs/../../pyproject.toml", "/docs/core.py", "/docs/index.css"):
            assert c.get(bad).status_code == 404, bad
        assert 'href="/docs"' in c.get("/").text
    dom = subprocess.run([shutil.which("chromium"), "--headless", "--no-sandbox",
                          "--disable-gpu", "--virtual-time-budget=15000", "--dump-dom",
                          f"{s.url}/docs"], capture_output=True, text=True, timeout=120).stdout
    for op in ("/query", "/add-unique", "/records/{id}", "/stats"):
        assert f'data-path="{op}"' in dom, op
    assert "opblock-tag" in dom and "simindex" in dom


FULL_DISK_SERVER = r"""
import os, subprocess, sys, simindex
d, port = sys.argv[1], sys.argv[2]
simindex.Index(os.path.join(d, "idx"), k=3, shards=2).close()
srv = subprocess.Popen([sys.executable, "-m", "simindex", "serve", os.path.join(d, "idx"),
                        "--port", port, "--workers", "1", "--log-level", "warning"])
print("started", flush=True)
for line in sys.stdin:
    if line.strip() == "fill":
        with open(os.path.join(d, "filler"), "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
    elif line.strip() == "free":
        os.remove(os.path.join(d, "filler"))
    print("done", flush=True)
srv.terminate()
srv.wait()
"""


def test_writes_resume_once_a_full_disk_has_room_again(tmp_path):
    """A write that fails on a full disk answers 507; once space is freed, the next write
    succeeds without a restart (the worker opens the index again), and nothing
    acknowledged is lost. The index lives on a small tmpfs in a private mount namespace."""
    d = tmp_path / "disk"
    d.mkdir()
    port = free_port()
    try:
        p = subprocess.Popen(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=16m tmpfs '
                              '"$1" || exit 77; shift; exec "$@"', "sh", str(d),
                              sys.executable, "-c", FULL_DISK_SERVER, str(d), str(port)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    except FileNotFoundError:
        pytest.skip("no unshare here")
    if p.stdout.readline().strip() != "started":
        p.kill()
        pytest.skip("no tmpfs can be mounted in a private namespace here")

    def say(cmd):
        p.stdin.write(cmd + "\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "done"
    try:
        url = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=url, timeout=30) as c:
            for _ in range(200):
                try:
                    c.get("/health")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            batch = [{"id": f"a{i}", "fingerprint": hexfp(fp_of(i), 64)} for i in range(500)]
            assert c.post("/add/batch", json={"records": batch}).status_code == 200
            say("fill")
            codes = []
            for n in range(20):
                more = [{"id": f"b{n}.{i}", "fingerprint": hexfp(fp_of(1000 * n + i + 10**6),
                                                                  64)} for i in range(2000)]
                codes.append(c.post("/add/batch", json={"records": more}).status_code)
                if codes[-1] != 200:
                    break
            assert codes[-1] == 507, codes
            # still full: the reopen fails too (it writes the tables); reads go on
            more = [{"id": f"c{i}", "fingerprint": hexfp(fp_of(i + 5 * 10**6), 64)}
                    for i in range(2000)]
            assert c.post("/add/batch", json={"records": more}).status_code == 507
            assert c.get("/records/a0").status_code == 200
            say("free")
            again = c.post("/add", json={"id": "after", "fingerprint": hexfp(fp_of(7), 64)})
            assert again.status_code == 200, again.text
            assert c.get("/records/after").status_code == 200
            assert all(c.get(f"/records/a{i}").status_code == 200 for i in range(0, 500, 50))
    finally:
        p.stdin.close()
        p.wait(timeout=60)
