"""How tests/data/index-v1.tar.gz was made: an index holding slab layout v1, written by
simindex at commit b23a09f (the last version that wrote v1). `history()` is also the test's
record of what the index must hold; running this file with newer code would write v2."""

import os
import sys
import tarfile
import tempfile

import numpy as np


def history():
    """The writes, in order: ("add_many", [(id, fp[, meta]), ...]), ("compact",), ("remove", id)."""
    rng = np.random.default_rng(20261122)
    fps = rng.integers(0, 2**64, size=600, dtype=np.uint64).tolist()
    for d in range(4):                      # near-copies at every distance 0..3, edge bits too
        for j in range(25):
            fp = fps[j * 7]
            for b in [0, 63, 17, 40][:d]:
                fp ^= 1 << (b if b in (0, 63) else (b + j) % 64)
            fps.append(fp)
    ids = [f"doc{i}" for i in range(len(fps))]
    ops = [("add_many", list(zip(ids[:400], fps[:400]))), ("compact",)]
    for i in range(400, len(ids), 60):      # a few runs on top of the compacted one
        ops.append(("add_many", [(ids[j], fps[j], {"n": j}) for j in range(i, min(i + 60, len(ids)))]))
    ops += [("remove", ids[i]) for i in range(0, 600, 37)]
    return ops


if __name__ == "__main__":
    import simindex
    path = os.path.join(tempfile.mkdtemp(), "index-v1")
    with simindex.Index(path, k=3, shards=4) as idx:
        for op, *args in history():
            getattr(idx, op)(*args)
        idx.flush()
    with tarfile.open(sys.argv[1], "w:gz") as t:
        t.add(path, arcname="index-v1",
              filter=lambda ti: None if ti.name.endswith("lock.mdb") else ti)
