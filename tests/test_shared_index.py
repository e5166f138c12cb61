"""A shared index is a shared decision: `simindex dedup --index` runs and a crawler's
add_unique_text, each in its own process on one index at once, never both keep a text.
Real processes racing (tools/reliability.py runs the same trials 20 times and more)."""

import random
import shutil
import subprocess
import sys

import pytest

import simindex
from simindex.datasets import run

import dataset_trials
from trials import ENV


def test_two_dedup_runs_at_once_keep_each_text_once(tmp_path):
    for trial in range(2):
        got = dataset_trials.two_runs(tmp_path / str(trial), 9000, seed=trial)
        assert got["failed runs"] == 0, got["errors"]
        assert (got["kept by both"], got["kept by neither"]) == (0, 0), got
        assert got["records"] == 9000 and got["problems"] == []


def test_two_runs_of_the_components_mode_at_once_keep_each_text_once(tmp_path):
    """A components run admits its kept rows in one transaction that judges them again
    against what the other run admitted since its first query."""
    for trial in range(1):
        got = dataset_trials.two_runs(tmp_path / str(trial), 6000, trial, "--mode",
                                      "components")
        assert got["failed runs"] == 0, got["errors"]
        assert (got["kept by both"], got["kept by neither"]) == (0, 0), got
        assert got["records"] == 6000 and got["problems"] == []


def test_a_crawler_beside_a_run_never_admits_what_the_run_keeps(tmp_path):
    for trial in range(1):
        got = dataset_trials.crawler_beside_a_run(tmp_path / str(trial), 6000, seed=trial)
        assert got["failed"] == 0, got["errors"]
        assert (got["kept and admitted"], got["taken by neither"]) == (0, 0), got


def test_a_components_run_judges_its_groups_again_against_records_admitted_meanwhile(
        tmp_path):
    """A record another writer admits after the run's first query (here from the on_error
    call of the run's last, bad row, in a later batch, before the run adds anything) joins
    the group it is near, as if it had been there before: that group keeps nothing."""
    t = dataset_trials.texts(2 + run.BATCH, seed=7)
    path = tmp_path / "in.jsonl"
    dataset_trials.write_jsonl(path, [{"id": "r1", "text": t[0]},
                                      {"id": "r2", "text": t[0] + " plus a tail"},
                                      *({"id": f"r{i + 1}", "text": x}
                                        for i, x in enumerate(t[1:], 2))])
    with open(path, "a") as f:
        f.write("not json\n")
    index = str(tmp_path / "idx")
    for options in ({}, {"min_similarity": 0.7}):
        simindex.Index(index, calibration=simindex.calibrate([], 0.7) if options else None,
                       k=None if options else 3).close()
        other = simindex.Index(index, sync=False)     # the run's own setting: one store

        def meanwhile(bad):
            other.add_text("crawled", t[0] + " plus a tail")
        got = list(simindex.decisions([str(path)], id_field="id", index=index,
                                      mode="components", on_error=meanwhile, **options))
        other.close()
        assert [(d.id, d.kept, d.match) for d in got[:3]] == \
            [("r1", False, "crawled"), ("r2", False, "crawled"), ("r3", True, None)]
        assert all(d.kept for d in got[2:]) and len(got) == len(t) + 1
        with simindex.Index(index, readonly=True) as idx:
            assert "r1" not in idx and "r2" not in idx and len(idx) == len(t)
        shutil.rmtree(index)


def test_a_full_disk_while_outputs_are_written_leaves_all_of_them_or_none(tmp_path):
    """Outputs of one run on a filling disk: at every free space, either every output is
    the complete one, or every path holds what it held before; no temporary file stays."""
    src = dataset_trials.publish_inputs(tmp_path)
    complete, kib = dataset_trials.complete_outputs(tmp_path, src)
    codes = set()
    # around what the three take: the last buffers of one output, then another, fail
    for free in [kib + d for d in (-400, -20, -12, -4, 0, 400)]:
        got = dataset_trials.full_disk_publish(tmp_path, src, free, complete)
        if got is None:
            pytest.skip("no tmpfs can be mounted in a private namespace here")
        wrong, rc = got
        assert wrong == [], (free, wrong)
        codes.add(rc)
    assert codes == {0, 1}               # the sweep saw runs fail and runs complete


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_failed_sync_or_rename_while_outputs_are_published_leaves_all_or_none(tmp_path):
    """Each fsync and each rename of a run failing in turn (strace injects the error): the
    outputs are all the complete ones, or all as they were."""
    src = dataset_trials.publish_inputs(tmp_path, rows=600)
    complete, _ = dataset_trials.complete_outputs(tmp_path, src)
    failed = 0
    for syscall, calls in (("fsync", 6), ("rename", 4)):
        for when in range(1, calls + 1):
            wrong, rc = dataset_trials.injected_publish(tmp_path, src, syscall, when,
                                                        complete)
            assert wrong == [], (syscall, when, wrong)
            failed += rc != 0
    assert failed >= 6


def _sig(text):
    from simindex.datasets.check import Shingles
    from simindex.signatures.similarity import fingerprint_and_set
    fp, s = fingerprint_and_set(text, "minhash-v1", 128)
    return fp, Shingles.of_set(s)


def test_a_batch_judged_again_when_the_map_grows_keeps_the_sets_it_now_keeps(
        tmp_path, monkeypatch):
    """A batch's admission runs again from its start when the map must grow; another
    process may admit a record in between, so the second run can keep other rows than the
    first: the exact shingle sets kept for later rows' checks are the second run's."""
    from simindex.datasets import run as runmod
    from simindex.datasets.check import Check
    from simindex.engine import store, transactions
    rnd = random.Random(5)
    check = Check(0.7, "jaccard", b"x" * 8, None)
    x = [rnd.choice(dataset_trials.WORDS) for _ in range(80)]

    def variant(lo, hi, n):
        v = list(x)
        for j in rnd.sample(range(lo, hi), n):
            v[j] = rnd.choice(dataset_trials.WORDS)
        return " ".join(v)
    xt = " ".join(x)
    xf, xs = _sig(xt)
    near = lambda a, b: bin(a[0] ^ b[0]).count("1") <= 29 and check(a[1], b[1])[0]  # noqa
    for _ in range(20000):                # Y near X, F near X, Y not near F
        yt, ft = variant(0, 40, rnd.randint(2, 5)), variant(40, 80, rnd.randint(2, 5))
        y, f = _sig(yt), _sig(ft)
        if near(y, (xf, xs)) and near((xf, xs), f) and not near(y, f):
            break
    src = tmp_path / "in.jsonl"
    dataset_trials.write_jsonl(src, [{"id": "X", "text": xt}, {"id": "Y", "text": yt},
                                     {"id": "Z", "text": " ".join(dataset_trials.texts(1, 9))}])
    index = str(tmp_path / "idx")
    simindex.Index(index, calibration=simindex.calibrate([], 0.7)).close()
    fired = []
    put, grow = store.Admission.put, transactions.TxnRunner._grow

    def full_once(self, *args):
        if args[0] and not fired:
            fired.append(1)
            raise simindex.MapFullError("the map is full")
        return put(self, *args)

    def grow_while_another_admits(self, env):
        # between the two runs, another process admits F: X is now a near-copy of it
        subprocess.run([sys.executable, "-c", "import sys, simindex\n"
                        "simindex.Index(sys.argv[1]).add_text('F', sys.argv[2])", index, ft],
                       check=True, env=ENV)
        return grow(self, env)
    monkeypatch.setattr(store.Admission, "put", full_once)
    monkeypatch.setattr(transactions.TxnRunner, "_grow", grow_while_another_admits)
    spilled = {}
    judged = runmod._Judge.batch

    def batch(self, *a, **kw):
        out = judged(self, *a, **kw)
        spilled.update({r: self.check.spill.get([0, n]) is not None
                        for r, n in (("X", 1), ("Y", 2), ("Z", 3))})
        return out
    monkeypatch.setattr(runmod._Judge, "batch", batch)
    got = list(simindex.decisions([str(src)], id_field="id", index=index, min_similarity=0.7))
    assert fired
    assert [(d.id, d.kept, d.match) for d in got] == \
        [("X", False, "F"), ("Y", True, None), ("Z", True, None)]
    assert spilled == {"X": False, "Y": True, "Z": True}


def test_a_ray_run_s_own_rows_added_for_an_earlier_part_are_not_another_writer_s(
        tmp_path, monkeypatch):
    """dedup --ray adds its kept rows in parts of one admission: a kept row near one it
    added for an earlier part (passing by the sketches, though not exactly) is not taken
    for a near-copy another writer admitted (the other writer's record here is near in
    bits only, so the row is looked at)."""
    dd = pytest.importorskip("simindex.distributed.datasets")
    from types import SimpleNamespace
    from simindex.datasets.check import Check
    from simindex.engine.codec import Packed, pack_meta
    monkeypatch.setattr(dd, "fetch", lambda x: x)      # the parts' counts, at hand
    rnd = random.Random(1)
    check = Check(0.7, "jaccard", b"T" * 8, None)
    x = [rnd.choice(dataset_trials.WORDS) for _ in range(600)]

    def variant(n):
        v = list(x)
        for j in rnd.sample(range(len(v)), n):
            v[j] = rnd.choice(dataset_trials.WORDS)
        return " ".join(v)
    xf, xs = _sig(" ".join(x))
    sk = lambda s: (s.sketch, len(s.set))            # noqa: E731
    for _ in range(4000):      # Y: within k of X, not similar exactly, similar by sketches
        yf, ys = _sig(variant(rnd.randint(25, 45)))
        if bin(xf ^ yf).count("1") <= 29 and not check(xs, ys)[0] and \
                check.sketches(sk(xs), sk(ys)):
            break
    for _ in range(4000):      # O: within k of X, similar to neither X nor Y
        ot = variant(rnd.randint(45, 70))
        of, os_ = _sig(ot)
        if bin(xf ^ of).count("1") <= 29 and not check.sketches(sk(xs), sk(os_)) and \
                not check.sketches(sk(ys), sk(os_)):
            break
    path = str(tmp_path / "idx")       # a radius of bits, as dedup --ray searches
    simindex.Index(path, calibration=simindex.calibrate([], 0.7, bands=False)).close()
    with simindex.Index(path, sync=False) as idx:
        since = idx._admit(lambda adm: adm.last_seq)
        with simindex.Index(path, sync=False) as other:
            other.add_text("O", ot)
        meta = lambda pos, s: Packed(pack_meta([b"T" * 8, pos], None, sk(s)))  # noqa
        adds = [("Y", yf, meta([0, 1], ys))]
        adds += [(f"f{i}", rnd.getrandbits(128), [b"T" * 8, [0, i + 2]])
                 for i in range(dd.BATCH - 1)]
        adds.append(("X", xf, meta([0, dd.BATCH + 1], xs)))
        job = SimpleNamespace(check=(0.7, "jaccard", b"T" * 8), k=29, width=128)
        dd._admit(idx, since, job, ["in.jsonl"], [{"adds": adds}])
        assert "X" in idx and "Y" in idx and len(idx) == dd.BATCH + 2
