"""The write buffer's log when its writer dies: SIGKILL at random moments loses no
acknowledged add, a torn or damaged log applies exactly its whole entries before the damage,
a fold marker keeps a folded log from being applied twice, and a live writer's log is left
alone. Real processes and real files; the buffer's own behaviour is in test_buffer.py.
"""

import os
import random
import shutil
import signal
import time
import warnings

import pytest

import simindex
from simindex import _testing as hook
from conftest import buffer_logs as logs, fp_of
from trials import kill, spawn, start_buffered


def markers(idx):
    return hook.log_markers(idx)


def test_kill_9_after_buffered_adds_loses_nothing(tmp_path):
    path = str(tmp_path / "i")
    p, log = start_buffered(path, 300)
    with simindex.Index(path, readonly=True) as ro:
        assert len(ro) == 0                       # buffered: not in records/ yet
    kill(p)
    assert os.path.exists(log)
    with simindex.Index(path, readonly=True) as ro:
        assert len(ro) == 0 and os.path.exists(log)   # read-only handles never replay
    with simindex.Index(path) as idx:
        assert len(idx) == 300
        for i in range(300):
            assert idx.get(f"r{i}") == (f"r{i}", fp_of(i), {"i": i})
            assert f"r{i}" in [m.id for m in idx.query(fp_of(i), k=0)]
        s = idx.stats()
        assert s["replayed"] == 300 and s["torn_bytes"] == 0 and s["stale"] == 0
        assert s["unapplied"] == 0 and idx.verify() == []
        assert logs(path) == [] and markers(idx) == []


LOOP_WRITER = r"""
import sys, simindex, simindex._testing
path = sys.argv[1]
simindex._testing.tune(fold=int(sys.argv[2]))
fp = lambda i: (i * 0x9E3779B97F4A7C15 + 12345) % 2**64
idx = simindex.Index(path, k=3, shards=4, sync=False)
print("ready", flush=True)
i = 0
while True:
    idx.add(f"r{i}", fp(i))
    print("ack", i, flush=True)
    i += 1
"""


@pytest.mark.parametrize("fold", [50, 4096])
def test_kill_9_at_random_moments_of_single_adds(tmp_path, fold):
    r = random.Random(fold)
    path = str(tmp_path / "i")
    total = 0
    for trial in range(4):
        p = spawn(LOOP_WRITER, path, fold)
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        time.sleep(r.uniform(0.05, 0.6))
        kill_time = time.time()
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
        lines = out.split("\n")[:-1]              # complete lines only: the last may be cut
        acked = [int(x.split()[1]) for x in lines if x.startswith("ack ")]
        assert acked, "the writer acknowledged nothing"
        with simindex.Index(path) as idx:           # replays the dead writer's log
            # every trial's writer reuses r0, r1, ...: its adds replace the last trial's
            for i in acked:
                assert [m.id for m in idx.query(fp_of(i), k=0)] == [f"r{i}"]
            total = max(total, acked[-1] + 1)
            assert len(idx) in (total, total + 1)  # the add in flight: in or out whole
            assert idx.verify() == [] and logs(path) == []
        assert time.time() - kill_time < 60


def _entries(log):
    return hook.read_log(log)


@pytest.mark.parametrize("damage", ["cut", "flip", "cut-head"])
def test_a_torn_log_tail_applies_the_whole_entries_before_it(tmp_path, damage):
    path = str(tmp_path / "i")
    p, log = start_buffered(path, 40)
    kill(p)
    entries, good, size = _entries(log)
    assert len(entries) == 40 and good == size
    last = entries[-1][0]
    with open(log, "r+b") as f:
        if damage == "cut":
            f.truncate(size - 3)                     # mid-payload of the last entry
        elif damage == "cut-head":
            f.truncate(last + 5)                     # inside the last entry's header
        else:
            f.seek(size - 2)
            b = f.read(1)
            f.seek(size - 2)
            f.write(bytes([b[0] ^ 0x40]))            # the last entry fails its CRC
    torn = os.path.getsize(log) - last
    with pytest.warns(RuntimeWarning, match="torn or damaged"):
        idx = simindex.Index(path)
    with idx:
        assert len(idx) == 39 and "r39" not in idx
        assert all(idx.get(f"r{i}") == (f"r{i}", fp_of(i), {"i": i}) for i in range(39))
        s = idx.stats()
        assert s["replayed"] == 39 and s["torn_bytes"] == torn
        assert idx.verify() == [] and logs(path) == []


def test_a_damaged_middle_entry_stops_the_replay_there(tmp_path):
    path = str(tmp_path / "i")
    p, log = start_buffered(path, 10)
    kill(p)
    entries, _good, size = _entries(log)
    with open(log, "r+b") as f:
        f.seek(entries[4][0] + 12)
        b = f.read(1)
        f.seek(entries[4][0] + 12)
        f.write(bytes([b[0] ^ 1]))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with simindex.Index(path) as idx:
            assert sorted(m for m in (f"r{i}" for i in range(10)) if m in idx) == \
                [f"r{i}" for i in range(4)]
            assert idx.stats()["torn_bytes"] == size - entries[4][0]
    assert any("torn or damaged" in str(x.message) for x in w)


MARKER_WRITER = r"""
import shutil, sys, simindex, simindex._testing
path, saved = sys.argv[1], sys.argv[2]
fp = lambda i: (i * 0x9E3779B97F4A7C15 + 12345) % 2**64
idx = simindex.Index(path, k=3, shards=4, sync=False)
for i in range(10):
    idx.add(f"r{i}", fp(i))
log = simindex._testing.log_path(idx)
shutil.copyfile(log, saved)               # the log as it was before the fold
idx.flush()                               # the fold: commit with its marker, remove the log
print(log, flush=True)
"""


def test_a_log_its_fold_covered_is_never_applied_again(tmp_path):
    """A writer dies between a fold's commit and the removal of its log: replay must skip
    what the marker covers, or it would revert a newer write by another handle."""
    path = str(tmp_path / "i")
    other = simindex.Index(path, k=3, shards=4)         # open before: no marker cleanup
    p = spawn(MARKER_WRITER, path, str(tmp_path / "saved"))
    out, err = p.communicate()
    assert p.returncode == 0, err
    log = out.strip()
    assert not os.path.exists(log)
    shutil.copyfile(str(tmp_path / "saved"), log)       # as if the removal never happened
    other.add("r3", 42, meta="newer")                   # another handle's newer record
    last_seq = other.stats()["last_seq"]
    other.close()
    with simindex.Index(path) as idx:
        assert idx.get("r3") == ("r3", 42, "newer")
        assert len(idx) == 10
        s = idx.stats()
        assert s["replayed"] == 0 and s["last_seq"] == last_seq
        assert logs(path) == [] and markers(idx) == []
        assert idx.verify() == []


def test_a_log_partly_folded_applies_only_the_entries_past_its_marker(tmp_path):
    path = str(tmp_path / "i")
    p, log = start_buffered(path, 12)
    kill(p)
    entries, _, _ = _entries(log)
    token = os.path.basename(log)[:-4]
    os.rename(log, log + ".away")               # hidden while the situation is staged
    with simindex.Index(path) as idx:
        # what a fold of r0..r4 commits (its records and its marker), then the writer died
        idx.add_many([(f"r{i}", fp_of(i), {"i": i}) for i in range(5)])
        hook.set_log_marker(idx, token, entries[5][0])
        idx.add("r2", 7, meta="newer")          # another writer's newer record of r2
    os.rename(log + ".away", log)
    with simindex.Index(path) as idx:
        assert idx.stats()["replayed"] == 7
        assert idx.get("r2") == ("r2", 7, "newer")
        assert all(idx.get(f"r{i}") == (f"r{i}", fp_of(i), {"i": i}) for i in range(5, 12))
        assert len(idx) == 12 and idx.verify() == [] and markers(idx) == []
        assert logs(path) == []


def test_a_writable_open_leaves_a_live_writers_log_alone(tmp_path):
    path = str(tmp_path / "i")
    p, log = start_buffered(path, 30)
    try:
        with simindex.Index(path) as idx:           # the writer holds its log's lock
            assert len(idx) == 0 and idx.stats()["replayed"] == 0
        assert os.path.exists(log)
        p.stdin.write("flush\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "flushed"
    finally:
        p.stdin.close()
        p.wait(timeout=60)
    with simindex.Index(path) as idx:               # applied once, by its writer
        assert len(idx) == 30 and idx.stats()["stale"] == 0 and idx.stats()["last_seq"] == 30


def test_a_log_removed_after_another_process_opened_it_is_not_replayed_again(tmp_path):
    """A replayer that opened a log just before another one replayed and removed it (and
    dropped its marker) must notice, once it gets the lock, that the file is gone."""
    path = str(tmp_path / "i")
    p, log = start_buffered(path, 12)
    kill(p)
    late = open(log, "rb")                      # opened before the replay below
    try:
        with simindex.Index(path) as idx:
            assert len(idx) == 12 and not os.path.exists(log) and markers(idx) == []
            last = idx.stats()["last_seq"]
            hook.replay_log(idx, late, log)
            s = idx.stats()
            assert s["last_seq"] == last and s["stale"] == 0 and s["replayed"] == 12
    finally:
        late.close()


