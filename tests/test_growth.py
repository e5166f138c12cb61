"""The map size grows by itself, in the writing process and in processes reading along."""

import numpy as np

import simindex
from simindex import _testing as hook
from conftest import run_py

GROW = r"""
import sys, numpy as np, simindex, simindex._testing
simindex._testing.tune(initial_map=1 << 20)
idx = simindex.Index(sys.argv[1])
fps = np.random.default_rng(int(sys.argv[2])).integers(0, 2**64, 60000, dtype=np.uint64)
idx.add_many([f"{sys.argv[2]}.{i}" for i in range(60000)], fps)
sizes = simindex._testing.mapsizes(idx)
print(sizes["records"], sizes[0])
"""


def test_map_grows_when_full(tmp_path, monkeypatch):
    monkeypatch.setattr(*hook.KNOBS["initial_map"], 1 << 20)
    path = tmp_path / "i"
    with simindex.Index(path, shards=2) as idx:
        fps = np.random.default_rng(0).integers(0, 2**64, 60000, dtype=np.uint64)
        idx.add_many([f"d{i}" for i in range(60000)], fps)
        sizes = hook.mapsizes(idx)
        assert sizes["records"] > 1 << 20 and sizes[0] > 1 << 20
        assert len(idx) == 60000 and idx.verify() == []
        assert all(ms for ms in idx.query_many(fps[:1000], k=0))


def test_reader_adopts_a_map_grown_by_another_process(tmp_path, monkeypatch):
    monkeypatch.setattr(*hook.KNOBS["initial_map"], 1 << 20)
    path = str(tmp_path / "i")
    simindex.Index(path, shards=2).close()
    with simindex.Index(path, readonly=True) as ro:
        assert ro.query(0) == []
        sizes = run_py(GROW, path, 1).stdout.split()
        assert int(sizes[0]) > 1 << 20
        fps = np.random.default_rng(1).integers(0, 2**64, 60000, dtype=np.uint64)
        assert len(ro) == 60000
        assert all(ms for ms in ro.query_many(fps[:2000], k=0))
        run_py(GROW, path, 2)
        assert len(ro) == 120000
        assert len(list(ro.pairs(k=0))) == 0


def test_add_unique_adopts_a_map_grown_by_another_process(tmp_path, monkeypatch):
    monkeypatch.setattr(*hook.KNOBS["initial_map"], 1 << 20)
    path = str(tmp_path / "i")
    with simindex.Index(path, shards=2) as idx:
        idx.add("first", 12345)
        run_py(GROW, path, 3)                       # grows records/ and the shards
        assert idx.add_unique("new", 1 << 40) == []
        assert [m.id for m in idx.add_unique("again", 12345)] == ["first"]
        assert len(idx) == 60002


def test_a_pending_pairs_iterator_does_not_block_growth(tmp_path, monkeypatch):
    monkeypatch.setattr(*hook.KNOBS["initial_map"], 1 << 20)
    with simindex.Index(tmp_path / "i", shards=2) as idx:
        idx.add_many([("a", 0), ("b", 1)])
        it = idx.pairs()
        fps = np.random.default_rng(4).integers(0, 2**64, 60000, dtype=np.uint64)
        idx.add_many([f"d{i}" for i in range(60000)], fps)     # needs to grow the map
        assert list(it) == [("a", "b", 1)]
        assert len(idx) == 60002


def test_the_map_grows_while_other_threads_query_and_add_unique(tmp_path, monkeypatch):
    """A resize waits for the queries in flight and holds new ones back; a thread inside a
    write (add_unique's query) is never made to wait for it."""
    import threading
    monkeypatch.setattr(*hook.KNOBS["initial_map"], 1 << 20)
    fps = np.random.default_rng(5).integers(0, 2**64, 80000, dtype=np.uint64)
    errors, stop = [], threading.Event()
    with simindex.Index(tmp_path / "i", shards=2) as idx:
        idx.add_many([("seed", int(fps[0]))])

        def query():
            try:
                while not stop.is_set():
                    assert [m.id for m in idx.query(int(fps[0]), k=0)] == ["seed"]
                    idx.query_many(fps[:50])
            except Exception as e:          # reported below: a thread's assert is lost
                errors.append(e)

        def unique():
            try:
                for i in range(300):
                    assert idx.add_unique(f"u{i}", int(fps[40000 + i]) ^ (1 << 7), k=0) == []
            except Exception as e:
                errors.append(e)

        threads = [threading.Thread(target=query) for _ in range(2)] + \
            [threading.Thread(target=unique)]
        for t in threads:
            t.start()
        for b in range(1, 40000, 2000):     # 20 batches: the maps double several times
            idx.add_many([(f"d{i}", int(fps[i])) for i in range(b, b + 2000)])
        threads[-1].join()
        stop.set()
        for t in threads:
            t.join()
        assert errors == []
        assert hook.mapsizes(idx)["records"] >= 1 << 22          # grew twice at least
        assert len(idx) == 1 + 40000 + 300 and idx.verify() == []
        assert all(len(ms) == 1 for ms in idx.query_many(fps[1:40000:7], k=0))
