"""What `simindex dedup` does with bad rows and with its outputs, as `build` does and a
careful operator expects: every per-row fault (encoding, quoting, ids) names its file and
line and can be skipped; two outputs on one path are refused before anything is read;
files keep the umask's mode or an existing file's; a killed run's scratch is removed by
the next. Real CLI processes."""

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from trials import ENV

TEXT = "the quick brown fox jumps over the lazy dog near the river bank today"


def run(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "simindex", *map(str, args)],
                          env=env or ENV, capture_output=True, text=True, timeout=300, **kw)


def lines(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(x) for x in f]


def test_two_outputs_on_one_path_are_refused_before_anything_is_read(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": TEXT}) + "\n")
    for other in ("--removed", "--clusters"):
        r = run("dedup", src, "--output", tmp_path / "x", other, tmp_path / "x")
        assert r.returncode == 1 and "name the same path" in r.stderr, r.stderr
        assert not (tmp_path / "x").exists()
    r = run("dedup", src, "-o", tmp_path / "x", "--removed", tmp_path / "." / "x")
    assert r.returncode == 1 and "name the same path" in r.stderr


def test_a_csv_quote_left_open_is_a_bad_row_never_rows_merged_into_it(tmp_path):
    src = tmp_path / "q.csv"
    src.write_text(f'id,text\ng1,{TEXT} one\ng2,"{TEXT} two\ng3,{TEXT} three x\n'
                   f'g4,"quoted, {TEXT} four"\ng5,{TEXT} five y z\n')
    out = tmp_path / "o.csv"
    r = run("dedup", src, "-o", out, "--id-field", "id", "--k", "0")
    assert r.returncode == 1 and "q.csv:3: not valid CSV" in r.stderr \
        and "lines 3 to 5 are one bad row" in r.stderr, r.stderr
    assert not out.exists()
    r = run("dedup", src, "-o", out, "--id-field", "id", "--k", "0", "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    assert "q.csv:3: not valid CSV" in r.stderr and "simindex: skipped" in r.stderr
    with open(out) as f:
        assert [row.split(",")[0] for row in f.read().splitlines()[1:]] == ["g1", "g5"]


def test_invalid_utf8_in_a_row_is_that_row_s_fault_and_can_be_skipped(tmp_path):
    rows = [json.dumps({"id": f"r{i}", "text": f"{TEXT} {i} {'x' * i}"}).encode()
            for i in range(600)]
    rows[500] = rows[500].replace(b"quick", b"qu\xe9ck")
    src = tmp_path / "mid.jsonl"
    src.write_bytes(b"\n".join(rows) + b"\n")
    csv_src = tmp_path / "mid.csv"
    csv_src.write_bytes(b"id,text\na,caf\xe9 " + TEXT.encode() + b"\nb," + TEXT.encode() + b"\n")
    for inp, where, rows in ((src, "mid.jsonl:501: invalid UTF-8: byte 0xe9", 600),
                             (csv_src, "mid.csv:2: invalid UTF-8: byte 0xe9", 2)):
        out = tmp_path / f"out-{inp.name}"
        r = run("dedup", inp, "-o", out, "--id-field", "id", "--k", "0")
        assert r.returncode == 1 and where in r.stderr, r.stderr
        r = run("dedup", inp, "-o", out, "--id-field", "id", "--k", "0", "--on-error", "skip")
        assert r.returncode == 0 and where in r.stderr and "skipped" in r.stderr, r.stderr
        assert f"rows in {rows}," in r.stderr and "skipped 1," in r.stderr


BAD_IDS = [
    ("x" * 600, "id is 600 bytes long; the limit is 510 bytes"),
    ("\ud800", "id '\\ud800' is not valid Unicode text"),
    ("", "id is empty"),
    ("a\tb", "id 'a\\tb' contains a tab or a line break"),
    ("a\nb", "id 'a\\nb' contains a tab or a line break"),
]


def test_an_id_build_refuses_is_a_bad_row_of_dedup_too(tmp_path):
    src = tmp_path / "in.jsonl"
    with open(src, "w") as f:
        f.write(json.dumps({"id": "ok", "text": TEXT}) + "\n")
        for n, (bad_id, _) in enumerate(BAD_IDS):
            f.write(json.dumps({"id": bad_id, "text": f"{TEXT} and {n} more words"}) + "\n")
    out = tmp_path / "o.jsonl"
    r = run("build", tmp_path / "idx", src, "--on-error", "skip")
    got = run("dedup", src, "-o", out, "--id-field", "id", "--index", tmp_path / "kept",
              "--on-error", "skip")
    for line, (_, why) in enumerate(BAD_IDS, 2):
        assert f"{src}:{line}: {why}" in r.stderr, r.stderr
        assert f"simindex: skipped {src}:{line}: {why}" in got.stderr, got.stderr
    assert got.returncode == 0 and [x["id"] for x in lines(out)] == ["ok"]
    r = run("dedup", src, "-o", out, "--id-field", "id", "--index", tmp_path / "kept")
    assert r.returncode == 1 and f"{src}:2: {BAD_IDS[0][1]}" in r.stderr, r.stderr


def test_messages_name_the_option_that_fixes_them(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"body": TEXT}) + "\n")
    r = run("dedup", src, "-o", tmp_path / "o.jsonl", "--min-similarity", "0.7")
    assert r.returncode == 1 and "(--text-field)" in r.stderr, r.stderr
    r = run("dedup", src, "-o", tmp_path / "missing" / "dir" / "o.jsonl")
    assert r.returncode == 1 and "the folder" in r.stderr and "does not exist" in r.stderr \
        and ".tmp" not in r.stderr, r.stderr
    r = run("dedup", src, "-o", tmp_path / "o.jsonl", "--text-field", "body", "--against",
            tmp_path / "nowhere")
    assert r.returncode == 1 and "nowhere does not exist" in r.stderr and \
        "readonly=True" not in r.stderr, r.stderr


def test_an_empty_input_keeps_nothing_alike_with_and_without_a_threshold(tmp_path):
    src = tmp_path / "empty.jsonl"
    src.write_text("")
    for extra in ([], ["--min-similarity", "0.7", "--index", tmp_path / "idx"]):
        out = tmp_path / "o.jsonl"
        r = run("dedup", src, "-o", out, *extra)
        assert r.returncode == 0, r.stderr
        assert out.read_text() == ""
    assert not (tmp_path / "idx").exists()     # no index made at a radius never chosen


def test_outputs_take_the_umask_s_mode_or_keep_an_existing_file_s(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": TEXT}) + "\n")
    out, removed = tmp_path / "o.jsonl", tmp_path / "r.jsonl"
    r = run("dedup", src, "-o", out, "--removed", removed,
            preexec_fn=lambda: os.umask(0o022))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o644 == stat.S_IMODE(removed.stat().st_mode)
    os.chmod(out, 0o640)
    r = run("dedup", src, "-o", out, preexec_fn=lambda: os.umask(0o077))
    assert r.returncode == 0 and stat.S_IMODE(out.stat().st_mode) == 0o640


def test_the_scratch_of_a_killed_run_is_removed_by_the_next(tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(ENV, TMPDIR=str(scratch))
    src = tmp_path / "in.jsonl"
    with open(src, "w") as f:
        for i in range(40000):
            f.write(json.dumps({"text": f"{TEXT} {i} {i * 7} {i * 13}"}) + "\n")
    p = subprocess.Popen([sys.executable, "-m", "simindex", "dedup", str(src), "-o",
                          str(tmp_path / "o.jsonl"), "-q"], env=env)
    end = time.time() + 60
    while not any(n.startswith("simindex-dedup-") for n in os.listdir(scratch)):
        assert time.time() < end and p.poll() is None
        time.sleep(0.01)
    time.sleep(0.3)
    p.send_signal(signal.SIGKILL)
    p.wait()
    left = [n for n in os.listdir(scratch) if n.startswith("simindex-dedup-")]
    assert len(left) == 1
    # a live run's scratch is left alone: this one holds its lock while the next runs
    live = tempfile.mkdtemp(prefix="simindex-dedup-", dir=scratch)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"),
        os.path.join(live, ".simindex-run.lock")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    try:
        small = tmp_path / "small.jsonl"
        small.write_text(json.dumps({"text": TEXT}) + "\n")
        r = run("dedup", small, "-o", tmp_path / "o2.jsonl", env=env)
        assert r.returncode == 0, r.stderr
        assert sorted(n for n in os.listdir(scratch) if n.startswith("simindex-dedup-")) == \
            [os.path.basename(live)]
    finally:
        holder.kill()


def test_a_finished_output_waiting_to_be_published_is_not_taken_for_a_killed_run_s(tmp_path):
    """Between its last write and its rename, a run's temporary output stays locked: a run
    that starts then (writing the same path) leaves it alone."""
    from simindex.datasets.publish import publish
    from simindex.datasets.rows import RowWriter
    out = tmp_path / "o.jsonl"
    w = RowWriter(str(out), "jsonl")
    w.write({"text": "first run"})
    w.finish()                                 # written, synced, closed: not yet renamed
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": TEXT}) + "\n")
    r = run("dedup", src, "-o", out)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(w.tmp)
    publish([(w.tmp, w.path)])
    w.release()
    assert lines(out) == [{"text": "first run"}]


def test_ray_failing_to_start_is_a_message_not_a_traceback(tmp_path, monkeypatch, capsys):
    ray = pytest.importorskip("ray")
    from simindex.cli import main

    def fails(*args, **kw):
        raise Exception("The current node timed out during startup")   # as Ray raises it
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fails)
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": TEXT}) + "\n")
    assert main(["dedup", str(src), "-o", str(tmp_path / "o"), "--ray"]) == 1
    err = capsys.readouterr().err
    assert "cannot start or join the Ray cluster" in err and "timed out during startup" \
        in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()
