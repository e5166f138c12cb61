"""A bulk load writes each table once: one pass, one run per table and shard, exact answers,
a group of shards at a time when its entries exceed the sort budget."""

import itertools
import random

import numpy as np
import pytest

import simindex
from simindex import _testing
from simindex.engine import protocol, records
from simindex.engine.codec import encode_id, pack_meta
from simindex.engine.plan import Plan
from conftest import brute, popcount
from test_exact import build_data


@pytest.fixture
def groups(monkeypatch):
    """The shard ranges each application pass computed entries for, in order."""
    seen = []
    make = protocol.Entries.__init__

    def spy(self, plan, seqs, fps, shards=None, **kw):
        seen.append(tuple(shards) if shards is not None else None)
        make(self, plan, seqs, fps, shards, **kw)
    monkeypatch.setattr(protocol.Entries, "__init__", spy)
    return seen


# (sort budget in entries, shards a group then holds: 16 shards, ~1,750 records, 4 tables,
# ~440 entries a shard; groups are sized so that two of them fit the budget when they can)
BUDGETS = [(None, 16), (2000, 2), (10, 1)]


@pytest.mark.parametrize("budget,per_group", BUDGETS)
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_bulk_load_writes_each_table_once_and_answers_exactly(tmp_path, groups, budget,
                                                                per_group, jobs):
    stored, queries = build_data(3, seed=11)
    knobs = {} if budget is None else {"sort_entries": budget}
    with _testing.tuned(**knobs), simindex.Index(tmp_path / "i", k=3, shards=16) as idx:
        idx.add_many(list(stored), np.array(list(stored.values()), dtype=np.uint64),
                     jobs=jobs)
        st = idx.stats()
        assert st["runs"] == st["shards"] * st["tables"]        # no run merged, none split
        assert st["unapplied"] == 0
        size = max(per_group, jobs)                             # jobs shards run at once
        assert groups == [(lo, min(16, lo + size)) for lo in range(0, 16, size)]
        got = idx.query_many(queries)
        assert [{m.id: m.distance for m in ms} for ms in got] == \
            [brute(stored, q, 3) for q in queries]
        assert idx.verify() == []


def test_a_bulk_load_into_a_filled_index_goes_group_by_group_exactly(tmp_path, groups):
    stored, queries = build_data(3, seed=12)
    items = list(stored.items())
    with simindex.Index(tmp_path / "i", k=3, shards=8) as idx:
        idx.add_many(items[:300])
        idx.add_many(items[300:337])           # small batches: one group of every shard
        assert set(groups) == {(0, 8)}
        with _testing.tuned(sort_entries=100):
            idx.add_many(items[337:])
        assert groups[2:] == [(s, s + 1) for s in range(8)]
        got = idx.query_many(queries)
        assert [{m.id: m.distance for m in ms} for ms in got] == \
            [brute(stored, q, 3) for q in queries]
    with simindex.Index(tmp_path / "i") as idx:                 # and after a reopen
        assert len(idx) == len(stored)
        assert idx.query_many(queries) == got


@pytest.mark.parametrize("early", [False, True])
def test_a_wide_bulk_load_goes_group_by_group_exactly(tmp_path, groups, early):
    """(early: the bulk load may be prepared while its records commit; wide passes in
    groups are not, so only the one-group load below is)"""
    rng = random.Random(5)
    stored = {f"r{i}": rng.getrandbits(128) for i in range(1500)}
    bases = [rng.getrandbits(128) for _ in range(8)] + [0, (1 << 128) - 1]
    for b, base in enumerate(bases):
        for d in range(0, 9):                  # planted at every distance 0..k+1
            flip = sum(1 << bit for bit in rng.sample(range(128), d))
            stored[f"p{b}.{d}"] = base ^ flip
    knobs = {"prepare": 1000, "group": 100} if early else {}
    queries = bases + [rng.getrandbits(128) for _ in range(5)]
    with _testing.tuned(sort_entries=500, **knobs), \
            simindex.Index(tmp_path / "i", k=7, width=128, shards=4) as idx:
        idx.add_many(stored.items())
        assert len(groups) > 1 and groups[0] != (0, 4)
        st = idx.stats()
        assert st["runs"] == st["shards"] * st["tables"]
        for q in queries:
            want = {i: popcount(fp ^ q) for i, fp in stored.items() if popcount(fp ^ q) <= 7}
            assert {m.id: m.distance for m in idx.query(q)} == want
    if early:                                   # one group: prepared, and exact
        with _testing.tuned(**knobs), \
                simindex.Index(tmp_path / "j", k=7, width=128, shards=4) as idx:
            idx.add_many(stored.items())
            assert groups[-1] is None
            for q in queries:
                want = {i: popcount(fp ^ q) for i, fp in stored.items()
                        if popcount(fp ^ q) <= 7}
                assert {m.id: m.distance for m in idx.query(q)} == want


# int ids given as a range or an integer array are encoded in C, without a Python object
# per record: the same records as from a list of Python ints
@pytest.mark.parametrize("ids", [
    range(5, 2005), np.arange(5, 2005, dtype=np.int64), np.arange(5, 2005, dtype=np.uint32),
    range(2**63 - 1000, 2**63 + 1000),           # past int64: the generic path
])
def test_int_ids_in_columns_store_the_same_records_as_a_list(tmp_path, ids):
    fps = np.random.default_rng(1).integers(0, 2**64, len(ids), dtype=np.uint64)
    fps[7] = fps[3] ^ 0b101                    # a planted near-duplicate
    want = [int(i) for i in ids]
    with simindex.Index(tmp_path / "a", k=3) as a, simindex.Index(tmp_path / "b", k=3) as b:
        a.add_many(ids, fps)
        b.add_many(want, fps)
        assert len(a) == len(b) == len(want)
        for i in (0, 3, 7, len(want) - 1):
            assert a.get(want[i]) == b.get(want[i])
            assert a.get(want[i]).fingerprint == int(fps[i])
            assert type(a.get(want[i]).id) is int
        assert a.query(int(fps[3])) == b.query(int(fps[3]))
        assert {m.id for m in a.query(int(fps[3]))} >= {want[3], want[7]}
        assert sorted(a.pairs()) == sorted(b.pairs())
        assert a.get(str(want[0])) is None and a.get(str(want[0]).encode()) is None
        # replacing: the same ids again keep one record each, the newest
        a.add_many(ids, fps[::-1].copy())
        assert len(a) == len(want)
        assert a.get(want[0]).fingerprint == int(fps[-1])
        assert a.verify() == []


def test_int_id_columns_are_checked_first(tmp_path):
    fps = np.zeros(3, dtype=np.uint64)
    with simindex.Index(tmp_path / "i", k=3) as idx:
        with pytest.raises(simindex.InputError, match=r"id -1 is out of range: .* \(at position 1"):
            idx.add_many(np.array([4, -1, 5]), fps)
        with pytest.raises(simindex.InputError, match=r"id -2 is out of range"):
            idx.add_many(range(-2, 1), fps)
        with pytest.raises(simindex.InputError, match="2 ids and 3 fingerprints"):
            idx.add_many(range(2), fps)
        assert len(idx) == 0
        idx.add_many(range(3), fps)
        # replace=False names a stored id, given as an array too
        with pytest.raises(simindex.InputError, match="id 2 is already stored"):
            idx.add_many(np.array([7, 2], dtype=np.uint64), fps[:2], replace=False)
        with pytest.raises(simindex.InputError, match="id 9 is given twice"):
            idx.add_many(np.array([9, 9], dtype=np.uint64), fps[:2], replace=False)
        assert len(idx) == 3


# ---------------------------------------------------------------- the compiled steps of a pass
# plans: the paper's (5/2: 10 tables), one table, 1-bit blocks, and 2-bit blocks narrower
# than the 3 shard bits (shard ids then come from the whole permutation)
PLANS = [(3, 5, 2), (3, 4, 1), (0, 1, 1), (2, 32, 30), (1, 64, 63)]


def plan_fps(n, seed):
    fps = np.random.default_rng(seed).integers(0, 2**64, n, dtype=np.uint64)
    return np.concatenate([fps, np.array([0, 2**64 - 1, 1, 2**63], dtype=np.uint64)])


@pytest.mark.parametrize("k,blocks,prefix", PLANS)
def test_permuted_keys_are_the_documented_permutation(k, blocks, prefix):
    from test_wide_plans import reference_key
    plan = Plan(k=k, blocks=blocks, prefix_blocks=prefix, shards=8)
    fps = plan_fps(300, 1)
    for t in range(min(plan.ntables, 12)):
        assert plan.permuter.keys(t, fps).tolist() == \
            [reference_key(plan, t, int(f)) for f in fps]


@pytest.mark.parametrize("k,blocks,prefix", PLANS)
def test_shard_ids_are_the_leading_bits_of_each_key_and_count_them(k, blocks, prefix):
    plan = Plan(k=k, blocks=blocks, prefix_blocks=prefix, shards=8)
    fps = plan_fps(5000, 2)
    ids, counts = plan.permuter.shard_ids(fps)
    assert ids.shape == (plan.ntables, len(fps)) and counts.shape == (plan.ntables, 8)
    for t in range(plan.ntables):
        want = (plan.permuter.keys(t, fps) >> np.uint64(61)).astype(np.uint8)
        assert (ids[t] == want).all()
        assert counts[t].tolist() == np.bincount(want, minlength=8).tolist()


def gather_reference(plan, fps, seqs, ids, lo, hi):
    out = []
    for t in range(plan.ntables):
        mine = (ids[t] >= lo) & (ids[t] < hi)
        out.append((plan.permuter.keys(t, fps)[mine], seqs[mine]))
    return out


@pytest.mark.parametrize("lo,hi", [(0, 1), (7, 8), (2, 5), (0, 8)])
@pytest.mark.parametrize("spare", [1, 3])
def test_gather_shards_takes_every_tables_entries_of_a_group_in_input_order(lo, hi, spare):
    plan = Plan(k=3, blocks=5, prefix_blocks=2, shards=8)
    # 40,000 records: the tiles of 2,048 that cannot fill a region take the fast loop,
    # the last ones the loop that stays within it
    fps = plan_fps(40_000, 3)
    seqs = np.arange(10, 10 + 3 * len(fps), 3, dtype=np.uint64)
    ids, counts = plan.permuter.shard_ids(fps)
    sizes = counts[:, lo:hi].sum(axis=1) + spare
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    ok = np.zeros(int(sizes.sum()), dtype=np.uint64)
    oq = np.zeros_like(ok)
    got = plan.permuter.gather_shards(fps, seqs, ids, lo, hi, ok, oq, starts)
    for t, (keys, sq) in enumerate(gather_reference(plan, fps, seqs, ids, lo, hi)):
        a = int(starts[t])
        assert got[t] == len(keys)
        assert (ok[a:a + got[t]] == keys).all() and (oq[a:a + got[t]] == sq).all()


def test_gather_shards_refuses_regions_it_would_overrun():
    plan = Plan(k=3, blocks=4, prefix_blocks=1, shards=8)
    fps = plan_fps(3000, 4)
    seqs = np.arange(len(fps), dtype=np.uint64)
    ids, counts = plan.permuter.shard_ids(fps)
    sizes = counts[:, 2] + 1
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    ok, oq = np.zeros(int(sizes.sum()), dtype=np.uint64), np.zeros(int(sizes.sum()),
                                                                    dtype=np.uint64)
    gather = plan.permuter.gather_shards
    gather(fps, seqs, ids, 2, 3, ok, oq, starts)                  # exactly enough
    tight = starts.copy()
    tight[2] -= 1                          # table 1's region one slot short: no spare
    with pytest.raises(ValueError, match="too small"):
        gather(fps, seqs, ids, 2, 3, ok, oq, tight)
    with pytest.raises(ValueError, match="too small"):
        gather(fps, seqs, ids, 2, 3, ok[:-1], oq[:-1], starts)    # the last table's
    with pytest.raises(ValueError, match="empty or out of order"):
        gather(fps, seqs, ids, 2, 3, ok, oq, starts[::-1].copy())
    with pytest.raises(ValueError, match="out of range"):
        gather(fps, seqs, ids, 3, 3, ok, oq, starts)
    with pytest.raises(ValueError, match="differ in shape"):
        gather(fps[1:], seqs, ids, 2, 3, ok, oq, starts)


def test_sort_entries_sorts_into_given_buffers_and_checks_them():
    from simindex.engine._slabs import sort_entries
    rng = np.random.default_rng(5)
    for n in (0, 1, 1000, 300_000):            # above 2**18: through the partitions
        keys = rng.integers(0, 2**64, n, dtype=np.uint64)
        keys[: n // 3] = keys[n // 3: 2 * (n // 3)]            # equal keys, seq decides
        seqs = rng.permutation(n).astype(np.uint64)
        bk, bq = np.empty(n + 5, dtype=np.uint64), np.empty(n + 5, dtype=np.uint64)
        got_k, got_s = sort_entries(keys, seqs, bk, bq)
        order = np.lexsort((seqs, keys))
        assert (got_k == keys[order]).all() and (got_s == seqs[order]).all()
        assert len(got_k) == n and np.shares_memory(got_k, bk) if n else True
    keys = np.arange(10, dtype=np.uint64)
    buf = np.empty(30, dtype=np.uint64)
    with pytest.raises(ValueError, match="at least as many"):
        sort_entries(keys, keys.copy(), buf[:9], buf[10:20])
    with pytest.raises(ValueError, match="at least as many"):
        sort_entries(keys, keys.copy(), buf[:10])
    with pytest.raises(ValueError, match="share memory"):
        sort_entries(keys, keys.copy(), buf[:10], buf[5:15])
    with pytest.raises(ValueError, match="share memory"):
        sort_entries(buf[:10], keys, buf[10:20], buf[5:15])


@pytest.fixture
def buffers(monkeypatch):
    """(group, sets) of each group_buffers call."""
    made = []
    real = protocol.group_buffers

    def spy(counts, group, sets=1):
        made.append((group, sets))
        return real(counts, group, sets)
    monkeypatch.setattr(protocol, "group_buffers", spy)
    return made


def test_a_bulk_load_fills_one_set_of_buffers_group_after_group(tmp_path, groups, buffers):
    """When two groups' entries do not fit the sort budget, one set of buffers serves
    every group in turn."""
    stored, queries = build_data(3, seed=13)
    with _testing.tuned(sort_entries=10), simindex.Index(tmp_path / "i", k=3, shards=8) as idx:
        idx.add_many(list(stored), np.array(list(stored.values()), dtype=np.uint64))
        assert buffers == [(1, 1)] and groups == [(s, s + 1) for s in range(8)]
        assert [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)] == \
            [brute(stored, q, 3) for q in queries]


@pytest.mark.parametrize("prepare", [False, True])
def test_a_bulk_load_sorts_the_next_group_while_it_writes_one(tmp_path, monkeypatch, groups,
                                                              buffers, prepare):
    """When two groups' entries fit the sort budget, group i + 1 is gathered and sorted on a
    second thread while group i is written, in two sets of buffers taken in turn."""
    import threading
    events = []
    started = {s: threading.Event() for s in range(8)}
    make, write = protocol.Entries.__init__, protocol._apply_shards

    def made(self, plan, seqs, fps, shards=None, **kw):
        events.append(("start", shards[0], threading.current_thread() is threading.main_thread()))
        started[shards[0]].set()
        make(self, plan, seqs, fps, shards, **kw)

    def wrote(txns, plan, shards, entries, top, todo, *rest):
        # group s + 1 is handed to the second thread before group s is written: the write
        # waits for it to begin (a loader that made it afterwards would wait in vain)
        if todo[0] + 1 < 8:
            started[todo[0] + 1].wait(timeout=30)
        write(txns, plan, shards, entries, top, todo, *rest)
        events.append(("written", todo[0], True))
    monkeypatch.setattr(protocol.Entries, "__init__", made)
    monkeypatch.setattr(protocol, "_apply_shards", wrote)
    stored, queries = build_data(3, seed=18)           # ~1,800 records, ~900 entries a shard
    knobs = {"prepare": 1000, "group": 100} if prepare else {}
    with _testing.tuned(sort_entries=2000, **knobs), \
            simindex.Index(tmp_path / "i", k=3, shards=8) as idx:
        idx.add_many(list(stored), np.array(list(stored.values()), dtype=np.uint64))
        assert buffers == [(1, 2)]
        assert [e for e in events if e[0] == "written"] == [("written", s, True)
                                                             for s in range(8)]
        for s in range(1, 8):               # made on the second thread, before s - 1 is written
            assert ("start", s, False) in events
            assert events.index(("start", s, False)) < events.index(("written", s - 1, True))
        st = idx.stats()
        assert st["runs"] == st["shards"] * st["tables"] and st["unapplied"] == 0
        assert exact(idx, stored, queries) and idx.verify() == []
    with simindex.Index(tmp_path / "i") as idx:
        assert exact(idx, stored, queries)


def prepared():
    """Bulk loads of build_data's ~1,800 records prepared (group commit leaves 100 waiting)."""
    return _testing.tuned(prepare=1000, group=100)


def exact(idx, stored, queries):
    return [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)] == \
        [brute(stored, q, 3) for q in queries]


@pytest.mark.parametrize("budget,want", [
    (None, [None]),                                  # all shards at once, before the commit
    (3000, [(0, 1), (1, 2), (2, 3), (3, 4)]),        # the first group before the commit
    (4000, [(0, 1), (1, 2), (2, 3), (3, 4)])])       # ... and each next one beside a write
def test_a_bulk_load_sorts_its_entries_while_its_records_commit(tmp_path, monkeypatch,
                                                                 groups, budget, want):
    """From PREPARE_MIN records into an index with nothing waiting, the table entries (of
    the first group of shards, when the pass has several) are computed on a second thread
    for the seqs the records will get, and the pass is applied without reading the records
    back."""
    stored, queries = build_data(3, seed=14)

    def read_back(*args, **kw):
        raise AssertionError("the records were read back")
    knobs = {} if budget is None else {"sort_entries": budget}
    with prepared(), _testing.tuned(**knobs), \
            simindex.Index(tmp_path / "i", k=3, shards=4) as idx:
        with monkeypatch.context() as m:
            m.setattr(protocol.records, "tail", read_back)
            idx.add_many(list(stored), np.array(list(stored.values()), dtype=np.uint64))
        assert groups == want
        st = idx.stats()
        assert st["runs"] == st["shards"] * st["tables"] and st["unapplied"] == 0
        assert exact(idx, stored, queries)
        assert idx.verify() == []
        more = {f"m{i}": fp ^ 0b1 for i, fp in enumerate(list(stored.values())[:1200])}
        with monkeypatch.context() as m:
            m.setattr(protocol.records, "tail", read_back)
            idx.add_many(list(more.items()))         # prepared again, onto the first runs
        stored.update(more)
        assert exact(idx, stored, queries)
    with simindex.Index(tmp_path / "i") as idx:
        assert len(idx) == len(stored) and exact(idx, stored, queries)
        assert idx.verify() == []


@pytest.mark.parametrize("case", ["an id twice", "records waiting", "a writer before",
                                  "a writer after"])
def test_a_prepared_bulk_load_is_dropped_unless_its_records_got_those_seqs_as_new_ids(
        tmp_path, monkeypatch, groups, case):
    """The prepared entries are applied only when the records got exactly the seqs they were
    made for, every id new; otherwise the shards catch up from the records, as before."""
    stored, queries = build_data(3, seed=15)
    items = list(stored.items())
    real = protocol.commit

    def commit(txns, env, *args, **kw):
        """protocol.commit, with another writer's record committed just before or after."""
        def other():
            txns.write(env, lambda txn: records.put(
                txn, [encode_id("other")], np.array([12345], dtype=np.uint64),
                [pack_meta(None)]))
        if case == "a writer before":
            other()
        out = real(txns, env, *args, **kw)
        if case == "a writer after":
            other()
        return out
    with prepared(), simindex.Index(tmp_path / "i", k=3, shards=4) as idx:
        if case == "records waiting":
            idx.add_many(items[:10])                 # fewer than GROUP_LIMIT: they wait
            assert idx.stats()["unapplied"] == 10
            items = items[10:]
        if case == "an id twice":
            items = items + [(items[0][0], items[0][1] ^ 0b111)]     # the later one wins
            stored[items[0][0]] = items[0][1] ^ 0b111
        with monkeypatch.context() as m:
            if case.startswith("a writer"):
                m.setattr(protocol, "commit", commit)
                stored["other"] = 12345
            idx.add_many(items)
        assert (groups[-1] is None) == (case == "a writer after")
        assert len(idx) == len(stored) and exact(idx, stored, queries)
        idx.flush()
        assert idx.stats()["unapplied"] == 0 and exact(idx, stored, queries)
        assert idx.verify() == []


def test_a_failed_prepared_bulk_load_writes_nothing_and_leaves_no_thread(tmp_path):
    import threading
    stored, queries = build_data(3, seed=16)
    items = list(stored.items())
    with prepared(), simindex.Index(tmp_path / "i", k=3, shards=4) as idx:
        idx.add_many(items[:5])
        before = threading.active_count()
        with pytest.raises(simindex.InputError, match="already stored"):
            idx.add_many(items[1000:] + items[3:4], replace=False)    # its last chunk fails
        assert threading.active_count() == before
        assert len(idx) == 5
        assert exact(idx, dict(items[:5]), queries)
        idx.add_many(items[5:])
        assert exact(idx, stored, queries) and idx.verify() == []


@pytest.mark.parametrize("width", [64, 128])
def test_entries_filled_by_two_threads_equal_entries_made_at_once(width):
    import threading
    plan = Plan(k=3, width=width, shards=4)
    rng = np.random.default_rng(3)
    fps = rng.integers(0, 2**64, (20000, width // 64), dtype=np.uint64)
    fps = fps[:, 0].copy() if width == 64 else fps
    seqs = np.arange(7, 20007, dtype=np.uint64)
    want = protocol.Entries(plan, seqs, fps)
    got = protocol.Entries(plan, seqs, fps, lazy=True)
    assert not got.complete()
    threads = [threading.Thread(target=got.fill) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got.fill()                                       # nothing left: returns at once
    assert got.complete() and len(got.tables) == plan.ntables
    for t in range(plan.ntables):
        for shard in range(plan.shards):
            for a, b in zip(got.of(t, shard), want.of(t, shard)):
                assert (a is None and b is None) or np.array_equal(a, b)


def _leaf_key_sizes(path):
    """The key size of each leaf page's first entry in records/, in file order: 8 for a
    seqs leaf (a u64 seq), 9 for an ids leaf (an int id's key); LMDB's page layout."""
    import struct
    data = (path / "records" / "data.mdb").read_bytes()
    page = 4096
    assert len(data) % page == 0
    sizes = []
    for off in range(2 * page, len(data), page):                # (pages 0 and 1: metas)
        flags, lower = struct.unpack_from("<HH", data, off + 10)
        if flags == 0x02 and lower > 16:                         # a leaf holding entries
            node = struct.unpack_from("<H", data, off + 16)[0]
            sizes.append(struct.unpack_from("<H", data, off + node + 6)[0])
    return [s for s in sizes if s in (8, 9)]


def test_a_bulk_load_commits_a_million_records_a_transaction_seqs_ahead_of_ids(tmp_path):
    """Up to 1,048,576 records (RECORD_CHUNK) commit in one records/ transaction: all or
    nothing, and their seqs' pages lie in one stretch ahead of their ids', so a cold query's
    readahead reads few of the ids it does not need (a cold batch at 1M read 40 MB of
    records/, 64 MB in transactions of 2**18)."""
    n = 1 << 20                                     # README's figure, not the constant
    fps = np.random.default_rng(17).integers(0, 2**64, n + 1, dtype=np.uint64)
    with simindex.Index(tmp_path / "i", k=3) as idx:
        env = _testing._store(idx).records
        before = env.info()["last_txnid"]
        idx.add_many(range(n + 1), fps)
        assert env.info()["last_txnid"] - before == 2           # n, then 1
        assert idx.query(int(fps[n]) ^ 1) and idx.query(int(fps[0]))[0].id == 0
    sizes = _leaf_key_sizes(tmp_path / "i")
    assert sizes.count(8) >= n // 110 and sizes.count(9) >= n // 160   # ~107, ~150 a page
    runs = [(size, len(list(run))) for size, run in itertools.groupby(sizes)]
    # the first chunk's seqs, its ids, then the few pages the second chunk copied to write
    # its record (transactions of 2**18 left 13 stretches of 200-2,500 pages)
    assert [size for size, _ in runs[:2]] == [8, 9], runs
    assert sum(count for _, count in runs[2:]) <= 10, runs
