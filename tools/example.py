"""The main job on a real corpus: index every Debian copyright file on this machine and
report the near-duplicate groups, then ask the index about one document.

    python tools/example.py [--dir DIR] [--k 3] [--index PATH]

Fingerprints here are a plain simhash (word 3-shingles, 64-bit BLAKE2b token hashes, bit i
set when more shingles have it set than not). The package's own text fingerprint schemes
are a separate piece of work; this script only needs a stable 64-bit simhash per file.
"""

import argparse
import glob
import hashlib
import os
import re
import sys
import time

import numpy as np

import simindex

WORD = re.compile(r"\w+", re.UNICODE)


def simhash(text):
    words = WORD.findall(text.lower())
    shingles = [" ".join(words[i:i + 3]) for i in range(max(1, len(words) - 2))]
    hashes = np.array([int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(),
                                      "little") for s in shingles], dtype=np.uint64)
    bits = (hashes[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    votes = bits.sum(axis=0) * 2 > len(hashes)
    return int(sum(1 << i for i in range(64) if votes[i]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/usr/share/doc", help="corpus root (default %(default)s)")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--index", default="example-index", help="index directory to build")
    a = ap.parse_args(argv)
    files = sorted(glob.glob(os.path.join(a.dir, "*", "copyright")))
    if not files:
        print(f"no */copyright files under {a.dir}", file=sys.stderr)
        return 1
    t = time.perf_counter()
    items = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        if WORD.search(text):
            items.append((os.path.basename(os.path.dirname(f)), simhash(text),
                          {"bytes": len(text)}))
    try:
        idx = simindex.Index(a.index, k=a.k)
    except simindex.Error as e:
        print(f"example: {e}", file=sys.stderr)
        return 2
    with idx:
        # incremental across runs: only what is new or changed since the last run is written
        fresh = [it for it in items if (r := idx.get(it[0])) is None or r.fingerprint != it[1]]
        idx.add_many(fresh)
        built = time.perf_counter() - t
        groups = list(idx.clusters())
        print(f"indexed {len(idx)} copyright files from {a.dir} ({len(fresh)} new or changed) "
              f"in {built:.2f} s into {a.index}/ (k={idx.k})")
        print(f"{len(groups)} groups of near-duplicates (within {idx.k} bits):")
        for g in sorted(groups, key=len, reverse=True)[:10]:
            more = f" ... (+{len(g) - 6})" if len(g) > 6 else ""
            print(f"  {len(g):4d}  {', '.join(map(str, g[:6]))}{more}")
        name, fp, _ = items[len(items) // 2]
        print(f"documents within {idx.k} bits of {name!r} ({fp:016x}):")
        for m in idx.query(fp):
            print(f"  {m.distance}  {m.id}  {m.fingerprint:016x}  {m.meta}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
