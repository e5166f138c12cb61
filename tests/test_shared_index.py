"""A shared index is a shared decision: `simindex dedup --index` runs and a crawler's
add_unique_text, each in its own process on one index at once, never both keep a text.
Real processes racing (tools/reliability.py runs the same trials 20 times and more)."""

import shutil

import pytest

import simindex
from simindex.datasets import run

import dataset_trials


def test_two_dedup_runs_at_once_keep_each_text_once(tmp_path):
    for trial in range(3):
        got = dataset_trials.two_runs(tmp_path / str(trial), 9000, seed=trial)
        assert got["failed runs"] == 0, got["errors"]
        assert (got["kept by both"], got["kept by neither"]) == (0, 0), got
        assert got["records"] == 9000 and got["problems"] == []


def test_two_runs_of_the_components_mode_at_once_keep_each_text_once(tmp_path):
    """A components run admits its kept rows in one transaction that judges them again
    against what the other run admitted since its first query."""
    for trial in range(2):
        got = dataset_trials.two_runs(tmp_path / str(trial), 6000, trial, "--mode",
                                      "components")
        assert got["failed runs"] == 0, got["errors"]
        assert (got["kept by both"], got["kept by neither"]) == (0, 0), got
        assert got["records"] == 6000 and got["problems"] == []


def test_a_crawler_beside_a_run_never_admits_what_the_run_keeps(tmp_path):
    for trial in range(2):
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


def test_a_ray_run_adds_nothing_when_another_writer_admitted_a_near_copy_meanwhile(
        local_ray, tmp_path):
    """dedup --ray writes its outputs before it adds its kept rows: a near-copy of one of
    them that another writer admitted after the run's queries makes it add nothing,
    publish nothing and say so (here admitted from the on_error call of a bad row, which
    the driver makes between the queries and the adds)."""
    ray_dedup = pytest.importorskip("simindex.distributed.datasets")
    t = dataset_trials.texts(20, seed=11)
    path = tmp_path / "in.jsonl"
    dataset_trials.write_jsonl(path, [{"id": f"r{i}", "text": x} for i, x in enumerate(t)])
    with open(path, "a") as f:
        f.write("not json\n")
    index = str(tmp_path / "idx")
    simindex.Index(index, k=3).close()
    other = simindex.Index(index, sync=False)

    def meanwhile(bad):
        other.add_text("crawled", t[5])
    out = tmp_path / "out"
    with pytest.raises(simindex.ParameterError, match=r"in.jsonl:6: another writer added "
                       r"'crawled' to the index while this run ran"):
        ray_dedup.dedup([str(path)], str(out), id_field="id", index=index, on_error=meanwhile)
    other.close()
    assert not out.exists()
    with simindex.Index(index, readonly=True) as idx:
        assert len(idx) == 1 and "crawled" in idx
    # run again: the row is judged against it
    got = ray_dedup.dedup([str(path)], str(out), id_field="id", index=index,
                          on_error=lambda bad: None)
    assert (got.kept, got.removed) == (19, 1)


def test_a_full_disk_while_outputs_are_written_leaves_all_of_them_or_none(tmp_path):
    """Outputs of one run on a filling disk: at every free space, either every output is
    the complete one, or every path holds what it held before; no temporary file stays."""
    src = dataset_trials.publish_inputs(tmp_path)
    complete, kib = dataset_trials.complete_outputs(tmp_path, src)
    codes = set()
    # around what the three take: the last buffers of one output, then another, fail
    for free in [kib + d for d in (-400, -36, -28, -20, -16, -12, -8, -4, 0, 8, 400)]:
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
