"""Fingerprinting speed on a real corpus, side by side with PyPI simhash 2.1.2, at
64, 128 and 256 bits.

    python tools/fingerprint_bench.py [--dir /usr/share/doc] [--repeat 3]

The corpus: every Debian copyright file, license text and Python standard library module on
the machine (read once, then timed from memory). Each system fingerprints the same texts in
the same process run, in rounds that alternate their order; the pypi-simhash scheme is also
checked bit for bit against PyPI simhash.
"""

import argparse
import glob
import os
import statistics
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


def timed(fn, texts):
    t = time.perf_counter()
    out = [fn(x) for x in texts]
    return out, time.perf_counter() - t


def pypi(f):
    """PyPI simhash's value of a text at f bits, None where it raises (2.1.2 under NumPy 2:
    a weight above 255)."""
    from simhash import Simhash

    def value(x):
        try:
            return Simhash(x, f=f).value
        except OverflowError:
            return None
    return value


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/usr/share/doc")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    texts = corpus(a.dir)
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    print(f"# {len(texts)} documents, {mb:.1f} MB; median (range) of {a.repeat} interleaved "
          f"rounds; python {sys.version.split()[0]}")
    systems = {
        "simindex simindex-v1": simindex.fingerprint,
        "simindex pypi-simhash": lambda x: simindex.fingerprint(x, scheme="pypi-simhash"),
        "simindex seomoz-simhash": lambda x: simindex.fingerprint(x, scheme="seomoz-simhash"),
        "simindex simindex-v1 width 128": lambda x: simindex.fingerprint(x, width=128),
        "simindex simindex-v1 width 256": lambda x: simindex.fingerprint(x, width=256),
        "simindex pypi-simhash width 128": lambda x: simindex.fingerprint(
            x, scheme="pypi-simhash", width=128),
        "simindex md5-128-notebook": lambda x: simindex.fingerprint(
            x, scheme="md5-128-notebook"),
        "simindex minhash-v1": lambda x: simindex.fingerprint(x, scheme="minhash-v1"),
        "simindex minhash-v1 width 256": lambda x: simindex.fingerprint(x, scheme="minhash-v1",
                                                                       width=256),
    }
    try:
        import simhash  # noqa: F401
        systems["PyPI simhash 2.1.2 Simhash(text)"] = pypi(64)
        systems["PyPI simhash Simhash(text, f=128)"] = pypi(128)
    except ImportError:
        print("PyPI simhash 2.1.2: not installed (pip install simhash==2.1.2)")
    times = {name: [] for name in systems}
    outs = {}
    for r in range(a.repeat):                # rounds alternate the order of the systems
        for name in (list(systems) if r % 2 == 0 else list(systems)[::-1]):
            outs[name], dt = timed(systems[name], texts)
            times[name].append(dt)
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"{name:<34} {med[name]:8.3f} s ({min(t):.3f}-{max(t):.3f}) "
              f"{mb / med[name]:9.1f} MB/s {len(texts) / med[name]:10.0f} docs/s", flush=True)
    for ours, ref, label in (("simindex pypi-simhash", "PyPI simhash 2.1.2 Simhash(text)",
                              "64"),
                             ("simindex pypi-simhash width 128",
                              "PyPI simhash Simhash(text, f=128)", "128")):
        if ref not in outs:
            break
        same = sum(1 for x, y in zip(outs[ours], outs[ref]) if y is not None and x == y)
        failed = sum(1 for y in outs[ref] if y is None)
        print(f"pypi-simhash at {label} bits bit-exact on {same} of {len(texts) - failed} "
              f"texts PyPI simhash computes ({failed} raise OverflowError under NumPy 2); "
              f"ratio of the medians PyPI / simindex: {med[ref] / med[ours]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
