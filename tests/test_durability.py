"""Nothing committed is lost: writers killed with SIGKILL at random moments, then reopened."""

import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import simindex
from conftest import run_py

BATCH = 64

# A writer that adds deterministic batches and prints "ack N" after each call returns.
WRITER = r"""
import sys, numpy as np, simindex
path, start, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
idx = simindex.Index(path, k=3, shards=8)
b = start
while True:
    rng = np.random.default_rng(b)
    fps = rng.integers(0, 2**64, %d, dtype=np.uint64)
    ids = [f"{b}.{i}" for i in range(%d)]
    if mode == "single":
        for i, fp in zip(ids, fps):
            idx.add(i, int(fp))
    else:
        idx.add_many(ids, fps)
    print("ack", b, flush=True)
    b += 1
""" % (BATCH, BATCH)


def batch_fps(b):
    return np.random.default_rng(b).integers(0, 2**64, BATCH, dtype=np.uint64)


def run_and_kill(path, start, mode, delay):
    p = subprocess.Popen([sys.executable, "-c", WRITER, path, str(start), mode],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    out, err = p.communicate()
    assert p.returncode == -signal.SIGKILL, err
    return [int(line.split()[1]) for line in out.splitlines() if line.startswith("ack")]


def check_after_crash(path, acked, tried_upto, mode):
    with simindex.Index(path) as idx:                 # writable open replays the shards
        assert idx.stats()["pending"] == 0
        assert idx.verify() == []                      # every table agrees with the records
        for b in acked:
            fps = batch_fps(b)
            for i in range(BATCH):
                assert f"{b}.{i}" in idx
            found = idx.query_many(fps, k=0)
            for i, ms in enumerate(found):
                assert f"{b}.{i}" in {m.id for m in ms}
        for b in range(max(acked, default=-1) + 1, tried_upto + 2):
            present = [f"{b}.{i}" in idx for i in range(BATCH)]
            if mode == "many":
                assert all(present) or not any(present)   # a batch is all or nothing
            else:
                assert present == sorted(present, reverse=True)   # a prefix of its adds


@pytest.mark.parametrize("mode", ["many", "single"])
def test_kill_during_inserts_loses_nothing_acknowledged(tmp_path, mode):
    path = str(tmp_path / "i")
    rng = random.Random(42)
    start = 0
    trials = 6 if mode == "many" else 4
    for trial in range(trials):
        acked = run_and_kill(path, start, mode, rng.uniform(0.6, 1.6))
        check_after_crash(path, acked, max(acked, default=start - 1), mode)
        start = max(acked, default=start) + 2


@pytest.mark.deep
@pytest.mark.parametrize("mode", ["many", "single"])
def test_kill_during_inserts_deep(tmp_path, mode):
    path = str(tmp_path / "i")
    rng = random.Random(7)
    start = 0
    for trial in range(100):
        acked = run_and_kill(path, start, mode, rng.uniform(0.4, 2.0))
        check_after_crash(path, acked, max(acked, default=start - 1), mode)
        start = max(acked, default=start) + 2


def _commit_without_applying(path, n, seed):
    """Commit records to records/ only, as a writer killed before touching the shards."""
    idx = simindex.Index(path)
    st = idx._store
    fps = np.random.default_rng(seed).integers(0, 2**64, n, dtype=np.uint64)
    idks = [simindex.codec.encode_id(f"t{seed}.{i}") for i in range(n)]
    metas = [simindex.codec.pack_meta(None)] * n
    st.write(st.records, lambda txn: st.put_records(txn, idks, fps, metas))
    idx._store = None
    st._close_envs()
    simindex.store._registry.clear()
    return fps


def test_unapplied_records_are_found_before_and_after_replay(tmp_path):
    path = str(tmp_path / "i")
    with simindex.Index(path, k=3) as idx:
        idx.add_many([f"a{i}" for i in range(500)],
                     np.random.default_rng(1).integers(0, 2**64, 500, dtype=np.uint64))
    fps = _commit_without_applying(path, 300, seed=5)
    with simindex.Index(path, readonly=True) as ro:           # cannot replay: checks the tail
        assert ro.stats()["pending"] == 300
        for i, ms in enumerate(ro.query_many(fps ^ np.uint64(0b101))):
            assert f"t5.{i}" in {m.id for m in ms}
        pairs = {(a, b) for a, b, _ in ro.pairs()}
    with simindex.Index(path) as idx:                        # the writer replays
        assert idx.stats()["pending"] == 0 and idx.verify() == []
        assert {(a, b) for a, b, _ in idx.pairs()} == pairs
        for i, ms in enumerate(idx.query_many(fps)):
            assert [m.id for m in ms if m.distance == 0] == [f"t5.{i}"]


REPLAYER = r"""
import sys, simindex
simindex.store.APPLY_CHUNK = 97      # many small shard transactions to be killed between
simindex.Index(sys.argv[1])
print("replayed", flush=True)
"""


def test_kill_during_replay(tmp_path):
    path = str(tmp_path / "i")
    simindex.Index(path, k=3).close()
    fps = _commit_without_applying(path, 3000, seed=9)
    rng = random.Random(3)
    for trial in range(5):
        p = subprocess.Popen([sys.executable, "-c", REPLAYER, path], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        time.sleep(rng.uniform(0.3, 1.0))
        p.kill()
        p.communicate()
        with simindex.Index(path, readonly=True) as ro:
            found = ro.query_many(fps, k=0)
            assert all(f"t9.{i}" in {m.id for m in ms} for i, ms in enumerate(found))
    with simindex.Index(path) as idx:
        assert idx.stats()["pending"] == 0 and idx.verify() == []


def test_compact_keeps_records_added_by_another_process_meanwhile(tmp_path, monkeypatch):
    path = str(tmp_path / "i")
    adder = "import sys, simindex\nwith simindex.Index(sys.argv[1]) as i: i.add('new', 777)"
    with simindex.Index(path, shards=1) as idx:
        idx.add_many([(f"d{i}", i * 7919) for i in range(100)])
        idx.remove("d5")
        st = idx._store
        real = st.with_txn
        calls = []

        def with_txn(env, fn):
            out = real(env, fn)
            if not calls:                       # right after compact() read its snapshot
                calls.append(1)
                run_py(adder, path)
            return out
        monkeypatch.setattr(st, "with_txn", with_txn)
        idx.compact()
        monkeypatch.setattr(st, "with_txn", real)
        assert calls and [m.id for m in idx.query(777, k=0)] == ["new"]
        assert idx.verify() == [] and "d5" not in idx


def test_reopen_never_reuses_seqs_a_shard_already_applied(tmp_path):
    path = str(tmp_path / "i")
    with simindex.Index(path, shards=1) as idx:
        idx.add_many([("a", 1), ("b", 2)])
        st = idx._store
        # as after an OS crash with sync=False: the shard is ahead of the records
        st.write(st.records, lambda txn: txn.put("info", b"next_seq", (2).to_bytes(8, "big")))
    with simindex.Index(path) as idx:
        idx.add("c", 3)
        assert idx.verify() == []
        assert [m.id for m in idx.query(3, k=0)] == ["c"]
