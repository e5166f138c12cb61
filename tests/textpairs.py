"""Texts at a chosen Jaccard similarity of their word 3-shingles, for the tests of the
similarity check."""

import math


def tokens(rng, n):
    """n distinct random words."""
    return [f"w{rng.getrandbits(40):x}" for _ in range(n)]


def pair_at(rng, jaccard, n=302):
    """Two texts of n distinct tokens sharing their first m, so that their word 3-shingle
    sets (n - 2 each, m - 2 shared) have a Jaccard similarity just at or above `jaccard`;
    returns the texts and that similarity."""
    s = n - 2
    shared = math.ceil(jaccard * 2 * s / (1 + jaccard))
    toks = tokens(rng, 2 * n - shared - 2)
    a = toks[:n]
    b = toks[:shared + 2] + toks[n:]
    return " ".join(a), " ".join(b), shared / (2 * s - shared)


def pairs_within(rng, calibration, count, jaccard, n=60):
    """`count` pairs of texts of n words at (just above) `jaccard` whose fingerprints under
    the calibration's scheme and width lie within its k (under a band scheme, share a
    band): candidates the check must judge."""
    import simindex
    from simindex.bands import is_band_scheme, shares_band
    from simindex.scheme_names import lsh_bands

    def fp(text):
        return simindex.fingerprint(text, scheme=calibration.scheme, width=calibration.width)

    def near(a, b):
        if is_band_scheme(calibration.scheme):
            return shares_band(fp(a), fp(b), lsh_bands(calibration.scheme))
        return simindex.hamming(fp(a), fp(b)) <= calibration.k
    out = []
    while len(out) < count:
        a, b, _ = pair_at(rng, jaccard, n=n)
        if near(a, b):
            out.append((a, b))
    return out
