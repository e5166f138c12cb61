"""What a similarity run pays per candidate and per band, the two costs the threshold's
calibration weighs (simindex/radius.py: CHECK_NS, BAND_NS), measured on synthetic rows that
no benchmark reports on.

Candidates: rows of 120 words drawn at random from a small vocabulary (so that unrelated
rows share MinHash values often), judged by `simindex dedup --min-similarity 0.5 --scheme
minhash-lsh-v1-r1` (8 bands of one value: every pair that shares a band is a candidate,
and none passes). The pairs that share a band are counted from the rows' codes; the cost
per candidate is the run's time beyond that of rows that share nothing, divided by them.

Bands: the same rows from a vocabulary too large to share anything, run with 8 and with 24
bands of 2 rows: the difference per row over the 16 more bands is a band's lookup and
write in the run.

    python3 tools/candidate_cost.py [--rows 20000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np

from simindex.radius import band_pairs
from simindex.signatures import _text

WORDS = 120
VOCABULARIES = (100_000, 60, 45)       # the first shares nothing; the others share a lot


def write_rows(path: str, rows: int, vocabulary: int, seed: int = 7) -> list:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocabulary)]
    texts = [" ".join(rng.choice(words) for _ in range(WORDS)) for _ in range(rows)]
    with open(path, "w") as f:
        for i, text in enumerate(texts):
            f.write(json.dumps({"id": i, "text": text}) + "\n")
    return texts


def shared_pairs(texts: list) -> tuple:
    """(pairs of rows that share one of 8 one-value bands, mean shingle set size)."""
    sets = _text.signatures(texts, 3, shingles=True, distinct=True)[2]
    i, _, more = band_pairs(_text.minhash_codes(sets, 4, 1))
    return len(i) + more, float(np.mean([len(s) for s in sets]))


def run(path: str, scheme: str) -> float:
    out = path + ".out"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "simindex", "dedup", path, "-o", out, "--id-field",
                    "id", "--min-similarity", "0.5", "--scheme", scheme, "--jobs", "1"],
                   check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        paths, pairs = {}, {}
        for v in VOCABULARIES:
            paths[v] = os.path.join(d, f"v{v}.jsonl")
            pairs[v], size = shared_pairs(write_rows(paths[v], a.rows, v))
            print(f"# vocabulary {v}: {pairs[v]:,} pairs share a band, {size:.0f} shingles "
                  f"a row")
        times: dict = {}
        for _ in range(a.rounds):                   # interleaved rounds
            for v in VOCABULARIES:
                times.setdefault(v, []).append(run(paths[v], "minhash-lsh-v1-r1"))
            for scheme in ("minhash-lsh-v1-r2", "minhash-lsh-v1-b24-r2"):
                times.setdefault(scheme, []).append(run(paths[VOCABULARIES[0]], scheme))
        med = {key: float(np.median(t)) for key, t in times.items()}
        base = med[VOCABULARIES[0]]
        for v in VOCABULARIES[1:]:
            per = (med[v] - base) / pairs[v] * 1e6
            print(f"vocabulary {v}: {med[v]:.2f} s against {base:.2f} s: {per:.2f} us a "
                  f"candidate")
        band = (med["minhash-lsh-v1-b24-r2"] - med["minhash-lsh-v1-r2"]) / a.rows / 16 * 1e6
        print(f"24 bands {med['minhash-lsh-v1-b24-r2']:.2f} s against 8 bands "
              f"{med['minhash-lsh-v1-r2']:.2f} s: {band:.2f} us a band and row")
    return 0


if __name__ == "__main__":
    from piped import exit_with
    exit_with(main)
