"""Indexes of 128- to 1024-bit fingerprints: every call against a brute-force scan with
planted near-duplicates at every distance 0..k+1 (packed, spread, the first and the last
bit), for the paper's plans and plans with flips, across reopen, compaction, records no
shard has applied, kill -9 of a writer, and the state machine."""

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import initialize, rule

import simindex
from simindex import _testing
from conftest import buffer_logs, fp_of, popcount, within
from test_buffer import BufferMachine, oracle, put
from test_state_machine import IndexMachine
from trials import ENV, kill, start_buffered


def brute(stored, q, k):
    return {i: d for i, f in stored.items() if (d := popcount(f ^ q)) <= k}


def brute_pairs(stored, k):
    ids = list(stored)
    return {(ids[i], ids[j]): d
            for i in range(len(ids)) for j in range(i + 1, len(ids))
            if (d := popcount(stored[ids[i]] ^ stored[ids[j]])) <= k}


def dataset(width, k, seed, bases=10, randoms=400):
    rng = random.Random(seed)
    stored = {f"r{i}": rng.getrandbits(width) for i in range(randoms)}
    queries = []
    for b in range(bases):
        base = rng.getrandbits(width) if b > 1 else (0 if b == 0 else 2 ** width - 1)
        queries.append(base)
        for d in range(k + 2):
            for name, bits in (("front", range(d)), ("back", range(width - d, width)),
                               ("spread", [int(x) for x in np.linspace(0, width - 1, d)]
                                if d else []),
                               ("random", rng.sample(range(width), d))):
                stored[f"b{b}.{d}.{name}"] = base ^ sum(1 << (width - 1 - x) for x in set(bits))
    queries += [rng.getrandbits(width) for _ in range(5)]
    return stored, queries


PLANS = [
    # (width, k, blocks, prefix_blocks, shards)
    (128, 8, None, None, 4),        # the planner's plan
    (128, 3, 4, None, 16),          # the paper's: 4 tables of 32-bit prefixes
    (128, 8, 4, 1, 16),             # flips 2 over 32-bit blocks
    (256, 16, None, None, 8),
    (256, 31, None, None, 2),       # flips over 16-bit blocks
    (256, 5, 6, 1, 1),              # prefixes longer than 64 bits: scanned by the first 64
    (512, 15, 16, 1, 4),            # a table per 32-bit block: the band plan of 16 bands
    (512, 7, 8, None, 2),           # prefixes of 64 bits and more
    (768, 23, 24, 1, 2),            # the band plans of 24 and 32 bands
    (1024, 31, 32, 1, 4),
]


@pytest.mark.parametrize("width,k,blocks,prefix_blocks,shards", PLANS)
def test_every_call_equals_brute_force(tmp_path, width, k, blocks, prefix_blocks, shards):
    stored, queries = dataset(width, k, seed=width + k)
    path = tmp_path / "i"
    with simindex.Index(path, width=width, k=k, blocks=blocks, prefix_blocks=prefix_blocks,
                        shards=shards) as idx:
        assert idx.width == width and idx.stats()["width"] == width
        items = list(stored.items())
        third = len(items) // 3
        idx.add_many(items[:third])                                   # (id, fp) items
        idx.add_many([i for i, _ in items[third:2 * third]],          # columnar: ints...
                     [f for _, f in items[third:2 * third]])
        rest = items[2 * third:]
        words = np.array([[(f >> (64 * (width // 64 - 1 - w))) & (2 ** 64 - 1)
                           for w in range(width // 64)] for _, f in rest], dtype=np.uint64)
        idx.add_many([i for i, _ in rest], words)                     # ...and word arrays
        assert len(idx) == len(stored)
        want = [brute(stored, q, k) for q in queries]
        for q, near in zip(queries, want):
            for kq in sorted({0, k // 2, k}):
                got = idx.query(q, k=kq)
                assert {m.id: m.distance for m in got} == within(near, kq)
                assert all(m.fingerprint == stored[m.id] for m in got)
        assert [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)] == want
        assert {(a, b): d for a, b, d in idx.pairs()} == brute_pairs(stored, k)
        assert idx.get("b2.0.front") == simindex.Record("b2.0.front", stored["b2.0.front"], None)
        near = stored["b3.0.front"] ^ 1
        assert {m.id for m in idx.add_unique("u", near)} == set(brute(stored, near, k))
        far = random.Random(1).getrandbits(width)
        while brute(stored, far, k):
            far = random.Random(far).getrandbits(width)
        assert idx.add_unique("u", far) == [] and idx.query(far)[0].id == "u"
        stored["u"] = far
        assert idx.remove("b4.1.back") and idx.verify() == []
        del stored["b4.1.back"]
    with simindex.Index(path) as idx:                                   # only the path
        assert (idx.width, idx.k) == (width, k)
        idx.compact()
        assert idx.verify() == []
        assert [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)] == \
            [brute(stored, q, k) for q in queries]


def test_records_no_shard_applied_are_found_and_paired(tmp_path):
    stored, queries = dataset(128, 8, seed=3, randoms=200)
    with simindex.Index(tmp_path / "i", width=128, k=8, shards=4) as idx:
        fps = np.array([[f >> 64, f & (2 ** 64 - 1)] for f in stored.values()], np.uint64)
        _testing.commit_unapplied(idx, list(stored), fps)
        assert idx.stats()["unapplied"] == len(stored)
        assert [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)] == \
            [brute(stored, q, 8) for q in queries]
        assert {(a, b): d for a, b, d in idx.pairs()} == brute_pairs(stored, 8)
        _testing.crash(idx)
    with simindex.Index(tmp_path / "i") as idx:                        # replays
        assert idx.stats()["unapplied"] == 0 and idx.verify() == []
        assert [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)] == \
            [brute(stored, q, 8) for q in queries]


WIDE_WRITER = r"""
import sys, numpy as np, simindex
path, b = sys.argv[1], int(sys.argv[2])
idx = simindex.Index(path, width=128, k=8, shards=4)
print("ready", flush=True)
while True:
    fps = np.random.default_rng(b).integers(0, 2**64, (64, 2), dtype=np.uint64)
    idx.add_many([f"{b}.{i}" for i in range(64)], fps)
    print("ack", b, flush=True)
    b += 1
"""


def test_kill_9_of_a_wide_writer_loses_nothing_acknowledged(tmp_path):
    path = str(tmp_path / "i")
    acked, b = [], 0
    rng = random.Random(7)
    for trial in range(6):
        p = subprocess.Popen([sys.executable, "-c", WIDE_WRITER, path, str(b)], env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        time.sleep(rng.uniform(0.05, 0.4))
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
        # whole lines only: the kill may cut the last one (a blocked write to the full pipe)
        got = [int(line.split()[1]) for line in out.split("\n")[:-1] if line.startswith("ack")]
        acked += got
        b = (max(got) + 1 if got else b) + 1000        # a fresh range: no half batch reused
    with simindex.Index(path) as idx:
        assert idx.verify() == []
        for a in acked:
            fps = np.random.default_rng(a).integers(0, 2**64, (64, 2), dtype=np.uint64)
            got = idx.query_many(fps, k=0)
            assert all(f"{a}.{i}" in {m.id for m in ms} for i, ms in enumerate(got))
    assert acked                                         # the trials did acknowledge writes


def test_wide_errors_name_the_width(tmp_path):
    with simindex.Index(tmp_path / "i", width=128, k=8) as idx:
        with pytest.raises(simindex.InputError, match="at width 128 it must be in"):
            idx.add("a", 2 ** 128)
        with pytest.raises(simindex.InputError, match="item 0: .*at width 128"):
            idx.add_many([("a", -1)])
        with pytest.raises(simindex.InputError, match=r"shape \(n, 2\)"):
            idx.query_many(np.zeros((3, 4), np.uint64))
        with pytest.raises(simindex.ParameterError, match="k \\(9\\) must be between 0 and "
                           "the index's k"):
            idx.query(0, k=9)
        fp = idx.add_text("doc", "the quick brown fox jumps over the lazy dog")
        assert fp == simindex.fingerprint("the quick brown fox jumps over the lazy dog",
                                          width=128)
        assert idx.query_text("the quick brown fox jumps over the lazy dog")[0].id == "doc"
    with pytest.raises(simindex.ParameterError, match="width=256 was given, but the index "
                       "was built with width=128"):
        simindex.Index(tmp_path / "i", width=256)
    with pytest.raises(simindex.ParameterError, match="seomoz.* not 128"):
        simindex.Index(tmp_path / "s", width=128, scheme="seomoz-simhash")
    with simindex.Index(tmp_path / "m", width=128, k=20, scheme="md5-128-notebook") as idx:
        assert idx.scheme == "md5-128-notebook"
    with pytest.raises(simindex.ParameterError, match="width \\(96\\) must be one of 64, 128, 256, 512, 768, 1024"):
        simindex.Index(tmp_path / "w", width=96)


def spread(fp):
    """A 64-bit fingerprint's bits spread over both words of 128 (the top half of each
    word): an injection of bit positions, so every distance is kept."""
    return ((fp >> 32) << 96) | ((fp & 0xFFFFFFFF) << 32)


def gather(fp):
    """spread's inverse."""
    return ((fp >> 96) << 32) | ((fp >> 32) & 0xFFFFFFFF)


def spread4(fp):
    """A 64-bit value's bit j at bit 4j+1 of 256: each of the four words gets 16 bits."""
    return sum(1 << (4 * j + 1) for j in range(64) if fp >> j & 1)


def gather4(fp):
    """spread4's inverse."""
    return sum(1 << j for j in range(64) if fp >> (4 * j + 1) & 1)


class Through:
    """A wide index seen through an injection of bit positions (`to`, undone by `back`):
    a state machine's 64-bit fingerprints go in spread over every word, and the
    fingerprints it gets back are its own."""

    def __init__(self, idx, to, back):
        self.idx, self.to, self.back = idx, to, back

    def __getattr__(self, name):
        return getattr(self.idx, name)

    def __len__(self):
        return len(self.idx)

    def _back(self, ms):
        return [m._replace(fingerprint=self.back(m.fingerprint)) for m in ms]

    def add(self, id_, fp, meta=None):
        self.idx.add(id_, self.to(fp), meta=meta)

    def add_many(self, items):
        self.idx.add_many([(i, self.to(f)) for i, f in items])

    def add_unique(self, id_, fp):
        return self._back(self.idx.add_unique(id_, self.to(fp)))

    def get(self, id_):
        r = self.idx.get(id_)
        return None if r is None else r._replace(fingerprint=self.back(r.fingerprint))

    def query(self, fp, k=None):
        return self._back(self.idx.query(self.to(fp), k=k))

    def query_many(self, fps):
        return [self._back(ms) for ms in self.idx.query_many([self.to(f) for f in fps])]


class WideIndexMachine(IndexMachine):
    """The state machine of test_state_machine.py on 128-bit indexes, its fingerprints'
    bits spread over both words."""

    @initialize(k=st.integers(0, 8), plan=st.sampled_from([(None, None), (4, 1), (8, 1)]),
                shards=st.sampled_from([1, 4, 256]))
    def open(self, k, plan, shards):
        self.k = k
        blocks, prefix_blocks = plan
        self.idx = Through(simindex.Index(f"{self.dir}/i", width=128, k=k, blocks=blocks,
                                          prefix_blocks=prefix_blocks, shards=shards),
                           spread, gather)

    @rule()
    def reopen(self):
        self.idx.close()
        self.idx = Through(simindex.Index(f"{self.dir}/i"), spread, gather)


# ---------------------------------------------------------------- the write buffer
@pytest.mark.parametrize("width,k", [(128, 8), (256, 16), (512, 15)])
def test_buffered_wide_queries_equal_a_brute_force_and_the_answers_after_flush(tmp_path,
                                                                               width, k):
    stored, queries = dataset(width, k, seed=11, bases=6, randoms=200)
    path = str(tmp_path / "i")
    model = {}
    names = list(stored)
    with simindex.Index(path, width=width, k=k, shards=4) as idx:     # half stored
        idx.add_many([(i, stored[i], n) for n, i in enumerate(names[::2])])
    for n, i in enumerate(names[::2]):
        put(model, i, stored[i], n)
    saved = _testing.tune(fold_age=3600.0)
    try:
        idx = simindex.Index(path, sync=False)                          # half buffered
        for i in names[1::2]:
            idx.add(i, stored[i], meta=[i])
            put(model, i, stored[i], [i])
        moved = names[2]                      # a stored id replaced by a buffered record
        idx.add(moved, queries[0] ^ 1)
        put(model, moved, queries[0] ^ 1, None)
        assert _testing.buffered(idx) == len(names[1::2]) + 1
        before = {}
        for q in queries:
            for kq in (0, k // 2, k):
                got = idx.query(q, k=kq)
                assert [tuple(m) for m in got] == oracle(model, q, kq)
                before[q, kq] = got
        assert _testing.buffered(idx) == len(names[1::2]) + 1        # queries never fold
        idx.flush()
        assert _testing.buffered(idx) == 0 and buffer_logs(path) == []
        for (q, kq), got in before.items():
            assert idx.query(q, k=kq) == got
        assert len(idx) == len(model) and idx.verify() == []
        idx.close()
    finally:
        _testing.tune(**saved)


@pytest.mark.parametrize("width", [128, 256, 512])
def test_kill_9_of_a_buffered_wide_writer_loses_nothing(tmp_path, width):
    path = str(tmp_path / "i")
    p, log = start_buffered(path, 200, width)
    kill(p)
    with simindex.Index(path) as idx:                                   # replays the log
        assert idx.stats()["replayed"] == 200 and len(idx) == 200
        for i in range(200):
            assert idx.get(f"r{i}") == (f"r{i}", fp_of(i, width), {"i": i})
            assert [m.id for m in idx.query(fp_of(i, width) ^ 1, k=1)] == [f"r{i}"]
        assert idx.verify() == [] and buffer_logs(path) == []


def test_a_torn_wide_log_applies_the_whole_entries_before_it(tmp_path):
    path = str(tmp_path / "i")
    p, log = start_buffered(path, 40, 256)
    kill(p)
    with open(log, "r+b") as f:
        f.truncate(os.path.getsize(log) - 3)          # mid-payload of the last entry
    with pytest.warns(RuntimeWarning, match="torn or damaged"):
        idx = simindex.Index(path)
    with idx:
        assert len(idx) == 39 and "r39" not in idx
        assert all(idx.get(f"r{i}").fingerprint == fp_of(i, 256) for i in range(39))


class WideBufferMachine(BufferMachine):
    """test_buffer.py's machine (buffered adds mixed with every other call, folds of every
    size) on a 256-bit index, its fingerprints spread over the four words."""

    @initialize(fold=st.sampled_from([1, 3, 8, 4096]), shards=st.sampled_from([1, 4]))
    def open(self, fold, shards):
        self.saved = _testing.tune(fold=fold, fold_age=3600.0)
        self.idx = Through(simindex.Index(f"{self.dir}/i", width=256, k=3, shards=shards,
                                          sync=False), spread4, gather4)

    @rule()
    def reopen(self):
        self.idx.close()
        self.idx = Through(simindex.Index(f"{self.dir}/i", sync=False), spread4, gather4)


TestWideBufferMachine = WideBufferMachine.TestCase
TestWideBufferMachine.settings = settings(max_examples=25, stateful_step_count=30,
                                          deadline=None)


TestWideIndexMachine = WideIndexMachine.TestCase
TestWideIndexMachine.settings = settings(max_examples=25, stateful_step_count=25,
                                         deadline=None)


def test_cli_builds_and_queries_a_wide_index(tmp_path):
    import json
    rng = random.Random(9)
    fps = [rng.getrandbits(256) for _ in range(200)]
    (tmp_path / "in.tsv").write_text("".join(f"r{i}\t{f:x}\n" for i, f in enumerate(fps)))
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "big", "fingerprint": fps[0] ^ 1})
                                       + "\n")
    q = fps[5] ^ (0b10111 << 250)
    (tmp_path / "q.tsv").write_text(f"q\t{q:x}\n")

    def run(*a):
        return subprocess.run([sys.executable, "-m", "simindex", *map(str, a)], env=ENV,
                              capture_output=True, text=True, timeout=120)
    b = run("build", tmp_path / "i", tmp_path / "in.tsv", tmp_path / "in.jsonl", "--width",
            "256", "--k", "16", "--quiet")
    assert b.returncode == 0, b.stderr
    out = run("query", tmp_path / "i", tmp_path / "q.tsv", "--quiet", "--output", "jsonl")
    [line] = [json.loads(x) for x in out.stdout.splitlines()]
    assert [(m["id"], m["distance"], m["fingerprint"]) for m in line["matches"]] == \
        [("r5", 4, f"{fps[5]:064x}")]
    (tmp_path / "bad.tsv").write_text(f"x\t{1 << 256:x}\n")
    bad = run("build", tmp_path / "i", tmp_path / "bad.tsv")
    assert bad.returncode == 1 and "bad.tsv:1: fingerprint" in bad.stderr and \
        "not 1-64 hex digits (256 bits at most)" in bad.stderr
    info = run("info", tmp_path / "i")
    assert "width\t256" in info.stdout and "count\t201" in info.stdout
    # radii above 63 bits: an index of k=70 is queried and paired at k=68
    (tmp_path / "far.tsv").write_text(f"far\t{fps[7] ^ (2 ** 68 - 1):x}\nnear\t{fps[7]:x}\n")
    b = run("build", tmp_path / "w", tmp_path / "far.tsv", "--width", "256", "--k", "70",
            "--quiet")
    assert b.returncode == 0, b.stderr
    (tmp_path / "q7.tsv").write_text(f"q\t{fps[7]:x}\n")
    out = run("query", tmp_path / "w", tmp_path / "q7.tsv", "--k", "68", "--quiet")
    assert out.returncode == 0, out.stderr
    assert sorted((m["id"], m["distance"]) for m in json.loads(out.stdout)["matches"]) == \
        [("far", 68), ("near", 0)]
    assert run("pairs", tmp_path / "w", "--k", "68").stdout == "far\tnear\t68\n"
    assert run("pairs", tmp_path / "w", "--k", "67").stdout == ""
