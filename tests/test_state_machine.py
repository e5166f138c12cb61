"""A hypothesis state machine: every step of add/remove/query/reopen against a plain model."""

import shutil

import pytest

from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine, initialize, invariant, precondition, rule,
)

import simindex
from conftest import brute, brute_pairs, scratch_dir

# Few distinct bases and few flipped bits, so near-duplicates are common.
BASES = [0, (1 << 64) - 1, 0x0123456789ABCDEF, 0xFF00000000000000, 0x00000000000000FF]
fingerprints = st.builds(
    lambda base, bits: base ^ sum(1 << b for b in set(bits)),
    st.sampled_from(BASES), st.lists(st.integers(0, 63), max_size=5))
ids = st.one_of(st.integers(0, 30), st.text("abc", min_size=1, max_size=2),
                st.binary(min_size=1, max_size=2))


class IndexMachine(RuleBasedStateMachine):
    sync = True                   # as opened (machines built on this one may not choose)

    def __init__(self):
        super().__init__()
        self.dir = scratch_dir("simindex-sm-")
        self.model = {}           # id -> fp, in insertion order of each id's latest add
        self.idx = None

    @initialize(k=st.integers(0, 4), extra=st.integers(1, 3), shards=st.sampled_from([1, 4, 256]),
                sync=st.booleans())
    def open(self, k, extra, shards, sync):
        self.k, self.sync = k, sync       # sync=False: single adds go through the buffer
        self.idx = simindex.Index(f"{self.dir}/i", k=k, blocks=k + extra, shards=shards,
                                  sync=sync)

    def _put(self, id_, fp):
        self.model.pop(id_, None)
        self.model[id_] = fp

    @rule(id_=ids, fp=fingerprints)
    def add(self, id_, fp):
        self.idx.add(id_, fp)
        self._put(id_, fp)

    @rule(items=st.lists(st.tuples(ids, fingerprints), max_size=20))
    def add_many(self, items):
        self.idx.add_many(items)
        for id_, fp in items:
            self._put(id_, fp)

    @rule(id_=ids)
    def remove(self, id_):
        assert self.idx.remove(id_) == (id_ in self.model)
        self.model.pop(id_, None)

    @rule(id_=ids, fp=fingerprints)
    def add_unique(self, id_, fp):
        want = brute(self.model, fp, self.k)
        if not want and id_ in self.model:       # never replaces: refused, nothing written
            with pytest.raises(simindex.IdExistsError):
                self.idx.add_unique(id_, fp)
            return
        found = self.idx.add_unique(id_, fp)
        assert {m.id: m.distance for m in found} == want
        if not want:
            self._put(id_, fp)

    @rule(fp=fingerprints, kq=st.integers(0, 4))
    def query(self, fp, kq):
        kq = min(kq, self.k)
        got = self.idx.query(fp, k=kq)
        want = brute(self.model, fp, kq)
        assert {m.id: m.distance for m in got} == want and len(got) == len(want)
        order = list(self.model)
        assert [(m.distance, order.index(m.id)) for m in got] == \
            sorted((m.distance, order.index(m.id)) for m in got)

    @rule(fps=st.lists(fingerprints, max_size=5))
    def query_many(self, fps):
        got = self.idx.query_many(fps)
        assert [{m.id: m.distance for m in ms} for ms in got] == \
            [brute(self.model, fp, self.k) for fp in fps]

    @precondition(lambda self: len(self.model) < 80)
    @rule()
    def pairs(self):
        got = {(a, b): d for a, b, d in self.idx.pairs()}
        assert got == brute_pairs(self.model, self.k)

    @rule()
    def reopen(self):
        self.idx.close()
        self.idx = simindex.Index(f"{self.dir}/i", sync=self.sync)

    @rule()
    def compact(self):
        self.idx.compact()

    @invariant()
    def counts(self):
        if self.idx is not None:
            assert len(self.idx) == len(self.model)

    def teardown(self):
        if self.idx is not None:
            assert self.idx.verify() == []
            self.idx.close()
        shutil.rmtree(self.dir, ignore_errors=True)


# group commit off (every batch reaches the shards' runs and merges at once), and as
# users get it (batches wait for the shards in groups, found through the unapplied tail)
TestIndexMachine = IndexMachine.TestCase
TestIndexMachineShipped = pytest.mark.group_commit(
    type("ShippedIndexMachine", (IndexMachine,), {}).TestCase)
