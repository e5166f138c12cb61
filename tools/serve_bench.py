"""What HTTP costs: `simindex serve` under wrk beside a hello-world JSON app on the same stack.

    python3 tools/serve_bench.py [--n 1000000] [--k 3] [--workers 2] [--connections 8 64]
        [--duration 5] [--batch 100] [--rounds 3] [--index DIR] [--keep]

What the HTTP layer costs on top of the library. This measures, with wrk
(`wrk -t1 -cC -dDs --latency -s script.lua URL`, keep-alive, one client thread), for each
connection count C:

  hello       GET / of a tiny Starlette app answering JSONResponse({"hello": "world"}), run by
              `python3 -m uvicorn mod:app --workers N` (the reference stack, the same
              worker count as the server)
  hello-asgi  the same answer from a bare ASGI callable on uvicorn: simindex serve's own
              stack (uvicorn under a small ASGI layer of its own), the floor any endpoint of
              it can reach
  search      GET /search?sig=<hex> of `simindex serve --workers N`
  query       POST /query {"fingerprint": "<hex>"}
  batch       POST /query/batch of --batch fingerprints
  add-unique  POST /add-unique of a fresh random fingerprint under a new id (a Lua counter
              behind a per-run random prefix, so no two requests of any round share an id)
  library     in this process: Index.query, one call (median us), and Index.query_many's
              cost per fingerprint (us), on the same queries

Data: a fixed seed; N random 64-bit fingerprints stored with add_many (columnar: ids 0..N-1,
a numpy uint64 array), k=3; 10,000 queries, half stored fingerprints with 1..k bits flipped,
half random, shuffled. Every request workload cycles through requests precomputed in its
generated Lua script (10,000 query requests; 10,000/B batch bodies), so wrk builds none of
them while it times. Before timing, each workload's requests are sent once over urllib and
their answers checked against the library; then each server is warmed for a second.

Writes: add-unique commits (with fsync) into the served index. The benchmark always serves
its own copy in a temporary directory (built there, or copied from --index DIR, which is
built there first if it holds no index and is never written afterwards), and accepts that
this copy grows by the add-unique requests (a few thousand a round: well under 1% of 1M), so
later queries (and the library's figures) see those records too.

Rounds (--rounds) run every workload once each, the workloads in an order rotated by one
each round. Printed: per workload and connection count, the median and (min-max) over the
rounds of requests/s, p50 and p99; the goals as per-round ratios (median and range):
single-query rate / hello rate (>= 0.8), single-query p99 / hello p99 at 8 connections
(<= 2), and batch cost per fingerprint, 1 / (batch requests/s * B), / query_many's cost per
fingerprint (<= 2); then a markdown table for docs/tutorials/serve.md. Any non-2xx answer or socket error
under load is printed loudly and makes the exit status 1: the load must run without errors.

wrk, the servers and this process share the machine's cores: on a small machine the client
takes a good part of the CPU, for the hello app and the server alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, Optional

import numpy as np

import simindex

SEED = 19
QUERIES = 10_000
LIBRARY_SINGLE = 2_000          # queries timed one call at a time per round
WARMUP = 1                     # seconds of untimed load on each server before the first timed round
WRK_TIMEOUT = "10s"             # a request slower than this counts as a socket error
HTTP = ["hello", "hello-asgi", "search", "query", "batch", "add-unique"]
HELLOS = ["hello", "hello-asgi"]
WORKLOADS = HTTP + ["library"]
SINGLE = ["search", "query"]

HELLO_APP = '''"""A hello-world JSON endpoint (written by tools/serve_bench.py)."""
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route


async def hello(request):
    return JSONResponse({"hello": "world"})


app = Starlette(routes=[Route("/", hello)])

BODY = b'{"hello":"world"}'


async def asgi_app(scope, receive, send):
    """The same answer on a bare ASGI callable: simindex serve's own stack (uvicorn and a
    small ASGI layer, no framework)."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"17")]})
    await send({"type": "http.response.body", "body": BODY})
'''


# ------------------------------------------------------------------ wrk's output
_TIME_US = {"us": 1.0, "ms": 1e3, "s": 1e6, "m": 60e6, "h": 3600e6}


def _us(text: str) -> float:
    """A wrk duration ("373.00us", "0.86ms", "1.20s") in microseconds."""
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    if m is None:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(m.group(1)) * _TIME_US[m.group(2)]


def parse_wrk(text: str) -> dict[str, Any]:
    """The figures of one `wrk --latency` run: rps, requests, seconds, p50/p75/p90/p99 (us),
    non2xx (wrk counts statuses >= 400 there), connect/read/write/timeout socket errors, and
    errors (their sum). Raises ValueError when the output lacks the rate or the percentiles."""
    rate = re.search(r"^Requests/sec:\s+([\d.]+)\s*$", text, re.M)
    total = re.search(r"^\s*(\d+) requests in ([\d.]+\w+),", text, re.M)
    pct = dict(re.findall(r"^\s+(\d+)%\s+([\d.]+[a-z]+)\s*$", text, re.M))
    if rate is None or total is None or not {"50", "90", "99"} <= pct.keys():
        raise ValueError("wrk's output lacks Requests/sec or the latency distribution:\n"
                         + text)
    out: dict[str, Any] = {"rps": float(rate.group(1)), "requests": int(total.group(1)),
                           "seconds": _us(total.group(2)) / 1e6}
    for p, v in pct.items():
        out[f"p{p}"] = _us(v)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
                     text)
    for i, name in enumerate(("connect", "read", "write", "timeout")):
        out[name] = int(sock.group(i + 1)) if sock else 0
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    out["non2xx"] = int(non2xx.group(1)) if non2xx else 0
    out["errors"] = out["non2xx"] + sum(out[n] for n in ("connect", "read", "write", "timeout"))
    return out


# ------------------------------------------------------------------ data and index
def make_fingerprints(n: int) -> np.ndarray:
    return np.random.default_rng(SEED).integers(0, 2**64, n, dtype=np.uint64)


def make_queries(fps: np.ndarray, k: int, nq: int = QUERIES) -> np.ndarray:
    """Half stored fingerprints with 1..k bits flipped, half random; shuffled."""
    rng = np.random.default_rng(SEED + 1)
    half = nq // 2
    near = fps[rng.integers(0, len(fps), half)].copy()
    for j in range(half):
        for b in rng.choice(64, rng.integers(1, max(k, 1) + 1), replace=False):
            near[j] ^= np.uint64(1) << np.uint64(b)
    far = rng.integers(0, 2**64, nq - half, dtype=np.uint64)
    return rng.permutation(np.concatenate([near, far]))


def build(path: str, fps: np.ndarray, k: int) -> simindex.Index:
    t = time.perf_counter()
    idx = simindex.Index(path, k=k, expected=len(fps))
    idx.add_many(range(len(fps)), fps)
    print(f"# built {len(fps):,} fingerprints at {path} in {time.perf_counter() - t:.1f} s",
          flush=True)
    return idx


def check_reused(path: str, fps: np.ndarray, k: int) -> None:
    """--index DIR: build it if it holds no index, else check it is this tool's N and seed."""
    if not os.path.exists(os.path.join(path, "manifest.msgpack")):
        build(path, fps, k).close()
        return
    with simindex.Index(path, k=k, create=False) as idx:
        if len(idx) != len(fps):
            sys.exit(f"--index {path} holds {len(idx):,} records, not --n {len(fps):,}")
        for i in np.random.default_rng(0).integers(0, len(fps), 100).tolist():
            rec = idx.get(i)
            if rec is None or rec.fingerprint != int(fps[i]):
                sys.exit(f"--index {path} was not built by this tool with --n {len(fps)}")
    print(f"# reusing {path} ({len(fps):,} fingerprints)", flush=True)


def served_index(args: argparse.Namespace, root: str, fps: np.ndarray) -> simindex.Index:
    """The index the servers share, in `root`; this process's one open handle on it."""
    path = os.path.join(root, "index")
    if args.index is None:
        return build(path, fps, args.k)
    check_reused(args.index, fps, args.k)
    shutil.copytree(args.index, path, ignore=shutil.ignore_patterns("lock.mdb"))
    return simindex.Index(path, k=args.k, create=False)


# ------------------------------------------------------------------ Lua scripts for wrk
def _lua_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


CYCLE_LUA = """-- written by tools/serve_bench.py: cycles through requests built once in init()
local method = {method}
local headers = {{["Content-Type"] = "application/json"}}
local items = {{
{items}
}}
local reqs = {{}}
local i = 0

function init(args)
  for j, it in ipairs(items) do
    reqs[j] = wrk.format(method, it[1], headers, it[2])
  end
end

function request()
  i = i % #reqs + 1
  return reqs[i]
end
"""

ADD_UNIQUE_LUA = """-- written by tools/serve_bench.py: a new id and random fingerprint per request
local prefix = {prefix}
local headers = {{["Content-Type"] = "application/json"}}
local n = 0

function init(args)
  math.randomseed({seed})
end

function request()
  n = n + 1
  local fp = string.format("%04x%04x%04x%04x", math.random(0, 65535), math.random(0, 65535),
                           math.random(0, 65535), math.random(0, 65535))
  local body = '{{"id":"' .. prefix .. n .. '","fingerprint":"' .. fp .. '"}}'
  return wrk.format("POST", "/add-unique", headers, body)
end
"""


def cycle_script(method: str, items: list[tuple[str, Optional[str]]]) -> str:
    rows = ",\n".join(f"  {{{_lua_str(p)}, {_lua_str(b) if b is not None else 'nil'}}}"
                      for p, b in items)
    return CYCLE_LUA.format(method=_lua_str(method), items=rows)


def hexes(queries: np.ndarray) -> list[str]:
    return [format(q, "016x") for q in queries.tolist()]


def compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def request_items(queries: np.ndarray, batch: int) -> dict[str, tuple[str, list]]:
    """Per HTTP workload but add-unique: (method, [(path, body or None), ...])."""
    hx = hexes(queries)
    chunks = [hx[i:i + batch] for i in range(0, len(hx) - batch + 1, batch)]
    return {
        "hello": ("GET", [("/", None)]),
        "hello-asgi": ("GET", [("/", None)]),
        "search": ("GET", [(f"/search?sig={h}", None) for h in hx]),
        "query": ("POST", [("/query", compact({"fingerprint": h})) for h in hx]),
        "batch": ("POST", [("/query/batch", compact({"fingerprints": c})) for c in chunks]),
    }


def write_scripts(root: str, items: dict[str, tuple[str, list]]) -> dict[str, str]:
    paths = {}
    for name, (method, its) in items.items():
        paths[name] = os.path.join(root, f"{name}.lua")
        with open(paths[name], "w") as f:
            f.write(cycle_script(method, its))
    return paths


def add_unique_script(root: str, tag: str) -> str:
    """A fresh script per run: its own id prefix and random seed."""
    path = os.path.join(root, f"add-unique-{tag}.lua")
    with open(path, "w") as f:
        f.write(ADD_UNIQUE_LUA.format(prefix=_lua_str(f"bench-{tag}-{secrets.token_hex(4)}-"),
                                      seed=secrets.randbelow(2**31)))
    return path


# ------------------------------------------------------------------ servers
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess in its own session, its output in a log file."""

    def __init__(self, name: str, cmd: list[str], port: int, probe: str, root: str,
                 cwd: Optional[str] = None) -> None:
        self.name, self.port, self.probe = name, port, probe
        self.url = f"http://127.0.0.1:{port}"
        self.log = os.path.join(root, f"{name}.log")
        env = dict(os.environ)
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(simindex.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg, env.get("PYTHONPATH")]))
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                         env=env, start_new_session=True)

    def tail(self) -> str:
        with open(self.log, errors="replace") as f:
            return "".join(f.readlines()[-20:])

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + self.probe, timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not answer in {timeout:.0f} s:\n{self.tail()}")

    def stop(self) -> None:
        """SIGTERM (uvicorn stops its workers), then SIGKILL to its group after 45 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(45)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def start_servers(root: str, index_path: str, workers: int) -> dict[str, Server]:
    with open(os.path.join(root, "hello_app.py"), "w") as f:
        f.write(HELLO_APP)
    quiet = ["--log-level", "warning"]
    p1, p2 = free_port(), free_port()
    servers = {}
    servers["simindex"] = Server(
        "simindex", [sys.executable, "-m", "simindex", "serve", index_path, "--port", str(p1),
                     "--workers", str(workers)] + quiet, p1, "/health", root)
    servers["hello"] = Server(
        "hello", [sys.executable, "-m", "uvicorn", "hello_app:app", "--app-dir", root,
                  "--host", "127.0.0.1", "--port", str(p2), "--workers", str(workers),
                  "--no-access-log", "--no-server-header"] + quiet, p2, "/", root, cwd=root)
    p3 = free_port()
    servers["hello-asgi"] = Server(
        "hello-asgi", [sys.executable, "-m", "uvicorn", "hello_app:asgi_app", "--app-dir", root,
                       "--host", "127.0.0.1", "--port", str(p3), "--workers", str(workers),
                       "--no-access-log", "--no-server-header"] + quiet, p3, "/", root,
        cwd=root)
    return servers


# ------------------------------------------------------------------ checks before load
def http_json(url: str, method: str, body: Optional[str]) -> Any:
    data = body.encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        if r.status != 200:
            raise RuntimeError(f"{method} {url} answered {r.status}")
        return json.loads(r.read())


def preflight(servers: dict[str, Server], items: dict[str, tuple[str, list]],
              idx: simindex.Index, queries: np.ndarray, batch: int) -> None:
    """Each workload's first requests once, their answers checked against the library."""
    want = [sorted(m.id for m in ms) for ms in idx.query_many(queries[:max(batch, 20)])]
    base = servers["simindex"].url
    for hello in HELLOS:
        assert http_json(servers[hello].url + "/", "GET", None) == {"hello": "world"}
    for i in range(min(20, len(queries))):
        for name in SINGLE:
            method, its = items[name]
            got = http_json(base + its[i][0], method, its[i][1])
            ids = got if name == "search" else [m["id"] for m in got["matches"]]
            if sorted(ids) != want[i]:
                raise RuntimeError(f"{name} of query {i}: {ids} != the library's {want[i]}")
    method, its = items["batch"]
    got = http_json(base + its[0][0], method, its[0][1])["results"]
    if [sorted(m["id"] for m in ms) for ms in got] != want[:batch]:
        raise RuntimeError("the first batch's answers differ from the library's")
    body = json.dumps({"id": f"preflight-{secrets.token_hex(4)}",
                       "fingerprint": format(secrets.randbits(64), "016x")})
    if http_json(base + "/add-unique", "POST", body).get("added") is not True:
        raise RuntimeError("add-unique of a random fingerprint was not added")
    found = sum(1 for w in want[:20] if w)
    print(f"# preflight: answers agree with the library ({found} of the first 20 queries "
          f"match something)", flush=True)


# ------------------------------------------------------------------ runs
def wrk(url: str, script: str, connections: int, duration: int) -> dict[str, Any]:
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency",
           "--timeout", WRK_TIMEOUT, "-s", script, url]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60)
    if p.returncode != 0:
        raise RuntimeError(f"wrk failed ({p.returncode}): {p.stdout}{p.stderr}")
    out = parse_wrk(p.stdout)
    out["raw"] = p.stdout
    return out


def count(url: str) -> int:
    return int(http_json(url + "/stats", "GET", None)["count"])


def run_http(name: str, c: int, servers: dict[str, Server], scripts: dict[str, str],
             root: str, duration: int, tag: str) -> dict[str, Any]:
    server = servers[name if name in HELLOS else "simindex"]
    if name != "add-unique":
        return wrk(server.url + "/", scripts[name], c, duration)
    before = count(server.url)
    out = wrk(server.url + "/", add_unique_script(root, tag), c, duration)
    out["grew"] = count(server.url) - before
    return out


def run_library(idx: simindex.Index, queries: np.ndarray) -> dict[str, float]:
    """Index.query one call at a time (median us) and query_many per fingerprint (us,
    the median of 5 passes over the queries)."""
    lat = []
    for q in queries[:LIBRARY_SINGLE].tolist():
        t = time.perf_counter()
        idx.query(q)
        lat.append(time.perf_counter() - t)
    many = []
    for _ in range(5):
        t = time.perf_counter()
        idx.query_many(queries)
        many.append((time.perf_counter() - t) / len(queries))
    return {"query_us": statistics.median(lat) * 1e6,
            "query_many_us": statistics.median(many) * 1e6}


def report_run(rnd: int, name: str, c: int, r: dict[str, Any]) -> bool:
    """Print one wrk run; loudly, and False, when it had any error."""
    line = (f"round {rnd + 1}  {name:<10} c={c:<3} {r['rps']:>10,.0f} req/s  "
            f"p50 {r['p50'] / 1e3:7.2f} ms  p99 {r['p99'] / 1e3:7.2f} ms")
    if "grew" in r:
        line += f"  (index +{r['grew']:,} records; wrk counted {r['requests']:,} answers)"
    print(line, flush=True)
    if r["errors"]:
        print(f"!!! ERRORS in {name} c={c}: {r['non2xx']} non-2xx answers, socket errors "
              f"connect {r['connect']} read {r['read']} write {r['write']} timeout "
              f"{r['timeout']}\n{r['raw']}", file=sys.stderr, flush=True)
    return not r["errors"]


def warm(servers: dict[str, Server], scripts: dict[str, str], conns: list[int]) -> None:
    for name in ("hello", "hello-asgi", "query"):
        server = servers[name if name in HELLOS else "simindex"]
        wrk(server.url + "/", scripts[name], max(conns), WARMUP)


def run_rounds(args: argparse.Namespace, servers: dict[str, Server], scripts: dict[str, str],
               idx: simindex.Index, queries: np.ndarray, root: str) -> tuple[dict, list, bool]:
    http: dict[tuple[str, int], list[dict[str, Any]]] = {}
    lib: list[dict[str, float]] = []
    clean = True
    for rnd in range(args.rounds):
        shift = rnd % len(WORKLOADS)
        order = WORKLOADS[shift:] + WORKLOADS[:shift]
        conns = args.connections if rnd % 2 == 0 else args.connections[::-1]
        for name in order:
            if name == "library":
                lib.append(run_library(idx, queries))
                print(f"round {rnd + 1}  library    Index.query {lib[-1]['query_us']:.1f} us "
                      f"(median call), query_many {lib[-1]['query_many_us']:.2f} us per "
                      f"fingerprint", flush=True)
                continue
            for c in conns:
                r = run_http(name, c, servers, scripts, root, args.duration, f"{rnd}-{c}")
                clean &= report_run(rnd, name, c, r)
                http.setdefault((name, c), []).append(r)
    return http, lib, clean


# ------------------------------------------------------------------ summary
def spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def ratio_rows(args: argparse.Namespace, http: dict, lib: list) -> list[tuple[str, list, str]]:
    """(goal, per-round ratios, target) for each goal."""
    rows = []
    conns = args.connections
    for hello in HELLOS:
        for name in SINGLE:
            for c in conns:
                rows.append((f"{name} rate / {hello} rate, c={c}",
                             [a["rps"] / b["rps"] for a, b in zip(http[name, c],
                                                                  http[hello, c])], ">= 0.8"))
    c8 = 8 if 8 in conns else min(conns)
    for hello in HELLOS:
        for name in SINGLE:
            rows.append((f"{name} p99 / {hello} p99, c={c8}",
                         [a["p99"] / b["p99"] for a, b in zip(http[name, c8], http[hello, c8])],
                         "<= 2"))
    for c in conns:
        rows.append((f"batch cost per fp / query_many's, c={c}",
                     [1e6 / (a["rps"] * args.batch) / b["query_many_us"]
                      for a, b in zip(http["batch", c], lib)], "<= 2"))
    return rows


def met(values: list[float], target: str) -> bool:
    med = statistics.median(values)
    bound = float(target.split()[1])
    return med >= bound if target.startswith(">=") else med <= bound


def summary(args: argparse.Namespace, http: dict, lib: list) -> None:
    n = args.rounds
    print(f"\n## Per workload: median (min-max) over {n} round{'s' * (n > 1)}\n")
    print(f"{'workload':<11} {'conns':>5}  {'requests/s':<28} {'p50 ms':<24} p99 ms")
    for name in HTTP:
        for c in args.connections:
            rs = http[name, c]
            print(f"{name:<11} {c:>5}  {spread([r['rps'] for r in rs]):<28} "
                  f"{spread([r['p50'] / 1e3 for r in rs], '{:.2f}'):<24} "
                  f"{spread([r['p99'] / 1e3 for r in rs], '{:.2f}')}")
    print(f"library: Index.query {spread([x['query_us'] for x in lib], '{:.1f}')} us per call "
          f"(median call); query_many {spread([x['query_many_us'] for x in lib], '{:.2f}')} "
          f"us per fingerprint")
    print("\n## Goals: per-round ratios, median (min-max)\n")
    for goal, values, target in ratio_rows(args, http, lib):
        verdict = "met" if met(values, target) else "MISSED"
        print(f"{goal:<42} {spread(values, '{:.2f}'):<22} goal {target:<7} {verdict}")
    markdown(args, http, lib)


def markdown(args: argparse.Namespace, http: dict, lib: list) -> None:
    print(f"\n## For docs/tutorials/serve.md\n\n{args.n:,} fingerprints, k={args.k}, {args.workers} "
          f"worker{'s' * (args.workers > 1)}, wrk -t1 {args.duration} s runs, {args.rounds} "
          f"round{'s' * (args.rounds > 1)} (median), {os.cpu_count()} cores shared with wrk.\n")
    print("| Workload | Connections | Requests/s | p50 (ms) | p99 (ms) |")
    print("|---|---:|---:|---:|---:|")
    labels = {"hello": "hello-world JSON (Starlette, uvicorn)",
              "hello-asgi": "hello-world JSON (bare ASGI, uvicorn)", "search": "GET /search?sig=",
              "query": "POST /query", "batch": f"POST /query/batch ({args.batch} fps)",
              "add-unique": "POST /add-unique (fsync)"}
    for name in HTTP:
        for c in args.connections:
            rs = http[name, c]
            med = {f: statistics.median(r[f] for r in rs) for f in ("rps", "p50", "p99")}
            print(f"| {labels[name]} | {c} | {med['rps']:,.0f} | {med['p50'] / 1e3:.2f} | "
                  f"{med['p99'] / 1e3:.2f} |")
    print("\n| Goal | Measured | Target |\n|---|---:|---:|")
    for goal, values, target in ratio_rows(args, http, lib):
        print(f"| {goal} | {statistics.median(values):.2f} | {target} |")
    print(f"\nLibrary, same queries: Index.query "
          f"{statistics.median(x['query_us'] for x in lib):.1f} us per call (median), "
          f"query_many {statistics.median(x['query_many_us'] for x in lib):.2f} us per "
          f"fingerprint.")


# ------------------------------------------------------------------ main
def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="fingerprints in the index")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="uvicorn workers of each server")
    ap.add_argument("--connections", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    ap.add_argument("--batch", type=int, default=100, help="fingerprints per batch request")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--index", help="build the index here once and reuse it (served from a "
                                    "copy: never written by the benchmark)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args(argv)
    if min(args.n, args.duration, args.batch, args.rounds, args.workers,
           *args.connections) < 1:
        ap.error("--n, --duration, --batch, --rounds, --workers, --connections must be >= 1")
    if args.batch > QUERIES:
        ap.error(f"--batch is at most {QUERIES:,} (the queries; also the server's --max-batch)")
    return args


def environment(args: argparse.Namespace) -> None:
    import starlette
    import uvicorn
    from importlib.util import find_spec
    extras = [m for m in ("uvloop", "httptools") if find_spec(m)]
    v = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
    wrk_v = (v.stdout + v.stderr).split("\n")[0]
    print(f"# simindex {simindex.__version__}, uvicorn {uvicorn.__version__} "
          f"({', '.join(extras) or 'no uvloop/httptools'}), starlette {starlette.__version__}, "
          f"{wrk_v.split(' Copyright')[0]}, {os.cpu_count()} cores", flush=True)
    print(f"# n={args.n:,} k={args.k} workers={args.workers} connections={args.connections} "
          f"duration={args.duration}s batch={args.batch} rounds={args.rounds}", flush=True)


def bench(args: argparse.Namespace, root: str) -> bool:
    fps = make_fingerprints(args.n)
    queries = make_queries(fps, args.k)
    idx = served_index(args, root, fps)
    servers: dict[str, Server] = {}
    try:
        idx.query_many(queries)                  # the page cache, for the servers too
        items = request_items(queries, args.batch)
        scripts = write_scripts(root, items)
        servers = start_servers(root, idx.path, args.workers)
        for s in servers.values():
            s.wait_ready()
        preflight(servers, items, idx, queries, args.batch)
        warm(servers, scripts, args.connections)
        http, lib, clean = run_rounds(args, servers, scripts, idx, queries, root)
    finally:
        for s in servers.values():
            s.stop()
        idx.close()
    summary(args, http, lib)
    return clean


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    environment(args)
    root = tempfile.mkdtemp(prefix="serve_bench-")
    try:
        clean = bench(args, root)
    except KeyboardInterrupt:
        print("\ninterrupted; the servers are stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"# kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    if not clean:
        print("\n!!! SOME RUNS HAD NON-2XX ANSWERS OR SOCKET ERRORS (see above): "
              "these figures are not valid", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
