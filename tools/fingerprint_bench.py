"""Fingerprinting speed on a real corpus, side by side with PyPI simhash 2.1.2 (1e0ng), at
64, 128 and 256 bits.

    python tools/fingerprint_bench.py [--dir /usr/share/doc] [--repeat 3]

The corpus: every Debian copyright file, license text and Python standard library module on
the machine (read once, then timed from memory). Each system fingerprints the same texts in
the same process run; the 1e0ng scheme is also checked bit for bit against PyPI simhash.
"""

import argparse
import glob
import os
import sys
import time

import simindex


def corpus(root):
    files = sorted(glob.glob(os.path.join(root, "*", "copyright")))
    files += sorted(glob.glob("/usr/share/common-licenses/*"))
    files += sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    texts = []
    for f in files:
        try:
            with open(f, encoding="utf-8", errors="replace") as fh:
                t = fh.read()
        except OSError:
            continue
        if any(c.isalnum() for c in t) and len(t.split()) >= 4:
            texts.append(t)
    return texts


def run(label, fn, texts, repeat, mb):
    best = None
    out = None
    for _ in range(repeat):
        t = time.perf_counter()
        out = [fn(x) for x in texts]
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    print(f"{label:<34} {best:8.3f} s {mb / best:9.1f} MB/s {len(texts) / best:10.0f} docs/s",
          flush=True)
    return out, best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/usr/share/doc")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    texts = corpus(a.dir)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    print(f"# {len(texts)} documents, {mb:.1f} MB; best of {a.repeat}; python "
          f"{sys.version.split()[0]}")
    _, v1 = run("simindex simindex-v1", simindex.fingerprint, texts, a.repeat, mb)
    ours, t_ours = run("simindex 1e0ng", lambda x: simindex.fingerprint(x, scheme="1e0ng"),
                       texts, a.repeat, mb)
    run("simindex seomoz", lambda x: simindex.fingerprint(x, scheme="seomoz"),
        texts, a.repeat, mb)
    for width in (128, 256):
        run(f"simindex simindex-v1 width {width}",
            lambda x, w=width: simindex.fingerprint(x, width=w), texts, a.repeat, mb)
    wide, t_wide = run("simindex 1e0ng width 128",
                       lambda x: simindex.fingerprint(x, scheme="1e0ng", width=128),
                       texts, a.repeat, mb)
    run("simindex memosstilvi (128)",
        lambda x: simindex.fingerprint(x, scheme="memosstilvi"), texts, a.repeat, mb)
    try:
        from simhash import Simhash
    except ImportError:
        print("PyPI simhash 2.1.2: not installed (pip install simhash==2.1.2)")
        return 0

    def theirs(x):
        try:
            return Simhash(x).value
        except OverflowError:            # 2.1.2 under NumPy 2: a weight above 255
            return None
    ref, t_ref = run("PyPI simhash 2.1.2 Simhash(text)", theirs, texts, a.repeat, mb)
    same = sum(1 for x, y in zip(ours, ref) if y is not None and x == y)
    failed = sum(1 for y in ref if y is None)
    print(f"1e0ng bit-exact on {same} of {len(texts) - failed} texts PyPI simhash computes "
          f"({failed} raise OverflowError under NumPy 2)")
    print(f"ratio PyPI simhash / simindex 1e0ng: {t_ref / t_ours:.1f}x; "
          f"/ simindex-v1: {t_ref / v1:.1f}x")

    def theirs128(x):
        try:
            return Simhash(x, f=128).value
        except OverflowError:
            return None
    ref128, t_ref128 = run("PyPI simhash Simhash(text, f=128)", theirs128, texts, a.repeat, mb)
    same = sum(1 for x, y in zip(wide, ref128) if y is not None and x == y)
    failed = sum(1 for y in ref128 if y is None)
    print(f"1e0ng width 128 bit-exact on {same} of {len(texts) - failed} texts; ratio PyPI "
          f"simhash f=128 / simindex 1e0ng width 128: {t_ref128 / t_wide:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
