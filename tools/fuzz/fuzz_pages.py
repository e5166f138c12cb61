"""atheris target: bytes changed anywhere in the data files of a small index. Opening,
verify(), queries and get() either answer as before the damage, raise a simindex.Error, or
(for wrong answers) are preceded by a verify() that reports the damage. A crash of this
process (SIGBUS, SIGSEGV, an LMDB abort) or any other exception is a finding.

    pip install atheris && python3 tools/fuzz/fuzz_pages.py -max_total_time=300 \
        -handle_segv=0 -handle_bus=0 -handle_fpe=0 -handle_abrt=0

(libFuzzer's own handlers would take the signals simindex's guard turns into errors; with
them off, a fault the guard does not cover still ends the process, which is the finding.)
"""

import os
import shutil
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    import numpy as np
    import simindex

N = 2000
WORK = tempfile.mkdtemp(prefix="simindex-fuzz-pages-")
PRISTINE = os.path.join(WORK, "pristine")
FPS = np.random.default_rng(7).integers(0, 2**64, N, dtype=np.uint64)
PROBES = np.concatenate([FPS, FPS[:50] ^ np.uint64(0b10011)])


def answers(idx):
    """Every query's matches and every id's record, comparable across opens."""
    return ([sorted((m.id, m.distance) for m in ms) for ms in idx.query_many(PROBES)],
            [idx.get(f"d{i}") for i in range(N + 1)])


def build():
    with simindex.Index(PRISTINE, k=3, shards=2) as idx:
        idx.add_many([(f"d{i}", int(f), {"n": i}) for i, f in enumerate(FPS[:N // 2])])
        idx.compact()
        idx.add_many([(f"d{i}", int(f), {"n": i}) for i, f in enumerate(FPS) if i >= N // 2])
        idx.remove("d3")
        return answers(idx)


EXPECTED = build()
FILES = [os.path.join(d, "data.mdb") for d in ("records", "shard-000", "shard-001")]
runs = 0


def one(data):
    global runs
    runs += 1
    fdp = atheris.FuzzedDataProvider(data)
    path = os.path.join(WORK, f"w{runs}")
    shutil.copytree(PRISTINE, path)
    try:
        name = fdp.PickValueInList(FILES)
        f = os.path.join(path, name)
        size = os.path.getsize(f)
        with open(f, "r+b") as fh:
            for _ in range(fdp.ConsumeIntInRange(1, 4)):
                fh.seek(fdp.ConsumeIntInRange(0, size - 1))
                fh.write(bytes([fdp.ConsumeInt(1) & 0xFF]))
        query_first = fdp.ConsumeBool()
        try:
            with simindex.Index(path, readonly=True) as idx:
                if query_first:
                    got = answers(idx)
                    found = idx.verify()
                else:
                    found = idx.verify()
                    got = answers(idx) if not found else EXPECTED
        except simindex.Error:
            return
        if got != EXPECTED and not found:
            raise AssertionError(f"{name}: answers changed and verify() reports nothing")
    finally:
        shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
