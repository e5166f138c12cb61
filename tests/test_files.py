"""On-disk layout: plain LMDB files any reader can open, and damage reported, never a crash."""

import os
import shutil

import msgpack
import numpy as np
import pytest

import simindex
from conftest import run_py

PYLMDB_READER = r"""
import sys, struct, zlib, lmdb, msgpack
path = sys.argv[1]
m = msgpack.unpackb(open(path + "/manifest.msgpack", "rb").read())
env = lmdb.open(path + "/records", readonly=True, lock=False, max_dbs=4)
with env.begin() as txn:
    ids = txn.stat(env.open_db(b"ids", txn=txn))["entries"]
    seqs = txn.stat(env.open_db(b"seqs", txn=txn))["entries"]
entries, found = 0, set()
for s in range(m["shards"]):
    e = lmdb.open(f"{path}/shard-{s:03d}", readonly=True, lock=False, max_dbs=4)
    with e.begin() as txn:
        db = e.open_db(b"blocks", txn=txn)          # the slabs, under their on-disk name
        for key, val in txn.cursor(db):
            # layout v2: header, kw-byte key offsets, sw-byte seq offsets, 8 zero bytes
            magic, count, crc, kw, sw, zero, kbase, sbase = struct.unpack_from("<IIIBBHQQ", val)
            assert magic == 0x32424953 and zero == 0 and len(key) == 20
            assert len(val) == 32 + count * (kw + sw) + 8 and val[-8:] == bytes(8)
            assert len(val) <= 16368 and zlib.crc32(val[12:-8]) == crc
            off = lambda at, w, i: int.from_bytes(val[at + i * w:at + (i + 1) * w], "little")
            keys = [kbase + off(32, kw, i) for i in range(count)]
            found.update(sbase + off(32 + count * kw, sw, i) for i in range(count))
            assert keys == sorted(keys) and keys[-1] < 2**64
            assert struct.unpack(">Q", key[8:16])[0] == keys[-1]
            entries += count
assert found == set(range(1, seqs + 1))
print(m["k"], m["blocks"], m["tables"], ids, seqs, entries)
"""


def test_files_are_plain_lmdb_readable_by_py_lmdb(tmp_path):
    path = str(tmp_path / "i")
    with simindex.Index(path, k=3, shards=4) as idx:
        idx.add_many([f"d{i}" for i in range(3000)],
                     np.random.default_rng(0).integers(0, 2**64, 3000, dtype=np.uint64))
        idx.compact()
    out = run_py(PYLMDB_READER, path).stdout.split()
    assert out == ["3", "4", "4", "3000", "3000", str(4 * 3000)]


def test_layout(tmp_path):
    path = tmp_path / "i"
    simindex.Index(path, shards=4).close()
    names = sorted(os.listdir(path))
    assert names == ["lock", "manifest.msgpack", "pending", "records", "shard-000",
                     "shard-001", "shard-002", "shard-003"]
    assert os.listdir(path / "pending") == []
    m = msgpack.unpackb((path / "manifest.msgpack").read_bytes())
    assert m["magic"] == "simindex" and m["format"] == 3 and m["k"] == 3 and m["shards"] == 4
    assert m["layout"] == "packed-blocks-v2" and m["block_bytes"] == 16368


def _built(tmp_path, n=2000):
    path = str(tmp_path / "i")
    with simindex.Index(path, k=3, shards=4) as idx:
        idx.add_many([f"d{i}" for i in range(n)],
                     np.random.default_rng(0).integers(0, 2**64, n, dtype=np.uint64))
    return path


OPEN_AND_QUERY = r"""
import sys, simindex
try:
    with simindex.Index(sys.argv[1]) as idx:
        idx.query(12345)
        print("opened", idx.verify())
except simindex.Error as e:
    print("error", type(e).__name__, e)
"""


@pytest.mark.parametrize("fraction", [0.5, 0.01])
def test_truncated_data_file_raises_instead_of_crashing(tmp_path, fraction):
    path = _built(tmp_path)
    f = os.path.join(path, "shard-001", "data.mdb")
    size = os.path.getsize(f)
    with open(f, "r+b") as fh:
        fh.truncate(max(int(size * fraction), 3 * 4096 if fraction < 0.1 else 0))
    out = run_py(OPEN_AND_QUERY, path).stdout      # a crash (SIGBUS) would fail run_py
    assert out.startswith("error CorruptError") and "truncated" in out


def test_an_lmdb_error_names_lmdb_and_carries_its_code(tmp_path):
    path = _built(tmp_path)
    f = os.path.join(path, "records", "data.mdb")
    data = bytearray(open(f, "rb").read())
    for meta in (0, 4096):                  # both meta pages name an LMDB version 999
        data[meta + 20:meta + 24] = (999).to_bytes(4, "little")
    open(f, "wb").write(bytes(data))
    with pytest.raises(simindex.CorruptError, match="MDB_VERSION_MISMATCH") as e:
        simindex.Index(path)
    assert e.value.code == -30794 and e.value.errno is None       # LMDB's MDB_VERSION_MISMATCH


def test_damaged_manifest(tmp_path):
    path = _built(tmp_path)
    mf = os.path.join(path, "manifest.msgpack")
    for content, words in [(b"", "empty"), (b"\xc1\xc1garbage", "cannot be decoded"),
                           (msgpack.packb({"magic": "other"}), "bad magic"),
                           (msgpack.packb({"magic": "simindex", "format": 99}), "format 99"),
                           (msgpack.packb({"magic": "simindex", "format": 1, "width": 64,
                                           "layout": "packed-blocks-v1", "block_entries": 1022,
                                           "k": 3, "blocks": 2, "shards": 4, "tables": 4}),
                            "impossible")]:
        with open(mf, "wb") as fh:
            fh.write(content)
        with pytest.raises(simindex.CorruptError, match=words):
            simindex.Index(path)
    os.remove(mf)
    with pytest.raises(simindex.CorruptError, match="manifest is missing"):
        simindex.Index(path)
    with pytest.raises(simindex.MissingIndexError):
        simindex.Index(path, create=False)
    assert not os.path.exists(mf)                  # nothing was rebuilt over the data


def test_missing_shard_directory(tmp_path):
    path = _built(tmp_path)
    shutil.rmtree(os.path.join(path, "shard-002"))
    with pytest.raises(simindex.CorruptError, match="shard-002/ is missing"):
        simindex.Index(path)


def test_damaged_slab_is_reported_by_verify(tmp_path):
    path = _built(tmp_path, n=5000)
    with simindex.Index(path) as idx:
        idx.compact()
    f = os.path.join(path, "shard-000", "data.mdb")
    data = bytearray(open(f, "rb").read())
    # flip a byte inside the keys of every slab (magic "SIB2", 32-byte header), live or freed
    at = data.find(b"SIB2")
    assert at > 0
    while at > 0:
        data[at + 32 + 7 * 5 + 3] ^= 0x40
        at = data.find(b"SIB2", at + 1)
    open(f, "wb").write(bytes(data))
    out = run_py(OPEN_AND_QUERY, path).stdout
    assert out.startswith("opened") and "checksum" in out


def test_a_closed_index_directory_can_be_copied(tmp_path):
    path = _built(tmp_path, n=500)
    shutil.copytree(path, tmp_path / "copy")
    with simindex.Index(tmp_path / "copy", readonly=True) as idx:
        assert len(idx) == 500 and idx.verify() == []


def _v1_index(tmp_path):
    """The index of tests/data/make_index_v1.py (slab layout v1) and what it must hold."""
    import sys
    import tarfile
    data = os.path.join(os.path.dirname(__file__), "data")
    with tarfile.open(os.path.join(data, "index-v1.tar.gz")) as t:
        t.extractall(tmp_path, filter="data")
    sys.path.insert(0, data)
    try:
        from make_index_v1 import history
    finally:
        sys.path.remove(data)
    state = {}
    for op, *args in history():
        if op == "add_many":
            state.update((r[0], r[1]) for r in args[0])
        elif op == "remove":
            state.pop(args[0], None)
    return str(tmp_path / "index-v1"), state


def _brute(state, q, k=3):
    return sorted(i for i, fp in state.items() if bin(fp ^ q).count("1") <= k)


def test_an_index_written_with_slab_layout_v1_is_read_and_upgraded(tmp_path):
    path, state = _v1_index(tmp_path)
    shard = os.path.join(path, "shard-000", "data.mdb")
    assert b"SIB1" in open(shard, "rb").read() and b"SIB2" not in open(shard, "rb").read()
    probes = list(state.values())[::3] + [fp ^ (1 << 63) ^ 1 for fp in list(state.values())[:50]]
    with simindex.Index(path, readonly=True) as idx:       # read as it is
        assert msgpack.unpackb(open(os.path.join(path, "manifest.msgpack"), "rb").read())[
            "layout"] == "packed-blocks-v1"
        assert len(idx) == len(state) and idx.verify() == []
        for q, ms in zip(probes, idx.query_many(probes)):
            assert sorted(m.id for m in ms) == _brute(state, q)
    with simindex.Index(path) as idx:                       # a writer upgrades the manifest
        assert msgpack.unpackb(open(os.path.join(path, "manifest.msgpack"), "rb").read())[
            "layout"] == "packed-blocks-v2"
        more = {f"new{i}": fp ^ (1 << (i % 64)) for i, fp in enumerate(list(state.values())[:300])}
        idx.add_many(list(more.items()))                   # v2 runs beside v1 runs
        state.update(more)
        for q, ms in zip(probes, idx.query_many(probes)):
            assert sorted(m.id for m in ms) == _brute(state, q)
        items = sorted(state.items())
        assert {frozenset(p[:2]) for p in idx.pairs()} == {
            frozenset((a, b)) for i, (a, x) in enumerate(items) for b, y in items[i + 1:]
            if bin(x ^ y).count("1") <= 3}
        idx.compact()
        assert idx.verify() == []
        for q, ms in zip(probes, idx.query_many(probes)):
            assert sorted(m.id for m in ms) == _brute(state, q)
    live = open(shard, "rb").read()
    assert b"SIB2" in live
