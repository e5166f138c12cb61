"""Exactness: query, query_many, pairs and find_all equal a brute-force popcount scan."""

import random

import numpy as np
import pytest

import simindex
from simindex import _testing
from conftest import (
    SETTINGS, brute, brute_pairs, one_table_family, planted_family, scratch, shard_boundary_fps,
    within,
)

PARAMS = [
    # (k, blocks, shards)
    (3, None, 16),      # the default plan: 4 tables of 16-bit prefixes
    (3, 6, 4),          # 20 tables, uneven prefixes (32/33 bits)
    (2, 5, 1),          # one shard
    (0, None, 256),     # exact match only, 256 shards
    (4, 5, 2),
    (1, 64, 8),         # 64 one-bit blocks, 63-bit prefixes
    (9, 10, 256),       # 6-7 bit prefixes: a table's range spans several shards
]


def build_data(k, seed, n_random=1500, n_bases=12, blocks=None):
    rng = random.Random(seed)
    stored = {}
    for i in range(n_random):
        stored[f"r{i}"] = rng.getrandbits(64)
    bases = [rng.getrandbits(64) for _ in range(n_bases)] + [0, (1 << 64) - 1]
    for b, base in enumerate(bases):
        for j, fp in enumerate(planted_family(rng, base, k)):
            stored[f"p{b}.{j}"] = fp
        for j, fp in enumerate(one_table_family(rng, base, k, blocks or k + 1)):
            stored[f"t{b}.{j}"] = fp
    for j, fp in enumerate(shard_boundary_fps(k)):
        stored[f"s{j}"] = fp
    # exact duplicates under different ids
    dup = rng.getrandbits(64)
    for j in range(3):
        stored[f"dup{j}"] = dup
    queries = bases + list(shard_boundary_fps(k)) + [dup] + \
        [rng.getrandbits(64) for _ in range(20)] + rng.sample(list(stored.values()), 40)
    return stored, queries


@pytest.mark.parametrize("settings", SETTINGS, indirect=True)
@pytest.mark.parametrize("k,blocks,shards", PARAMS)
def test_query_equals_brute_force(tmp_path, k, blocks, shards, settings):
    stored, queries = build_data(k, seed=k * 100 + (blocks or 0), blocks=blocks)
    with simindex.Index(tmp_path / "i", k=k, blocks=blocks, shards=shards,
                        sync=settings.sync) as idx:
        # half in one columnar batch, the rest in small batches and (buffered) one by one
        items = list(stored.items())
        half = len(items) // 2
        idx.add_many([i for i, _ in items[:half]], np.array([f for _, f in items[:half]],
                                                            dtype=np.uint64))
        for n in range(half, len(items), 37):
            if settings.name == "buffered" and n % 2:
                for i, f in items[n:n + 37]:
                    idx.add(i, f)
            else:
                idx.add_many(items[n:n + 37])
        assert len(idx) == len(stored)
        want = [brute(stored, q, k) for q in queries]
        for q, near in zip(queries, want):
            for kq in sorted({0, k // 2, k}):
                got = idx.query(q, k=kq)
                assert {m.id: m.distance for m in got} == within(near, kq)
                assert len(got) == len(within(near, kq))         # each id once
                assert [m.distance for m in got] == sorted(m.distance for m in got)
                for m in got:
                    assert m.fingerprint == stored[m.id]
        many = idx.query_many(queries)
        assert [{m.id: m.distance for m in ms} for ms in many] == want
        # big batches over big tables scan in key order, table by table: the same answers
        with _testing.key_ordered_batches():
            assert idx.query_many(queries) == many
        assert idx.verify() == []


@pytest.mark.parametrize("k,blocks,shards", [(3, None, 1), (3, None, 16), (9, 10, 4),
                                           (1, 64, 2)])
def test_run_filters_change_no_answer(tmp_path, k, blocks, shards):
    """A run's filter of its keys' prefixes spares the reads of a probe whose prefix the run
    lacks: over tables of many runs, queries within 0..k (planted at every distance, first
    and last bit) answer as brute force does, with the filters and without."""
    stored, queries = build_data(k, seed=k + 5, n_random=6000, blocks=blocks)
    items = list(stored.items())
    with simindex.Index(tmp_path / "i", k=k, blocks=blocks, shards=shards) as idx:
        for n in range(0, len(items), 700):
            idx.add_many(items[n:n + 700])
            idx.flush()
        want = [brute(stored, q, k) for q in queries]
        with _testing.key_ordered_batches():
            assert [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)] == want
        assert [{m.id: m.distance for m in idx.query(q)} for q in queries] == want
        assert _testing.run_filters_built(idx) > 0
    with _testing.run_filters(0), simindex.Index(tmp_path / "i", readonly=True) as idx:
        assert [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)] == want
        assert _testing.run_filters_built(idx) == 0


@pytest.mark.parametrize("settings", ["tuned", "shipped"], indirect=True)
@pytest.mark.parametrize("k,blocks,shards", PARAMS)
def test_pairs_equal_brute_force(tmp_path, k, blocks, shards, settings):
    stored, _ = build_data(k, seed=7 + k, n_random=800, blocks=blocks)
    with simindex.Index(tmp_path / "i", k=k, blocks=blocks, shards=shards,
                        sync=settings.sync) as idx:
        items = list(stored.items())
        for n in range(0, len(items), 200):
            idx.add_many(items[n:n + 200])
        want = brute_pairs(stored, k)
        got = list(idx.pairs())
        assert len(got) == len(set((a, b) for a, b, _ in got))   # each pair once
        assert {(a, b): d for a, b, d in got} == want
        if k:
            want_k1 = {p: d for p, d in want.items() if d <= k - 1}
            assert {(a, b): d for a, b, d in idx.pairs(k=k - 1)} == want_k1


def crowded_fps(seed, free_bits, n):
    """n fingerprints that differ only in `free_bits` bit positions (0 and 63 among them):
    hundreds share a table prefix, so their pairs are joined through sub-blocks."""
    rng = random.Random(seed)
    free = [0, 63] + rng.sample(range(1, 63), free_bits - 2)
    base = rng.getrandbits(64)
    return [base ^ sum(1 << b for b in free if rng.random() < 0.5) for _ in range(n)]


@pytest.mark.parametrize("k,blocks,free_bits,n", [
    (1, None, 10, 1000), (3, None, 12, 1000), (3, 6, 12, 1000), (5, 6, 16, 600),
    (9, 10, 24, 500)])
def test_pairs_in_crowded_prefixes_equal_brute_force(tmp_path, k, blocks, free_bits, n):
    fps = crowded_fps(k * 10 + (blocks or 0), free_bits, n)
    plan = simindex.engine.plan.Plan(k=k, blocks=blocks, shards=1)
    biggest = max(np.unique(plan.permuter.keys(t, np.array(fps, dtype=np.uint64)) &
                            np.uint64(plan.permuter.prefix_mask(t)), return_counts=True)[1].max()
                  for t in range(plan.ntables))
    assert biggest > 100                     # groups far above the core's SUB_MIN of 32
    want = brute_pairs(dict(enumerate(fps)), k)
    assert simindex.find_all(fps, k=k, blocks=blocks) == sorted(want)
    with simindex.Index(tmp_path / "i", k=k, blocks=blocks, shards=4) as idx:
        idx.add_many([(str(i), fp) for i, fp in enumerate(fps)])
        got = list(idx.pairs())
        assert len(got) == len(set((a, b) for a, b, _ in got))   # each pair once
        assert {(int(a), int(b)): d for a, b, d in got} == want


@pytest.mark.parametrize("width", [64, 128])
def test_slabs_with_unevenly_spread_keys_answer_exactly(tmp_path, width):
    """Dense runs of keys beside sparse ones (a slab's scan start is guessed by
    interpolation and then searched: a far-off guess must still find every entry)."""
    rng = np.random.default_rng(5)
    words = width // 64
    low = np.zeros((4000, words), np.uint64)
    low[:, -1] = np.arange(4000, dtype=np.uint64)                 # the lowest bits only
    mid = np.zeros((2000, words), np.uint64)
    mid[:, 0] = np.arange(2000, dtype=np.uint64) << np.uint64(40)  # a few middle bits
    top = np.zeros((2000, words), np.uint64)
    top[:, 0] = np.arange(2000, dtype=np.uint64) << np.uint64(53)  # the highest bits
    fps = np.concatenate([low, mid, top, rng.integers(0, 2 ** 64, (2000, words), np.uint64),
                          np.full((3, words), 2 ** 64 - 1, np.uint64)])
    q = fps[rng.integers(0, len(fps), 300)].copy()
    flips = rng.integers(0, 64, (300, 2))
    for i, (a, b) in enumerate(flips):
        q[i, i % words] ^= np.uint64(1 << int(a)) | np.uint64(1 << int(b))
    k = 3
    with simindex.Index(tmp_path / "i", width=width, k=k, blocks=4, shards=1) as idx:
        idx.add_many(range(len(fps)), fps if width > 64 else fps[:, 0])
        assert idx.stats()["runs"] == 4 and idx.verify() == []
        got = idx.query_many(q if width > 64 else q[:, 0])
    for i, ms in enumerate(got):
        d = np.unpackbits((fps ^ q[i]).view(np.uint8), axis=1).sum(axis=1)
        assert {m.id: m.distance for m in ms} == \
            {int(j): int(d[j]) for j in np.nonzero(d <= k)[0]}, i


@pytest.mark.parametrize("width", [64, 128])
def test_equal_keys_spanning_slabs_at_the_top_of_a_range_are_all_found(tmp_path, width):
    """40,000 copies of the all-ones fingerprint: their key is the top of its prefix range in
    every table and fills several slabs, so a scan that stopped at a slab whose last key
    equals the range's top would miss the copies in the next one."""
    n = 40_000
    words = width // 64
    with simindex.Index(tmp_path / "i", width=width, k=3, blocks=4, shards=1) as idx:
        idx.add_many(range(n), np.full((n, words) if words > 1 else n, 2 ** 64 - 1, np.uint64))
        idx.add_many(range(n, n + 100), [i for i in range(100)])
        assert len(idx.query(2 ** width - 1, k=0)) == n
        assert [len(ms) for ms in idx.query_many([2 ** width - 1, 2 ** width - 2])] == [n, n]


def test_ties_sort_by_insertion_order(tmp_path):
    with simindex.Index(tmp_path / "i") as idx:
        idx.add("b", 0b1000)
        idx.add("a", 0b0100)
        idx.add("c", 0)
        idx.add("d", 0b0010)
        assert [m.id for m in idx.query(0)] == ["c", "b", "a", "d"]
        idx.add("b", 0b1000)                      # re-adding moves b to the end of its tie
        assert [m.id for m in idx.query(0)] == ["c", "a", "d", "b"]


@pytest.mark.parametrize("k,blocks", [(3, None), (3, 5), (2, 8), (0, None), (5, 6)])
def test_find_all_equals_brute_force(k, blocks):
    stored, _ = build_data(k, seed=99 + k, n_random=700, blocks=blocks)
    fps = list(stored.values())
    want = {(i, j) for (i, j) in brute_pairs(dict(enumerate(fps)), k)}
    got = simindex.find_all(fps, k=k, blocks=blocks)
    assert got == sorted(want)
    assert simindex.find_all(np.array(fps, dtype=np.uint64), k=k, blocks=blocks) == got


def test_find_all_keeps_identical_fingerprints():
    assert simindex.find_all([5, 5, 5, 1 << 63], k=0) == [(0, 1), (0, 2), (1, 2)]
    assert simindex.find_all([], k=3) == []
    assert simindex.find_all([7], k=3) == []


def test_hamming():
    assert simindex.hamming(0, 0) == 0
    assert simindex.hamming(0, (1 << 64) - 1) == 64
    assert simindex.hamming(1, 1 << 63) == 2
    with pytest.raises(simindex.InputError):
        simindex.hamming(-1, 0)
    with pytest.raises(TypeError):
        simindex.hamming(1.0, 0)


from hypothesis import given, strategies as st  # noqa: E402

clustered = st.lists(
    st.builds(lambda base, bits: base ^ sum(1 << b for b in set(bits)),
              st.sampled_from([0, (1 << 64) - 1, 0xDEADBEEFCAFEF00D, 1 << 63, 1]),
              st.lists(st.integers(0, 63), max_size=6)),
    max_size=60)


@given(fps=clustered, k=st.integers(0, 5), extra=st.integers(1, 4))
def test_find_all_property(fps, k, extra):
    want = sorted(brute_pairs(dict(enumerate(fps)), k))
    assert simindex.find_all(fps, k=k, blocks=k + extra) == want


@given(fps=clustered, q=clustered, k=st.integers(0, 4), extra=st.integers(1, 3),
       shards=st.sampled_from([1, 2, 16, 256]))
def test_query_property(fps, q, k, extra, shards):
    stored = {f"id{i}": fp for i, fp in enumerate(fps)}
    with scratch("simindex-p-") as d, \
            simindex.Index(f"{d}/i", k=k, blocks=k + extra, shards=shards) as idx:
        idx.add_many(list(stored.items()))
        got = idx.query_many(q)
        assert [{m.id: m.distance for m in ms} for ms in got] == [brute(stored, x, k) for x in q]
        with _testing.key_ordered_batches():
            assert idx.query_many(q + q) == got + got


entries = st.lists(st.tuples(
    st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 5, 2**63, 2**64 - 1]),
              st.integers(0, 2**10 - 1)),          # crowded: one leading-bits bucket
    st.integers(0, 2**64 - 1)), max_size=200)


@given(es=entries, copies=st.integers(1, 40))
def test_run_entries_sort_by_key_then_seq(es, copies):
    from simindex.engine._slabs import sort_entries
    es = es * copies                                # equal pairs and crowded buckets
    keys = np.array([k for k, _ in es], dtype=np.uint64)
    seqs = np.array([q for _, q in es], dtype=np.uint64)
    got_k, got_s = sort_entries(keys, seqs)
    assert list(zip(got_k.tolist(), got_s.tolist())) == sorted(es)


@pytest.mark.parametrize("keys", ["random", "one shard", "crowded", "equal", "narrow"])
def test_large_runs_sort_through_partitions_by_key_then_seq(keys):
    # above 2**18 entries sort_entries splits by leading bits first, then sorts each part
    from simindex.engine._slabs import sort_entries
    rng = np.random.default_rng(9)
    n = 300_000
    k = rng.integers(0, 2**64, n, dtype=np.uint64)
    k = {"random": k,
         "one shard": (k >> np.uint64(3)) | np.uint64(5 << 61),       # 3 leading bits fixed
         "crowded": k[rng.integers(0, n // 50, n)],                   # ~50 copies of each
         "equal": np.full(n, 2**63 + 1, dtype=np.uint64),
         "narrow": rng.integers(0, 300, n, dtype=np.uint64)}[keys]
    seqs = rng.permutation(n).astype(np.uint64)
    got_k, got_s = sort_entries(k, seqs)
    order = np.lexsort((seqs, k))
    assert (got_k == k[order]).all() and (got_s == seqs[order]).all()


def test_runs_left_unmerged_by_a_writer_stopped_before_its_merge_answer_exactly(
        tmp_path, monkeypatch):
    """A large merge commits after the records' application, in a transaction of its own: a
    writer stopped between the two leaves more runs, which answer as merged ones do, verify,
    pair and compact alike, and which the next write to the table merges."""
    from simindex.engine import protocol
    monkeypatch.setattr(protocol, "merge_deferred", lambda *a, **k: None)   # never made
    rng = np.random.default_rng(5)
    fps = rng.integers(0, 2**64, 40000, dtype=np.uint64)
    fps[1::97] = fps[::97][:len(fps[1::97])] ^ np.uint64(0b101)              # pairs at 2
    path = tmp_path / "i"
    with _testing.tuned(merge_inline=1):          # every merge past one run is deferred
        with simindex.Index(path, k=3, shards=2) as idx:
            for s in range(0, 30000, 2500):
                idx.add_many([f"x{i}" for i in range(s, s + 2500)], fps[s:s + 2500])
            unmerged = idx.stats()["runs"]
            stored = {f"x{i}": int(fps[i]) for i in range(30000)}
            queries = [int(x) for x in fps[:300:7]] + [int(x) ^ 1 for x in fps[5:300:11]]
            for q in queries:
                assert {m.id: m.distance for m in idx.query(q)} == within(brute(stored, q, 3), 3)
            assert idx.verify() == []
            pairs = sorted((a, b) for a, b, _ in idx.pairs())
    monkeypatch.undo()
    with simindex.Index(path) as idx:             # reopened: the same answers
        for q in queries:
            assert {m.id: m.distance for m in idx.query(q)} == within(brute(stored, q, 3), 3)
        assert sorted((a, b) for a, b, _ in idx.pairs()) == pairs
        idx.add_many([f"x{i}" for i in range(30000, 40000)], fps[30000:])
        assert idx.stats()["runs"] < unmerged     # the next write merged them
        idx.compact()
        stored.update({f"x{i}": int(fps[i]) for i in range(30000, 40000)})
        for q in queries:
            assert {m.id: m.distance for m in idx.query(q)} == within(brute(stored, q, 3), 3)
        assert idx.verify() == []
