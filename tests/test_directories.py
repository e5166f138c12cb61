"""Run directories (a query finds its slab in an in-memory array of each run's slab keys,
kept across snapshots while the run is listed), the compiled single-query path and batch
results: answers stay exact while this process or another one writes, merges, compacts and
grows the map, and a batch leaves the garbage collector as it found it."""

import random

import numpy as np
import pytest

import simindex
from simindex import _testing as hook
from conftest import brute, fp_of, planted_family, run_py
from test_wide_index import brute as wide_brute

# Batch sizes that make runs of one tiny slab (its value inside a leaf page, which a later
# write may copy elsewhere), of one or several full slabs (overflow pages), and merges.
BATCHES = [1, 3, 2500, 1, 40, 7000, 2, 300, 1, 1, 12000, 5]


def check_all(idx, stored, queries, k, width=64):
    want = [(brute if width == 64 else wide_brute)(stored, q, k) for q in queries]
    got_one = [{m.id: m.distance for m in idx.query(q)} for q in queries]
    got_many = [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)]
    with hook.key_ordered_batches():            # the path of big batches over big tables
        got_keyed = [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)]
    assert got_one == want
    assert got_many == want
    assert got_keyed == want


def planted_queries(rng, stored, k, n=30, width=64):
    """Stored fingerprints and copies of them at every distance 0..k+1 (some bits flipped)."""
    out = []
    for fp in rng.sample(list(stored.values()), min(n, len(stored))):
        for d in range(k + 2):
            q = fp
            for b in rng.sample(range(width), d):
                q ^= 1 << b
            out.append(q)
    return out


@pytest.mark.parametrize("width,k", [(64, 3), (128, 8)])
def test_queries_stay_exact_while_this_process_adds_merges_removes_and_compacts(tmp_path, width,
                                                                                k):
    rng = random.Random(width)
    stored = {}
    n = 0
    with simindex.Index(tmp_path / "i", k=k, width=width, shards=2) as idx:
        for step, size in enumerate(BATCHES):
            ids = [f"b{n + i}" for i in range(size)]
            fps = [rng.getrandbits(width) for _ in range(size)]
            base = fps[0]
            fams = planted_family(rng, base, k, width)
            ids += [f"f{n}.{j}" for j in range(len(fams))]
            fps += fams
            idx.add_many(ids, fps)
            stored.update(zip(ids, fps))
            n += size
            if step % 4 == 3:                           # drop some, then merge them away
                for gone in rng.sample(sorted(stored), 5):
                    idx.remove(gone)
                    del stored[gone]
            if step == 8:
                idx.compact()
            n_q = 30 if width == 64 else 10                 # a wide brute force is slow
            check_all(idx, stored, planted_queries(rng, stored, k, n_q, width), k, width)
        assert idx.verify() == []


WRITER = r"""
import sys, numpy as np, simindex
path, seed, sizes = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
rng = np.random.default_rng(seed)
with simindex.Index(path) as idx:
    for j, n in enumerate(sizes):
        fps = rng.integers(0, 2**64, n, dtype=np.uint64)
        if n <= 20:         # one commit each: tiny runs, leaf pages copied and freed
            for i in range(n):
                idx.add(f"w{seed}.{j}.{i}", int(fps[i]))
        else:
            idx.add_many([f"w{seed}.{j}.{i}" for i in range(n)], fps)
    if seed % 2 and len(sizes) < 10:
        idx.compact()
"""


def writer_fps(seed, sizes):
    rng = np.random.default_rng(seed)
    out = {}
    for j, n in enumerate(sizes):
        for i, fp in enumerate(rng.integers(0, 2**64, n, dtype=np.uint64).tolist()):
            out[f"w{seed}.{j}.{i}"] = fp
    return out


def test_a_reader_stays_exact_while_another_process_writes_merges_and_reuses_pages(tmp_path):
    path = str(tmp_path / "i")
    rng = random.Random(5)
    stored = {}
    with simindex.Index(path, k=3, shards=4) as idx:
        seed_fps = [rng.getrandbits(64) for _ in range(3000)]
        idx.add_many([f"s{i}" for i in range(3000)], seed_fps)
        stored.update((f"s{i}", fp) for i, fp in enumerate(seed_fps))
        for j in range(6):                               # tiny runs: values in leaf pages
            stored[f"t{j}"] = rng.getrandbits(64)
            idx.add(f"t{j}", stored[f"t{j}"])
    with simindex.Index(path, readonly=True) as ro:
        for seed in range(1, 7):
            check_all(ro, stored, planted_queries(rng, stored, 3), 3)   # directories built
            sizes = [20, 4000, 20, 3] if seed % 3 else [9000, 20]
            run_py(WRITER, path, seed, ",".join(map(str, sizes)))
            stored.update(writer_fps(seed, sizes))
        check_all(ro, stored, planted_queries(rng, stored, 3), 3)


def test_a_reader_stays_exact_after_another_process_grows_the_map(tmp_path, monkeypatch):
    monkeypatch.setattr(*hook.KNOBS["initial_map"], 1 << 20)
    path = str(tmp_path / "i")
    rng = random.Random(9)
    stored = {f"s{i}": rng.getrandbits(64) for i in range(20000)}
    with simindex.Index(path, shards=1) as idx:
        idx.add_many(list(stored), list(stored.values()))
    with simindex.Index(path, readonly=True) as ro:
        check_all(ro, stored, planted_queries(rng, stored, 3), 3)       # directories built
        before = hook.mapsizes(ro)[0]
        # small batches: the big run stays listed (its directory kept) while the map grows
        sizes = [500] * 24
        run_py(WRITER, path, 2, ",".join(map(str, sizes)))
        stored.update(writer_fps(2, sizes))
        check_all(ro, stored, planted_queries(rng, stored, 3), 3)
        assert hook.mapsizes(ro)[0] > before           # the reader adopted the grown map


def test_single_query_takes_every_input_the_python_path_takes(tmp_path):
    with simindex.Index(tmp_path / "i", k=3) as idx:
        fps = [fp_of(i) for i in range(200)]
        idx.add_many(range(200), fps)
        q = fps[7] ^ 0b101
        want = idx.query(q)
        assert [m.id for m in want] == [7] and want[0].distance == 2
        assert idx.query(np.uint64(q)) == want                  # numpy ints: the Python path
        assert idx.query(q, k=2) == want and idx.query(q, k=1) == []
        assert idx.query(q, where=lambda m: False) == []
        for bad, err in [(-1, simindex.InputError), (2**64, simindex.InputError),
                         ("7", simindex.InputTypeError), (1.0, simindex.InputTypeError),
                         (True, simindex.InputTypeError)]:
            with pytest.raises(err):
                idx.query(bad)
        for bad_k in [4, -1, True, 2.0, 2**70, np.int64(2)]:
            with pytest.raises(simindex.ParameterError):
                idx.query(q, k=bad_k)
    with pytest.raises(simindex.ClosedError):
        idx.query(q)


def test_batches_leave_the_collector_as_they_found_it_and_matches_with_containers_tracked(
        tmp_path):
    import gc
    with simindex.Index(tmp_path / "i", k=3) as idx:
        idx.add_many(range(50), [fp_of(i) for i in range(50)])
        idx.add("m", fp_of(99), {"tags": ["a"]})
        qs = [fp_of(i) for i in range(50)] + [fp_of(99)]
        assert gc.isenabled()
        got = idx.query_many(qs)
        assert gc.isenabled()
        gc.disable()
        try:
            assert idx.query_many(qs) == got
            assert not gc.isenabled()               # a caller's choice stays
        finally:
            gc.enable()
        plain, with_meta = got[0][0], got[-1][0]
        assert with_meta.meta == {"tags": ["a"]}
        assert not gc.is_tracked(plain)             # atomic fields: no cycle possible
        assert gc.is_tracked(with_meta)             # its dict could come to hold it


def test_batches_from_two_threads_leave_the_collector_on(tmp_path):
    """Two batches building their results at once (their metas decoded by Python code, so
    their threads take turns) keep the collector paused until the last one is done."""
    import gc
    import sys
    import threading
    with simindex.Index(tmp_path / "i", k=3) as idx:
        idx.add_many([(i, fp_of(i), {"n": [i]}) for i in range(400)])
        qs = [fp_of(i) for i in range(400)]
        want = idx.query_many(qs)
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            got = [None] * 4

            def run(t):
                for _ in range(20):
                    got[t] = idx.query_many(qs)
            threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(interval)
        assert got == [want] * 4
        assert gc.isenabled()


@pytest.mark.parametrize("shards", [1, 4])
def test_batch_matches_of_every_kind_of_record_equal_single_queries(tmp_path, shards):
    """Matches of an int id with no meta are made from what the scan found; every other
    record is decoded from its stored value. Both give the same Match, in the same order
    (distance, then insertion), whatever their mix in a batch."""
    records = [(0, None), (1, None), (2 ** 63, None), (2 ** 64 - 1, None),
               (5, 0), (6, False), (7, {"a": 1}), (8, b""), ("text", None), (b"raw", None),
               ("", None), (9, None)]
    base = [fp_of(i) for i in range(len(records))]
    with simindex.Index(tmp_path / "i", k=3, shards=shards) as idx:
        for n, (rid, meta) in enumerate(records):
            # each record has a twin at 1 bit and at 3 bits of its base, and record 9
            # ties with record 1 (same fingerprint, added later)
            idx.add(rid, base[n] if rid != 9 else base[1], meta)
        idx.add(4, base[0] ^ 0b1)
        idx.add("four", base[0] ^ 0b111 << 61)
        idx.remove(2 ** 63)
        idx.add(1, base[1])                        # replaced: moves after 9 in the tie
        queries = [b ^ (1 << (n % 64)) for n, b in enumerate(base)] + [base[0], base[1]]
        many = idx.query_many(queries)
        assert many == [idx.query(q) for q in queries]
        for q, ms in zip(queries, many):
            for m in ms:
                assert type(m) is simindex.Match and m.distance == bin(m.fingerprint ^ q).count("1")
        assert [(m.id, m.distance) for m in many[-2]] == [(0, 0), (4, 1), ("four", 3)]
        assert [(m.id, m.distance) for m in many[-1]] == [(9, 0), (1, 0)]
        got = {m.id: m for ms in many for m in ms}
        assert 2 ** 63 not in got
        for rid, meta in records:
            if rid != 2 ** 63:
                assert type(got[rid].id) is type(rid) and got[rid].meta == meta
                assert type(got[rid].meta) is type(meta)
        assert got[2 ** 64 - 1].fingerprint == base[3]


def test_big_batches_resolve_many_hits_of_one_record_in_order(tmp_path):
    """A batch of 20,000 queries with ~60,000 hits spread over 6,000 records, many queries
    hitting the same record: every query's matches equal its own single query's."""
    rng = np.random.default_rng(5)
    fps = rng.integers(0, 2 ** 64, 6000, dtype=np.uint64)
    with simindex.Index(tmp_path / "i", k=3) as idx:
        idx.add_many(range(6000), fps)
        idx.add_many(range(6000, 9000), fps[:3000] ^ np.uint64(0b11))     # twins at 2 bits
        picks = fps[rng.integers(0, 6000, 20000)]
        flips = np.uint64(1) << rng.integers(0, 64, 20000).astype(np.uint64)
        queries = (picks ^ flips).tolist()
        many = idx.query_many(queries)
        assert sum(map(len, many)) > 25000
        assert many == [idx.query(q) for q in queries]


@pytest.mark.parametrize("shards", [1, 4])
def test_a_key_ordered_batch_finds_records_no_table_holds_yet(tmp_path, shards):
    rng = random.Random(shards)
    path = tmp_path / "i"
    applied = {f"a{i}": rng.getrandbits(64) for i in range(3000)}
    pending = {f"u{i}": fp ^ (1 << rng.randrange(64))                 # near the applied
               for i, fp in enumerate(rng.sample(list(applied.values()), 300))}
    with simindex.Index(path, k=3, shards=shards) as idx:
        idx.add_many(list(applied), list(applied.values()))
        hook.commit_unapplied(idx, list(pending), np.array(list(pending.values()), np.uint64))
        hook.crash(idx)                          # a writer killed: close() would apply them
    stored = {**applied, **pending}
    with simindex.Index(path, readonly=True) as ro:           # read-only: no catching up
        assert ro.stats()["unapplied"] == len(pending)
        check_all(ro, stored, planted_queries(rng, pending, 3, 60), 3)


def distances(fps, q):
    """Hamming distance of q to every fingerprint of an uint64 array (the bulk oracle)."""
    x = np.bitwise_xor(fps, np.uint64(q))
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x)
    return np.unpackbits(x.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)


# Runs of 40 to 150 slabs: a directory's top holds one key per group of 8 slabs, the last
# group partial; a crowd of equal keys spans slabs and groups; plans without and with flips
@pytest.mark.parametrize("k,blocks,prefix", [(3, 4, 1), (7, 8, 1), (3, 2, 1)])
def test_runs_of_many_slabs_find_the_first_slab_of_every_range(tmp_path, k, blocks, prefix):
    rng = np.random.default_rng(k * 10 + blocks)
    crowd = int(rng.integers(0, 2**64, dtype=np.uint64))
    fps = np.concatenate([rng.integers(0, 2**64, 60_000, dtype=np.uint64),
                          np.full(4000, crowd, np.uint64),
                          np.full(3000, crowd ^ (1 << 63), np.uint64),
                          np.full(2000, crowd ^ 1, np.uint64)])
    rng.shuffle(fps)
    pyrng = random.Random(k)
    queries = [crowd, crowd ^ (1 << 62), crowd ^ 0b110]
    for fp in rng.choice(fps, 60).tolist():
        queries += [fp] + planted_family(pyrng, fp, k)
    queries += rng.integers(0, 2**64, 100, dtype=np.uint64).tolist()
    with simindex.Index(tmp_path / "i", k=k, blocks=blocks, prefix_blocks=prefix,
                        shards=1) as idx:
        idx.add_many(range(len(fps)), fps)
        assert idx.stats()["runs"] == idx.stats()["tables"]     # one run of many slabs each
        want = []
        for q in queries:
            d = distances(fps, q)
            hit = np.nonzero(d <= k)[0]
            want.append(dict(zip(hit.tolist(), d[hit].tolist())))
        assert [{m.id: m.distance for m in idx.query(q)} for q in queries] == want
        assert [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)] == want
        with hook.key_ordered_batches():
            assert [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)] == want
