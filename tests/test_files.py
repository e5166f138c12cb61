"""On-disk layout: plain LMDB files any reader can open, and damage reported, never a crash."""

import os
import shutil

import msgpack
import numpy as np
import pytest

import simindex
from conftest import run_py

PYLMDB_READER = r"""
import sys, struct, lmdb, msgpack
path = sys.argv[1]
m = msgpack.unpackb(open(path + "/manifest.msgpack", "rb").read())
env = lmdb.open(path + "/records", readonly=True, lock=False, max_dbs=4)
with env.begin() as txn:
    ids = txn.stat(env.open_db(b"ids", txn=txn))["entries"]
    seqs = txn.stat(env.open_db(b"seqs", txn=txn))["entries"]
entries = 0
for s in range(m["shards"]):
    e = lmdb.open(f"{path}/shard-{s:03d}", readonly=True, lock=False, max_dbs=4)
    with e.begin() as txn:
        db = e.open_db(b"blocks", txn=txn)
        for key, val in txn.cursor(db):
            magic, count = struct.unpack_from("<II", val)
            assert magic == 0x31424953 and len(val) == 16 + 16 * count and len(key) == 20
            keys = struct.unpack_from(f"<{count}Q", val, 16)
            assert list(keys) == sorted(keys)
            assert struct.unpack(">Q", key[8:16])[0] == keys[-1]
            entries += count
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
    assert m["magic"] == "simindex" and m["format"] == 1 and m["k"] == 3 and m["shards"] == 4


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


def test_damaged_block_is_reported_by_verify(tmp_path):
    path = _built(tmp_path, n=5000)
    with simindex.Index(path) as idx:
        idx.compact()
    f = os.path.join(path, "shard-000", "data.mdb")
    data = bytearray(open(f, "rb").read())
    # flip a byte inside the keys of every block (magic "SIB1"), live or freed
    at = data.find(b"SIB1")
    assert at > 0
    while at > 0:
        data[at + 16 + 8 * 5 + 3] ^= 0x40
        at = data.find(b"SIB1", at + 1)
    open(f, "wb").write(bytes(data))
    out = run_py(OPEN_AND_QUERY, path).stdout
    assert out.startswith("opened") and "checksum" in out


def test_a_closed_index_directory_can_be_copied(tmp_path):
    path = _built(tmp_path, n=500)
    shutil.copytree(path, tmp_path / "copy")
    with simindex.Index(tmp_path / "copy", readonly=True) as idx:
        assert len(idx) == 500 and idx.verify() == []
