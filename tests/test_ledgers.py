"""An index whose records are split over several ledgers (simindex/engine/ledgers.py): a
Cluster of several ledgers answers as the brute force does, a ledger or shard actor killed
under a write load loses no acknowledged record, add_unique stays atomic across ledgers,
and simindex.Index opens what it wrote, read-only, with the same answers."""

import os
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, strategies as st

import simindex
from conftest import brute, brute_pairs, ledger_server
from simindex.engine import ledgers, manifest
from simindex.engine.codec import encode_id, pack

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'simindex[ray]')")
dist = pytest.importorskip("simindex.distributed")
from test_dist import as_words, dataset, wide_brute_pairs, wide_dataset  # noqa: E402
from test_reliability import _root_of  # noqa: E402


def ledger_counts(c):
    return ray.get([led.count.remote() for led in c.ledgers])


def same_answers(got, stored, queries, k):
    """Each query's matches are the oracle's, by distance then seq (ties: any order the
    Index gives too, compared apart)."""
    for q, ms in zip(queries, got):
        assert {m.id: m.distance for m in ms} == brute(stored, q, k)
        assert [m.distance for m in ms] == sorted(m.distance for m in ms)
        assert all(m.fingerprint == stored[m.id] for m in ms)


@given(st.integers(1, 2 ** 40), st.integers(0, 40), st.integers(1, 64))
def test_global_seqs_name_one_ledger_and_local_seq(local, ledger, n):
    ledger %= n
    g = ledgers.to_global(np.array([local], dtype=np.uint64), ledger, n)
    assert int(g[0]) == ledgers.global_seq(local, ledger, n)
    led, loc = ledgers.to_local(g, n)
    assert (int(led[0]), int(loc[0])) == (ledger, local)
    # one ledger's global seqs keep its local order
    assert ledgers.global_seq(local + 1, ledger, n) > int(g[0])


@pytest.mark.parametrize("n,width,k", [(3, 64, 3), (2, 128, 8), (1, 64, 3)])
def test_a_cluster_of_several_ledgers_answers_as_the_brute_force(local_ray, tmp_path, n,
                                                                 width, k):
    path = tmp_path / "i"
    with simindex.Index(path, width=width, k=k, shards=4) as idx:
        blocks = idx.blocks
    stored, queries = dataset(k, seed=n) if width == 64 else \
        wide_dataset(width, k, blocks, seed=n)
    items = list(stored.items())
    third = len(items) // 3
    with dist.Cluster(path, ledgers=n) as c:
        assert len(c.ledgers) == n and repr(c).endswith(f"ledgers={n}>")
        c.add_many(items[:third])                                     # one batch
        for i, fp in items[third:third + 50]:                         # one by one
            c.add(i, fp, {"i": i})
        rest = items[third + 50:]
        fps = [f for _, f in rest]
        c.add_many([i for i, _ in rest], np.array(fps, dtype=np.uint64) if width == 64
                   else as_words(fps, width))
        assert all(count > 0 for count in ledger_counts(c))           # every ledger writes
        for i, _ in items[::17]:                                      # removals
            assert c.remove(i)
            del stored[i]
        assert not c.remove(items[0][0])
        for i, fp in items[5::23]:                                    # replacements
            if i in stored:
                c.add(i, fp ^ 1, None)
                stored[i] = fp ^ 1
        c.add("newest", 12345)                                        # then removed:
        assert c.remove("newest")                                     # compact drops it
        assert len(c) == len(stored)
        got = c.query_many(queries)
        same_answers(got, stored, queries, k)
        for j in range(k + 1):                                        # every radius
            same_answers(c.query_many(queries[:20], k=j), stored, queries[:20], j)
        assert c.get(items[1][0]).fingerprint == stored[items[1][0]]
        assert items[0][0] not in c and items[1][0] in c
        busy = c.busy()                       # each actor's calls and seconds, by method
        assert set(busy) == {ledgers.ledger_dir(j) for j in range(n)} | set(range(4))
        assert all(busy[ledgers.ledger_dir(j)]["resolve"][0] > 0 for j in range(n))
        assert sum(busy[s]["apply"][0] for s in range(4)) > 0
        assert all(calls > 0 and secs >= 0 for b in busy.values()
                   for calls, secs in b.values())
        pairs = {(a, b): d for a, b, d in c.pairs()}
        assert {frozenset(p): d for p, d in pairs.items()} == \
            {frozenset(p): d for p, d in (brute_pairs(stored, k) if width == 64 else
                                          wide_brute_pairs(stored, k)).items()}
        with simindex.Index(path, readonly=True) as idx:
            before = idx.stats()
        assert before["stale"] > 0 and before["entries"] > len(stored) * before["tables"]
        c.compact()                            # drops the removed and replaced entries
        assert [[(m.id, m.distance) for m in ms] for ms in c.query_many(queries)] == \
            [[(m.id, m.distance) for m in ms] for ms in got]
    with simindex.Index(path, readonly=True) as idx:
        assert idx.verify() == []
        stats = idx.stats()
        assert len(idx) == len(stored) and stats["ledgers"] == n
        assert stats["format"] == (4 if n > 1 else 3) and stats["stale"] == 0
        assert stats["entries"] == len(stored) * stats["tables"]
        ix = idx.query_many(queries)
        assert [[(m.id, m.distance) for m in ms] for ms in ix] == \
            [[(m.id, m.distance) for m in ms] for ms in got]
        assert [(m.id, m.distance) for m in idx.query(queries[0])] == \
            [(m.id, m.distance) for m in got[0]]
        assert idx.get(items[1][0]).fingerprint == stored[items[1][0]]
        assert {frozenset((a, b)) for a, b, _ in idx.pairs()} == \
            {frozenset(p) for p in pairs}
        assert sorted(map(sorted, idx.clusters())) == \
            sorted(map(sorted, dist.clusters(path)))
        with pytest.raises(simindex.ReadOnlyError):
            idx.add("x", 1)


def test_a_killed_ledger_or_shard_loses_no_acknowledged_record(local_ray, tmp_path):
    path = tmp_path / "i"
    with simindex.Index(path, k=3, shards=4):
        pass
    acked = {}
    with dist.Cluster(path, ledgers=3) as c:
        pids = c.pids()
        assert set(pids) == {"records", "records-1", "records-2", 0, 1, 2, 3}
        for b in range(10):
            fps = np.random.default_rng(b).integers(0, 2 ** 64, 3000, dtype=np.uint64)
            ids = [f"{b}.{i}" for i in range(len(fps))]
            killer = None
            if b == 2:
                os.kill(pids["records-1"], signal.SIGKILL)        # a ledger, between batches
            if b in (4, 6, 8):
                # while this batch commits or is applied: a ledger, the first one (which
                # also serialises add_unique), a shard
                victim = {4: pids["records-2"], 6: pids["records"], 8: pids[1]}[b]
                kill = f"import os, time; time.sleep(0.03); os.kill({victim}, 9)"
                killer = subprocess.Popen([sys.executable, "-c", kill])
            c.add_many(ids, fps)
            if killer is not None:
                killer.wait()
            acked.update(zip(ids, fps.tolist()))
            if b == 5:
                assert c.add_unique("u", int(fps[0]) ^ 1) != []   # near 5.0: refused
        after = c.pids()
        assert after["records-1"] != pids["records-1"]             # restarted
        assert len(c) == len(acked)
        qs = np.array(list(acked.values()), dtype=np.uint64)
        for i, ms in zip(acked, c.query_many(qs, k=0)):
            assert i in {m.id for m in ms}
    with dist.Cluster(path) as c:                                  # reopened as it is
        assert len(c.ledgers) == 3 and len(c) == len(acked)
    with simindex.Index(path, readonly=True) as idx:
        assert idx.verify() == [] and len(idx) == len(acked)
        assert idx.stats()["unapplied"] == 0


def test_add_unique_admits_one_of_two_near_copies_in_different_ledgers(local_ray, tmp_path):
    path = tmp_path / "i"
    with simindex.Index(path, k=3, shards=2):
        pass
    # ids whose records live in different ledgers, added by two clients at once
    names = [f"doc{i}" for i in range(40)]
    home = ledgers.ledger_of([encode_id(x) for x in names], 2)
    a = names[int(np.flatnonzero(home == 0)[0])]
    b = names[int(np.flatnonzero(home == 1)[0])]
    with dist.Cluster(path, ledgers=2) as c1, dist.Cluster(path) as c2:
        for round_ in range(6):
            base = (round_ + 1) * 0x9E3779B97F4A7C15 % 2 ** 64
            out = {}
            go = threading.Barrier(2)

            def add(c, name, fp):
                go.wait()
                out[name] = c.add_unique(f"{name}.{round_}", fp)
            ts = [threading.Thread(target=add, args=(c1, b if round_ % 2 else a, base)),
                  threading.Thread(target=add, args=(c2, a if round_ % 2 else b,
                                                     base ^ 0b11))]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert sorted(len(v) == 0 for v in out.values()) == [False, True]
            assert len(c1.query(base)) == len(c2.query(base)) == 1


def test_a_ledger_recalls_the_commit_of_a_request(tmp_path):
    # a retried add_unique whose commit went through asks the record's ledger first, and
    # returns that commit instead of finding the record it added
    with ledger_server(tmp_path / "i") as led:
        me = (b"client-1" * 3, 7)
        prev, seqs = led.commit(me, [encode_id("a")], np.array([5], dtype=np.uint64),
                                [pack(None)])
        [(prev2, seqs2)] = led.recall(me)
        assert (prev2, list(seqs2)) == (prev, list(seqs)) == (0, [1])
        assert led.recall((me[0], 8)) is None and led.recall((b"other" * 5, 7)) is None


def test_build_makes_and_extends_an_index_of_several_ledgers(local_ray, tmp_path):
    stored, queries = dataset(3, seed=9, n_random=400)
    items = list(stored.items())
    path = tmp_path / "i"
    assert dist.build(path, items[:200], shards=4, k=3, ledgers=2)["records"] == 200
    assert dist.build(path, items[200:], k=3)["records"] == len(items) - 200
    with simindex.Index(path, readonly=True) as idx:
        assert idx.stats()["ledgers"] == 2 and idx.verify() == []
        for q, ms in zip(queries, idx.query_many(queries)):
            assert {m.id: m.distance for m in ms} == brute(stored, q, 3)


def test_ledgers_are_chosen_while_the_index_is_empty(local_ray, tmp_path):
    with simindex.Index(tmp_path / "full", k=3, shards=2) as idx:
        idx.add("a", 1)
    with pytest.raises(simindex.ParameterError, match="only while empty"):
        dist.Cluster(tmp_path / "full", ledgers=2)
    with simindex.Index(tmp_path / "full") as idx:
        assert idx.verify() == [] and len(idx) == 1              # nothing was changed
    with simindex.Index(tmp_path / "i", k=3, shards=2):
        pass
    for bad in (0, True, "2", 5000):
        with pytest.raises(simindex.ParameterError, match="ledgers"):
            dist.Cluster(tmp_path / "i", ledgers=bad)
    with dist.Cluster(tmp_path / "i", ledgers=2) as c:
        c.add("x", 5)
    with pytest.raises(simindex.ParameterError, match="has 2 ledgers"):
        dist.Cluster(tmp_path / "i", ledgers=3)
    with pytest.raises(simindex.ReadOnlyError, match="2 ledgers"):
        simindex.Index(tmp_path / "i")
    assert os.path.isdir(tmp_path / "i" / "records-1")
    with dist.Cluster(tmp_path / "i", readonly=True) as r:
        assert [m.id for m in r.query(5)] == ["x"]


def test_no_split_under_a_writer_or_over_records_waiting_in_a_log(local_ray, tmp_path):
    path = tmp_path / "i"
    with simindex.Index(path, k=3, shards=2):
        with pytest.raises(simindex.ParameterError, match="open for writing"):
            dist.Cluster(path, ledgers=2)                 # this process writes it
    writer = subprocess.Popen(
        [sys.executable, "-c", "import sys, time, simindex\n"
         "with simindex.Index(sys.argv[1]):\n print('open', flush=True); time.sleep(60)",
         str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "open\n"
        with pytest.raises(simindex.ParameterError, match="open for writing"):
            dist.Cluster(path, ledgers=2)                 # another process writes it
    finally:
        writer.kill()
        writer.wait()
    # a writer with sync=False killed before it folded its records
    subprocess.run([sys.executable, "-c", "import os, sys, simindex\n"
                    "i = simindex.Index(sys.argv[1], sync=False)\n"
                    "i.add_many([('r0', 1), ('r1', 2), ('r2', 3)])\nos._exit(0)",
                    str(path)], check=True, timeout=60)
    with pytest.raises(simindex.ParameterError, match="pending"):
        dist.Cluster(path, ledgers=2)
    with simindex.Index(path) as idx:                      # replayed, nothing lost
        assert len(idx) == 3 and idx.get("r0").fingerprint == 1


def test_a_manifest_names_its_ledgers_or_is_refused(tmp_path):
    with simindex.Index(tmp_path / "i", k=3, shards=2):
        pass
    raw = manifest.read(str(tmp_path / "i")).raw
    for fields in ({"ledgers": 2},                    # format 3 with ledgers
                   {"format": 4},                     # format 4 without
                   {"format": 4, "ledgers": 1},
                   {"format": 4, "ledgers": "2"}):
        (tmp_path / "i" / manifest.NAME).write_bytes(pack(dict(raw, **fields)))
        with pytest.raises(simindex.CorruptError, match="ledgers"):
            simindex.Index(tmp_path / "i", readonly=True)


def test_cli_builds_an_index_of_several_ledgers_on_ray(local_ray, tmp_path):
    exe = [sys.executable, "-m", "simindex.cli"]
    stored, queries = dataset(3, seed=5, n_random=500)
    items = list(stored.items())
    for name, part in (("a.tsv", items[:300]), ("b.tsv", items[300:])):
        (tmp_path / name).write_text("".join(f"{i}\t{fp:016x}\n" for i, fp in part))
    (tmp_path / "q.tsv").write_text("".join(f"q{n}\t{q:016x}\n" for n, q in enumerate(queries)))
    ray_at = ["--ray", local_ray]

    def run(*args):
        return subprocess.run(exe + [str(a) for a in args], capture_output=True, text=True,
                              timeout=300)
    r = run("build", tmp_path / "i", tmp_path / "a.tsv", "--shards", "4", "--ledgers", "3",
            *ray_at)
    assert r.returncode == 0 and "added 300 records" in r.stderr, r.stderr
    r = run("build", tmp_path / "i", tmp_path / "b.tsv", *ray_at)           # extends it
    assert r.returncode == 0, r.stderr
    r = run("build", tmp_path / "i", tmp_path / "b.tsv", "--ledgers", "2", *ray_at)
    assert r.returncode == 2 and "has 3 ledgers" in r.stderr
    r = run("build", tmp_path / "i", tmp_path / "b.tsv")                   # one machine
    assert r.returncode == 1 and "3 ledgers" in r.stderr and "Traceback" not in r.stderr
    outs = [run("query", tmp_path / "i", tmp_path / "q.tsv", "--output", "tsv", *extra)
            for extra in (ray_at, [])]
    assert all(o.returncode == 0 for o in outs), outs[1].stderr
    want = {f"q{n}\t{i}\t{d}" for n, q in enumerate(queries)
            for i, d in brute(stored, q, 3).items()}
    for o in outs:
        assert {"\t".join(line.split("\t")[:3]) for line in o.stdout.splitlines()} == want
    assert run("verify", tmp_path / "i").returncode == 0


def ledger_index(path, n, count=3000):
    """An index of `n` ledgers written through a Cluster, with removals: (fps, queries)."""
    fps = np.random.default_rng(3).integers(0, 2 ** 64, count, dtype=np.uint64)
    with simindex.Index(path, k=3, shards=2):
        pass
    with dist.Cluster(path, ledgers=n) as c:
        c.add_many([f"d{i}" for i in range(count)], fps)
        c.remove("d7")
    return fps, np.concatenate([fps[:200], fps[:200] ^ np.uint64(0b101)])


def answers(path, queries):
    with simindex.Index(path, readonly=True) as idx:
        return [sorted((m.id, m.distance) for m in ms) for ms in idx.query_many(queries)]


@pytest.mark.parametrize("damage", ["empty", "page", "tables"])
def test_repair_rebuilds_a_shard_of_an_index_of_several_ledgers(local_ray, tmp_path, damage):
    path = tmp_path / "i"
    fps, queries = ledger_index(path, 3)
    want = answers(path, queries)
    f = path / "shard-001" / "data.mdb"
    if damage == "empty":
        f.write_bytes(b"")
    elif damage == "page":                 # the root page of its slabs zeroed
        data = bytearray(f.read_bytes())
        root = _root_of(str(f), "blocks")
        data[root * 4096:(root + 1) * 4096] = bytes(4096)
        f.write_bytes(bytes(data))
    else:                                  # sound pages, its applied seqs set back to 0
        code = (f"import lmdb; e = lmdb.open({str(f.parent)!r}, max_dbs=4); "
                f"db = e.open_db(b'state')\n"
                f"with e.begin(write=True) as t: t.put(b'ledgers', bytes(8 * 3), db=db)")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    r = subprocess.run([sys.executable, "-m", "simindex.cli", "repair", str(path)],
                       capture_output=True, text=True, timeout=300)
    if damage == "tables":
        # an applied seq of 0 is a shard behind, not a damaged one: caught up, verified
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    else:
        assert r.returncode == 0 and r.stdout.startswith("shard 1 rebuilt"), r.stderr
    assert answers(path, queries) == want
    with simindex.Index(path, readonly=True) as idx:
        assert idx.verify() == [] and len(idx) == len(fps) - 1 and "d7" not in idx


def test_a_ledger_emptied_or_replaced_is_refused_never_read_as_empty(local_ray, tmp_path):
    path = tmp_path / "i"
    ledger_index(path, 2)
    d = path / "records-1"
    os.remove(d / "data.mdb")
    with pytest.raises(simindex.CorruptError, match="records-1"):
        simindex.Index(path, readonly=True)
    # a fresh, valid but empty environment in its place
    code = (f"import lmdb; e = lmdb.open({str(d)!r}, max_dbs=4); "
            f"[e.open_db(n) for n in (b'ids', b'seqs', b'info')]; e.close()")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    for opening in (lambda: simindex.Index(path, readonly=True),
                    lambda: dist.Cluster(path), lambda: simindex.repair(path)):
        with pytest.raises(simindex.CorruptError, match="records-1/ holds no record"):
            opening()


def test_verify_finds_a_record_in_a_ledger_its_id_does_not_belong_to(local_ray, tmp_path):
    path = tmp_path / "i"
    ledger_index(path, 2, count=200)
    with simindex.Index(path, readonly=True) as idx:
        assert idx.verify() == []
    stray = next(f"x{i}" for i in range(100)
                 if ledgers.ledger_of([encode_id(f"x{i}")], 2)[0] == 0)
    with ledger_server(path, ledger=1) as led:                  # ledger 1 writes it
        led.commit((b"client-1" * 3, 1), [encode_id(stray)],
                   np.array([99], dtype=np.uint64), [pack(None)])
    with simindex.Index(path, readonly=True) as idx:
        assert idx.get(stray) is None                            # looked up in ledger 0
        problems = idx.verify()
        assert len(problems) == 1 and problems[0].startswith("records-1: 1 records whose "
                                                              "ids belong to another ledger")


def test_a_ledger_put_back_to_an_older_copy_is_refused_everywhere(local_ray, tmp_path):
    """An index of 3 ledgers holding 6,000 records whose records-1/ was put back to a copy
    taken at 3,000: every open, verify and repair refuse it, naming what is missing."""
    path = tmp_path / "i"
    fps = np.random.default_rng(4).integers(0, 2 ** 64, 6000, dtype=np.uint64)
    with simindex.Index(path, k=3, shards=2):
        pass
    with dist.Cluster(path, ledgers=3) as c:
        c.add_many([f"d{i}" for i in range(3000)], fps[:3000])
    shutil.copytree(path / "records-1", tmp_path / "copy")
    with dist.Cluster(path) as c:
        c.add_many([f"d{i}" for i in range(3000, 6000)], fps[3000:])
    shutil.rmtree(path / "records-1")
    shutil.copytree(tmp_path / "copy", path / "records-1")
    want = r"records-1/ ends at seq \d+, but shard \d recorded that it held every record " \
           r"up to seq \d+ on disk"
    for opening in (lambda: simindex.Index(path, readonly=True),
                    lambda: dist.Cluster(path), lambda: simindex.repair(path)):
        with pytest.raises(simindex.RecordsLostError, match=want):
            opening()
    r = subprocess.run([sys.executable, "-m", "simindex", "verify", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "committed records are missing" in r.stderr, r.stderr
    assert simindex.repair(path, accept_loss=True)[0].startswith("every shard rebuilt")
    with simindex.Index(path, readonly=True) as idx:
        kept = len(idx)
        assert 4000 < kept < 6000 and idx.verify() == []
        found = {m.id for ms in idx.query_many(fps, k=0) for m in ms}
        assert len(found) == kept


def test_ledger_directories_swapped_are_refused(local_ray, tmp_path):
    path = tmp_path / "i"
    ledger_index(path, 3, count=600)
    os.rename(path / "records-1", path / "swap")
    os.rename(path / "records-2", path / "records-1")
    os.rename(path / "swap", path / "records-2")
    for opening in (lambda: simindex.Index(path, readonly=True), lambda: dist.Cluster(path)):
        with pytest.raises(simindex.CorruptError, match=r"records-([12])/ holds the records "
                                                        r"of records-(?!\1)[12]/"):
            opening()
