"""simindex.distributed on a real local Ray that can reach nothing but loopback: every answer is the
single-process one and the brute force's, and a killed actor loses no acknowledged record."""

import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest

import simindex
from conftest import (
    block_ranges, brute, brute_pairs, flip, ledger_server, one_table_family, planted_family,
    popcount, shard_boundary_fps,
)
from simindex import _testing
from simindex.bands import BAND_RADIUS
from simindex.engine.plan import Plan
from textpairs import pairs_within

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'simindex[ray]')")
dist = pytest.importorskip("simindex.distributed")
sandbox = pytest.importorskip("simindex.distributed.sandbox")


def dataset(k, seed, n_random=3000, blocks=None):
    """Random records plus planted families at every distance 0..k+1 (edge bits included),
    one-table families and shard-boundary fingerprints; and queries at those places."""
    rng = random.Random(seed)
    stored = {f"r{i}": rng.getrandbits(64) for i in range(n_random)}
    bases = [rng.getrandbits(64) for _ in range(6)] + [0, (1 << 64) - 1]
    for b, base in enumerate(bases):
        for j, fp in enumerate(planted_family(rng, base, k)):
            stored[f"p{b}.{j}"] = fp
        for j, fp in enumerate(one_table_family(rng, base, k, blocks or k + 1)):
            stored[f"o{b}.{j}"] = fp
    for j, fp in enumerate(shard_boundary_fps(k)):
        stored[f"s{j}"] = fp
    queries = bases + [fp ^ 1 for fp in list(stored.values())[::97]] + \
        [rng.getrandbits(64) for _ in range(50)]
    return stored, queries


def answers(matches):
    return [[(m.id, m.distance, m.fingerprint, m.meta) for m in ms] for ms in matches]


def write_tsv(path, records):
    with open(path, "w") as f:
        for i, fp in records:
            f.write(f"{i}\t{fp:016x}\n")


def single_process(path, stored, k, blocks, shards):
    with simindex.Index(path, k=k, blocks=blocks, shards=shards) as idx:
        idx.add_many(list(stored.items()))


@pytest.mark.parametrize("k,blocks,shards", [(3, None, 4), (4, 6, 2), (9, 10, 4)])
def test_build_gives_the_single_process_index(local_ray, tmp_path, k, blocks, shards):
    stored, queries = dataset(k, seed=k * 7 + shards, blocks=blocks)
    items = list(stored.items())
    half = len(items) // 2
    write_tsv(tmp_path / "a.tsv", items[:half])
    write_tsv(tmp_path / "b.tsv", items[half:])
    got = dist.build(tmp_path / "d", [tmp_path / "a.tsv", tmp_path / "b.tsv"], shards=shards,
                     k=k, blocks=blocks)
    assert got["records"] == len(items)
    single_process(str(tmp_path / "s"), stored, k, blocks, shards)
    with simindex.Index(tmp_path / "d", readonly=True) as d, \
            simindex.Index(tmp_path / "s", readonly=True) as s:
        assert (d.k, d.blocks, d.shards) == (k, s.blocks, shards)
        assert d.verify() == [] and len(d) == len(stored)
        want = s.query_many(queries)
        assert answers(d.query_many(queries)) == answers(want)
        for q, ms in zip(queries, want):
            assert {m.id: m.distance for m in ms} == brute(stored, q, k)


def test_build_from_an_iterable_and_stops_at_a_bad_line(local_ray, tmp_path):
    stored, queries = dataset(3, seed=5)
    dist.build(tmp_path / "d", iter(stored.items()), shards=4, k=3)
    with simindex.Index(tmp_path / "d", readonly=True) as d:
        for q, ms in zip(queries, d.query_many(queries)):
            assert {m.id: m.distance for m in ms} == brute(stored, q, 3)
    (tmp_path / "good.tsv").write_text("g1\t01\ng2\t02\n")
    (tmp_path / "bad.tsv").write_text("h1\t03\nh2\tnot-hex\nh3\t04\n")
    with pytest.raises(simindex.Error, match=r"bad.tsv:2: fingerprint 'not-hex'"):
        dist.build(tmp_path / "e", [tmp_path / "good.tsv", tmp_path / "bad.tsv"], shards=2, k=3)
    with simindex.Index(tmp_path / "e", readonly=True) as e:
        assert sorted(r.id for r in map(e.get, ["g1", "g2", "h1", "h3"]) if r) == \
            ["g1", "g2", "h1"]                    # everything before the bad line, no more
    with pytest.raises(simindex.InputError, match="fingerprint"):
        dist.build(tmp_path / "f", [("x", -1)], shards=2, k=3)
    with pytest.raises(simindex.ParameterError, match="k"):
        dist.build(tmp_path / "d", [("x", 1)], shards=4, k=2)   # the index has k=3


def test_cluster_answers_like_the_index(local_ray, tmp_path):
    stored, queries = dataset(3, seed=11)
    items = list(stored.items())
    with simindex.Index(tmp_path / "i", k=3, shards=8) as idx:
        idx.add_many(items[:1000])                  # some records before the cluster starts
    with dist.Cluster(tmp_path / "i") as c:
        c.add_many(items[1000:2000])
        c.add_many([i for i, _ in items[2000:]], np.array([f for _, f in items[2000:]],
                                                          dtype=np.uint64))
        c.add("meta", 0x1234, {"url": "http://x"})
        stored["meta"] = 0x1234
        assert len(c) == len(stored) and "meta" in c and "nope" not in c
        assert c.get("meta") == simindex.Record("meta", 0x1234, {"url": "http://x"})
        got = c.query_many(queries)
        for q, ms in zip(queries, got):
            assert {m.id: m.distance for m in ms} == brute(stored, q, 3)
        assert answers([c.query(queries[0], k=1)]) == answers(c.query_many(queries[:1], k=1))
        # add_unique: refused within k (returning the neighbours), admitted otherwise
        near = stored["p0.0"] ^ 0b101
        assert {m.id for m in c.add_unique("u1", near)} == set(brute(stored, near, 3))
        assert c.get("u1") is None
        far = next(x for x in iter(lambda: random.getrandbits(64), None)
                   if not brute(stored, x, 3))
        assert c.add_unique("u2", far) == [] and c.query(far)[0].id == "u2"
        assert c.remove("u2") and not c.remove("u2") and c.query(far) == []
        with pytest.raises(simindex.ParameterError):
            c.query(1, k=4)
        # a wide fingerprint given to a 64-bit cluster: its value and the rule
        with pytest.raises(simindex.InputError, match=rf"item 0: fingerprint {2 ** 64} is "
                                                      rf"out of range: .*2\*\*64"):
            c.add_many([("x", 2 ** 64)])
        with pytest.raises(simindex.InputError, match=rf"{2 ** 128} is out of range"):
            c.query(2 ** 128)
        with pytest.raises(simindex.InputError, match=rf"{2 ** 100} is out of range"):
            c.add_unique("x", 2 ** 100)
        with pytest.raises(simindex.InputTypeError, match=r"int, got bytes b'\\x00\\x00"):
            c.add("x", bytes(16))
        with pytest.raises(simindex.InputError, match=r"1-d array, got shape \(2, 2\)"):
            c.query_many(np.zeros((2, 2), dtype=np.uint64))
        with simindex.Index(tmp_path / "i", readonly=True) as idx:
            assert answers(idx.query_many(queries)) == answers(c.query_many(queries))
    with simindex.Index(tmp_path / "i") as idx:
        assert idx.verify() == [] and idx.stats()["unapplied"] == 0


@pytest.mark.parametrize("bands", [False, True], ids=["radius", "bands"])
def test_cluster_text_calls_judge_as_the_index_does(local_ray, tmp_path, bands):
    """A calibrated index served by a Cluster (a radius of minhash-v1 bits, or the band
    search): add_text keeps sketches, and query_text and add_unique_text (judged by the
    ledger under its lock) answer what the Index answers."""
    rng = random.Random(3)
    cal = simindex.calibrate([], 0.7, bands=bands)
    simindex.Index(tmp_path / "i", calibration=cal, shards=4).close()
    pairs = pairs_within(rng, cal, 6, 0.85) + pairs_within(rng, cal, 6, 0.4)
    with dist.Cluster(tmp_path / "i") as c:
        assert c.text_check() == (simindex.TextCheck(BAND_RADIUS, 0.7, "jaccard", 8) if bands
                                  else simindex.TextCheck(cal.k, 0.7, "jaccard"))
        for n, (a, _b) in enumerate(pairs):
            c.add_text(f"a{n}", a, meta={"n": n})
        assert c.get("a0").meta == {"n": 0}
        for n, (_a, b) in enumerate(pairs):
            assert [m.id for m in c.query_text(b)] == ([f"a{n}"] if n < 6 else [])
            assert c.query_text(b, min_similarity=0.99) == []
        sims = [[m.similarity for m in c.query_text(b)] for _a, b in pairs]
        got = [c.add_unique_text(f"b{n}", b) for n, (_a, b) in enumerate(pairs)]
        assert [[m.id for m in ms] for ms in got] == \
            [[f"a{n}"] for n in range(6)] + [[] for _ in range(6)]
        assert [[m.similarity for m in ms] for ms in got] == sims
    with simindex.Index(tmp_path / "i", readonly=True) as idx:
        assert len(idx) == 18
        for n, (_a, b) in enumerate(pairs[6:], 6):
            assert {m.id for m in idx.query_text(b)} == {f"b{n}"}
        for n, (_a, b) in enumerate(pairs[:6]):         # the Index's estimates, as served
            assert {m.id: m.similarity for m in idx.query_text(b)}[f"a{n}"] == sims[n][0]


def test_a_killed_actor_comes_back_and_loses_nothing(local_ray, tmp_path):
    with simindex.Index(tmp_path / "i", k=3, shards=4):
        pass
    acked = {}
    with dist.Cluster(tmp_path / "i") as c:
        pids = c.pids()
        for b in range(12):
            fps = np.random.default_rng(b).integers(0, 2 ** 64, 2000, dtype=np.uint64)
            ids = [f"{b}.{i}" for i in range(len(fps))]
            if b == 4:
                os.kill(pids[2], signal.SIGKILL)          # a shard server, between batches
            if b == 8:
                os.kill(pids["records"], signal.SIGKILL)  # the ledger
            if b == 6:
                # a shard server killed while this batch is being applied
                kill = f"import os, time; time.sleep(0.05); os.kill({pids[1]}, 9)"
                killer = subprocess.Popen([sys.executable, "-c", kill])
            c.add_many(ids, fps)
            if b == 6:
                killer.wait()
            acked.update(zip(ids, fps.tolist()))
        after = c.pids()
        assert after[2] != pids[2] and after["records"] != pids["records"]   # restarted
        assert len(c) == len(acked)
        qs = np.array(list(acked.values()), dtype=np.uint64)
        for (i, fp), ms in zip(acked.items(), c.query_many(qs, k=0)):
            assert i in {m.id for m in ms}
    with simindex.Index(tmp_path / "i") as idx:
        assert idx.verify() == [] and len(idx) == len(acked)


@pytest.mark.parametrize("k,blocks", [(3, None), (2, 5)])
def test_pairs_and_clusters_are_exact(local_ray, tmp_path, k, blocks):
    stored, _ = dataset(k, seed=21 + k, n_random=2000, blocks=blocks)
    want = brute_pairs(stored, k)
    got = dist.pairs(list(stored.items()), k=k, blocks=blocks, partitions=4)
    assert {(a, b): d for a, b, d in got} == want and len(got) == len(want)
    single_process(str(tmp_path / "s"), stored, k, blocks, 4)
    with simindex.Index(tmp_path / "s", readonly=True) as s:
        assert sorted(dist.pairs(tmp_path / "s")) == sorted(s.pairs())
        assert dist.clusters(tmp_path / "s") == list(s.clusters())
    assert dist.clusters(list(stored.items()), k=k, blocks=blocks) == \
        list(simindex.Index(tmp_path / "s", readonly=True).clusters())


def test_cli_build_and_query_on_ray(local_ray, tmp_path):
    exe = [sys.executable, "-m", "simindex.cli"]
    stored, queries = dataset(3, seed=3, n_random=500)
    write_tsv(tmp_path / "in.tsv", list(stored.items()))
    write_tsv(tmp_path / "q.tsv", [(f"q{i}", q) for i, q in enumerate(queries)])
    outs = []
    for name, extra in [("ray", ["--ray", local_ray]), ("plain", [])]:
        b = subprocess.run(exe + ["build", str(tmp_path / name), str(tmp_path / "in.tsv"),
                                  "--shards", "4", *extra], capture_output=True, text=True,
                           timeout=300)
        assert b.returncode == 0 and f"added {len(stored)} records" in b.stderr, b.stderr
        q = subprocess.run(exe + ["query", str(tmp_path / name), str(tmp_path / "q.tsv"),
                                  "--output", "tsv", *extra], capture_output=True, text=True,
                           timeout=300)
        assert q.returncode == 0 and "Traceback" not in q.stderr, q.stderr
        outs.append(q.stdout)
    assert outs[0] == outs[1] and outs[0].count("\n") > len(queries)
    # --ray without an address starts (and stops) a Ray of its own
    own = subprocess.run(exe + ["query", str(tmp_path / "ray"), str(tmp_path / "q.tsv"),
                                "--output", "tsv", "--ray"], capture_output=True, text=True,
                         timeout=300)
    assert own.returncode == 0 and own.stdout == outs[0], own.stderr
    bad = subprocess.run(exe + ["query", str(tmp_path / "ray"), str(tmp_path / "q.tsv"),
                                "--k", "4", "--ray", local_ray], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "above the index's k" in bad.stderr


def test_placement_on_a_named_node(local_ray, tmp_path):
    with simindex.Index(tmp_path / "i", k=3, shards=2) as idx:
        idx.add_many([("a", 1), ("b", 3)])
    node = ray.get_runtime_context().get_node_id()
    with dist.Cluster(tmp_path / "i", nodes={"records": node, 0: node, 1: node}) as c:
        assert [m.id for m in c.query(1)] == ["a", "b"]
    with pytest.raises(simindex.MissingIndexError):
        dist.Cluster(tmp_path / "missing")


def test_ledger_writes_run_once_per_request(tmp_path):
    # Ray re-runs a call whose reply was lost on the restarted actor: the ledger returns
    # the stored result instead of writing again (no Ray needed to show it)
    from simindex.engine.codec import encode_id, pack_meta
    with ledger_server(tmp_path / "i") as led:
        me = (b"client-1" * 3, 1)
        args = ([encode_id("a")], np.array([5], dtype=np.uint64), [pack_meta(None)])
        first = led.commit(me, *args)
        again = led.commit(me, *args)
        assert first[0] == again[0] and list(first[1]) == list(again[1]) == [1]
        assert led.count() == 1 and led.last() == 1
        assert led.remove((me[0], 2), encode_id("a")) is True
        other = led.commit((b"client-2" * 3, 1), *args)      # another client re-adds "a"
        assert led.remove((me[0], 2), encode_id("a")) is True  # the retry: no second delete
        assert led.count() == 1 and led.get(encode_id("a")) is not None
        assert list(other[1]) == [2]


def test_cluster_edge_cases_and_errors(local_ray, tmp_path, monkeypatch):
    with simindex.Index(tmp_path / "i", k=2, shards=4) as idx:
        idx.add_many([("a", 1), ("b", 3)])
    dist.build(tmp_path / "i", [("c", 7)])              # extends it with its own k and shards
    (tmp_path / "t.jsonl").write_text('{"id": "doc", "text": "the quick brown fox jumps"}\n')
    dist.build(tmp_path / "i", [tmp_path / "t.jsonl"])   # texts use the index's scheme
    monkeypatch.chdir(tmp_path)                          # a relative path reaches the actors
    with dist.Cluster("i") as c:
        assert len(c) == 4 and 1.5 not in c and "c" in c
        assert [m.id for m in c.query_text("the quick brown fox jumps", k=0)] == ["doc"]
        assert [m.id for m in c.query(1, where=lambda m: m.id != "a")] == ["b", "c"]
        assert [[m.id for m in ms] for ms in c.query_many([1], where=lambda i, m: False)] == [[]]
        assert c.add_text("doc2", "an entirely different sentence about ducks") > 0
        with simindex.Index("i", readonly=True) as idx:
            assert sorted(c.pairs()) == sorted(idx.pairs())
            assert {("a", "b", 1), ("a", "c", 2), ("b", "c", 1)} <= set(c.pairs())
            assert c.clusters() == list(idx.clusters())
    with pytest.raises(simindex.ClosedError):
        c.query(1)
    with dist.Cluster(tmp_path / "i", readonly=True) as r:
        assert [m.id for m in r.query(1)] == ["a", "b", "c"]
        with pytest.raises(simindex.ReadOnlyError):
            r.add("x", 1)
    assert dist.pairs([]) == [] and dist.clusters([]) == []
    with pytest.raises(simindex.ParameterError):
        dist.pairs(tmp_path / "i", k=3)                  # above the index's k
    with pytest.raises(simindex.ParameterError):
        dist.pairs([("a", 1)], k="1")
    # a truncated shard file is a typed error, not an actor crashing on every restart
    data = tmp_path / "i" / "shard-001" / "data.mdb"
    os.truncate(data, os.path.getsize(data) // 3)
    with pytest.raises(simindex.CorruptError, match="truncated"):
        dist.Cluster(tmp_path / "i")


def test_a_plan_with_flips_is_exact_on_ray(local_ray, tmp_path):
    # four 16-bit tables probed within 2 bits: flips cross shard boundaries
    stored, queries = dataset(8, seed=33, blocks=4)
    dist.build(tmp_path / "d", iter(stored.items()), shards=8, k=8, blocks=4, prefix_blocks=1)
    with dist.Cluster(tmp_path / "d") as c:
        for q, ms in zip(queries, c.query_many(queries)):
            assert {m.id: m.distance for m in ms} == brute(stored, q, 8)
    want = brute_pairs(stored, 8)
    got = dist.pairs(tmp_path / "d", partitions=4)
    assert {(a, b): d for a, b, d in got} == want and len(got) == len(want)
    smaller = dist.pairs(tmp_path / "d", k=5)          # the index's tables, fewer bits
    assert {(a, b): d for a, b, d in smaller} == {p: d for p, d in want.items() if d <= 5}
    with simindex.Index(tmp_path / "d", readonly=True) as d:
        assert (d.blocks, d.prefix_blocks, d.flips) == (4, 1, 2) and d.verify() == []


# ---------------------------------------------------------------- wide indexes (128, 256)
def wide_dataset(width, k, blocks, seed, n_random=400):
    """Random records plus, around each base (0 and all ones among them), fingerprints at
    every distance 0..k+1: bits packed in one of the plan's `blocks`, spread, from the first
    and last bit inwards, and at random; queries at the bases, next to stored ones and at
    random."""
    rng = random.Random(seed)
    stored = {f"r{i}": rng.getrandbits(width) for i in range(n_random)}
    ranges = block_ranges(blocks, width)
    bases = [0, (1 << width) - 1] + [rng.getrandbits(width) for _ in range(3)]
    for b, base in enumerate(bases):
        for d in range(k + 2):
            # in one block, or contiguous over the fewest when no block is that wide
            lo, hi = rng.choice([r for r in ranges if r[1] - r[0] >= d] or [(0, width)])
            start = rng.randrange(lo, hi - d + 1)
            edges = [x for pair in zip(range(width), reversed(range(width))) for x in pair]
            for name, bits in (("packed", range(start, start + d)),
                               ("spread", {int(x) for x in np.linspace(0, width - 1, d)}),
                               ("edges", edges[:d]),
                               ("random", rng.sample(range(width), d))):
                stored[f"b{b}.{d}.{name}"] = flip(base, bits)
    queries = bases + [fp ^ (1 << (width - 1)) for fp in list(stored.values())[::41]] + \
        [rng.getrandbits(width) for _ in range(10)]
    return stored, queries


def wide_brute_pairs(stored, k):
    """{(id_a, id_b): d} of every pair within k bits, a stored first (any width)."""
    ids, fps = list(stored), list(stored.values())
    return {(ids[i], ids[j]): d for i in range(len(ids))
            for j in range(i + 1, len(ids)) if (d := popcount(fps[i] ^ fps[j])) <= k}


def as_words(fps, width):
    """(n, width/64) uint64 words, most significant first."""
    words = width // 64
    return np.array([[(f >> (64 * (words - 1 - w))) & (2 ** 64 - 1) for w in range(words)]
                     for f in fps], dtype=np.uint64).reshape(-1, words)


@pytest.mark.parametrize("width,k,blocks,prefix_blocks,shards", [
    (128, 8, None, None, 4),         # the planner's plan: 9 tables of 14-15-bit prefixes
    (256, 16, None, None, 2),        # the planner's plan: 17 tables
    (256, 16, 8, 1, 8),              # flips: 8 tables of 32-bit prefixes probed within 2 bits
])
def test_a_wide_cluster_answers_like_the_index(local_ray, tmp_path, width, k, blocks,
                                              prefix_blocks, shards):
    path = tmp_path / "i"
    with simindex.Index(path, width=width, k=k, blocks=blocks, prefix_blocks=prefix_blocks,
                        shards=shards) as idx:
        stored, queries = wide_dataset(width, k, idx.blocks, seed=width + k + shards)
        items = list(stored.items())
        q = len(items) // 4
        idx.add_many(items[:q])
        # committed but applied by no shard (a writer killed): the cluster catches them up
        _testing.commit_unapplied(idx, [i for i, _ in items[q:2 * q]],
                                  as_words([f for _, f in items[q:2 * q]], width))
        _testing.crash(idx)                      # close() would apply them
    with simindex.Index(path, readonly=True) as idx:
        assert idx.stats()["unapplied"] == q
        text_fp = idx.fingerprint("a text")
    with dist.Cluster(path) as c:
        assert (c.width, c.k, c.fingerprint("a text")) == (width, k, text_fp)
        c.add_many(items[2 * q:3 * q])                                    # (id, fp) items
        rest = items[3 * q:]
        c.add_many([i for i, _ in rest], as_words([f for _, f in rest], width))   # words
        fp = stored["b2.0.packed"]
        c.add("bytes", fp.to_bytes(width // 8, "big"), {"m": 1})        # big-endian bytes
        stored["bytes"] = fp
        got = c.query_many(queries)
        for q, ms in zip(queries, got):
            assert {m.id: m.distance for m in ms} == brute(stored, q, k)
            assert all(m.fingerprint == stored[m.id] for m in ms)
        with simindex.Index(path, readonly=True) as idx:
            assert answers(got) == answers(idx.query_many(queries))
            assert answers(c.query_many(as_words(queries, width), k=k // 2)) == \
                answers(idx.query_many(queries, k=k // 2))
            assert [c.get(i) for i in ("bytes", "r7", "b1.3.edges", "nope")] == \
                [idx.get(i) for i in ("bytes", "r7", "b1.3.edges", "nope")]
        assert c.get("bytes") == simindex.Record("bytes", fp, {"m": 1})
        for q in queries[:3]:
            assert answers([c.query(q)]) == answers(c.query_many([q]))
        assert answers([c.query(queries[2].to_bytes(width // 8, "big"), k=1)]) == \
            answers(c.query_many([queries[2]], k=1))
        # add_unique: refused within k (the neighbours returned), admitted otherwise; a
        # single add leaves shards without its entries behind (queries check the ledger)
        near = stored["b3.1.spread"] ^ 1
        assert {m.id: m.distance for m in c.add_unique("u1", near)} == brute(stored, near, k)
        assert c.get("u1") is None
        far = random.Random(width).getrandbits(width)
        while brute(stored, far, k):
            far = random.Random(far).getrandbits(width)
        assert c.add_unique("u2", far, {"x": 2}) == []
        stored["u2"] = far
        assert [(m.id, m.distance, m.meta) for m in c.query(far ^ 3)] == [("u2", 2, {"x": 2})]
        assert c.add_text("t", "a text") == c.fingerprint("a text")
        stored["t"] = c.fingerprint("a text")
        assert c.query_text("a text", k=0)[0].id == "t"
        assert c.remove("r3") and not c.remove("r3")
        del stored["r3"]
        want = wide_brute_pairs(stored, k)
        pairs = c.pairs(partitions=4)
        assert {(a, b): d for a, b, d in pairs} == want and len(pairs) == len(want)
        with simindex.Index(path, readonly=True) as idx:
            assert sorted(pairs) == sorted(idx.pairs())
            assert c.clusters() == list(idx.clusters())
            assert answers(c.query_many(queries)) == answers(idx.query_many(queries))
        # a wrong width names the value and the rule
        with pytest.raises(simindex.InputError, match=rf"{2 ** width}.*2\*\*{width}"):
            c.query(2 ** width)
        with pytest.raises(simindex.InputError,
                           match=rf"b'(\\x01\\x02){{4}}' is 8 bytes.*exactly {width // 8}"):
            c.add("x", b"\x01\x02" * 4)
        with pytest.raises(simindex.InputError, match=rf"\(n, {width // 64}\), got \(2,\)"):
            c.query_many(np.array([1, 2], dtype=np.uint64))
        with pytest.raises(simindex.InputError, match=rf"item 0: .*{2 ** width + 1}"):
            c.add_many([("x", 2 ** width + 1)])
    with simindex.Index(path) as idx:
        assert idx.verify() == [] and idx.stats()["unapplied"] == 0 and len(idx) == len(stored)
    # the batch join of inputs (not an index) at this width
    got = dist.pairs(items, k=k, width=width, partitions=4)
    assert {(a, b): d for a, b, d in got} == wide_brute_pairs(dict(items), k)


def write_hex_tsv(path, records, width):
    """id<TAB>hex lines: width/4 digits, every third with its leading zeros dropped."""
    with open(path, "w") as f:
        for n, (i, fp) in enumerate(records):
            f.write(f"{i}\t{fp:x}\n" if n % 3 == 0 else f"{i}\t{fp:0{width // 4}x}\n")


@pytest.mark.parametrize("width,k", [(128, 6), (256, 12)])
def test_build_of_wide_hex_gives_the_cli_index(local_ray, tmp_path, width, k):
    from click.testing import CliRunner
    from simindex.cli import cli
    stored, queries = wide_dataset(width, k, Plan(k=k, width=width).blocks, seed=width,
                                   n_random=300)
    items = list(stored.items())
    write_hex_tsv(tmp_path / "a.tsv", items[:200], width)
    write_hex_tsv(tmp_path / "b.tsv", items[200:], width)
    files = [str(tmp_path / "a.tsv"), str(tmp_path / "b.tsv")]
    got = dist.build(tmp_path / "d", files, width=width, k=k, shards=4)
    assert got["records"] == len(items)
    cli_build = subprocess.run([sys.executable, "-m", "simindex.cli", "build",
                                str(tmp_path / "s"), *files, "--width", str(width), "--k",
                                str(k), "--shards", "4", "-q"], capture_output=True, text=True,
                               timeout=300)
    assert cli_build.returncode == 0, cli_build.stderr
    with simindex.Index(tmp_path / "d", readonly=True) as d, \
            simindex.Index(tmp_path / "s", readonly=True) as s:
        assert (d.width, d.k, d.blocks, d.shards) == (width, k, s.blocks, 4)
        assert d.verify() == [] and len(d) == len(s) == len(stored)
        want = s.query_many(queries)
        assert answers(d.query_many(queries)) == answers(want)
        assert [d.get(i) for i in stored] == [s.get(i) for i in stored]
        for q, ms in zip(queries, want):
            assert {m.id: m.distance for m in ms} == brute(stored, q, k)
        assert sorted(dist.pairs(tmp_path / "d")) == sorted(s.pairs())
        assert dist.clusters(files, k=k, width=width) == list(s.clusters())
    if width == 256:
        # the CLI through a Cluster (once: its actors take seconds to start): build --ray
        # --width and query --ray give the plain answers, fingerprints in 64 hex digits
        run = CliRunner().invoke(cli, ["build", str(tmp_path / "r"), *files, "--width", "256",
                                       "--k", str(k), "--shards", "4", "-q", "--ray", local_ray])
        assert run.exit_code == 0, run.output
        outs = [CliRunner().invoke(cli, ["query", str(tmp_path / name), files[1], "-q", *extra])
                for name, extra in (("r", ["--ray", local_ray]), ("s", []))]
        assert outs[0].exit_code == 0 and outs[0].stdout == outs[1].stdout
        assert f'"fingerprint": "{stored["b0.0.packed"]:064x}"' in outs[1].stdout
    # an existing index keeps its width; one given that differs is the error Index gives
    other = 384 - width
    with pytest.raises(simindex.ParameterError) as e:
        simindex.Index(tmp_path / "d", width=other)
    for call in (lambda: dist.build(tmp_path / "d", [("x", 1)], width=other),
                 lambda: dist.pairs(tmp_path / "d", width=other)):
        with pytest.raises(simindex.ParameterError) as e2:
            call()
        assert str(e2.value) == str(e.value)
    (tmp_path / "bad.tsv").write_text(f"x\t{'f' * (width // 4 + 1)}\n")
    with pytest.raises(simindex.BadLine, match=rf"bad.tsv:1: .*1-{width // 4} hex digits"):
        dist.build(tmp_path / "d", [tmp_path / "bad.tsv"])


def test_request_records_keep_wide_results():
    # a ledger write's stored result (replayed to a retried call) keeps 2-d fingerprint
    # arrays and the full-width fingerprints of add_unique's refusing matches
    from simindex.engine.codec import pack, unpack
    from simindex.distributed.servers import _flat, _revive
    arr = np.arange(6, dtype=np.uint64).reshape(3, 2) | np.uint64(1 << 63)
    hits = [(3, 2 ** 255 + 5, 7, "id", b"\x90"), (0, 5, 8, b"raw", None)]
    out = _revive(unpack(pack([1, _flat((arr, (None, hits), np.arange(2, dtype=np.uint64)))]))[1])
    assert out[0].shape == (3, 2) and (out[0] == arr).all()
    assert out[1] == (None, tuple(hits))
    assert list(out[2]) == [0, 1]
