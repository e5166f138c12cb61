"""tools/serve_bench.py's reading of wrk's output, on real `wrk --latency` runs (wrk 4.1.0)
captured against a uvicorn app: a clean run; one with 5xx answers and timeouts; one with
latencies in seconds."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from serve_bench import parse_wrk  # noqa: E402

CLEAN = """\
Running 2s test @ http://127.0.0.1:18731/
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   411.47us  195.95us   1.83ms   69.97%
    Req/Sec    18.52k   249.71    18.82k    80.95%
  Latency Distribution
     50%  373.00us
     75%  539.00us
     90%  718.00us
     99%    0.86ms
  38662 requests in 2.10s, 5.24MB read
Requests/sec:  18407.25
Transfer/sec:      2.49MB
"""

ERRORS = """\
Running 3s test @ http://127.0.0.1:18731/flaky
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   539.45us  327.86us   1.55ms   74.68%
    Req/Sec   294.00    312.54   515.00    100.00%
  Latency Distribution
     50%  451.00us
     75%  721.00us
     90%    1.04ms
     99%    1.43ms
  162 requests in 3.00s, 22.61KB read
  Socket errors: connect 0, read 0, write 0, timeout 8
  Non-2xx or 3xx responses: 16
Requests/sec:     53.93
Transfer/sec:      7.52KB
"""

SECONDS = """\
Running 3s test @ http://127.0.0.1:18731/flaky
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   272.79ms  456.43ms   1.50s    82.32%
    Req/Sec   830.00    742.23     1.43k    66.67%
  Latency Distribution
     50%  538.00us
     75%  434.69ms
     90%    1.11s 
     99%    1.50s 
  250 requests in 3.01s, 34.83KB read
  Non-2xx or 3xx responses: 18
Requests/sec:     83.18
Transfer/sec:     11.59KB
"""


def test_parse_wrk():
    r = parse_wrk(CLEAN)
    assert r["rps"] == 18407.25 and r["requests"] == 38662
    assert r["seconds"] == pytest.approx(2.10)
    assert (r["p50"], r["p75"], r["p90"]) == (373.0, 539.0, 718.0)       # us
    assert r["p99"] == pytest.approx(860.0)                               # "0.86ms"
    assert (r["non2xx"], r["connect"], r["read"], r["write"], r["timeout"]) == (0, 0, 0, 0, 0)
    assert r["errors"] == 0

    r = parse_wrk(ERRORS)
    assert r["rps"] == 53.93 and r["requests"] == 162
    assert r["p50"] == 451.0 and r["p90"] == pytest.approx(1040.0)
    assert r["p99"] == pytest.approx(1430.0)
    assert (r["connect"], r["read"], r["write"], r["timeout"]) == (0, 0, 0, 8)
    assert r["non2xx"] == 16 and r["errors"] == 24

    r = parse_wrk(SECONDS)
    assert r["rps"] == 83.18 and r["requests"] == 250 and r["seconds"] == pytest.approx(3.01)
    assert r["p50"] == 538.0 and r["p75"] == pytest.approx(434_690.0)
    assert r["p90"] == pytest.approx(1_110_000.0)            # "1.11s " (wrk pads the unit)
    assert r["p99"] == pytest.approx(1_500_000.0)
    assert r["non2xx"] == 18 and r["timeout"] == 0 and r["errors"] == 18

    with pytest.raises(ValueError):
        parse_wrk("unable to connect to 127.0.0.1:18731 Connection refused\n")
