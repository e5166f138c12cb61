"""The slab and record codecs (layout.pxd): runs and records written and read back
exactly, at width 64 and with the further words of wide fingerprints, and damage refused
(a slab's low words must be the run's)."""

import numpy as np
import pytest

import simindex
from simindex.engine._layout import DB_SLABS
from simindex.engine._slabs import read_run, write_run
from simindex.engine._lmdb import Env, Txn
from simindex.engine._records import (
    read_tail, record_get, records_lookup, records_problems, records_put, split_record,
)


@pytest.fixture
def env(tmp_path):
    e = Env(str(tmp_path), mapsize=1 << 28)
    for db in (DB_SLABS, "ids", "seqs"):
        e.open_db(db, create=True)
    yield e
    e.close()


def entries(n, low_words, seed, spread=64):
    rng = np.random.default_rng(seed)
    keys = np.sort(rng.integers(0, 2 ** 63, n, dtype=np.uint64) >> np.uint64(64 - spread - 1)
                   if spread < 64 else rng.integers(0, 2 ** 64, n, dtype=np.uint64))
    seqs = rng.permutation(np.arange(1, n + 1, dtype=np.uint64) * np.uint64(3))
    lows = rng.integers(0, 2 ** 64, (n, low_words), dtype=np.uint64)
    return keys, seqs, lows


@pytest.mark.parametrize("low_words", [0, 1, 3, 7, 15])
@pytest.mark.parametrize("n,spread", [(1, 64), (5000, 64), (20000, 20), (3000, 0)])
def test_runs_round_trip(env, low_words, n, spread):
    keys, seqs, lows = entries(n, low_words, seed=n + low_words, spread=spread)
    with Txn(env, write=True) as txn:
        slabs = write_run(txn, DB_SLABS, 7, keys, seqs, lows if low_words else None)
    with Txn(env) as txn:
        got = read_run(txn, DB_SLABS, 7, n, check=True, low_words=low_words)
    assert np.array_equal(got[0], keys) and np.array_equal(got[1], seqs)
    if low_words:
        assert np.array_equal(got[2], lows)
    # a slab holds 16,328 bytes of entries: the lows alone need their share, and at the
    # widest key and seq offsets (8 bytes each) a slab but the last still holds what fills
    # two 4 KiB pages (it takes 2, 3 or 4, whichever holds the most entries a page)
    assert -(-n * 8 * low_words // 16328) <= slabs <= \
        -(-n // ((2 * 4096 - 16 - 40) // (16 + 8 * low_words)))


def test_a_run_read_with_other_low_words_is_damage(env):
    keys, seqs, lows = entries(100, 1, seed=1)
    with Txn(env, write=True) as txn:
        write_run(txn, DB_SLABS, 3, keys, seqs, lows)
    with Txn(env) as txn:
        with pytest.raises(simindex.CorruptError, match="holds 1 low words per entry, not 0"):
            read_run(txn, DB_SLABS, 3, 100)
        with pytest.raises(simindex.CorruptError, match="not 3"):
            read_run(txn, DB_SLABS, 3, 100, low_words=3)


def test_bad_tails_are_refused(env):
    keys, seqs, _ = entries(10, 1, seed=2)
    with Txn(env, write=True) as txn:
        for bad in (np.zeros((9, 1), np.uint64), np.zeros((10, 16), np.uint64)):
            with pytest.raises(ValueError, match="lows must be"):
                write_run(txn, DB_SLABS, 4, keys, seqs, bad)


@pytest.mark.parametrize("sums", [True, False], ids=["format 3", "formats 1 and 2"])
@pytest.mark.parametrize("words", [1, 2, 4])
def test_records_round_trip_at_every_width(env, words, sums):
    env.sums = sums
    rng = np.random.default_rng(words)
    n = 300
    fps = rng.integers(0, 2 ** 64, (n, words), dtype=np.uint64)
    ids = [b"s" + f"doc{i}".encode() for i in range(n)]
    metas = [b"\xc0" if i % 2 else b"\x81\xa1a\x01" for i in range(n)]
    with Txn(env, write=True) as txn:
        nxt, replaced = records_put(txn, "ids", "seqs", ids, fps if words > 1 else fps[:, 0],
                                    metas, 1)
        assert (nxt, replaced) == (n + 1, 0)
        # replacing an id: its old record goes, the new one gets the next seq
        records_put(txn, "ids", "seqs", [ids[5]], fps[:1] if words > 1 else fps[:1, 0],
                    [b"\xc0"], nxt)
    as_int = [int.from_bytes(r.astype(">u8").tobytes(), "big") for r in fps]
    with Txn(env) as txn:
        seqs, got = read_tail(txn, "seqs", 0, 0, words)
        assert len(seqs) == n and seqs[-1] == n + 1 and 6 not in seqs.tolist()
        want = np.concatenate([np.delete(fps, 5, axis=0), fps[:1]])
        assert np.array_equal(got.reshape(n, words), want)
        found, names = records_lookup(txn, "seqs", np.array([1, 6, n + 1], np.uint64), words)
        assert names == ["doc0", None, "doc5"]
        assert np.array_equal(found.reshape(3, words)[[0, 2]], fps[[0, 0]])
        raw = txn.get("seqs", (n).to_bytes(8, "big"))
        fp, idkey, meta = split_record(record_get(txn, "ids", "seqs", ids[n - 1], words), words)
        assert fp == as_int[n - 1] and idkey == ids[n - 1] and meta == metas[n - 1]
        assert len(raw) == record_header(words) + len(idkey) + len(meta) + 4 * sums
        assert records_problems(txn, "ids", "seqs", words) == []
    if sums:            # the checksum covers every byte, and the seq the record is under
        for at in range(len(raw)):
            with Txn(env, write=True) as txn:
                txn.put("seqs", (n).to_bytes(8, "big"), raw[:at] + bytes([raw[at] ^ 0x40]) +
                        raw[at + 1:])
                with pytest.raises(simindex.CorruptError, match=f"seq {n} is damaged"):
                    record_get(txn, "ids", "seqs", ids[n - 1], words)
        with Txn(env, write=True) as txn:
            txn.put("seqs", (n - 1).to_bytes(8, "big"), raw)
            with pytest.raises(simindex.CorruptError, match=f"seq {n - 1} is damaged"):
                record_get(txn, "ids", "seqs", ids[n - 2], words)


def record_header(words):
    return 10 + 8 * (words - 1)


@pytest.mark.parametrize("width", [64, 128, 256])
def test_log_records_round_trip_and_refuse_another_width(width):
    from simindex.engine.codec import encode_id, pack_log_record, unpack_log_record
    for fp in (0, 1, 2 ** width - 1, 3 << (width - 2)):
        b = pack_log_record(encode_id("d"), fp, b"\xc0", width)
        assert unpack_log_record(b, width) == (encode_id("d"), fp, b"\xc0")
        for other in {64, 128, 256} - {width}:
            with pytest.raises(simindex.CorruptError, match="fingerprint"):
                unpack_log_record(b, other)
