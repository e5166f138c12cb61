"""Many processes on one index: readers during writes, two writers, atomic admission."""

import os
import subprocess
import sys
import threading
import time

import numpy as np

import simindex
from conftest import run_py


READER = r"""
import sys, time, zlib, numpy as np, simindex
path, seconds = sys.argv[1], float(sys.argv[2])
def fp_of(name):
    return (zlib.crc32(name.encode()) * 0x9E3779B97F4A7C15) % 2**64
idx = simindex.Index(path, readonly=True)
probes = [fp_of(f"w{b}.{i}") for b in range(0, 400, 7) for i in range(0, 50, 5)]
seen, queries, end = 0, 0, time.time() + seconds
while time.time() < end:
    for ms, q in zip(idx.query_many(probes), probes):
        for m in ms:
            assert m.distance <= idx.k and bin(m.fingerprint ^ q).count("1") == m.distance
            assert m.fingerprint == fp_of(m.id), (m.id, m.fingerprint)   # committed state only
    n = sum(1 for ms in idx.query_many(probes, k=0) if ms)
    assert n >= seen, (n, seen)                                           # never goes back
    seen = n
    queries += len(probes)
print("ok", queries, seen, flush=True)
"""

WRITER = r"""
import sys, zlib, simindex
path, prefix, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
def fp_of(name):
    return (zlib.crc32(name.encode()) * 0x9E3779B97F4A7C15) % 2**64
idx = simindex.Index(path)
for b in range(batches):
    ids = [f"{prefix}{b}.{i}" for i in range(50)]
    idx.add_many([(i, fp_of(i)) for i in ids])
print("done", flush=True)
"""


def crc_fp(name):
    import zlib
    return (zlib.crc32(name.encode()) * 0x9E3779B97F4A7C15) % 2**64


def test_readers_see_only_committed_state_while_a_writer_inserts(tmp_path):
    path = str(tmp_path / "i")
    simindex.Index(path, k=3, shards=8).close()
    readers = [subprocess.Popen([sys.executable, "-c", READER, path, "4"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for _ in range(2)]
    w = run_py(WRITER, path, "w", 400, timeout=300)
    assert "done" in w.stdout
    for r in readers:
        out, err = r.communicate(timeout=120)
        assert r.returncode == 0, err
        assert out.startswith("ok")
    with simindex.Index(path) as idx:
        assert len(idx) == 400 * 50 and idx.verify() == []


def test_two_writer_processes_lose_nothing(tmp_path):
    path = str(tmp_path / "i")
    simindex.Index(path, k=3, shards=4).close()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, path, p, "60"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for p in ("a", "b")]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    with simindex.Index(path) as idx:
        assert len(idx) == 2 * 60 * 50
        assert idx.verify() == []
        for p in ("a", "b"):
            fps = [crc_fp(f"{p}{b}.{i}") for b in range(60) for i in range(50)]
            assert all(ms for ms in idx.query_many(fps, k=0))


ADMIT = r"""
import sys, time, simindex
path, me, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
idx = simindex.Index(path)
while time.time() < start:
    time.sleep(0.001)
won = 0
for base in range(40):
    fp = (base * 0x9E3779B97F4A7C15) % 2**64
    if not idx.add_unique(f"{me}:{base}", fp ^ (1 << me)):     # within 2 bits of the others
        won += 1
print(won, flush=True)
"""


def test_add_unique_admits_exactly_one_across_processes(tmp_path):
    path = str(tmp_path / "i")
    simindex.Index(path, k=3, shards=4).close()
    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", ADMIT, path, str(me), str(start)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for me in range(4)]
    wins = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        wins.append(int(out))
    assert sum(wins) == 40
    with simindex.Index(path) as idx:
        assert len(idx) == 40
        for base in range(40):
            fp = (base * 0x9E3779B97F4A7C15) % 2**64
            assert len(idx.query(fp, k=1)) == 1


def test_threads_share_one_index(tmp_path):
    errors = []
    with simindex.Index(tmp_path / "i", k=3) as idx:
        idx.add_many([(f"s{i}", crc_fp(f"s{i}")) for i in range(2000)])

        def reader():
            try:
                probes = np.array([crc_fp(f"s{i}") for i in range(2000)], dtype=np.uint64)
                for _ in range(5):
                    res = idx.query_many(probes, k=0)
                    assert all(any(m.id == f"s{i}" for m in ms) for i, ms in enumerate(res))
            except Exception as e:          # surfaced below
                errors.append(e)

        def writer():
            try:
                for b in range(20):
                    idx.add_many([(f"t{b}.{i}", crc_fp(f"t{b}.{i}")) for i in range(100)])
            except Exception as e:
                errors.append(e)

        ts = [threading.Thread(target=reader) for _ in range(3)] + \
             [threading.Thread(target=writer) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert errors == []
        assert len(idx) == 2000 + 20 * 100
        assert idx.verify() == []


def test_fork_child_must_reopen(tmp_path):
    idx = simindex.Index(tmp_path / "i")
    idx.add("a", 1)
    pid = os.fork()
    if pid == 0:                                 # child
        code = 1
        try:
            idx.query(1)
        except simindex.ClosedError:
            try:
                with simindex.Index(tmp_path / "i") as again:
                    code = 0 if [m.id for m in again.query(1)] == ["a"] else 2
            except Exception:
                code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert [m.id for m in idx.query(1)] == ["a"]
    idx.close()


def test_child_closing_its_inherited_copy_leaves_the_parent_working(tmp_path):
    idx = simindex.Index(tmp_path / "i")
    idx.add("a", 1)
    assert [m.id for m in idx.query(1)] == ["a"]        # the parent holds reader slots now
    for how in ("close", "with"):
        pid = os.fork()
        if pid == 0:
            try:
                if how == "close":
                    idx.close()
                else:
                    with idx:
                        pass
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert [m.id for m in idx.query(1)] == ["a"]
        assert [[m.id for m in ms] for ms in idx.query_many([1, 1])] == [["a"], ["a"]]
    idx.close()


def test_close_waits_for_queries_in_other_threads(tmp_path):
    idx = simindex.Index(tmp_path / "i")
    fps = np.random.default_rng(2).integers(0, 2**64, 5000, dtype=np.uint64)
    idx.add_many([f"d{i}" for i in range(5000)], fps)
    outcomes = []

    def reader():
        try:
            while True:
                assert all(idx.query_many(fps, k=0))
        except simindex.ClosedError:
            outcomes.append("closed")
        except Exception as e:                     # anything else is a failure
            outcomes.append(e)

    ts = [threading.Thread(target=reader) for _ in range(2)]
    for t in ts:
        t.start()
    time.sleep(0.3)
    idx.close()
    for t in ts:
        t.join(timeout=30)
    assert outcomes == ["closed", "closed"]
