"""The main job on a real corpus: index every Debian copyright file on this machine by its
text and print the largest groups of near-duplicates with their distances.

    python tools/example.py [--dir /usr/share/doc] [--k 3] [--index example-index]
    python tools/example.py --emit-jsonl > docs.jsonl     # the corpus, for `simindex build`

Fingerprints use the package's default scheme, simindex-v1. Nothing here is random: the
same machine gives the same output every run.
"""

import argparse
import glob
import json
import os
import sys
import time

import simindex


def documents(root):
    """(package name, text) of every */copyright file under root that has words in it."""
    for f in sorted(glob.glob(os.path.join(root, "*", "copyright"))):
        with open(f, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        if simindex.tokenize(text):
            yield os.path.basename(os.path.dirname(f)), text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/usr/share/doc", help="corpus root (default %(default)s)")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--index", default="example-index", help="index directory to build")
    ap.add_argument("--emit-jsonl", action="store_true",
                    help='write {"id", "text"} lines to stdout instead of building')
    a = ap.parse_args(argv)
    docs = list(documents(a.dir))
    if not docs:
        print(f"example: no */copyright files with text under {a.dir}", file=sys.stderr)
        return 1
    if a.emit_jsonl:
        for name, text in docs:
            print(json.dumps({"id": name, "text": text}))
        return 0
    t = time.perf_counter()
    try:
        idx = simindex.Index(a.index, k=a.k)
    except simindex.Error as e:
        print(f"example: {e}", file=sys.stderr)
        return 2
    with idx:
        # incremental across runs: only what is new or changed since the last run is written
        items = [(name, idx.fingerprint(text), {"bytes": len(text)}) for name, text in docs]
        fresh = [it for it in items if (r := idx.get(it[0])) is None or r.fingerprint != it[1]]
        idx.add_many(fresh)
        built = time.perf_counter() - t
        fps = {name: fp for name, fp, _ in items}
        groups = []
        for g in idx.clusters():
            # each member with its distance to the group's first member, nearest first
            dist = sorted((simindex.hamming(fps[g[0]], fps[m]), m) for m in g)
            groups.append((dist[-1][0] == 0, -len(g), dist))
        groups.sort()                    # groups holding near (not identical) copies first
        print(f"indexed {len(idx)} copyright files from {a.dir} ({len(fresh)} new or changed) "
              f"in {built:.2f} s into {a.index}/ (k={idx.k}, scheme {idx.scheme})")
        print(f"{len(groups)} groups of near-duplicates (chains of documents within {idx.k} "
              f"bits of one another, so a member may lie farther from the first); a few, "
              f"those with near rather than identical copies first, each member with its "
              f"distance in bits to the first:")
        for _same, _size, dist in groups[:6]:
            members = ", ".join(f"{m} ({d})" for d, m in dist[:6])
            more = f" ... (+{len(dist) - 6})" if len(dist) > 6 else ""
            print(f"  {len(dist):3d}: {members}{more}")
        name, fp, _ = items[len(items) // 2]
        print(f"documents within {idx.k} bits of {name!r} ({fp:016x}):")
        for m in idx.query(fp):
            print(f"  {m.distance}  {m.id}  {m.fingerprint:016x}  {m.meta}")
    return 0


if __name__ == "__main__":
    from piped import exit_with     # `| head`: quietly, as a producer killed by SIGPIPE
    exit_with(main)
