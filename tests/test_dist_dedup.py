"""`simindex dedup --ray` and simindex.distributed.dedup on a real local Ray (loopback only):
for every mode and option, the rows kept, the removed report and the groups are exactly
those of the one-machine command on the same files; a worker killed mid-run or a run
killed as a whole and started again changes nothing in what is written."""

import importlib
import inspect
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

import simindex
from simindex.engine import environments, manifest, records
from simindex.engine.transactions import TxnRunner
import dataset_trials
from trials import ENV

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'simindex[ray]')")
dist_dedup = pytest.importorskip("simindex.distributed.datasets")
pq = pytest.importorskip("pyarrow.parquet")
psutil = pytest.importorskip("psutil")

MODULES = ("argparse", "inspect", "typing", "email.message", "http.client", "json.decoder",
           "csv", "difflib", "textwrap", "logging")


def paragraphs(count, words=120):
    """Real text: runs of words from the sources of standard-library modules."""
    out = []
    for name in MODULES:
        w = inspect.getsource(importlib.import_module(name)).split()
        out += [" ".join(w[i:i + words]) for i in range(0, len(w) - words, words)]
    random.Random(1).shuffle(out)
    return out[:count]


def corpus(seed, count=240):
    """Rows of real text with near-copies planted at 0 to 30 changed words (so kept rows,
    removed rows, chains and rows that only the threshold tells apart all occur), shuffled
    so copies land in other files than their originals."""
    rng = random.Random(seed)
    rows = []
    for i, text in enumerate(paragraphs(count)):
        rows.append({"id": f"d{i}", "text": text, "score": rng.randrange(100)})
        for c in range(rng.choice([0, 0, 1, 2, 3])):
            w = text.split()
            for _ in range(rng.choice([0, 1, 2, 4, 8, 16, 30])):
                w[rng.randrange(len(w))] = rng.choice(["alpha", "beta", "gamma", "delta"])
            rows.append({"id": f"d{i}c{c}", "text": " ".join(w), "score": rng.randrange(100)})
    rng.shuffle(rows)
    return rows


def write_shards(directory, rows, files, fmt):
    os.makedirs(directory, exist_ok=True)
    for f in range(files):
        part = rows[f::files]
        path = os.path.join(directory, f"shard-{f}.{fmt}")
        if fmt == "parquet":
            import pyarrow as pa
            pq.write_table(pa.Table.from_pylist(part), path)
        else:
            with open(path, "w", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in part)
    return str(directory)


def rows_of(path):
    """The rows of an output: a file, or a directory's part files in name order."""
    if os.path.isdir(path):
        return [r for n in sorted(os.listdir(path)) for r in rows_of(os.path.join(path, n))]
    if path.endswith(".parquet"):
        return pq.read_table(path).to_pylist()
    if path.endswith(".csv"):
        import csv
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def env():
    """The tests' environment, with what this process's Ray set (its token) for a CLI run
    that joins it."""
    return dict(os.environ, PYTHONPATH=ENV["PYTHONPATH"])


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "simindex", "dedup", *map(str, args)],
                          env=env(), capture_output=True, text=True, timeout=timeout)


def one_machine(tmp, inputs, name, fmt, *options):
    out = os.path.join(tmp, f"{name}.{fmt}")
    r = cli(inputs, "-o", out, "--removed", out + ".removed", "--clusters", out + ".clusters",
            *options)
    assert r.returncode == 0, r.stderr
    return out


def assert_same(one, distributed):
    assert rows_of(distributed) == rows_of(one)
    assert rows_of(distributed + ".removed") == rows_of(one + ".removed")
    # the groups' lines, in the order of their parts
    assert sorted(map(json.dumps, rows_of(distributed + ".clusters"))) == \
        sorted(map(json.dumps, rows_of(one + ".clusters")))


def ray_run(tmp, inputs, name, **options):
    out = os.path.join(tmp, name)
    dist_dedup.dedup(inputs, out, removed=out + ".removed", clusters=out + ".clusters",
                     **options)
    return out


# the runs compared name the scheme they search with: minhash-v1's radius, or the band
# search of minhash-lsh-v1 (which a threshold alone chooses for large inputs)
MH = ["--scheme", "minhash-v1"]
BANDS = "minhash-lsh-v1-r2"
BANDS16 = "minhash-lsh-v1-b16-r2"      # 16 bands: 512-bit codes, a table per band
OPTIONS = [
    ("greedy", ["--k", "8"], dict(k=8)),
    ("components", ["--k", "8", "--mode", "components"], dict(k=8, mode="components")),
    ("jaccard", ["--min-similarity", "0.7", *MH], dict(min_similarity=0.7)),
    ("jaccard-components", ["--min-similarity", "0.7", "--mode", "components", *MH],
     dict(min_similarity=0.7, mode="components")),
    ("keep-column-annotated", ["--k", "10", "--keep", "score", "--annotate"],
     dict(k=10, keep="score", annotate=True)),
    ("drop-all", ["--k", "10", "--drop-all"], dict(k=10, drop_all=True)),
    ("containment-longest", ["--min-similarity", "0.6", "--containment", "--keep", "longest",
                             *MH], dict(min_similarity=0.6, containment=True, keep="longest")),
    ("wide", ["--k", "20", "--width", "128"], dict(k=20, width=128)),
    ("bands", ["--min-similarity", "0.7", "--scheme", BANDS, "--annotate"],
     dict(min_similarity=0.7, scheme=BANDS, annotate=True)),
    ("bands-components", ["--min-similarity", "0.6", "--scheme", BANDS, "--mode",
                          "components", "--keep", "longest"],
     dict(min_similarity=0.6, scheme=BANDS, mode="components", keep="longest")),
    ("bands-16", ["--min-similarity", "0.6", "--scheme", BANDS16],
     dict(min_similarity=0.6, scheme=BANDS16)),
    # band codes searched by bits within the band plan's k, not by bands
    ("bands-k", ["--min-similarity", "0.7", "--scheme", BANDS, "--k", "7"],
     dict(min_similarity=0.7, scheme=BANDS, k=7)),
]


# every option on Parquet shards, two of them on JSON lines too
CASES = [pytest.param("parquet", *o, id=f"{o[0]}-parquet") for o in OPTIONS] + \
    [pytest.param("jsonl", *o, id=f"{o[0]}-jsonl") for o in OPTIONS
     if o[0] in ("greedy", "jaccard-components", "bands")]


@pytest.mark.parametrize("fmt,name,args,kw", CASES)
def test_every_mode_keeps_what_one_machine_keeps(local_ray, tmp_path, fmt, name, args, kw):
    src = write_shards(tmp_path / "in", corpus(3), 4, fmt)
    one = one_machine(tmp_path, src, "one", fmt, "--id-field", "id", *args)
    got = ray_run(tmp_path, src, "ray", id_field="id", **kw)
    assert_same(one, got)
    assert len(rows_of(got + ".removed")) > 20 and len(os.listdir(got)) == 4


def stored_records(path):
    """(id, fingerprint, meta) of an index's live records, in insertion order."""
    env = environments.open_records(path, readonly=True, sync=True,
                                    sums=manifest.read(path).record_sums)
    runner = TxnRunner(path, [env], what=path)
    try:
        with simindex.Index(path, readonly=True) as idx:
            _, _, ids = runner.read_txn(env, lambda txn: records.live(txn, idx.width // 64))
            return [tuple(idx.get(i)) for i in ids]
    finally:
        runner.close(sync=False)


@pytest.mark.parametrize("mode,scheme", [("greedy", "minhash-v1"), ("components", "minhash-v1"),
                                         ("greedy", BANDS), ("components", BANDS),
                                         ("greedy", BANDS16)])
def test_runs_into_a_kept_index_then_against_it_match_one_machine(local_ray, tmp_path, mode,
                                                                  scheme):
    rows = corpus(5)
    first = write_shards(tmp_path / "first", rows[:len(rows) // 2], 2, "jsonl")
    later = write_shards(tmp_path / "later", rows[len(rows) // 2:], 3, "jsonl")
    common = ["--id-field", "id", "--min-similarity", "0.7", "--mode", mode]
    for run, src in (("a", first), ("b", later)):
        one = one_machine(tmp_path, src, f"one-{run}", "jsonl", *common, "--index",
                          tmp_path / "one-idx", *(["--scheme", scheme] if run == "a" else []))
        got = ray_run(tmp_path, src, f"ray-{run}", id_field="id", min_similarity=0.7,
                      mode=mode, index=str(tmp_path / "ray-idx"),
                      **({"scheme": scheme} if run == "a" else {}))
        assert_same(one, got)
    assert stored_records(tmp_path / "ray-idx") == stored_records(tmp_path / "one-idx")
    # against the kept index, with the radius it was calibrated for (a band index: its
    # band keys, of the run's own scheme)
    with simindex.Index(tmp_path / "one-idx", readonly=True) as idx:
        k, width = (None, None) if scheme in (BANDS, BANDS16) else (idx.k, idx.width)
    again = write_shards(tmp_path / "again", corpus(6), 2, "jsonl")
    ref = ["--scheme", scheme, "--min-similarity", "0.7"] + \
        ([] if k is None else ["--k", k, "--width", width])
    one = one_machine(tmp_path, again, "one-c", "jsonl", "--id-field", "id", "--mode", mode,
                      "--against", tmp_path / "one-idx", *ref)
    got = ray_run(tmp_path, again, "ray-c", id_field="id", mode=mode, k=k, width=width,
                  scheme=scheme, min_similarity=0.7, against=str(tmp_path / "ray-idx"))
    assert_same(one, got)
    assert any(r["reference"] for r in rows_of(got + ".removed"))


def test_the_cli_on_ray_writes_part_directories_and_refuses_what_it_cannot_do(local_ray,
                                                                              tmp_path):
    src = write_shards(tmp_path / "in", corpus(7), 3, "jsonl")
    one = one_machine(tmp_path, src, "one", "jsonl", "--id-field", "id", "--k", "8")
    out = tmp_path / "ray"
    r = cli(src, "-o", out, "--removed", f"{out}.removed", "--clusters", f"{out}.clusters",
            "--id-field", "id", "--k", "8", "--ray", local_ray)
    assert r.returncode == 0, r.stderr
    assert_same(one, str(out))
    assert sorted(os.listdir(out)) == ["part-00000.jsonl", "part-00001.jsonl",
                                       "part-00002.jsonl"]
    assert "simindex dedup: rows in" in r.stderr
    # a second run replaces the parts whole
    r = cli(src, "-o", out, "--id-field", "id", "--k", "0", "--ray", local_ray)
    assert r.returncode == 0, r.stderr
    assert len(rows_of(str(out))) > len(rows_of(one))
    r = cli(src, "-o", out, "--ray", local_ray, "--jobs", "2")
    assert r.returncode == 2 and "--jobs" in r.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    r = cli(src, "-o", tmp_path / "mine", "--ray", local_ray)
    assert r.returncode == 1 and "notes.txt" in r.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    bad = tmp_path / "bad"
    write_shards(bad, corpus(7)[:50], 2, "jsonl")
    with open(bad / "shard-1.jsonl", "a") as f:
        f.write('{"id": "x", "txt": "no text"}\n')
    r = cli(bad, "-o", tmp_path / "o", "--ray", local_ray, "--id-field", "id")
    assert r.returncode == 1 and "shard-1.jsonl:26: text field" in r.stderr
    assert "no output was written" in r.stderr and not (tmp_path / "o").exists()
    r = cli(bad, "-o", tmp_path / "o", "--ray", local_ray, "--id-field", "id",
            "--on-error", "skip")
    assert r.returncode == 0 and "skipped" in r.stderr and "skipped 1" in r.stderr


def big_corpus(tmp_path):
    """Files large enough that a worker can be killed while it reads one."""
    rows = corpus(8, count=400)
    rows = [dict(r, id=f"{r['id']}.{n}", text=f"{r['text']} copy {n}") for n in range(12)
            for r in rows]
    return write_shards(tmp_path / "big", rows, 4, "jsonl")


def meanwhile(act, run):
    """(run()'s result, whether `act` succeeded): `act()` tried again and again on another
    thread while `run()` runs, until it returns True (at most 60 s)."""
    done = []

    def keep_trying():
        end = time.time() + 60
        while not done and time.time() < end:
            if act():
                done.append(True)
                return
            time.sleep(0.002)
    t = threading.Thread(target=keep_trying)
    t.start()
    try:
        return run(), bool(done)
    finally:
        done.append(False)
        t.join()


def test_a_worker_killed_mid_run_changes_nothing(local_ray, tmp_path):
    src = big_corpus(tmp_path)
    one = one_machine(tmp_path, src, "one", "jsonl", "--id-field", "id", "--k", "6")

    def a_reader():
        for p in psutil.process_iter(["cmdline"]):
            if any("ray::_read" in c for c in (p.info["cmdline"] or [])):
                os.kill(p.pid, signal.SIGKILL)
                return True
        return False
    got, killed = meanwhile(a_reader, lambda: ray_run(tmp_path, src, "ray", id_field="id",
                                                     k=6))
    assert killed, "no read task was seen running"
    assert_same(one, got)


def test_a_run_killed_and_run_again_writes_what_an_uninterrupted_run_writes(local_ray,
                                                                             tmp_path):
    src = big_corpus(tmp_path)
    args = ["--id-field", "id", "--min-similarity", "0.7", "--ray", local_ray]
    want = cli(src, "-o", tmp_path / "want", "--removed", tmp_path / "want.removed",
               "--index", tmp_path / "want-idx", *args)
    assert want.returncode == 0, want.stderr
    cmd = [sys.executable, "-m", "simindex", "dedup", src, "-o", str(tmp_path / "o"),
           "--removed", str(tmp_path / "o.removed"), "--index", str(tmp_path / "idx"), *args]
    for delay in (1.0, 2.5):
        p = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.communicate()
        assert p.returncode == -signal.SIGKILL, "the run ended before it was killed"
        assert not (tmp_path / "o").exists() and not (tmp_path / "o.removed").exists()
    r = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert rows_of(str(tmp_path / "o")) == rows_of(str(tmp_path / "want"))
    assert rows_of(str(tmp_path / "o.removed")) == rows_of(str(tmp_path / "want.removed"))
    assert stored_records(tmp_path / "idx") == stored_records(tmp_path / "want-idx")
    assert not [n for n in os.listdir(tmp_path) if "simindex-partial" in n]


def write_files(directory, files):
    """Input files from {name: rows}; a row given as a str is written as the line itself."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for name, rows in files.items():
        path = os.path.join(directory, name)
        paths.append(path)
        if name.endswith(".parquet"):
            import pyarrow as pa
            pq.write_table(pa.Table.from_pylist(rows), path)
        elif name.endswith(".csv"):
            import csv
            with open(path, "w", newline="", encoding="utf-8") as fh:
                w = csv.DictWriter(fh, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
        else:
            with open(path, "w", encoding="utf-8") as fh:
                fh.writelines((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    return paths


def one_machine_result(tmp, inputs, fmt, *options):
    """(return code, stderr, kept rows, removed rows) of the one-machine command."""
    out = os.path.join(tmp, f"one.{fmt}")
    r = cli(*inputs, "-o", out, "--removed", out + ".removed", *options)
    if r.returncode:
        return r.returncode, r.stderr, None, None
    return 0, r.stderr, rows_of(out), rows_of(out + ".removed")


def test_an_id_repeated_by_kept_rows_fails_as_on_one_machine(local_ray, tmp_path):
    a, b = paragraphs(2)
    src = write_files(tmp_path / "in", {"a.jsonl": [{"id": "x", "text": a}],
                                        "b.jsonl": [{"id": "x", "text": b}]})
    rc, err, _, _ = one_machine_result(tmp_path, src, "jsonl", "--id-field", "id", "--k", "3")
    assert rc == 1 and "b.jsonl:1: the id 'x' of a row to keep is given twice" in err
    with pytest.raises(simindex.IdExistsError, match="b.jsonl:1: the id 'x' of a row to "
                                                     "keep is given twice"):
        ray_run(tmp_path, src, "ray", id_field="id", k=3)
    assert not (tmp_path / "ray").exists()


def test_rows_without_the_keep_column_are_skipped_and_move_no_fingerprint(local_ray,
                                                                            tmp_path):
    rows = corpus(11, count=60)
    for n, r in enumerate(rows):
        if n % 3 == 0:
            del r["score"]
    src = write_shards(tmp_path / "in", rows, 2, "jsonl")
    args = ["--id-field", "id", "--k", "8", "--keep", "score", "--on-error", "skip"]
    one = one_machine(tmp_path, src, "one", "jsonl", *args)
    got = ray_run(tmp_path, src, "ray", id_field="id", k=8, keep="score", on_error="skip")
    assert_same(one, got)
    # the answer of the same files without the rows skipped
    write_files(tmp_path / "scored", {
        f"shard-{f}.jsonl": [r for r in rows[f::2] if "score" in r] for f in range(2)})
    want = one_machine(tmp_path, tmp_path / "scored", "want", "jsonl", *args)
    assert rows_of(got) == rows_of(want)
    assert [(r["id"], r["match"], r["distance"]) for r in rows_of(got + ".removed")] == \
        [(r["id"], r["match"], r["distance"]) for r in rows_of(want + ".removed")]


def test_bad_rows_are_skipped_or_stopped_on_in_input_order(local_ray, tmp_path):
    a, b = paragraphs(2)
    src = write_files(tmp_path / "in", {
        "a.jsonl": [{"id": "a1", "text": " .. "}, {"id": "a2", "text": a}, {"id": "a3"}],
        "b.jsonl": [{"id": "b1"}, {"id": "b2", "text": b}]})
    order = [f"{src[0]}:1", f"{src[0]}:3", f"{src[1]}:1"]
    rc, err, _, _ = one_machine_result(tmp_path, src, "jsonl", "--id-field", "id", "--k", "3",
                                       "--on-error", "skip")
    assert rc == 0
    assert [line.split()[2].rstrip(":") for line in err.splitlines()
            if line.startswith("simindex: skipped")] == order
    skipped = []
    ray_run(tmp_path, src, "ray", id_field="id", k=3, on_error=skipped.append)
    assert [e.where for e in skipped] == order
    rc, err, _, _ = one_machine_result(tmp_path, src, "jsonl", "--id-field", "id", "--k", "3")
    assert rc == 1 and f"error: {order[0]}: " in err
    with pytest.raises(simindex.errors.BadLine) as e:
        ray_run(tmp_path, src, "stopped", id_field="id", k=3)
    assert e.value.where == order[0]


def test_the_kept_lines_are_written_as_read_past_blank_and_bad_lines(local_ray, tmp_path):
    """A JSON lines output holds each kept row's line as the input has it (its spacing, its
    keys' order), also after a blank line and a bad row in the middle of a file: the bytes
    one machine writes."""
    a, b, c = paragraphs(3)
    lines = [json.dumps({"text": a, "id": "a"}), "", '{"id": "bad"}',
             '{ "id" : "b",   "text": ' + json.dumps(b) + " }",
             json.dumps({"id": "a-copy", "text": a}), json.dumps({"id": "c", "text": c})]
    src = tmp_path / "f.jsonl"
    src.write_text("\n".join(lines) + "\n")
    one = str(tmp_path / "one.jsonl")
    r = cli(src, "-o", one, "--id-field", "id", "--k", "3", "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    out = ray_run(tmp_path, [str(src)], "ray", id_field="id", k=3, on_error=lambda e: None)
    got = b"".join(open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out))
                   if n.endswith(".jsonl"))
    with open(one, "rb") as f:
        assert got == f.read() == ("\n".join(lines[i] for i in (0, 3, 5)) + "\n").encode()


def test_a_parquet_output_holds_the_columns_and_types_of_the_one_machine_file(local_ray,
                                                                               tmp_path):
    a, b, c = paragraphs(3)
    src = write_files(tmp_path / "in", {
        "a.jsonl": [{"id": "a1", "text": a, "n": 1}],
        "b.jsonl": [{"id": "b1", "text": b, "n": 2.5, "extra": "x"}, {"id": "b2", "text": c}]})
    args = ["--id-field", "id", "--k", "3", "--output-format", "parquet"]
    rc, err, kept, _ = one_machine_result(tmp_path, src, "parquet", *args)
    assert rc == 0, err
    got = ray_run(tmp_path, src, "ray", id_field="id", k=3, output_format="parquet")
    assert rows_of(got) == kept
    assert pq.read_table(got).schema == pq.read_table(tmp_path / "one.parquet").schema


def test_csv_files_with_other_headers_give_the_one_machine_rows(local_ray, tmp_path):
    a, b = paragraphs(2)
    src = write_files(tmp_path / "in", {"a.csv": [{"id": "a1", "text": a, "lang": "en"}],
                                        "b.csv": [{"text": b, "id": "b1"}]})
    rc, err, kept, _ = one_machine_result(tmp_path, src, "csv", "--id-field", "id", "--k", "3")
    assert rc == 0, err
    got = ray_run(tmp_path, src, "ray", id_field="id", k=3)
    assert rows_of(got) == kept
    with open(tmp_path / "one.csv", encoding="utf-8") as f:
        header = f.readline()
    assert [open(os.path.join(got, n), encoding="utf-8").readline()
            for n in sorted(os.listdir(got))] == [header, header]


def test_annotate_on_rows_that_hold_its_columns_adds_no_record(local_ray, tmp_path):
    a, b, c = paragraphs(3)
    src = write_files(tmp_path / "in", {
        "a.jsonl": [{"id": "a1", "text": a}, {"id": "a2", "text": b}],
        "b.jsonl": [{"id": "b1", "text": c, "simindex_cluster": 1}]})
    rc, err, _, _ = one_machine_result(tmp_path, src, "jsonl", "--id-field", "id", "--k", "3",
                                       "--mode", "components", "--annotate", "--index",
                                       tmp_path / "one-idx")
    assert rc == 1 and "b.jsonl:1: the row already has the column 'simindex_cluster'" in err
    with pytest.raises(simindex.errors.InputError, match="b.jsonl:1: the row already has"):
        ray_run(tmp_path, src, "ray", id_field="id", k=3, mode="components", annotate=True,
                index=str(tmp_path / "ray-idx"))
    assert not (tmp_path / "ray").exists()
    assert stored_records(tmp_path / "ray-idx") == stored_records(tmp_path / "one-idx") == []


def test_annotate_writes_parquet_values_as_one_machine(local_ray, tmp_path):
    import datetime
    a, b = paragraphs(2)
    when = datetime.datetime(2024, 1, 2, 3, 4, 5)
    src = write_files(tmp_path / "in", {"a.parquet": [{"id": "a1", "text": a, "at": when}],
                                        "b.parquet": [{"id": "b1", "text": b, "at": when}]})
    rc, err, kept, _ = one_machine_result(tmp_path, src, "parquet", "--id-field", "id",
                                          "--k", "3", "--annotate")
    assert rc == 0, err
    assert rows_of(ray_run(tmp_path, src, "ray", id_field="id", k=3, annotate=True)) == kept


def test_a_failed_run_leaves_no_part_for_the_next_run(local_ray, tmp_path):
    rows = corpus(12, count=300)
    rows = [dict(r, id=f"{r['id']}.{n}", text=f"{r['text']} copy {n}") for n in range(6)
            for r in rows]
    src = write_shards(tmp_path / "in", rows, 8, "jsonl")
    files = sorted(os.path.join(src, n) for n in os.listdir(src))
    with simindex.Index(tmp_path / "idx", k=8) as idx:
        first = json.loads(open(files[0], encoding="utf-8").readline())["id"]
        idx.add(first, 1)                    # the first file's first kept row: refused
    out = str(tmp_path / "out")
    with pytest.raises(simindex.IdExistsError, match="already names a record of the index"):
        dist_dedup.dedup(files, out, id_field="id", k=8, index=str(tmp_path / "idx"))
    dist_dedup.dedup(files[:2], out, id_field="id", k=8)
    assert sorted(os.listdir(out)) == ["part-00000.jsonl", "part-00001.jsonl"]


def test_an_output_in_a_missing_directory_fails_as_on_one_machine(local_ray, tmp_path):
    src = write_shards(tmp_path / "in", corpus(13, count=20), 2, "jsonl")
    r = cli(src, "-o", tmp_path / "no" / "such" / "one.jsonl", "--k", "3")
    assert r.returncode == 1 and "no/such does not exist" in r.stderr
    (tmp_path / "kept.jsonl").write_text("mine\n")
    with pytest.raises(simindex.errors.ParameterError, match="is a file"):
        dist_dedup.dedup(src, str(tmp_path / "ray"), removed=str(tmp_path / "kept.jsonl"), k=3)
    assert (tmp_path / "kept.jsonl").read_text() == "mine\n"
    assert sorted(os.listdir(tmp_path)) == ["in", "kept.jsonl"]
    with pytest.raises(simindex.ParameterError, match="none/such does not exist"):
        dist_dedup.dedup(src, str(tmp_path / "none" / "such" / "ray"), k=3)
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("mode", ["greedy", "components"])
def test_ties_across_the_one_machine_batches_resolve_alike(local_ray, tmp_path, mode):
    """More rows than one-machine batch (4096), planted at equal distances from each other
    and from records of an earlier run: the earlier record, then the earlier row wins."""
    rng = random.Random(14)
    centres = [rng.getrandbits(64) for _ in range(2000)]
    rows = [{"id": n if n % 3 else str(n), "score": rng.randrange(4),
             "fp": f"{rng.choice(centres) ^ (1 << rng.randrange(64)) ^ (1 << rng.randrange(64)):016x}"}
            for n in range(9000)]
    src = write_shards(tmp_path / "in", rows, 3, "jsonl")
    for name in ("one-idx", "ray-idx"):
        with simindex.Index(tmp_path / name, k=3) as idx:
            idx.add_many([(f"old{n}", c ^ (1 << 7)) for n, c in enumerate(centres[::5])])
    args = ["--id-field", "id", "--fingerprint-field", "fp", "--k", "3", "--mode", mode]
    one = one_machine(tmp_path, src, "one", "jsonl", *args, "--index", tmp_path / "one-idx")
    got = ray_run(tmp_path, src, "ray", id_field="id", fingerprint_field="fp", k=3, mode=mode,
                  index=str(tmp_path / "ray-idx"))
    assert_same(one, got)
    assert stored_records(tmp_path / "ray-idx") == stored_records(tmp_path / "one-idx")


def test_a_task_error_reads_as_the_one_machine_error(local_ray, tmp_path):
    a, b = paragraphs(2)
    src = write_files(tmp_path / "in", {"a.jsonl": [{"id": "a", "text": a},
                                                    {"id": "b", "text": b, "x": 1}]})
    want = "simindex: error: dict contains fields not in fieldnames: 'x' ("
    r = cli(*src, "-o", tmp_path / "one.csv", "--k", "0")
    assert r.returncode == 1 and want in r.stderr
    r = cli(*src, "-o", tmp_path / "ray", "--output-format", "csv", "--k", "0", "--ray",
            local_ray)
    assert r.returncode == 1 and want in r.stderr and "ray::" not in r.stderr


def test_what_killed_write_tasks_leave_is_neither_published_nor_in_the_way(local_ray,
                                                                          tmp_path):
    """A write task killed after it made its temporary part leaves that file behind in the
    run's folder (Ray runs the task again): it is not published, and one an earlier run
    published before it was removed does not stop the same command from running again.
    Here the leftover is dropped into the run's folder as soon as the folder appears."""
    rows = corpus(9, count=60)
    src = write_shards(tmp_path / "in", rows, 2, "jsonl")
    one = one_machine(tmp_path, src, "one", "jsonl", "--id-field", "id", "--k", "6")
    out = tmp_path / "ray"

    def a_leftover():
        for n in os.listdir(tmp_path):
            if n.startswith(".ray.simindex-partial-"):
                (tmp_path / n / ".part-00001.jsonl.x1y2z3w4.tmp").write_text('{"half": ')
                return True
        return False
    got, dropped = meanwhile(a_leftover, lambda: ray_run(tmp_path, src, "ray", id_field="id",
                                                        k=6))
    assert dropped, "the run's folder was never seen"
    assert sorted(os.listdir(out)) == ["part-00000.jsonl", "part-00001.jsonl"]
    assert_same(one, got)
    # an output folder that still holds such a leftover (published before it was tidied)
    (out / ".part-00000.jsonl.a1b2c3d4.tmp").write_text("{")
    again = ray_run(tmp_path, src, "ray", id_field="id", k=6)
    assert sorted(os.listdir(out)) == ["part-00000.jsonl", "part-00001.jsonl"]
    assert_same(one, again)


@pytest.mark.parametrize("scheme", [None, BANDS])
def test_a_ray_run_adds_nothing_when_another_writer_admitted_a_near_copy_meanwhile(
        local_ray, tmp_path, scheme):
    """dedup --ray writes its outputs before it adds its kept rows: a near-copy of one of
    them that another writer admitted after the run's queries makes it add nothing,
    publish nothing and say so (here admitted from the on_error call of a bad row, which
    the driver makes between the queries and the adds)."""
    t = dataset_trials.texts(20, seed=11)
    path = tmp_path / "in.jsonl"
    dataset_trials.write_jsonl(path, [{"id": f"r{i}", "text": x} for i, x in enumerate(t)])
    with open(path, "a") as f:
        f.write("not json\n")
    index = str(tmp_path / "idx")
    # k=3 bits, or a band index judged at a threshold
    simindex.Index(index, **({"k": 3} if scheme is None else {"scheme": scheme})).close()
    judge = {} if scheme is None else {"min_similarity": 0.7}
    other = simindex.Index(index, sync=False)

    def meanwhile(bad):
        other.add_text("crawled", t[5])
    out = tmp_path / "out"
    with pytest.raises(simindex.ParameterError, match=r"in.jsonl:6: another writer added "
                       r"'crawled' to the index while this run ran"):
        dist_dedup.dedup([str(path)], str(out), id_field="id", index=index, on_error=meanwhile,
                         **judge)
    other.close()
    assert not out.exists()
    with simindex.Index(index, readonly=True) as idx:
        assert len(idx) == 1 and "crawled" in idx
    # run again: the row is judged against it
    got = dist_dedup.dedup([str(path)], str(out), id_field="id", index=index,
                          on_error=lambda bad: None, **judge)
    assert (got.kept, got.removed) == (19, 1)


def test_a_ray_dataset_gives_back_the_rows_one_machine_keeps(local_ray, tmp_path):
    """read_parquet -> dedup -> write_parquet, the Ray Data way: a Ray Dataset in, a Ray
    Dataset of the kept rows out (materialized, or read from `output`), the rows and
    annotations simindex.dedup gives for the same rows in the same order."""
    dist = importlib.import_module("simindex.distributed")
    rows = corpus(5, count=80)
    ds = ray.data.from_items(rows, override_num_blocks=3)
    for options in (dict(min_similarity=0.7), dict(k=8, mode="components", keep="score")):
        want = simindex.dedup(rows, id_field="id", **options)
        got = dist.dedup(ds, id_field="id", **options)
        assert sorted(r["id"] for r in got.take_all()) == sorted(r["id"] for r in want)
        assert got.schema().names == ["id", "text", "score"]
        marked = {r["id"]: r for r in dist.dedup(ds, id_field="id", annotate=True,
                                                 **options).take_all()}
        for r in simindex.dedup(rows, id_field="id", annotate=True, **options):
            assert {c: marked[r["id"]][c] for c in r} == r
    out = tmp_path / "kept"
    written = dist.dedup(ds, str(out), id_field="id", min_similarity=0.7)
    assert sorted(os.listdir(out)) and all(n.endswith(".parquet") for n in os.listdir(out))
    assert written.count() == len(simindex.dedup(rows, id_field="id", min_similarity=0.7))
    assert dist.dedup(ds.limit(0), id_field="id", k=3).count() == 0
    with pytest.raises(simindex.ParameterError, match="fmt= is not an option"):
        dist.dedup(ds, fmt="csv")
    with pytest.raises(simindex.ParameterError, match="needs output"):
        dist.dedup(str(tmp_path / "in.jsonl"))
    with pytest.raises(simindex.ParameterError, match="with index=, give id_field"):
        dist.dedup(ds, k=3, index=str(tmp_path / "idx"))
    with pytest.raises(simindex.ParameterError, match=r"simindex.distributed.dedup\(data"):
        simindex.dedup(ds, k=3)
