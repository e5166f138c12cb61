"""Reliability: dead readers, full disks, injected I/O errors and corrupt files, in real
processes. Crash trials are in test_durability.py; tools/reliability.py runs all of it larger."""

import errno
import os
import shutil
import signal
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest

import simindex
from simindex import _testing as hook
from trials import (
    ENV, PAGE_KINDS, build_pristine, corrupt_trial, damage_byte, disk_full_trial, io_counts,
    io_trial, spawn,
)

HOLD = r"""
import sys, time, simindex, simindex._testing
idx = simindex.Index(sys.argv[1], readonly=True)
with simindex._testing.snapshot(idx):        # read transactions on every environment
    print("holding", flush=True)
    time.sleep(600)
"""


def data_bytes(path):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path)
               for f in fs if f == "data.mdb")


def test_a_reader_killed_inside_a_transaction_does_not_pin_the_file(tmp_path):
    path = str(tmp_path / "i")
    ids = [f"d{i}" for i in range(2000)]
    with simindex.Index(path, k=3, shards=2) as idx:      # open before the reader dies

        def replace_all(rounds, seed):
            for r in range(rounds):
                idx.add_many(ids, np.random.default_rng(seed + r).integers(
                    0, 2**64, len(ids), dtype=np.uint64))

        replace_all(10, 0)
        reader = spawn(HOLD, path)
        assert reader.stdout.readline().strip() == "holding"
        before = data_bytes(path)
        replace_all(20, 100)
        pinned = data_bytes(path) - before               # old pages cannot be reused
        assert pinned > 4 << 20
        reader.send_signal(signal.SIGKILL)
        reader.communicate()
        time.sleep(hook.KNOBS["reader_check_every"][0].READER_CHECK_EVERY + 0.1)
        replace_all(5, 200)                              # clears the dead reader's slot
        before = data_bytes(path)
        replace_all(20, 300)
        assert data_bytes(path) - before < pinned / 4    # freed pages are reused again
        assert idx.verify() == []


@pytest.mark.parametrize("how", ["tmpfs", "fsize"])
def test_disk_full_is_a_clear_error_and_the_index_recovers(tmp_path, how):
    if how == "tmpfs" and (os.geteuid() != 0 or not shutil.which("unshare")):
        pytest.skip("mounting a small tmpfs needs root and unshare (util-linux)")
    r = disk_full_trial(str(tmp_path / "w"), how)
    if r is None:
        pytest.skip("this machine does not allow a private mount namespace with a tmpfs")
    kind, message, number = r["error"]
    assert kind == "DiskFullError"
    assert ("disk is full" if how == "tmpfs" else "file size limit") in message
    # the errno says what ran out, even where LMDB reported a short write as EIO
    assert number == (errno.ENOSPC if how == "tmpfs" else errno.EFBIG)
    assert str(tmp_path / "w") in message                # names the path
    assert r["failed_batch"] in ("all", "none")           # nothing partial is visible
    assert r["refused"][0] == "StorageError" and "open it again" in r["refused"][1]
    assert r["acked"] and r["lost"] == 0 and r["pending"] == 0 and r["verify"] == []


needs_strace = pytest.mark.skipif(not shutil.which("strace"), reason="strace is not installed")
SWEEP = [("fdatasync", "EIO"), ("pwrite64", "ENOSPC"), ("pwrite64", "EIO"),
         ("writev", "ENOSPC"), ("writev", "EIO"), ("fsync", "EIO")]


def sweep(tmp_path, stride):
    counts = io_counts(str(tmp_path / "count"))
    injected, failures = 0, []
    for syscall, error in SWEEP:
        assert counts.get(syscall), f"a clean run made no {syscall} calls: {counts}"
        for when in range(1, counts[syscall] + 1, stride):
            wrong, did = io_trial(str(tmp_path / f"{syscall}-{error}-{when}"), syscall, error,
                                  when)
            injected += did
            failures += [f"{syscall}={error} at call {when}: {w}" for w in wrong]
    return injected, failures


@needs_strace
def test_injected_write_and_sync_errors_raise_and_lose_nothing_acknowledged(tmp_path):
    # every 12th fdatasync / pwrite64 / writev / fsync of create + 3 add_many calls fails,
    # from the first (test_injected_io_errors_full_sweep makes each of them fail in turn)
    injected, failures = sweep(tmp_path, stride=12)
    assert injected >= 10
    assert failures == []


@pytest.mark.deep
@needs_strace
def test_injected_io_errors_full_sweep(tmp_path):
    injected, failures = sweep(tmp_path, stride=1)
    assert failures == []


def test_a_handle_that_saw_a_write_error_refuses_writes_until_reopened(tmp_path):
    path = str(tmp_path / "i")
    with simindex.Index(path, shards=2) as idx:
        idx.add("a", 1)
        def fail(txn):
            raise simindex.StorageError(5, f"{path}/records: commit failed: Input/output error")
        with pytest.raises(simindex.StorageError, match="Input/output"):
            hook.write_records(idx, fail)
        with pytest.raises(simindex.StorageError, match="refuses writes.*open it again"):
            idx.add("b", 2)
        assert [m.id for m in idx.query(1, k=0)] == ["a"]          # reads still work
    with simindex.Index(path) as idx:
        idx.add("b", 2)
        assert len(idx) == 2 and idx.verify() == []


def test_a_creation_that_failed_at_its_first_write_can_be_finished(tmp_path):
    path = tmp_path / "i"
    simindex.Index(path, shards=2).close()
    os.remove(path / "manifest.msgpack")
    for sub in ("records", "shard-001"):                # as if a write had failed in LMDB
        (path / sub / "data.mdb").write_bytes(b"")
    (path / "shard-000" / "data.mdb").write_bytes(b"\0" * 5000)
    with simindex.Index(path, shards=2) as idx:
        idx.add("a", 1)
        assert idx.verify() == []


def test_a_manifest_with_a_field_of_the_wrong_type_is_corrupt_not_a_crash(tmp_path):
    # found by tools/fuzz/fuzz_manifest.py: an unhashable scheme raised TypeError
    path = tmp_path / "i"
    simindex.Index(path, shards=2).close()
    m = msgpack.unpackb((path / "manifest.msgpack").read_bytes())
    for field, value in [("scheme", ["x"]), ("scheme", {"a": 1}), ("layout", [1]),
                         ("format", {"v": 1}), ("k", [3]), ("magic", None)]:
        (path / "manifest.msgpack").write_bytes(msgpack.packb(dict(m, **{field: value})))
        with pytest.raises(simindex.CorruptError):
            simindex.Index(path)


def test_add_many_of_something_not_iterable_is_an_input_type_error(tmp_path):
    # found by tools/reliability.py's bad-input trials: a raw TypeError escaped
    with simindex.Index(tmp_path / "i", shards=2) as idx:
        for bad in (-1, 2.5, float("inf"), 3j, object(), "ab", b"ab"):
            with pytest.raises(simindex.InputTypeError, match="iterable"):
                idx.add_many(bad)
        assert len(idx) == 0


CORRUPT_SEEDS = 25


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pristine") / "i")
    probes, answers = build_pristine(d)
    return d, probes, answers


def corrupt_sweep(pristine, tmp_path, seeds):
    path, probes, answers = pristine
    outcomes, failures = {}, []
    for seed in seeds:
        what, outcome, wrong = corrupt_trial(path, probes, answers, str(tmp_path / "w"), seed,
                                             cli=seed % 5 == 0)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        failures += [f"seed {seed}, {what}: {w}" for w in wrong]
    return outcomes, failures


def test_corrupt_files_never_crash_and_damage_is_reported(pristine, tmp_path):
    # byte flips, truncations and zeroed pages in data.mdb and lock.mdb of records/ and
    # the shards and in the manifest, and deleted shards: each opened, verified and (when
    # sound) queried in a child process, whose death by a signal would be a host crash
    outcomes, failures = corrupt_sweep(pristine, tmp_path, range(CORRUPT_SEEDS))
    assert failures == []
    assert outcomes.get("error", 0) and outcomes.get("reported", 0), outcomes


@pytest.mark.deep
@pytest.mark.timeout(3600)
def test_corrupt_files_deep(pristine, tmp_path):
    outcomes, failures = corrupt_sweep(pristine, tmp_path, range(1000, 1300))
    assert failures == []


def byte_sweep(pristine, tmp_path, seeds):
    """(the places damaged as (data file, page kind), the rule violations)."""
    path, probes, answers = pristine
    places, failures = set(), []
    for seed in seeds:
        for first in ("verify", "query"):
            what, _, wrong = corrupt_trial(path, probes, answers, str(tmp_path / "w"), seed,
                                           first=first, how=damage_byte)
            places.add(tuple(what.split()[:2]))
            failures += [f"seed {seed} ({first} first), {what}: {w}" for w in wrong]
    return places, failures


def test_single_bytes_changed_in_any_page_are_errors_or_findings_never_crashes(pristine,
                                                                                tmp_path):
    # one byte of a meta, branch, leaf or overflow page of records/ or a shard, then the
    # copy verified first and, apart, queried first (every query and get() compared)
    places, failures = byte_sweep(pristine, tmp_path, range(7))
    assert failures == []
    assert {kind for _, kind in places} == set(PAGE_KINDS)          # every kind of page
    assert {f.startswith("records/") for f, _ in places} == {True, False}   # and both files


@pytest.mark.deep
@pytest.mark.timeout(3600)
def test_single_bytes_deep(pristine, tmp_path):
    assert byte_sweep(pristine, tmp_path, range(1000, 1300))[1] == []


def _root_of(f, db):
    """The root page number of LMDB database `db` in data file `f`."""
    meta = hook.read_meta(f)
    page = open(f, "rb").read()[meta.roots[1] * meta.psize:][:meta.psize]
    lower = int.from_bytes(page[12:14], "little")
    for i in range((lower - 16) // 2):
        off = int.from_bytes(page[16 + 2 * i:18 + 2 * i], "little")
        ks = int.from_bytes(page[off + 6:off + 8], "little")
        if page[off + 8:off + 8 + ks] == db.encode():
            return int.from_bytes(page[off + 8 + ks + 40:off + 8 + ks + 48], "little")
    raise AssertionError(f"no database {db!r} in {f}")


def _second_leaf_of(f, db):
    """The page number of the second leaf of LMDB database `db` in data file `f`."""
    meta = hook.read_meta(f)
    data = open(f, "rb").read()
    psize = meta.psize

    def nodes(pgno):
        page = data[pgno * psize:(pgno + 1) * psize]
        lower = int.from_bytes(page[12:14], "little")
        for i in range((lower - 16) // 2):
            off = int.from_bytes(page[16 + 2 * i:18 + 2 * i], "little")
            lo, hi, fl, ks = (int.from_bytes(page[off + j:off + j + 2], "little")
                              for j in (0, 2, 4, 6))
            yield page[off + 8:off + 8 + ks], page[off + 8 + ks:off + 56 + ks], \
                lo | hi << 16 | fl << 32
    root = next(int.from_bytes(v[40:48], "little") for k, v, _ in nodes(meta.roots[1])
                if k == db.encode())
    return [child for _k, _v, child in nodes(root)][1]     # root is a branch page


def test_a_damaged_page_is_reported_by_verify_not_an_lmdb_abort(tmp_path):
    # LMDB fails an assertion (abort, a host crash) when a cursor steps onto a zeroed
    # leaf page; verify() walks the pages with plain reads first
    path = tmp_path / "i"
    with simindex.Index(path, k=3, shards=2) as idx:
        idx.add_many([f"d{i}" for i in range(5000)],
                     np.random.default_rng(0).integers(0, 2**64, 5000, dtype=np.uint64))
    f = path / "records" / "data.mdb"
    leaf = _second_leaf_of(str(f), "seqs")
    data = bytearray(f.read_bytes())
    data[leaf * 4096:(leaf + 1) * 4096] = bytes(4096)
    f.write_bytes(bytes(data))
    code = ("import sys, simindex\nwith simindex.Index(sys.argv[1], readonly=True) as i:\n"
            "    print(i.verify())")
    p = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert f"records/data.mdb: page {leaf} of the database 'seqs' is damaged" in p.stdout
    cli = subprocess.run([sys.executable, "-m", "simindex.cli", "verify", str(path)],
                         capture_output=True, text=True)
    assert cli.returncode == 1 and f"page {leaf}" in cli.stdout + cli.stderr


def test_a_damaged_record_size_is_an_error_not_a_sigbus(tmp_path):
    # the damage of the deep corrupt sweep's seed 1163: LMDB trusts a node's size, so a
    # flipped one would make a query copy past the end of the file; the core checks values
    # against their pages
    path = tmp_path / "i"
    fps = np.random.default_rng(0).integers(0, 2**64, 5000, dtype=np.uint64)
    with simindex.Index(path, k=3, shards=2) as idx:
        idx.add_many([f"d{i}" for i in range(5000)], fps)
    f = path / "records" / "data.mdb"
    leaf = _second_leaf_of(str(f), "seqs")
    data = bytearray(f.read_bytes())
    page = data[leaf * 4096:(leaf + 1) * 4096]
    off = int.from_bytes(page[16:18], "little")                  # node 0
    seq = int.from_bytes(page[off + 8:off + 16], "big")
    data[leaf * 4096 + off:leaf * 4096 + off + 4] = b"\xff\xff\xff\x7f"   # 2 GiB of data
    f.write_bytes(bytes(data))
    code = ("import sys, simindex\nwith simindex.Index(sys.argv[1], readonly=True) as i:\n"
            "    try:\n        i.query(int(sys.argv[2]))\n"
            "    except simindex.CorruptError as e:\n        print('error', e)\n")
    p = subprocess.run([sys.executable, "-c", code, str(path), str(int(fps[seq - 1]))],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("error") and "damaged" in p.stdout


# ------------------------------------------------------------------ refuse rather than forget
def small_index(path, n=2000, shards=4):
    with simindex.Index(path, k=3, shards=shards) as idx:
        idx.add_many([f"d{i}" for i in range(n)],
                     np.random.default_rng(1).integers(0, 2**64, n, dtype=np.uint64))


OPEN = ("import sys, simindex\ntry:\n"
        "    simindex.Index(sys.argv[1], readonly=sys.argv[2] == 'ro').close()\n"
        "except simindex.CorruptError as e:\n    print('corrupt:', e)\n")


def open_in_child(path, mode):
    p = subprocess.run([sys.executable, "-c", OPEN, str(path), mode], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.parametrize("damage", ["empty", "missing", "replaced"])
def test_lost_records_are_refused_never_taken_for_an_empty_index(tmp_path, damage):
    """records/data.mdb emptied, removed, or replaced by a new empty environment: every
    open (writable, read-only, the CLI) refuses, naming the file, and changes nothing."""
    path = tmp_path / "i"
    small_index(path)
    f = path / "records" / "data.mdb"
    if damage == "empty":
        f.write_bytes(b"")
    elif damage == "missing":
        f.unlink()
    else:
        f.unlink()
        (path / "records" / "lock.mdb").unlink()
        env = tmp_path / "fresh"
        with simindex.Index(env, k=3, shards=4):          # a real, empty records env
            pass
        shutil.copy(env / "records" / "data.mdb", f)
    before = sorted((p.name, p.stat().st_size) for p in path.rglob("data.mdb"))
    for mode in ("rw", "ro"):
        out = open_in_child(path, mode)
        assert out.startswith("corrupt:") and "records" in out, out
        assert ("cannot be rebuilt" in out or "holds no record, but shard" in out) and \
            "backup" in out, out
    assert sorted((p.name, p.stat().st_size) for p in path.rglob("data.mdb")) == before
    for cmd in ("info", "verify"):
        cli = subprocess.run([sys.executable, "-m", "simindex.cli", cmd, str(path)],
                             capture_output=True, text=True)
        assert cli.returncode == 1 and "records" in cli.stderr and "Traceback" not in cli.stderr


def test_a_meta_page_claiming_a_huge_file_is_damage_and_nothing_grows(tmp_path):
    """One high byte in a meta page's last-page field: a typed error from every open, and
    no file is extended (a read-only open never writes at all)."""
    path = tmp_path / "i"
    small_index(path, shards=2)
    f = path / "shard-001" / "data.mdb"
    data = bytearray(f.read_bytes())
    for page in (0, 1):                                 # both meta pages: 136 is last_pg
        data[page * 4096 + 136 + 4] = 0x41
    f.write_bytes(bytes(data))
    size = f.stat().st_size
    for mode in ("ro", "rw"):
        out = open_in_child(path, mode)
        assert out.startswith("corrupt:") and "meta page" in out and "shard 1" in out, out
        assert f.stat().st_size == size
    cli = subprocess.run([sys.executable, "-m", "simindex.cli", "verify", str(path)],
                         capture_output=True, text=True)
    assert cli.returncode == 1 and "Traceback" not in cli.stderr and f.stat().st_size == size


def test_a_read_only_open_of_a_short_file_never_extends_it(tmp_path):
    """A data file shorter than its last page (as a crash can leave it: free pages never
    written) opens read-only as it is; a writable open fills the tail."""
    path = tmp_path / "i"
    small_index(path, shards=2)
    f = path / "shard-000" / "data.mdb"
    data = bytearray(f.read_bytes())
    size = len(data)
    assert size % 4096 == 0
    for page in (0, 1):                       # each meta page's last page: 3 past the end
        at = page * 4096 + 136
        data[at:at + 8] = (size // 4096 + 2).to_bytes(8, "little")
    f.write_bytes(bytes(data))
    assert open_in_child(path, "ro") == "" and f.stat().st_size == size
    assert open_in_child(path, "rw") == ""
    assert f.stat().st_size >= size + 3 * 4096


# ------------------------------------------------------------------ repair
def answers(path, fps):
    with simindex.Index(path, readonly=True) as idx:
        return [sorted((m.id, m.distance) for m in ms) for ms in idx.query_many(fps)]


@pytest.mark.parametrize("damage", ["empty", "missing", "page"])
def test_repair_rebuilds_a_damaged_shard_from_the_records(tmp_path, damage):
    path = tmp_path / "i"
    n = 5000
    fps = np.random.default_rng(1).integers(0, 2**64, n, dtype=np.uint64)
    with simindex.Index(path, k=3, shards=2) as idx:
        idx.add_many([f"d{i}" for i in range(n)], fps)
        idx.remove("d7")
    queries = np.concatenate([fps[:300], fps[:300] ^ np.uint64(0b101)])
    want = answers(path, queries)
    f = path / "shard-001" / "data.mdb"
    if damage == "empty":
        f.write_bytes(b"")
    elif damage == "missing":
        f.unlink()
    else:
        data = bytearray(f.read_bytes())
        root = _root_of(str(f), "blocks")
        data[root * 4096:(root + 1) * 4096] = bytes(4096)
        f.write_bytes(bytes(data))
    if damage != "page":                   # a lost shard file: every open says what to do
        out = open_in_child(path, "rw")
        assert "shard 1" in out and "simindex repair" in out, out
    r = subprocess.run([sys.executable, "-m", "simindex.cli", "repair", str(path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("shard 1 rebuilt from the records") and "sound" in r.stderr
    assert answers(path, queries) == want
    with simindex.Index(path) as idx:
        assert idx.verify() == [] and len(idx) == n - 1 and "d7" not in idx
    assert (path / "shard-001" / "data.mdb.damaged").exists() == (damage != "missing")
    assert simindex.repair(path) == []                         # nothing left to do


def test_repair_never_rebuilds_the_records(tmp_path):
    path = tmp_path / "i"
    small_index(path, shards=2)
    (path / "records" / "data.mdb").write_bytes(b"")
    before = sorted((str(p), p.stat().st_size) for p in path.rglob("*.mdb"))
    with pytest.raises(simindex.CorruptError, match="records .*cannot be rebuilt"):
        simindex.repair(path)
    r = subprocess.run([sys.executable, "-m", "simindex.cli", "repair", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "backup" in r.stderr and "Traceback" not in r.stderr
    assert sorted((str(p), p.stat().st_size) for p in path.rglob("*.mdb")) == before



def test_errors_say_what_happened(tmp_path):
    with pytest.raises(simindex.ParameterError, match="NUL character"):
        simindex.Index(str(tmp_path / "x\0y"))
    with pytest.raises(simindex.ParameterError, match="NUL character"):
        simindex.Index(os.fsencode(str(tmp_path / "x\0y")))


RO_MOUNT = r"""
mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" || exit 77
exec "$2" -c '
import sys, simindex
try:
    simindex.Index(sys.argv[1])
except simindex.ReadOnlyError as e:
    print("refused", e.errno, e)
with simindex.Index(sys.argv[1], readonly=True) as idx:
    print("read", [m.id for m in idx.query(5)])
' "$1"
"""


def test_a_writable_open_on_read_only_media_is_a_read_only_error(tmp_path):
    if not shutil.which("unshare"):
        pytest.skip("needs unshare (util-linux)")
    path = tmp_path / "i"
    with simindex.Index(path, k=3) as idx:
        idx.add("a", 5)
    p = subprocess.run(["unshare", "-rm", "sh", "-c", RO_MOUNT, "sh", str(path),
                        sys.executable], env=ENV, capture_output=True, text=True)
    if p.returncode in (1, 77) and not p.stdout:
        pytest.skip("this machine does not allow a private mount namespace")
    assert p.returncode == 0, p.stderr
    refused, read = p.stdout.splitlines()
    assert refused.startswith("refused 30 ") and "readonly=True" in refused
    assert read == "read ['a']"


DAMAGE_SLABS = r"""
import sys, lmdb                      # py-lmdb, in its own process (one LMDB per process)
env = lmdb.open(sys.argv[1], max_dbs=4)
db = env.open_db(b"blocks")           # the slab database (its on-disk name)
with env.begin(write=True) as t:
    for k, v in list(t.cursor(db)):
        b = bytearray(v)
        b[0] ^= 0xFF
        b[4] ^= 0xFF
        t.put(k, bytes(b), db=db)
env.close()
"""


def test_a_damaged_slab_is_reported_at_its_shard(tmp_path):
    """A query that meets a damaged table slab names the shard that holds it, not
    records/."""
    path = tmp_path / "i"
    fps = np.random.default_rng(0).integers(0, 2**64, 5000, dtype=np.uint64)
    with simindex.Index(path, k=3, shards=2) as idx:
        idx.add_many([f"d{i}" for i in range(5000)], fps)
    p = subprocess.run([sys.executable, "-c", DAMAGE_SLABS, str(path / "shard-001")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    with simindex.Index(path, readonly=True) as idx:
        for call in (lambda: idx.query_many(fps[:200]),
                     lambda: [idx.query(int(f)) for f in fps[:200]]):
            with pytest.raises(simindex.CorruptError, match=r"shard-001: a table slab is "
                                                            r"damaged"):
                call()


# ------------------------------------------------------------------ damage inside records
def records_index(path, n=3000):
    """An index of n records d0.. with metas; (fingerprints, data file of records/)."""
    fps = np.random.default_rng(5).integers(0, 2**64, n, dtype=np.uint64)
    with simindex.Index(path, k=3, shards=2) as idx:
        idx.add_many([(f"d{i}", int(f), {"n": i}) for i, f in enumerate(fps)])
    return fps, path / "records" / "data.mdb"


def change(f, at, new):
    """Overwrite the bytes of data file `f` at offset `at` with `new` (the damage)."""
    with open(f, "r+b") as fh:
        fh.seek(at)
        fh.write(new)


def record_at(f, i, fp):
    """Offset of record d{i}'s value in records/data.mdb: fp, id key length, id key."""
    key = f"sd{i}".encode()
    at = f.read_bytes().index(int(fp).to_bytes(8, "little") + len(key).to_bytes(2, "little") + key)
    return at


def id_entry_at(f, i):
    """Offset of the id entry of d{i} in records/data.mdb: its key, then its seq (u64 BE)."""
    key = f"sd{i}".encode()
    node = bytes([8, 0, 0, 0, 0, 0, len(key), 0]) + key         # a leaf node of 8 data bytes
    return f.read_bytes().index(node) + 8


def verify_of(path):
    with simindex.Index(path, readonly=True) as idx:
        return idx.verify()


@pytest.mark.parametrize("where", ["id", "meta", "fingerprint", "checksum"])
def test_a_byte_changed_inside_a_record_is_an_error_on_every_read_and_in_verify(tmp_path,
                                                                                 where):
    """One byte of a stored record, changed: a query, get() and verify() all say so (its
    checksum no longer matches), never answer another id or meta."""
    path = tmp_path / "i"
    fps, f = records_index(path)
    i = 1234
    at = record_at(f, i, fps[i])
    off = {"fingerprint": 3, "id": 10 + 5, "meta": 10 + 6 + 2}
    if where == "checksum":
        raw = f.read_bytes()
        off[where] = raw.index(b"n", at) + 3 - at        # msgpack {"n": 1234}: past its end
    pos = at + off[where]
    b = f.read_bytes()[pos]
    change(f, pos, bytes([b ^ 0x08]))                     # "d1234" -> "d123<" for the id
    with simindex.Index(path, readonly=True) as idx:
        with pytest.raises(simindex.CorruptError, match="record of seq 1235 is damaged"):
            idx.query(int(fps[i]))
        with pytest.raises(simindex.CorruptError, match="record of seq 1235 is damaged"):
            idx.query_many(fps[i - 2:i + 2])
        with pytest.raises(simindex.CorruptError, match="record of seq 1235 is damaged"):
            idx.get(f"d{i}")
        assert idx.get(f"d{i + 1}").meta == {"n": i + 1}   # the others still read
        found = idx.verify()
    assert any("the record of seq 1235 is damaged" in p for p in found), found
    cli = subprocess.run([sys.executable, "-m", "simindex.cli", "verify", str(path)],
                         env=ENV, capture_output=True, text=True)
    assert cli.returncode == 1 and "seq 1235" in cli.stdout + cli.stderr


def test_an_id_entry_leading_to_another_record_is_an_error_never_its_answer(tmp_path):
    path = tmp_path / "i"
    fps, f = records_index(path)
    at = id_entry_at(f, 1234)
    seq = int.from_bytes(f.read_bytes()[at + 6:at + 14], "big")
    assert seq == 1235
    change(f, at + 6, (seq + 1).to_bytes(8, "big"))          # now the seq of d1235
    with simindex.Index(path, readonly=True) as idx:
        with pytest.raises(simindex.CorruptError, match="id entry of 'd1234' leads to the "
                                                        "record of seq 1236, which holds "
                                                        "another id"):
            idx.get("d1234")
        assert [m.id for m in idx.query(int(fps[1235]))] == ["d1235"]
    assert any("b'sd1234' leads to the record of seq 1236" in p for p in verify_of(path))


def test_an_id_key_changed_in_place_is_found_by_verify(tmp_path):
    """'d1234' stored as 'd123<': get('d1234') cannot know the key it asks for was lost,
    but verify() finds the entry that leads to a record of another id."""
    path = tmp_path / "i"
    fps, f = records_index(path)
    at = id_entry_at(f, 1234)
    change(f, at + 5, b"<")
    found = verify_of(path)
    assert found and all(p.startswith("records") for p in found), found


def _branch_separator(f, db):
    """Offset of the second key of the root (a branch page) of database `db`: the first key
    that sends LMDB's search to the root's second child."""
    meta = hook.read_meta(str(f))
    data = f.read_bytes()
    root = _root_of(str(f), db)
    page = data[root * meta.psize:(root + 1) * meta.psize]
    assert int.from_bytes(page[10:12], "little") & 1, "the root is a branch page"
    off = int.from_bytes(page[18:20], "little")                       # node 1
    ksize = int.from_bytes(page[off + 6:off + 8], "little")
    return root * meta.psize + off + 8, ksize


@pytest.mark.parametrize("db, by", [("seqs", +1), ("seqs", -1), ("ids", +1)])
def test_a_changed_branch_key_is_found_by_verify(tmp_path, db, by):
    """A branch page's key moved up or down: LMDB's search now misses records that are
    there (a query drops their matches, a get answers None), and verify() says which page."""
    path = tmp_path / "i"
    fps, f = records_index(path)
    at, ksize = _branch_separator(f, db)
    last = f.read_bytes()[at + ksize - 1]
    change(f, at + ksize - 1, bytes([(last + by) % 256]))
    found = verify_of(path)
    assert len(found) == 1 and f"database '{db}' is damaged" in found[0] and \
        "key" in found[0], found


# ------------------------------------------------------------------ damaged pages, queried
QUERY_FIRST = r"""
import sys, numpy as np, simindex
path, readonly = sys.argv[1], sys.argv[2] == "ro"
fps = np.random.default_rng(5).integers(0, 2**64, 3000, dtype=np.uint64)
try:
    with simindex.Index(path, readonly=readonly) as idx:
        for f in fps:
            idx.query(int(f))
        idx.query_many(fps)
        [idx.get(f"d{i}") for i in range(3000)]
    print("answered")
except simindex.CorruptError as e:
    print("error", e)
"""


def query_first(path, readonly=True):
    p = subprocess.run([sys.executable, "-c", QUERY_FIRST, str(path), "ro" if readonly else "rw"],
                       env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    return p.stdout


@pytest.mark.parametrize("readonly", [True, False])
def test_a_page_whose_bounds_run_past_the_file_is_an_error_not_a_sigbus(tmp_path, readonly):
    """The page of a shard's state claims thousands of nodes (one byte of its lower bound):
    LMDB reads their offsets past the end of the file, which is SIGBUS, at the open; the
    guard makes it an error, and `simindex verify` names the page."""
    path = tmp_path / "i"
    records_index(path)
    f = path / "shard-000" / "data.mdb"
    leaf = _root_of(str(f), "state")
    assert (leaf + 16) * 4096 > os.path.getsize(f)       # its nodes' offsets reach past the end
    change(f, leaf * 4096 + 13, b"\xed")
    out = query_first(path, readonly)
    assert out.startswith("error") and "damaged page" in out, out
    cli = subprocess.run([sys.executable, "-m", "simindex.cli", "verify", str(path)],
                         env=ENV, capture_output=True, text=True)
    assert cli.returncode == 1 and f"page {leaf}" in cli.stdout + cli.stderr, cli


def test_a_query_that_steps_onto_a_zeroed_page_is_an_error_not_an_lmdb_abort(tmp_path):
    """A zeroed leaf page of the records: LMDB fails an assertion when a cursor steps onto
    it, which would abort the process; the guard makes it an error."""
    path = tmp_path / "i"
    records_index(path)
    f = path / "records" / "data.mdb"
    leaf = _second_leaf_of(str(f), "seqs")
    change(f, leaf * 4096, bytes(4096))
    out = query_first(path)
    assert out.startswith("error"), out
    assert any(f"page {leaf}" in p for p in verify_of(path))


# ------------------------------------------------------------------ readers without write access
NO_WRITE_ACCESS = r"""
import sys, simindex
path = sys.argv[1]
try:
    simindex.Index(path, readonly=True)
except simindex.StorageError as e:
    print("refused", e.errno, e)
with simindex.Index(path, readonly=True, lock=False) as idx:
    print("read", [m.id for m in idx.query(5)], idx.verify())
"""


def test_a_reader_that_may_not_write_the_lock_files_is_told_and_may_read_without_locks(tmp_path):
    """LMDB's readers register in the lock file: a user who may not write it gets an error
    that says so, and reads with lock=False (an index no process writes)."""
    path = tmp_path / "i"
    with simindex.Index(path, k=3, shards=2) as idx:
        idx.add("a", 5)
    for d in ["records", "shard-000", "shard-001"]:
        os.chmod(path / d / "lock.mdb", 0o444)
    # as root without the capability to override file permissions: as another user
    p = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
                        sys.executable, "-c", NO_WRITE_ACCESS, str(path)], env=ENV,
                       capture_output=True, text=True)
    if p.returncode != 0 and "setpriv" in p.stderr:
        pytest.skip(f"this machine does not let setpriv drop capabilities: {p.stderr[-200:]}")
    assert p.returncode == 0, p.stderr
    refused, read = p.stdout.splitlines()
    assert refused.startswith("refused 13 ") and "lock=False" in refused and "lock.mdb" in refused
    assert read == "read ['a'] []"


def test_lock_false_is_for_readers_and_never_loosens_an_open_store(tmp_path):
    path = tmp_path / "i"
    with pytest.raises(simindex.ParameterError, match="lock=False is for readonly=True"):
        simindex.Index(path, lock=False)
    with pytest.raises(simindex.ParameterTypeError, match="lock must be True or False"):
        simindex.Index(path, readonly=True, lock="no")
    simindex.Index(path).close()
    with simindex.Index(path, readonly=True, lock=False):
        with pytest.raises(simindex.ParameterError, match="already open with lock=False"):
            simindex.Index(path, readonly=True)
    with simindex.Index(path, readonly=True) as a, simindex.Index(path, readonly=True,
                                                                    lock=False) as b:
        assert a.query(5) == b.query(5) == []


@pytest.mark.parametrize("meta", [0, 1])
def test_a_meta_page_claiming_no_page_size_is_damage_not_a_division_by_zero(tmp_path, meta):
    """LMDB divides by the page size a meta page claims (SIGFPE at 0, found by
    tools/fuzz/fuzz_pages.py): the open refuses it first, naming the meta page."""
    path = tmp_path / "i"
    records_index(path, n=200)
    change(path / "records" / "data.mdb", meta * 4096 + 40, bytes(4))
    out = query_first(path)
    assert out.startswith("error") and f"meta page {meta} claims a page size of 0" in out, out
