"""Records fewer than were committed are refused, never answered from: a records/ restored
from an older copy (or another index's) is found by every open, by verify and by repair,
with a message that says what is missing; `repair --accept-loss` takes what remains. An OS
crash of a sync=False writer, which may lose what it never flushed, is not refused."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import simindex
from simindex import _testing as hook

FPS = np.random.default_rng(9).integers(0, 2**64, 6000, dtype=np.uint64)
IDS = [f"d{i}" for i in range(6000)]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "simindex", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def rolled_back(tmp_path, sync):
    """An index of 6,000 records whose records/ was put back to a copy taken at 3,000."""
    path = tmp_path / "i"
    with simindex.Index(path, k=3, shards=4, sync=sync) as idx:
        idx.add_many(IDS[:3000], FPS[:3000])
    shutil.copytree(path / "records", tmp_path / "copy")
    with simindex.Index(path, sync=sync) as idx:
        for s in range(3000, 6000, 500):                  # several batches, then close
            idx.add_many(IDS[s:s + 500], FPS[s:s + 500])
    shutil.rmtree(path / "records")
    shutil.copytree(tmp_path / "copy", path / "records")
    return path


@pytest.mark.parametrize("sync", [True, False])
def test_a_records_environment_put_back_to_an_older_copy_is_refused_everywhere(tmp_path,
                                                                            sync):
    path = rolled_back(tmp_path, sync)
    want = r"records/ ends at seq 3000, but shard \d recorded that it held every record up " \
           r"to seq 6000 on disk: up to 3000 committed records are missing"
    for opening in (lambda: simindex.Index(path), lambda: simindex.Index(path, readonly=True),
                    lambda: simindex.repair(path)):
        with pytest.raises(simindex.RecordsLostError, match=want):
            opening()
    for cmd in ("verify", "repair", "info"):
        r = cli(cmd, path)
        assert r.returncode == 1 and "up to 3000 committed records are missing" in r.stderr \
            and "repair --accept-loss" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # nothing was changed: the newer copy put back opens as it was
    r = cli("repair", path, "--accept-loss")
    assert r.returncode == 0 and "every shard rebuilt from the records that remain" in \
        r.stdout, r.stderr
    with simindex.Index(path, readonly=True) as idx:
        assert len(idx) == 3000 and idx.verify() == []
        assert [m.id for m in idx.query(int(FPS[10]), k=0)] == ["d10"]
        assert idx.query(int(FPS[4000]), k=0) == []      # lost, and forgotten by the tables
    with simindex.Index(path) as idx:                     # and written on
        idx.add("new", int(FPS[4000]))
        assert [m.id for m in idx.query(int(FPS[4000]), k=0)] == ["new"]


def test_records_a_sync_false_writer_never_flushed_may_be_lost_without_a_refusal(tmp_path):
    """What an OS crash may do to a sync=False writer: records/ back at its last flush while
    the shards applied more. The index opens; the seqs the shards hold are never reused."""
    path = tmp_path / "i"
    idx = simindex.Index(path, k=3, shards=4, sync=False)
    idx.add_many(IDS[:3000], FPS[:3000])
    idx.flush()
    shutil.copytree(path / "records", tmp_path / "flushed")
    idx.add_many(IDS[3000:4000], FPS[3000:4000])          # applied, never flushed
    hook.crash(idx)
    shutil.rmtree(path / "records")
    shutil.copytree(tmp_path / "flushed", path / "records")
    with simindex.Index(path) as idx:
        assert len(idx) == 3000 and idx.query(int(FPS[3500]), k=0) == []
        idx.add("after", int(FPS[3500]) ^ 1)
        assert [m.id for m in idx.query(int(FPS[3500]))] == ["after"]
        assert idx.verify() == []


BYSTANDER = r"""
import sys, simindex, simindex._testing as hook
idx = simindex.Index(sys.argv[1])               # sync=True: its open applies what waits
print("durable", flush=True)
hook.crash(idx)
"""


def test_a_synced_process_beside_a_sync_false_writer_marks_only_what_is_on_disk(tmp_path):
    """A sync=True process that applies records a sync=False writer committed but never
    flushed syncs records/ before it marks them: so an OS crash's loss of nothing but
    unflushed records is still not refused; and a flush marks only what it synced."""
    path = tmp_path / "i"
    idx = simindex.Index(path, k=3, shards=4, sync=False)
    idx.add_many(IDS[:3000], FPS[:3000])
    idx.flush()
    shutil.copytree(path / "records", tmp_path / "flushed")
    for i in range(3000, 3100):
        idx.add_unique(IDS[i], int(FPS[i]))
    trace = ["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync", "-P",
             str(path / "records" / "data.mdb")] if shutil.which("strace") else []
    p = subprocess.run([*trace, sys.executable, "-c", BYSTANDER, str(path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "durable" in p.stdout, p.stderr
    if trace:                          # it synced records/ (nothing else of its own did)
        assert "sync(" in p.stderr, p.stderr
    hook.crash(idx)
    # the bystander synced records/ before marking: a loss now would be a real rollback
    shutil.rmtree(path / "records")
    shutil.copytree(tmp_path / "flushed", path / "records")
    with pytest.raises(simindex.RecordsLostError, match="up to 100 committed records"):
        simindex.Index(path)
