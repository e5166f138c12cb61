"""Plans over 128- and 256-bit fingerprints: the permuted keys against a plain-Python
permutation, and find_all(width=...) against a brute-force scan with planted
near-duplicates at every distance 0..k+1 (packed in one block, spread over blocks, the
first and the last bit), for the paper's plans and plans with flips."""

import random

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import simindex
from simindex.engine.plan import Plan


def brute_pairs(fps, k):
    return sorted((i, j) for i in range(len(fps)) for j in range(i + 1, len(fps))
                  if bin(fps[i] ^ fps[j]).count("1") <= k)


def words(fps, width):
    return np.array([[(x >> (64 * (width // 64 - 1 - w))) & (2 ** 64 - 1)
                      for w in range(width // 64)] for x in fps], dtype=np.uint64)


def reference_key(plan, t, fp):
    """The permuted key as documented: the table's chosen blocks first, in their order,
    then the rest, each block's bits kept in order (most significant first)."""
    starts = [sum(plan.widths[:b]) for b in range(plan.blocks)]
    bits = format(fp, f"0{plan.width}b")
    return int("".join(bits[starts[b]:starts[b] + plan.widths[b]] for b in plan.orders[t]), 2)


def planted(rng, width, k, bases=12, randoms=300):
    """Random fingerprints and, around each base, copies at every distance 0..k+1 with the
    differing bits packed at the front, at the back (the first and last bit), in one
    block's span and spread evenly."""
    fps = [rng.getrandbits(width) for _ in range(randoms)]
    for _ in range(bases):
        base = rng.getrandbits(width)
        fps.append(base)
        for d in range(k + 2):
            for pattern in (range(d), range(width - d, width),
                            [int(x) for x in np.linspace(0, width - 1, d)] if d else [],
                            rng.sample(range(width), d)):
                fps.append(base ^ sum(1 << (width - 1 - b) for b in set(pattern)))
    return fps


@pytest.mark.parametrize("width", [128, 256, 512])
@pytest.mark.parametrize("k,blocks,prefix_blocks", [
    (3, 4, 1),      # the paper's plan: 4 tables of a quarter of the bits (prefix > 64 at 256)
    (8, 10, 2),     # the paper's plan, 45 tables
    (8, 4, 1),      # multi-index hashing: flips 2 over the first 64 bits of 32/64-bit blocks
    (16, 16, 1),    # flips 1 over 8/16-bit blocks
    (12, 1, 0),     # one table scanned whole
])
def test_wide_find_all_equals_brute_force(width, k, blocks, prefix_blocks):
    rng = random.Random(width * 100 + k)
    fps = planted(rng, width, k)
    want = brute_pairs(fps, k)
    got = simindex.find_all(fps, k=k, blocks=blocks, prefix_blocks=prefix_blocks, width=width)
    assert got == want
    assert simindex.find_all(words(fps, width), k=k, blocks=blocks,
                             prefix_blocks=prefix_blocks, width=width) == want
    assert simindex.find_all([x.to_bytes(width // 8, "big") for x in fps], k=k, blocks=blocks,
                             prefix_blocks=prefix_blocks, width=width) == want


@pytest.mark.parametrize("width,k", [(128, 8), (128, 31), (256, 16), (256, 31), (512, 15), (1024, 31)])
def test_wide_find_all_with_the_planners_plan(width, k):
    fps = planted(random.Random(k), width, k, bases=8, randoms=200)
    assert simindex.find_all(fps, k=k, width=width) == brute_pairs(fps, k)


@pytest.mark.parametrize("width", [128, 256, 512, 768, 1024])
def test_wide_keys_are_the_documented_permutation(width):
    rng = random.Random(width)
    fps = [rng.getrandbits(width) for _ in range(20)] + [0, 2 ** width - 1, 1,
                                                         1 << (width - 1)]
    for blocks, prefix_blocks, k in [(4, 1, 3), (5, 2, 3), (7, 3, 4), (13, 1, 12), (1, 0, 4)]:
        plan = Plan(k=k, blocks=blocks, prefix_blocks=prefix_blocks, shards=16, width=width)
        for t in range(plan.ntables):
            keys = plan.permuter.keys(t, words(fps, width))
            for fp, row in zip(fps, keys):
                want = reference_key(plan, t, fp)
                assert plan.permuter.key(t, fp) == want
                assert int.from_bytes(row.astype(">u8").tobytes(), "big") == want
            eff = min(plan.prefix_bits[t], 64)
            assert plan.permuter.prefix_mask(t) == (((1 << eff) - 1) << (64 - eff))


def test_wide_shard_routing_covers_every_probe():
    plan = Plan(k=8, blocks=4, prefix_blocks=1, shards=16, width=128)
    fps = words([0, 2 ** 128 - 1, 0x0123456789ABCDEF << 64], 128)
    reach = plan.permuter.shard_reach(fps)
    owners = plan.permuter.shard_owners(fps)
    assert reach.shape == owners.shape == (16, 3)
    # flipping any 2 of the 4 shard bits of the 32-bit prefix: every shard within 2 bits
    for i in range(3):
        for t in range(plan.ntables):
            lead = int(plan.permuter.keys(t, fps[i:i + 1])[0, 0]) >> 60
            assert owners[lead, i]
            for s in range(16):
                if bin(s ^ lead).count("1") <= 2:
                    assert reach[s, i]


def test_wide_plan_errors_name_the_rule():
    with pytest.raises(simindex.ParameterError, match="width \\(96\\) must be one of 64, 128, 256, 512, 768, 1024"):
        Plan(k=3, width=96)
    with pytest.raises(simindex.ParameterError, match="k \\(128\\) must be between 0 and 127"):
        Plan(k=128, width=128)
    with pytest.raises(simindex.ParameterError, match="blocks \\(300\\) must be between 1 "
                       "and 256"):
        Plan(k=3, blocks=300, width=256)
    with pytest.raises(simindex.InputError, match="at position 0: fingerprint .* out of "
                       "range: at width 128"):
        simindex.find_all([2 ** 128], k=3, width=128)
    assert simindex.find_all([], k=3, width=256) == []


def test_hamming_takes_fingerprints_of_up_to_1024_bits():
    assert simindex.hamming(0, 2 ** 256 - 1) == 256
    assert simindex.hamming(0, 2 ** 1024 - 1) == 1024
    assert simindex.hamming(1 << 200, 1) == 2 and simindex.hamming(1 << 900, 1) == 2
    with pytest.raises(simindex.InputError, match="2\\*\\*1024"):
        simindex.hamming(2 ** 1024, 0)
    with pytest.raises(simindex.InputTypeError, match="int fingerprints"):
        simindex.hamming(b"\x00" * 16, 0)


@settings(deadline=None, max_examples=40)
@given(seed=st.integers(0, 2 ** 32), width=st.sampled_from([128, 256, 512, 768, 1024]),
       k=st.integers(0, 24), blocks=st.integers(1, 24), prefix_blocks=st.integers(0, 4))
def test_any_wide_plan_is_exact(seed, width, k, blocks, prefix_blocks):
    assume(prefix_blocks <= blocks)
    try:
        Plan(k=k, blocks=blocks, prefix_blocks=prefix_blocks, shards=1, width=width)
    except simindex.ParameterError:
        assume(False)
    fps = planted(random.Random(seed), width, k, bases=3, randoms=40)
    assert simindex.find_all(fps, k=k, blocks=blocks, prefix_blocks=prefix_blocks,
                             width=width) == brute_pairs(fps, k)


def test_simindex_plan_shows_wide_plans():
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "simindex", "plan", "--size", "1000000", "--k",
                        "31", "--width", "256"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = [r.split("\t") for r in p.stdout.splitlines()[1:]]
    chosen = simindex.engine.plan.default_plan(31, 1_000_000, width=256)
    assert [tuple(map(int, r[:2])) for r in rows if r[-1].startswith("<- build")] == [chosen]
    bad = subprocess.run([sys.executable, "-m", "simindex", "plan", "--size", "10", "--k",
                          "64"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "must be below the width 64" in bad.stderr
