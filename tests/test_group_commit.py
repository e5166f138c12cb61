"""Group commit: add_many commits its records at once (the durability point) and applies
them to the shards only once GROUP_LIMIT of them wait. Until then queries check them
directly, through the read context's kept tail and, once that has served enough queries,
tables built over it. Answers stay exact at every point, in this process and in others; a
killed writer loses nothing; close() leaves nothing unapplied."""

import random

import numpy as np
import pytest
from hypothesis import given, strategies as st

import simindex
from simindex import _testing as hook
from simindex.engine import protocol
from conftest import brute, planted_family, run_py

pytestmark = pytest.mark.group_commit


def answers(idx, queries):
    """Single, batch and key-ordered batch answers, each as [{id: distance}]."""
    one = [{m.id: m.distance for m in idx.query(q)} for q in queries]
    many = [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)]
    with hook.key_ordered_batches():
        keyed = [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)]
    return one, many, keyed


def check(idx, stored, queries, k):
    want = [brute(stored, q, k) for q in queries]
    one, many, keyed = answers(idx, queries)
    assert one == want
    assert many == want
    assert keyed == want


def families(rng, n, k):
    """n random fingerprints, each followed by copies at every distance 0..k+1."""
    out = []
    for _ in range(n):
        out += planted_family(rng, rng.getrandbits(64), k)
    return out


def test_batches_commit_at_once_and_reach_the_shards_in_groups(tmp_path):
    rng = random.Random(1)
    group = protocol.GROUP_LIMIT
    stored, seen = {}, set()
    with simindex.Index(tmp_path / "i", k=3, shards=4) as idx:
        for b in range(6):
            fps = [rng.getrandbits(64) for _ in range(940)] + families(rng, 4, 3)
            ids = [f"b{b}.{i}" for i in range(len(fps))]
            idx.add_many(ids, fps)
            stored.update(zip(ids, fps))
            unapplied = idx.stats()["unapplied"]
            assert unapplied < group             # applied once a group waits
            seen.add(unapplied == 0)
            queries = [fp for fp in rng.sample(fps, 40)] + families(rng, 3, 3)
            check(idx, stored, queries, 3)
        assert seen == {True, False}             # batches waited, and a group was applied
        assert idx.stats()["unapplied"] > 0
    with simindex.Index(tmp_path / "i", readonly=True) as ro:
        assert ro.stats()["unapplied"] == 0      # close() applied what waited
        assert ro.verify() == []
        check(ro, stored, rng.sample(list(stored.values()), 50), 3)


# plans without and with flips (several probes per table)
@pytest.mark.parametrize("k,blocks,prefix", [(3, 4, 1), (3, 2, 1), (6, 8, 2)])
def test_the_tables_over_the_unapplied_records_answer_as_a_pass_over_them(tmp_path, k,
                                                                         blocks, prefix):
    rng = random.Random(k * 10 + blocks)
    base = {f"a{i}": rng.getrandbits(64) for i in range(3000)}
    with simindex.Index(tmp_path / "i", k=k, blocks=blocks, prefix_blocks=prefix,
                        shards=2) as idx:
        idx.add_many(list(base), list(base.values()))
        idx.flush()
        crowd = rng.getrandbits(64)
        tail = families(rng, 60, k) + [crowd] * 50 + [crowd ^ 1 << 63] * 20 + [crowd ^ 1] * 9
        tail += [rng.getrandbits(64) for _ in range(400)]
        # all-zero and all-one keys: the first and last key of their prefix ranges
        edges = planted_family(rng, 0, k) + planted_family(rng, 2**64 - 1, k)
        tail += edges
        pending = {f"u{i}": fp for i, fp in enumerate(tail)}
        hook.commit_unapplied(idx, list(pending), np.array(list(pending.values()), np.uint64))
        stored = {**base, **pending}
        queries = [crowd, crowd ^ 1 << 62] + [fp for fp in rng.sample(tail, 100)] + \
            edges + families(rng, 10, k)
        want = [brute(stored, q, k) for q in queries]
        one = [{m.id: m.distance for m in idx.query(q)} for q in queries[:10]]
        assert one == want[:10]
        assert hook.tail_counters(idx)["builds"] == 0    # a few queries: passes over it
        one, many, keyed = answers(idx, queries)
        assert hook.tail_counters(idx)["builds"] == 1    # a batch paid for its tables
        assert (one, many, keyed) == (want, want, want)
        with hook.tail_tables(1 << 62):                  # never tables: passes over it
            assert list(answers(idx, queries)) == [want] * 3
        assert hook.tail_counters(idx)["builds"] == 1
        # records removed and replaced meanwhile: kept tail and tables follow the snapshot
        gone = rng.sample(list(pending), 100)
        for i in gone:
            idx.remove(i)
            del stored[i]
        moved = rng.sample(sorted(set(pending) - set(gone)), 50)
        new = families(rng, 5, k)[:50]
        idx.add_many(moved, new)
        stored.update(zip(moved, new))
        queries += new
        assert list(answers(idx, queries)) == [[brute(stored, q, k) for q in queries]] * 3
        assert hook.tail_counters(idx)["loads"] == len(pending) + 50   # only what was new


def test_removing_the_newest_waiting_records_reads_nothing_again(tmp_path):
    rng = random.Random(4)
    stored = {f"w{i}": rng.getrandbits(64) for i in range(600)}
    with simindex.Index(tmp_path / "i", k=3, shards=2) as idx:
        idx.add_many(list(stored), list(stored.values()))
        assert idx.stats()["unapplied"] == 600              # waiting for their group
        queries = list(stored.values())[-50:]
        check(idx, stored, queries, 3)
        loads = hook.tail_counters(idx)["loads"]
        for i in list(stored)[-20:]:                        # the newest seqs go
            idx.remove(i)
            del stored[i]
        check(idx, stored, queries, 3)
        assert hook.tail_counters(idx)["loads"] == loads    # the kept list served


@given(st.one_of(st.just(0), st.just(2**64 - 1), st.integers(0, 2**64 - 1)),
       st.lists(st.integers(0, 63), min_size=0, max_size=4), st.integers(0, 3),
       st.randoms(use_true_random=False))
def test_the_tail_tables_miss_nothing_at_any_distance(tmp_path_factory, base, flips, k, rnd):
    path = tmp_path_factory.mktemp("t") / "i"
    tail = [rnd.getrandbits(64) for _ in range(300)] + planted_family(rnd, base, 3)
    q = base
    for b in flips:
        q ^= 1 << b
    stored = {i: fp for i, fp in enumerate(tail)}
    with simindex.Index(path, k=3, shards=2) as idx:
        hook.commit_unapplied(idx, list(stored), np.array(tail, np.uint64))
        got = idx.query_many([q] * 200, k=k)        # enough queries to build the tables
        assert hook.tail_counters(idx)["builds"] == 1
        assert all({m.id: m.distance for m in ms} == brute(stored, q, k) for ms in got)


READER_STEP = """
import os, sys, numpy as np, simindex
path, step = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(step)
idx = simindex.Index(path)
removed = []
if step % 3 == 2:                          # remove and replace some of the last batch
    removed = [f"s{step - 1}.{i}" for i in range(0, 300, 3)]
    for i in removed:
        idx.remove(i)
    ids = [f"s{step - 1}.{i}" for i in range(1, 300, 3)]
else:
    ids = [f"s{step}.{i}" for i in range(300)]
fps = rng.integers(0, 2**64, len(ids), dtype=np.uint64)
idx.add_many(ids, fps)
print(repr((removed, dict(zip(ids, fps.tolist())))), flush=True)
os._exit(0)    # no close(), which would apply the records: the reader must see them waiting
"""


def test_a_reader_reads_only_what_another_process_committed_since(tmp_path):
    path = tmp_path / "i"
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**64, 2000, dtype=np.uint64)
    stored = {f"a{i}": int(fp) for i, fp in enumerate(base)}
    with simindex.Index(path, k=3, shards=2) as idx:
        idx.add_many(list(stored), base)
    with simindex.Index(path, readonly=True) as ro:
        loads = 0
        for step in range(6):
            removed, added = eval(run_py(READER_STEP, path, step).stdout)
            for i in removed:
                del stored[i]
            stored.update(added)
            assert 0 < ro.stats()["unapplied"] < protocol.GROUP_LIMIT
            fps = list(added.values())
            queries = fps[:40] + [fp ^ 1 << 63 for fp in fps[:20]] + list(stored.values())[:10]
            check(ro, stored, queries, 3)
            new = hook.tail_counters(ro)["loads"] - loads
            loads += new
            assert new == len(added)             # only the records committed since


KILLED_WRITER = """
import os, signal, sys, numpy as np, simindex
idx = simindex.Index(sys.argv[1], k=3, shards=4)
rng = np.random.default_rng(5)
for b in range(3):
    idx.add_many([f"k{b}.{i}" for i in range(1000)], rng.integers(0, 2**64, 1000, dtype=np.uint64))
print("added", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writer_loses_no_record_that_waited_for_its_group(tmp_path):
    path = tmp_path / "i"
    p = run_py(KILLED_WRITER, path, check=False)
    assert p.returncode == -9 and p.stdout == "added\n"
    rng = np.random.default_rng(5)
    stored = {f"k{b}.{i}": int(fp) for b in range(3)
              for i, fp in enumerate(rng.integers(0, 2**64, 1000, dtype=np.uint64))}
    queries = [fp ^ 1 << 7 for fp in list(stored.values())[::50]]
    with simindex.Index(path, readonly=True) as ro:
        assert ro.stats()["unapplied"] == 3000 and len(ro) == 3000
        check(ro, stored, queries, 3)
    with simindex.Index(path) as idx:           # a writable open applies them
        assert idx.stats()["unapplied"] == 0 and idx.verify() == []
        check(idx, stored, queries, 3)
