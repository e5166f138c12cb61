"""The Python API contract: types, errors, parameters, lifetime, records."""

import os
import sys

import numpy as np
import pytest

import simindex
from simindex import Index, _testing as hook


def test_add_get_contains_len_remove(tmp_path):
    with Index(tmp_path / "i") as idx:
        assert len(idx) == 0 and "a" not in idx and idx.get("a") is None
        idx.add("a", 1, meta={"url": "http://x", "n": [1, 2]})
        idx.add(b"a", 2)
        idx.add(7, 3)
        assert len(idx) == 3
        assert idx.get("a") == simindex.Record("a", 1, {"url": "http://x", "n": [1, 2]})
        assert idx.get(b"a") == simindex.Record(b"a", 2, None)
        assert idx.get(7).id == 7 and isinstance(idx.get(7).id, int)
        assert "7" not in idx and 7 in idx            # 7, "7" and b"7" never collide
        assert idx.remove("a") is True
        assert idx.remove("a") is False
        assert "a" not in idx and len(idx) == 2
        assert {m.id for m in idx.query(1)} == {b"a", 7}


def test_add_replaces_existing_id(tmp_path):
    with Index(tmp_path / "i") as idx:
        idx.add("doc", 0)
        idx.add("doc", (1 << 64) - 1, meta="v2")
        assert len(idx) == 1
        assert idx.get("doc") == simindex.Record("doc", (1 << 64) - 1, "v2")
        assert idx.query(0) == []
        assert [m.id for m in idx.query((1 << 64) - 1)] == ["doc"]
        idx.compact()
        assert idx.stats()["entries"] == idx.stats()["tables"]
        assert idx.verify() == []


def test_add_many_with_repeated_ids_keeps_each_ids_last_record(tmp_path):
    # ids in any order, repeated within a call and across calls, above and below the stored
    # ones: the records write them sorted (appending when all are new and larger)
    with Index(tmp_path / "i", k=3) as idx:
        idx.add_many([("b", 1), ("a", 2), ("b", 3), ("c", 4), ("a", 5)])
        assert [idx.get(i).fingerprint for i in "abc"] == [5, 3, 4] and len(idx) == 3
        idx.add_many([(i, i) for i in range(100, 200)])          # new and ascending
        idx.add_many([(i, 1000 + i) for i in range(150, 50, -1)])  # descending, half stored
        assert len(idx) == 3 + 149                                  # ids 51..199
        assert idx.get(120).fingerprint == 1120 and idx.get(60).fingerprint == 1060
        assert idx.get(180).fingerprint == 180
        assert [m.id for m in idx.query(2, k=0)] == [] and idx.query(120, k=0) == []
        assert idx.stats()["stale"] == 2 + 51                      # ids 100..150 again
        assert idx.verify() == []


def test_add_many_whose_smallest_id_is_the_last_stored_one_replaces_it(tmp_path):
    # the smallest new key equals the largest stored key, later in the call than a larger
    # new key: not an append (it once raised MDB_KEYEXIST)
    with Index(tmp_path / "i", k=3) as idx:
        idx.add_many([("a", 0)])
        idx.add_many([("aa", 1), ("a", 5)])
        assert idx.get("a").fingerprint == 5 and len(idx) == 2
        idx.add_many([(7, 0)])
        idx.add_many([(9, 1), (8, 2), (7, 3)])
        assert idx.get(7).fingerprint == 3 and len(idx) == 5
        assert idx.stats()["stale"] == 2 and idx.verify() == []


def test_add_many_forms(tmp_path):
    with Index(tmp_path / "i") as idx:
        idx.add_many([("a", 1), ("b", 2, {"m": 1})])
        idx.add_many(["c", "d"], np.array([3, 4], dtype=np.uint64))
        idx.add_many(iter(["e"]), [5])
        idx.add_many([])
        assert len(idx) == 5 and idx.get("b").meta == {"m": 1}
        # numpy scalars and signed arrays of non-negative values are fine
        idx.add_many(["f"], np.array([6], dtype=np.int64))
        idx.add(np.uint64(9), np.uint64((1 << 64) - 1))
        assert idx.get(9).fingerprint == (1 << 64) - 1
        # numpy arrays of int ids are the ints they hold; a negative or 2-d one is refused
        idx.add_many(np.array([20, 21], dtype=np.int32), [20, 21])
        idx.add_many(np.array([2 ** 64 - 1], dtype=np.uint64), [22])
        assert [idx.get(i).fingerprint for i in (20, 21, 2 ** 64 - 1)] == [20, 21, 22]
        with pytest.raises(simindex.InputError, match="id -1 is out of range"):
            idx.add_many(np.array([3, -1]), [1, 2])
        with pytest.raises(simindex.InputTypeError, match="got list"):
            idx.add_many(np.array([[1, 2]]), [1])
        with pytest.raises(simindex.InputTypeError, match="bool"):
            idx.add_many(np.array([True]), [1])


@pytest.mark.parametrize("fp,exc,words", [
    (-1, simindex.InputError, "out of range"),
    (1 << 64, simindex.InputError, "out of range"),
    (1.5, simindex.InputTypeError, "float"),
    (float("nan"), simindex.InputTypeError, "float"),
    ("ff", simindex.InputTypeError, "str"),
    (True, simindex.InputTypeError, "bool"),
    (None, simindex.InputTypeError, "NoneType"),
])
def test_bad_fingerprints_are_refused_with_the_value(tmp_path, fp, exc, words):
    with Index(tmp_path / "i") as idx:
        with pytest.raises(exc, match=words):
            idx.add("x", fp)
        with pytest.raises(exc):
            idx.query(fp)
        with pytest.raises(exc, match="item 1"):
            idx.add_many([("ok", 1), ("x", fp)])
        assert len(idx) == 0                                   # nothing written


@pytest.mark.parametrize("id_,exc", [
    (1.0, simindex.InputTypeError), (None, simindex.InputTypeError),
    (True, simindex.InputTypeError), (-1, simindex.InputError), (1 << 64, simindex.InputError),
    ("x" * 511, simindex.InputError), ("\ud800", simindex.InputError),
    (("a",), simindex.InputTypeError),
])
def test_bad_ids_are_refused(tmp_path, id_, exc):
    with Index(tmp_path / "i") as idx:
        with pytest.raises(exc):
            idx.add(id_, 1)
        assert len(idx) == 0


def test_errors_are_builtin_subclasses():
    assert issubclass(simindex.InputError, ValueError)
    assert issubclass(simindex.InputTypeError, TypeError)
    assert issubclass(simindex.ParameterError, ValueError)
    assert issubclass(simindex.StorageError, OSError)
    for e in (simindex.InputError, simindex.ParameterError, simindex.CorruptError,
              simindex.ClosedError, simindex.ReadOnlyError, simindex.MissingIndexError):
        assert issubclass(e, simindex.Error)
    # a wrong type is caught by `except InputError` and by `except TypeError`
    assert issubclass(simindex.InputTypeError, simindex.InputError)
    assert issubclass(simindex.ParameterTypeError, simindex.ParameterError)
    assert issubclass(simindex.BadLine, simindex.InputError)


def test_storage_errors_carry_their_code_across_processes():
    import pickle
    e = simindex.DiskFullError(28, "No space left on device: the disk is full", code=28)
    assert e.errno == 28 and e.code == 28 and isinstance(e, OSError)
    lmdb = simindex.CorruptError("records: MDB_CORRUPTED", code=-30796)
    assert lmdb.errno is None and lmdb.code == -30796
    for x in (e, lmdb):                      # Ray pickles the errors of its actors
        y = pickle.loads(pickle.dumps(x))
        assert type(y) is type(x) and y.code == x.code and str(y) == str(x)
    bad = pickle.loads(pickle.dumps(simindex.BadLine("in.tsv:3", "not a fingerprint")))
    assert (bad.where, bad.reason, str(bad)) == ("in.tsv:3", "not a fingerprint",
                                                 "in.tsv:3: not a fingerprint")


def test_closed_handles_say_so_in_one_way(tmp_path):
    idx = Index(tmp_path / "i")
    idx.close()
    for call in (lambda: idx.query(1), lambda: idx.add("a", 1), lambda: len(idx),
                 lambda: idx.stats(), lambda: idx.k):
        with pytest.raises(simindex.ClosedError, match=r"^index .* is closed$"):
            call()


def test_unserializable_meta_is_refused(tmp_path):
    with Index(tmp_path / "i") as idx:
        with pytest.raises(simindex.InputError, match="msgpack"):
            idx.add("x", 1, meta=object())
        with pytest.raises(simindex.InputError, match="item 0"):
            idx.add_many([("x", 1, {1, 2})])
        assert len(idx) == 0


@pytest.mark.parametrize("kwargs,words", [
    ({"k": 4, "blocks": 4}, r"blocks \(4\) must be greater than k \(4\)"),
    ({"shards": 3}, r"shards \(3\) must divide 256"),
    ({"shards": 512}, r"shards \(512\)"),
    ({"k": -1}, r"k \(-1\)"),
    ({"k": 3, "blocks": 65}, r"blocks \(65\)"),
    ({"k": 10, "blocks": 40}, "tables"),
    ({"k": "3"}, "must be an int"),
    ({"k": 3.0}, "must be an int"),
])
def test_bad_parameters_name_value_and_rule(tmp_path, kwargs, words):
    with pytest.raises(simindex.ParameterError, match=words):
        Index(tmp_path / "i", **kwargs)
    assert not os.path.exists(tmp_path / "i" / "manifest.msgpack")


def test_reopen_takes_parameters_from_manifest(tmp_path):
    with Index(tmp_path / "i", k=2, blocks=6, shards=4) as idx:
        idx.add("a", 5)
    with Index(tmp_path / "i") as idx:
        assert (idx.k, idx.blocks, idx.shards) == (2, 6, 4)
        assert idx.get("a").fingerprint == 5
    with Index(tmp_path / "i", k=2, blocks=6) as idx:
        pass
    with pytest.raises(simindex.ParameterError, match=r"k=3 was given.*k=2"):
        Index(tmp_path / "i", k=3)
    with pytest.raises(simindex.ParameterError, match=r"shards=16.*shards=4"):
        Index(tmp_path / "i", shards=16)


def test_query_k_above_index_k_raises(tmp_path):
    with Index(tmp_path / "i", k=2) as idx:
        idx.add("a", 0)
        assert idx.query(0b111, k=2) == []
        assert [m.id for m in idx.query(0b11, k=2)] == ["a"]
        with pytest.raises(simindex.ParameterError, match=r"k \(3\).*index's k \(2\)"):
            idx.query(0, k=3)
        with pytest.raises(simindex.ParameterError):
            idx.query_many([0], k=-1)


def test_closed_index_raises_clearly(tmp_path):
    idx = Index(tmp_path / "i")
    idx.add("a", 1)
    idx.close()
    idx.close()                                                  # idempotent
    assert idx.closed
    for call in (lambda: idx.add("b", 2), lambda: idx.query(1), lambda: len(idx),
                 lambda: idx.get("a"), lambda: list(idx.pairs()), lambda: idx.stats()):
        with pytest.raises(simindex.ClosedError, match="closed"):
            call()


def test_missing_index_and_bad_paths(tmp_path):
    with pytest.raises(simindex.MissingIndexError):
        Index(tmp_path / "nope", create=False)
    with pytest.raises(simindex.MissingIndexError):
        Index(tmp_path / "nope", readonly=True)
    assert not os.path.exists(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(simindex.CorruptError, match="is a file"):
        Index(tmp_path / "file")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("x")
    with pytest.raises(simindex.CorruptError, match="not a simindex index"):
        Index(tmp_path / "other")


def test_readonly_refuses_writes(tmp_path):
    with Index(tmp_path / "i") as idx:
        idx.add("a", 1)
    with Index(tmp_path / "i", readonly=True) as ro:
        assert [m.id for m in ro.query(1)] == ["a"]
        for call in (lambda: ro.add("b", 2), lambda: ro.remove("a"), lambda: ro.flush(),
                     lambda: ro.add_unique("c", 3), lambda: ro.compact()):
            with pytest.raises(simindex.ReadOnlyError):
                call()
        assert isinstance(simindex.ReadOnlyError("x"), PermissionError)


def test_same_index_opened_twice_in_one_process_shares_one_handle(tmp_path):
    a = Index(tmp_path / "i")
    b = Index(str(tmp_path / "i"))
    assert hook.same_store(a, b)                                 # one LMDB open per env
    a.add("x", 1)
    assert b.get("x").fingerprint == 1
    a.close()
    b.add("y", 2)                                                # still open
    assert [m.id for m in b.query(1, k=2)] == ["x", "y"]
    b.close()
    with Index(tmp_path / "i", readonly=True) as ro:
        with pytest.raises(simindex.ParameterError, match="read-only"):
            Index(tmp_path / "i")
        assert len(ro) == 2
    assert "lmdb" not in sys.modules                             # the core owns LMDB alone


def test_add_unique(tmp_path):
    with Index(tmp_path / "i", k=3) as idx:
        assert idx.add_unique("a", 0b0) == []
        found = idx.add_unique("b", 0b111)
        assert [(m.id, m.distance) for m in found] == [("a", 3)]
        assert "b" not in idx
        assert idx.add_unique("c", 0b1111) == []
        assert idx.add_unique("d", 0b1, k=0) == []
        assert len(idx) == 3


def test_add_unique_never_replaces_a_record_of_the_same_id(tmp_path):
    """An id already stored whose record is not a near-copy is refused, and the stored
    record stays: an insert-if-new is never a replace. Within k, it blocks like any other."""
    with Index(tmp_path / "i", k=3) as idx:
        idx.add("a", 0, meta={"v": 1})
        with pytest.raises(simindex.IdExistsError, match="'a' is already stored") as e:
            idx.add_unique("a", 0xFFFF << 40)
        assert e.value.id == "a" and isinstance(e.value, simindex.InputError)
        assert idx.get("a").fingerprint == 0 and idx.get("a").meta == {"v": 1}
        assert [m.id for m in idx.add_unique("a", 0b11)] == ["a"]       # near: it blocks
        assert len(idx) == 1 and idx.query(0xFFFF << 40) == []


def test_add_unique_text_never_replaces_a_record_of_the_same_id(tmp_path):
    text = " ".join(f"word{i}" for i in range(300))
    other = " ".join(f"other{i}" for i in range(300))
    with Index(tmp_path / "i", calibration=simindex.calibrate([], 0.7)) as idx:
        idx.add_text("doc", text)
        with pytest.raises(simindex.IdExistsError, match="never replaces"):
            idx.add_unique_text("doc", other)
        assert [m.id for m in idx.query_text(text)] == ["doc"]
        assert idx.query_text(other) == []
        assert [m.id for m in idx.add_unique_text("doc", text)] == ["doc"]


def test_pairs_and_clusters(tmp_path):
    with Index(tmp_path / "i", k=2) as idx:
        idx.add_many([("a", 0), ("b", 0b11), ("c", 0b1111), ("x", 0x5555 << 40),
                      ("y", (0x5555 << 40) | 1), ("z", 0xFFFF << 20)])
        assert sorted(idx.pairs()) == [("a", "b", 2), ("b", "c", 2), ("x", "y", 1)]
        assert sorted(idx.pairs(k=1)) == [("x", "y", 1)]
        assert list(idx.clusters()) == [["a", "b", "c"], ["x", "y"]]
        idx.remove("b")
        assert list(idx.clusters()) == [["x", "y"]]


def test_stats_and_flush(tmp_path):
    with Index(tmp_path / "i", k=3, shards=4) as idx:
        idx.add_many([(i, i * 7919) for i in range(1000)])
        idx.flush()
        s = idx.stats()
        assert s["count"] == 1000 and s["k"] == 3 and s["blocks"] == 4 and s["tables"] == 4
        assert s["shards"] == 4 and s["width"] == 64 and s["unapplied"] == 0
        assert s["entries"] == 4000 and s["runs"] >= 4 and s["bytes"] > 0
        assert s["format"] == 3                 # records with their checksums
        assert s["prefix_blocks"] == 1 and s["flips"] == 0 and s["probes"] == 4


def test_many_small_batches_keep_few_runs(tmp_path):
    with Index(tmp_path / "i", shards=1) as idx:
        rng = np.random.default_rng(0)
        for b in range(300):
            idx.add_many([f"{b}.{i}" for i in range(50)],
                         rng.integers(0, 2**64, 50, dtype=np.uint64))
        runs = idx.stats()["runs"]
        assert runs <= 4 * 8, runs            # O(log n) runs per table, not one per batch
        idx.compact()
        assert idx.stats()["runs"] == 4
        assert idx.verify() == []


def test_paths_and_flags_are_checked(tmp_path):
    with pytest.raises(simindex.MissingIndexError, match="parent directory"):
        Index(tmp_path / "no" / "such" / "i")
    assert not os.path.exists(tmp_path / "no")
    with pytest.raises(simindex.ParameterTypeError, match="path must be"):
        Index(None)
    for flag in ("sync", "readonly", "create"):
        with pytest.raises(simindex.ParameterTypeError, match=f"{flag} must be True or False"):
            Index(tmp_path / "i", **{flag: "yes"})
    with pytest.raises(TypeError):                     # a ParameterTypeError is a TypeError too
        Index(tmp_path / "i", k=3.0)
    (tmp_path / "f").write_text("x")
    with pytest.raises(simindex.NotAnIndexError):
        Index(tmp_path / "f" / "sub")
    with Index(os.fsencode(tmp_path / "b")) as idx:     # bytes paths work
        idx.add("a", 1)
        assert idx.path == str(tmp_path / "b")


def test_expected_size_picks_the_plan_of_a_new_index(tmp_path, monkeypatch):
    # small indexes keep k+1 blocks; a large expected size buys longer prefixes, as long
    # as the bigger index still fits in memory (here: a machine with 256 GiB)
    monkeypatch.setattr(simindex.engine.plan, "physical_memory", lambda: 256 << 30)
    # where even k+1 tables would not fit in memory, fewer tables probed with flips do
    assert simindex.engine.plan.default_plan(3, 100_000_000, memory=16 << 30) == (2, 1)
    assert simindex.engine.plan.Plan(3, 2, 16, prefix_blocks=1).flips == 1
    with Index(tmp_path / "small", k=3, expected=1_000_000) as idx:
        assert idx.blocks == 4
    with Index(tmp_path / "big", k=3, expected=100_000_000) as idx:
        assert idx.blocks == 5 and idx.stats()["tables"] == 10
        idx.add_many([("a", 0), ("b", 0b111)])
        assert [(m.id, m.distance) for m in idx.query(0)] == [("a", 0), ("b", 3)]
    with Index(tmp_path / "big", expected=10) as idx:      # an existing index keeps its plan
        assert idx.blocks == 5
    with pytest.raises(simindex.ParameterError):
        Index(tmp_path / "bad", expected=-1)


def test_expected_size_picks_the_fewest_shards_of_16_8M_fingerprints_or_less(tmp_path):
    # every batch commits each shard it touches (an fsync each): small indexes get few shards
    shards = simindex.engine.plan.default_shards
    assert shards(None) == 16
    assert shards(0) == shards(1) == shards(1 << 24) == 1
    assert shards((1 << 24) + 1) == 2 and shards(100_000_000) == 8
    assert shards(10_000_000_000) == shards(10 ** 15) == 256
    with Index(tmp_path / "small", expected=1_000_000) as idx:
        assert idx.stats()["shards"] == 1
        idx.add_many([("a", 0), ("b", 0b111), ("c", 1 << 63 | 0b1111)])
        assert [(m.id, m.distance) for m in idx.query(0)] == [("a", 0), ("b", 3)]
    with Index(tmp_path / "small", expected=100_000_000) as idx:   # an existing index keeps its shards
        assert idx.stats()["shards"] == 1 and len(idx) == 3
    with Index(tmp_path / "given", expected=1_000_000, shards=4) as idx:
        assert idx.stats()["shards"] == 4
    with Index(tmp_path / "unsized") as idx:
        assert idx.stats()["shards"] == 16
    with pytest.raises(simindex.ParameterError, match="expected"):
        Index(tmp_path / "bad", expected=-1, blocks=4)


def test_add_many_without_replace_refuses_stored_and_repeated_ids_writing_nothing(tmp_path):
    with Index(tmp_path / "i") as idx:
        idx.add_many([("a", 1), ("b", 2)])
        with pytest.raises(simindex.InputError, match="id 'b' is already stored"):
            idx.add_many([("c", 3), ("b", 9)], replace=False)
        with pytest.raises(simindex.InputError, match="id 'd' is given twice"):
            idx.add_many([("d", 4), ("d", 5)], replace=False)
        assert len(idx) == 2 and "c" not in idx and idx.get("b").fingerprint == 2
        idx.add_many([("c", 3)], replace=False)
        assert idx.get("c").fingerprint == 3 and idx.verify() == []
