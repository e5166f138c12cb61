"""Plans with flips (multi-index hashing): a query probes each table at every prefix within
`flips` bits of its own. Exact at every plan: query, query_many, add_unique, pairs,
clusters and find_all equal a brute-force scan, across reopen, shards and the CLI."""

import json
import subprocess
import sys

import msgpack
import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st
from hypothesis.stateful import initialize

import simindex
from simindex.engine.plan import Plan, flips_needed
from conftest import brute, brute_pairs, within
from test_exact import build_data
from test_state_machine import IndexMachine

FLIP_PLANS = [
    # (k, blocks, prefix_blocks, shards): flips
    (8, 4, 1, 16),      # 2: four 16-bit tables, 137 probes each; flips cross shard bits
    (6, 3, 1, 4),       # 2: three 21-22-bit tables
    (5, 4, 2, 256),     # 2: six 32-bit tables, every flip of the top 8 bits another shard
    (4, 2, 1, 1),       # 2: two 32-bit halves
    (7, 1, 0, 16),      # 0: one table scanned whole
    (3, 5, 1, 2),       # 0: fewer prefix blocks than blocks - k
    (9, 6, 2, 8),       # 3: fifteen 21-22-bit tables
]


def compositions(k, m):
    if m == 1:
        yield (k,)
        return
    for i in range(k + 1):
        for rest in compositions(k - i, m - 1):
            yield (i,) + rest


def test_flips_needed_is_the_worst_case_of_the_best_prefix_blocks():
    # k differing bits spread over m blocks: the p least differing blocks hold at most
    # flips_needed(k, m, p) of them, and some spread reaches it
    for m in range(1, 8):
        for k in range(0, 11):
            for p in range(0, m + 1):
                worst = max(sum(sorted(c)[:p]) for c in compositions(k, m))
                assert flips_needed(k, m, p) == worst, (k, m, p)
    assert flips_needed(3, 4, 1) == 0                   # the paper's plans need none


def test_probe_masks_are_every_prefix_within_flips():
    plan = Plan(k=5, blocks=4, shards=1, prefix_blocks=2)
    assert plan.flips == 2 and plan.prefix_bits == [32] * 6
    for t in range(plan.ntables):
        masks = plan.permuter.probe_masks(t)
        assert masks[0] == 0 and len(masks) == 1 + 32 + 32 * 31 // 2 == plan.probes[t]
        assert len(set(masks.tolist())) == len(masks)
        assert all(bin(int(x)).count("1") <= 2 and int(x) & ((1 << 32) - 1) == 0
                   for x in masks)                     # only the 32 prefix bits flip


@pytest.mark.parametrize("k,blocks,prefix_blocks,shards", FLIP_PLANS)
def test_queries_with_flips_equal_brute_force(tmp_path, k, blocks, prefix_blocks, shards):
    stored, queries = build_data(k, seed=k * 31 + blocks, n_random=1200, blocks=blocks)
    path = tmp_path / "i"
    with simindex.Index(path, k=k, blocks=blocks, prefix_blocks=prefix_blocks,
                        shards=shards) as idx:
        assert idx.flips == flips_needed(k, blocks, prefix_blocks)
        items = list(stored.items())
        idx.add_many(items[:len(items) // 2])
        for n in range(len(items) // 2, len(items), 53):
            idx.add_many(items[n:n + 53])
        want = [brute(stored, q, k) for q in queries]
        for q, near in zip(queries, want):
            for kq in sorted({0, k // 2, k}):
                got = idx.query(q, k=kq)
                assert {m.id: m.distance for m in got} == within(near, kq)
                assert len(got) == len(set(m.id for m in got))
        assert [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)] == want
        assert idx.verify() == []
    with simindex.Index(path) as idx:               # reopen needs only the path
        assert (idx.k, idx.blocks, idx.prefix_blocks) == (k, blocks, prefix_blocks)
        idx.compact()
        assert [{m.id: m.distance for m in ms} for ms in idx.query_many(queries)] == \
            [brute(stored, q, k) for q in queries]


@pytest.mark.parametrize("k,blocks,prefix_blocks,shards", FLIP_PLANS)
def test_pairs_and_find_all_with_flips_equal_brute_force(tmp_path, k, blocks, prefix_blocks,
                                                         shards):
    stored, _ = build_data(k, seed=5 + k, n_random=500, blocks=blocks)
    want = brute_pairs(stored, k)
    with simindex.Index(tmp_path / "i", k=k, blocks=blocks, prefix_blocks=prefix_blocks,
                        shards=shards) as idx:
        items = list(stored.items())
        for n in range(0, len(items), 150):
            idx.add_many(items[n:n + 150])
        got = list(idx.pairs())
        assert len(got) == len(set((a, b) for a, b, _ in got))        # each pair once
        assert {(a, b): d for a, b, d in got} == want
        groups = list(idx.clusters())
        members = {i for g in groups for i in g}
        assert members == {i for p in want for i in p}
    fps = list(stored.values())
    assert simindex.find_all(fps, k=k, blocks=blocks, prefix_blocks=prefix_blocks) == \
        sorted(brute_pairs(dict(enumerate(fps)), k))


@pytest.mark.parametrize("k,blocks,prefix_blocks", [(8, 4, 1), (5, 4, 2), (6, 1, 0)])
def test_planted_near_duplicates_at_every_distance_are_found(tmp_path, k, blocks,
                                                             prefix_blocks):
    rng = np.random.default_rng(k)
    base = int(rng.integers(0, 2 ** 63)) << 1
    patterns = []
    for d in range(k + 2):
        patterns.append(list(range(d)))                      # packed in the first block
        patterns.append(list(range(64 - d, 64)))             # the last bits
        patterns.append([int(b) for b in np.linspace(0, 63, d).astype(int)] if d else [])
        patterns.append(sorted(rng.choice(64, d, replace=False).tolist()))
    stored = {}
    for i, bits in enumerate(patterns):
        stored[f"p{i}"] = base ^ sum(1 << (63 - b) for b in set(bits))
    with simindex.Index(tmp_path / "i", k=k, blocks=blocks, prefix_blocks=prefix_blocks,
                        shards=16) as idx:
        idx.add_many(list(stored.items()))
        got = {m.id: m.distance for m in idx.query(base)}
        assert got == brute(stored, base, k)
        assert max(got.values()) == k and len(got) < len(stored)


def test_add_unique_with_flips(tmp_path):
    with simindex.Index(tmp_path / "i", k=8, blocks=4, prefix_blocks=1, shards=16) as idx:
        assert idx.add_unique("a", 0) == []
        assert [(m.id, m.distance) for m in idx.add_unique("b", (1 << 8) - 1)] == [("a", 8)]
        assert idx.add_unique("c", (1 << 9) - 1 << 55) == []      # 9 bits away: admitted
        assert len(idx) == 2


def test_a_flip_plan_names_its_prefix_blocks_and_reopens_checked(tmp_path):
    path = tmp_path / "i"
    simindex.Index(path, k=8, blocks=4, prefix_blocks=1).close()
    m = msgpack.unpackb((path / "manifest.msgpack").read_bytes())
    assert m["format"] == 3 and m["prefix_blocks"] == 1 and m["tables"] == 4
    with pytest.raises(simindex.ParameterError, match="prefix_blocks=2 was given, but the "
                       "index was built with prefix_blocks=1"):
        simindex.Index(path, prefix_blocks=2)
    with simindex.Index(path, prefix_blocks=1) as idx:
        assert idx.stats()["format"] == 3 and idx.stats()["probes"] == 4 * 137
    # the paper's plans name theirs too; naming them on reopen is fine
    simindex.Index(tmp_path / "c", k=3, blocks=5).close()
    m = msgpack.unpackb((tmp_path / "c" / "manifest.msgpack").read_bytes())
    assert m["format"] == 3 and m["prefix_blocks"] == 2
    simindex.Index(tmp_path / "c", prefix_blocks=2).close()
    # format 2 or 3 without the field, or format 1 with it, is damage
    for fmt, extra in [(3, {}), (2, {}), (1, {"prefix_blocks": 1})]:
        bad = {**{f: v for f, v in m.items() if f != "prefix_blocks"}, "format": fmt, **extra}
        (tmp_path / "c" / "manifest.msgpack").write_bytes(msgpack.packb(bad))
        with pytest.raises(simindex.CorruptError, match="prefix_blocks"):
            simindex.Index(tmp_path / "c")


def test_plan_errors_name_the_rule():
    with pytest.raises(simindex.ParameterError, match="must be greater than k .* or give "
                       "prefix_blocks"):
        Plan(k=8, blocks=4)
    with pytest.raises(simindex.ParameterError, match="prefix_blocks \\(5\\) must be between "
                       "0 and blocks \\(4\\)"):
        Plan(k=8, blocks=4, prefix_blocks=5)
    with pytest.raises(simindex.ParameterError, match="probes .* prefixes per query "
                       "\\(flips=8\\); the limit is 65536"):
        Plan(k=8, blocks=1, prefix_blocks=1)
    with pytest.raises(simindex.ParameterTypeError):
        Plan(k=3, blocks=4, prefix_blocks="1")


def test_large_k_without_expected_gets_a_planned_default(tmp_path):
    # k + 1 blocks below k = 8; from there, the plan of least estimated time at 1M
    assert simindex.engine.plan.default_plan(3) == (4, 1)
    with simindex.Index(tmp_path / "i", k=10) as idx:
        chosen = simindex.engine.plan.default_plan(10, simindex.engine.plan.NOMINAL_SIZE)
        assert (idx.blocks, idx.prefix_blocks) == chosen
        assert min(idx.stats()["prefix_bits"]) > 7


def test_cli_builds_and_queries_a_flip_plan(tmp_path):
    rng = np.random.default_rng(3)
    fps = rng.integers(0, 2 ** 63, 300).tolist()
    (tmp_path / "in.tsv").write_text("".join(f"r{i}\t{fp:x}\n" for i, fp in enumerate(fps)))
    q = fps[7] ^ 0b1011011 << 40                                  # 5 bits away
    run = lambda *a: subprocess.run([sys.executable, "-m", "simindex", *map(str, a)],
                                    capture_output=True, text=True, timeout=120)
    b = run("build", tmp_path / "i", tmp_path / "in.tsv", "--k", "6", "--blocks", "3",
            "--prefix-blocks", "1", "--quiet")
    assert b.returncode == 0, b.stderr
    (tmp_path / "q.tsv").write_text(f"q\t{q:x}\n")
    out = run("query", tmp_path / "i", tmp_path / "q.tsv", "--quiet", "--output", "jsonl")
    assert out.returncode == 0, out.stderr
    [line] = [json.loads(x) for x in out.stdout.splitlines()]
    assert {h["id"]: h["distance"] for h in line["matches"]} == \
        brute({f"r{i}": fp for i, fp in enumerate(fps)}, q, 6)
    info = run("info", tmp_path / "i")
    assert "prefix_blocks" in info.stdout and "flips" in info.stdout


# ---------------------------------------------------------------- properties

small = st.lists(
    st.builds(lambda base, bits: base ^ sum(1 << b for b in set(bits)),
              st.sampled_from([0, (1 << 64) - 1, 0xDEADBEEFCAFEF00D, 1 << 63, 1]),
              st.lists(st.integers(0, 63), max_size=9)),
    max_size=50)


@settings(deadline=None, max_examples=60)
@given(fps=small, q=small, k=st.integers(0, 8), blocks=st.integers(1, 10),
       prefix_blocks=st.integers(0, 10), shards=st.sampled_from([1, 4, 256]))
def test_any_plan_with_flips_is_exact(tmp_path_factory, fps, q, k, blocks, prefix_blocks,
                                      shards):
    assume(prefix_blocks <= blocks)
    try:
        Plan(k=k, blocks=blocks, prefix_blocks=prefix_blocks, shards=shards)
    except simindex.ParameterError:
        assume(False)                    # too many tables or probes: refused, not wrong
    stored = {f"id{i}": fp for i, fp in enumerate(fps)}
    with simindex.Index(tmp_path_factory.mktemp("f") / "i", k=k, blocks=blocks,
                        prefix_blocks=prefix_blocks, shards=shards) as idx:
        idx.add_many(list(stored.items()))
        got = idx.query_many(q)
        assert [{m.id: m.distance for m in ms} for ms in got] == [brute(stored, x, k) for x in q]
        assert {(a, b): d for a, b, d in idx.pairs()} == brute_pairs(stored, k)
    assert simindex.find_all(fps, k=k, blocks=blocks, prefix_blocks=prefix_blocks) == \
        sorted(brute_pairs(dict(enumerate(fps)), k))


class FlipIndexMachine(IndexMachine):
    """The state machine of test_state_machine.py on plans with flips."""

    @initialize(k=st.integers(0, 4),
                plan=st.sampled_from([(2, 1), (1, 0), (3, 1), (4, 2), (5, 3)]),
                shards=st.sampled_from([1, 4, 256]))
    def open(self, k, plan, shards):
        self.k = k
        blocks, prefix_blocks = plan
        self.idx = simindex.Index(f"{self.dir}/i", k=k, blocks=blocks,
                                  prefix_blocks=prefix_blocks, shards=shards)


TestFlipIndexMachine = FlipIndexMachine.TestCase
TestFlipIndexMachine.settings = settings(max_examples=30, stateful_step_count=25,
                                         deadline=None)


@pytest.mark.parametrize("k,blocks,prefix_blocks,shards", [(3, 4, 1, 16), (3, 4, 1, 1),
                                                           (8, 4, 1, 16), (6, 3, 1, 4)])
def test_pairs_of_records_no_shard_has_applied_yet(tmp_path, k, blocks, prefix_blocks, shards):
    # a writer that died between its records commit and the shards: the tail, in seq order,
    # is the only part of every table's groups and must be sorted before the join
    from simindex import _testing
    stored, _ = build_data(k, seed=41 + k, n_random=400, blocks=blocks)
    path = tmp_path / "i"
    with simindex.Index(path, k=k, blocks=blocks, prefix_blocks=prefix_blocks,
                        shards=shards) as idx:
        _testing.commit_unapplied(idx, list(stored), np.array(list(stored.values()),
                                                              dtype=np.uint64))
        assert idx.stats()["unapplied"] == len(stored)
        assert {(a, b): d for a, b, d in idx.pairs()} == brute_pairs(stored, k)
        _testing.crash(idx)
    with simindex.Index(path, readonly=True) as ro:          # nothing applied it since
        assert {(a, b): d for a, b, d in ro.pairs()} == brute_pairs(stored, k)
