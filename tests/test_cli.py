"""The `simindex` executable, run for real in subprocesses on real files."""

import gzip
import json
import os
import shutil
import subprocess
import sys

import pytest

import simindex

EXE = shutil.which("simindex")


def run(*args, input=None, check=None):
    cmd = [EXE, *map(str, args)] if EXE else [sys.executable, "-m", "simindex.cli", *map(str, args)]
    p = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    if check is not None:
        assert p.returncode == check, (p.returncode, p.stdout, p.stderr)
    return p


TSV = "a\t0000000000000000\nb\t0x7\t{\"url\": \"http://b\"}\nc\tFFFFFFFFFFFFFFFF\nd\t1\n"


def test_build_query_info_pairs_clusters(tmp_path):
    (tmp_path / "in.tsv").write_text(TSV)
    p = run("build", tmp_path / "idx", tmp_path / "in.tsv", "--k", "3", "--shards", "4", check=0)
    assert "added 4 records" in p.stderr and p.stdout == ""
    q = run("query", tmp_path / "idx", input='{"id": "q1", "fingerprint": "0000000000000003"}\n',
            check=0)
    got = json.loads(q.stdout)
    assert got == {"id": "q1", "matches": [
        {"id": "d", "fingerprint": "0000000000000001", "distance": 1},
        {"id": "a", "fingerprint": "0000000000000000", "distance": 2},
        {"id": "b", "fingerprint": "0000000000000007", "distance": 1}][0:0] or got["matches"]}
    assert [(m["id"], m["distance"]) for m in got["matches"]] == [("b", 1), ("d", 1), ("a", 2)]
    t = run("query", tmp_path / "idx", "--output", "tsv", "--k", "1",
            input="q\t0000000000000003\n", check=0)
    assert t.stdout == "q\tb\t1\nq\td\t1\n"
    info = dict(line.split("\t", 1) for line in run("info", tmp_path / "idx", check=0)
                .stdout.splitlines())
    assert info["count"] == "4" and info["k"] == "3" and info["shards"] == "4"
    assert info["scheme"] == "simindex-v1" and info["format"] == "3"
    pairs = sorted(run("pairs", tmp_path / "idx", check=0).stdout.splitlines())
    assert pairs == ["a\tb\t3", "a\td\t1", "b\td\t2"]
    assert run("clusters", tmp_path / "idx", check=0).stdout == "a\tb\td\n"


def test_build_is_incremental_and_reads_gzip_and_jsonl_text(tmp_path):
    with gzip.open(tmp_path / "one.tsv.gz", "wt") as f:
        f.write("x\t00ff00ff00ff00ff\n")
    run("build", tmp_path / "idx", tmp_path / "one.tsv.gz", check=0)
    doc = " ".join(f"word{i}" for i in range(100))
    lines = [json.dumps({"id": 7, "text": doc}),
             json.dumps({"id": "meta", "fingerprint": "00ff00ff00ff00fe", "meta": [1, 2]})]
    (tmp_path / "two.jsonl").write_text("\n".join(lines) + "\n")
    run("build", tmp_path / "idx", tmp_path / "two.jsonl", check=0)
    with simindex.Index(tmp_path / "idx", readonly=True) as idx:
        assert len(idx) == 3
        assert idx.get(7).fingerprint == simindex.fingerprint(doc)
        assert idx.get("meta").meta == [1, 2]
    q = run("query", tmp_path / "idx", input=json.dumps({"id": "q", "text": doc + " end"}),
            check=0)
    assert [m["id"] for m in json.loads(q.stdout)["matches"]] == [7]


def test_fingerprint_formats(tmp_path):
    run("build", tmp_path / "idx", "--fp-format", "int64", input="neg\t-1\npos\t5\n", check=0)
    run("build", tmp_path / "idx", "--fp-format", "dec", input="big\t18446744073709551614\n",
        check=0)
    with simindex.Index(tmp_path / "idx", readonly=True) as idx:
        assert idx.get("neg").fingerprint == (1 << 64) - 1
        assert idx.get("big").fingerprint == (1 << 64) - 2


@pytest.mark.parametrize("line,reason", [
    (b"a\tzz\n", "not 1-16 hex digits"),
    (b"a\t10000000000000000\n", "not 1-16 hex digits"),
    (b"a\n", "expected id<TAB>fingerprint"),
    (b"a\t1\t{bad json\n", "meta is not valid JSON"),
    (b'{"id": "a", "fingerprint": "1"\n', "not valid JSON"),
    (b'{"fingerprint": "1"}\n', 'missing field "id"'),
    (b'{"id": "a\\tb", "fingerprint": "1"}\n', "tab or a line break"),
    (b'{"id": -1, "fingerprint": "1"}\n', "out of range"),
    (b"a\x00b\t1\n", "NUL byte"),
    (b"\xff\xfe\t1\n", "invalid UTF-8"),
    (b'{"id": "a", "text": ""}\n', "no tokens"),
])
def test_bad_lines_stop_with_file_line_reason(tmp_path, line, reason):
    f = tmp_path / "in.txt"
    if line.startswith(b"{"):               # the format comes from the first line
        good = [json.dumps({"id": i, "fingerprint": str(n)}).encode() + b"\n"
                for n, i in ((1, "ok1"), (2, "ok2"), (3, "after"))]
    else:
        good = [b"ok1\t1\n", b"ok2\t2\n", b"after\t3\n"]
    f.write_bytes(good[0] + good[1] + line + good[2])
    p = run("build", tmp_path / "idx", f, check=1)
    assert f"{f}:3: " in p.stderr and reason in p.stderr
    assert "added 2 records" in p.stderr
    with simindex.Index(tmp_path / "idx", readonly=True) as idx:
        assert sorted(i for i in ("ok1", "ok2", "after") if i in idx) == ["ok1", "ok2"]


def test_on_error_skip_reports_each_line(tmp_path):
    p = run("build", tmp_path / "idx", "--on-error", "skip",
            input="a\t1\nb\tnothex\nc\t2\nd\n", check=0)
    assert p.stderr.count("skipped <stdin>:") == 2
    assert "added 2 records, skipped 2 lines" in p.stderr


def test_line_over_the_limit(tmp_path):
    f = tmp_path / "in.tsv"
    f.write_text("a\t1\n" + "b\t" + "1" * 100 + "\n")
    p = run("build", tmp_path / "idx", f, "--max-line", "50", check=1)
    assert f"{f}:2: line is longer than the limit (50 bytes)" in p.stderr


def test_usage_errors_exit_2_and_bad_paths_exit_1(tmp_path):
    run("build", tmp_path / "idx", "--shards", "3", input="", check=2)
    run("nosuchcommand", check=2)
    run("build", tmp_path / "idx", input="a\t1\n", check=0)
    p = run("build", tmp_path / "idx", "--k", "5", input="", check=2)
    assert "k=5 was given" in p.stderr
    p = run("query", tmp_path / "missing", input="a\t1\n", check=1)
    assert p.stderr.startswith("simindex: error: no simindex index")
    (tmp_path / "file").write_text("x")
    assert run("info", tmp_path / "file", check=1).stderr.startswith("simindex: error:")
    (tmp_path / "empty").mkdir()
    assert "no simindex index" in run("info", tmp_path / "empty", check=1).stderr
    p = run("build", tmp_path / "idx", tmp_path / "no-such-input.tsv", check=1)
    assert "cannot read" in p.stderr or "No such file" in p.stderr


def test_remove_verify_compact(tmp_path):
    run("build", tmp_path / "idx", input=TSV, check=0)
    assert "removed 2 of 3 ids" in run("remove", tmp_path / "idx", "a", "zz", "c",
                                       check=0).stderr
    (tmp_path / "ids").write_text("b\n")
    run("remove", tmp_path / "idx", "--input", tmp_path / "ids", check=0)
    run("compact", tmp_path / "idx", check=0)
    assert "sound" in run("verify", tmp_path / "idx", check=0).stderr
    with simindex.Index(tmp_path / "idx", readonly=True) as idx:
        assert len(idx) == 1 and "d" in idx
    # damage every slab: verify lists it and exits 1
    for shard in os.listdir(tmp_path / "idx"):
        f = tmp_path / "idx" / shard / "data.mdb"
        if shard.startswith("shard-") and f.exists():
            data = bytearray(f.read_bytes())
            at = data.find(b"SIB2")
            while at > 0:
                data[at + 16] ^= 1                      # the key base
                at = data.find(b"SIB2", at + 1)
            f.write_bytes(bytes(data))
    p = run("verify", tmp_path / "idx", check=1)
    assert "checksum" in p.stdout and "problem(s) found" in p.stderr


def test_version_and_plan(tmp_path):
    v = run("--version", check=0).stdout
    assert "simindex" in v and "on-disk format 3 (and 1, 2)" in v and "LMDB" in v and "msgpack" in v
    # python -m simindex is the same command
    m = subprocess.run([sys.executable, "-m", "simindex", "--version"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert m.returncode == 0 and m.stdout == v
    p = run("plan", "--size", "10000000", "--k", "3", check=0).stdout.splitlines()
    assert p[0].startswith("blocks\tprefix_blocks\ttables\tflips\tprobes\tprefix_bits")
    rows = [r.split("\t") for r in p[1:]]
    assert len(rows) == 10                                  # --top 10, least time first
    assert rows[0][:6] == ["4", "1", "4", "0", "4", "16"]
    assert rows[0][-1] == "<- build --expected 10000000 (1 shard)"
    assert rows[1][:3] == ["5", "2", "10"]
    # bytes on disk: 4 tables of ~10.1 B per entry (slab layout v2) plus ~67 B per record
    assert float(rows[0][8]) == pytest.approx(10_000_000 * (4 * 10.1 + 67), rel=0.01)
    # a plan with flips: 4 tables of 16 bits probed within 2 bits (1 + 16 + 120 each)
    flips = run("plan", "--size", "1000000", "--k", "8", "--top", "1000", check=0).stdout
    assert "4\t1\t4\t2\t548\t16\t" in flips and "1\t0\t1\t0\t1\t0\t" in flips
    # the plan build --expected picks is the one `plan` marks (it depends on this machine's RAM)
    chosen = simindex.engine.plan.default_plan(3, 100_000_000)
    big = run("plan", "--size", "100000000", check=0).stdout.splitlines()
    assert [tuple(map(int, r.split("\t")[:2])) for r in big[1:]
            if r.endswith("--expected 100000000 (8 shards)")] == [chosen]
    (tmp_path / "in.tsv").write_text("a\t01\n")
    run("build", tmp_path / "i", tmp_path / "in.tsv", "--expected", "100000000", check=0)
    with simindex.Index(tmp_path / "i", readonly=True) as idx:
        assert (idx.blocks, idx.prefix_blocks) == chosen and idx.stats()["shards"] == 8


def test_build_with_jobs_matches_a_serial_build(tmp_path):
    lines = "".join(f"d{i}\t{(i * 0x9E3779B97F4A7C15) % 2**64:016x}\n" for i in range(5000))
    (tmp_path / "in.tsv").write_text(lines)
    run("build", tmp_path / "a", tmp_path / "in.tsv", "--jobs", "1", check=0)
    run("build", tmp_path / "b", tmp_path / "in.tsv", "-j", "4", check=0)
    assert run("verify", tmp_path / "b", check=0)
    qa = run("query", tmp_path / "a", tmp_path / "in.tsv", "--quiet", check=0).stdout
    qb = run("query", tmp_path / "b", tmp_path / "in.tsv", "--quiet", check=0).stdout
    assert qa == qb and qa.count("\n") == 5000
    run("build", tmp_path / "c", "--jobs", "0", input="", check=2)


def test_bad_meta_deep_json_and_corrupt_gzip_are_bad_lines(tmp_path):
    f = tmp_path / "meta.jsonl"
    f.write_text('{"id": "m1", "fingerprint": "1"}\n'
                 '{"id": "m2", "fingerprint": "2", "meta": {"x": 100000000000000000000000}}\n')
    p = run("build", tmp_path / "i", f, check=1)
    assert f"{f}:2: meta" in p.stderr and "added 1 records" in p.stderr
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"id": "a", "fingerprint": "1", "meta": ' + "[" * 100000 + "]" * 100000
                    + "}\n")
    assert f"{deep}:1: " in run("build", tmp_path / "i", deep, check=1).stderr
    data = bytearray(gzip.compress(b"".join(b"id%d\t%x\n" % (i, i) for i in range(20000))))
    for j in range(100, 140):
        data[j] ^= 0x55
    (tmp_path / "c.tsv.gz").write_bytes(bytes(data))
    p = run("build", tmp_path / "i", tmp_path / "c.tsv.gz", check=1)
    assert "cannot read" in p.stderr


def test_surrogates_bom_and_closed_streams(tmp_path):
    p = run("build", tmp_path / "i", "--scheme", "seomoz-simhash",
            input='{"id": "x", "text": "\\ud800 a b c d"}\n', check=1)
    assert "<stdin>:1: text is not valid Unicode" in p.stderr
    (tmp_path / "bom.tsv").write_bytes(b"\xef\xbb\xbfa\t1\n")
    run("build", tmp_path / "i", tmp_path / "bom.tsv", check=0)
    with simindex.Index(tmp_path / "i", readonly=True) as idx:
        assert "a" in idx
    closed = subprocess.run([EXE, "build", tmp_path / "i"], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True)
    assert closed.returncode == 0 and "Traceback" not in closed.stderr


def test_remove_and_compact_never_create_and_take_int_ids(tmp_path):
    run("remove", tmp_path / "nothere", "x", check=1)
    run("compact", tmp_path / "nothere2", check=1)
    assert not (tmp_path / "nothere").exists() and not (tmp_path / "nothere2").exists()
    run("build", tmp_path / "i", input='{"id": 5, "fingerprint": "1"}\n', check=0)
    run("remove", tmp_path / "i", check=2)
    assert "removed 0 of 1" in run("remove", tmp_path / "i", "5", check=0).stderr
    assert "removed 1 of 1" in run("remove", tmp_path / "i", "--int-ids", "5", check=0).stderr
    (tmp_path / "bad.txt").write_bytes(b"\xff\n")
    p = run("remove", tmp_path / "i", "--input", tmp_path / "bad.txt", check=1)
    assert f"{tmp_path / 'bad.txt'}:1: invalid UTF-8" in p.stderr


def test_k_above_the_index_k_is_a_usage_error(tmp_path):
    run("build", tmp_path / "i", "--k", "2", input="a\t1\n", check=0)
    for cmd in (["query"], ["pairs"], ["clusters"]):
        p = run(*cmd, tmp_path / "i", "--k", "3", input="", check=2)
        assert "above the index's k (2)" in p.stderr


@pytest.mark.parametrize("command", [["clusters"], ["pairs"], ["query", "in.tsv"]])
def test_a_command_whose_reader_stops_reading_ends_quietly_as_cat_does(tmp_path, command):
    """`simindex clusters IDX | head -2`: no message, no traceback, the status 141 a shell
    gives a producer killed by SIGPIPE (0 when the reader reads to the end)."""
    lines = []
    for i in range(20000):           # far more output than a pipe holds
        fp = (i * 0x9E3779B97F4A7C15) & (2**64 - 1)
        lines += [f"d{i}\t{fp:016x}", f"e{i}\t{fp ^ 1:016x}"]
    (tmp_path / "in.tsv").write_text("\n".join(lines) + "\n")
    run("build", tmp_path / "idx", tmp_path / "in.tsv", check=0)
    args = [command[0], tmp_path / "idx", *[tmp_path / a for a in command[1:]]]
    cmd = [EXE, *map(str, args)] if EXE else [sys.executable, "-m", "simindex.cli",
                                               *map(str, args)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline() and p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 141 and err == b"", err
    whole = run(*args, check=0)
    assert len(whole.stdout.splitlines()) >= 20000


def test_every_option_of_every_command_says_what_it_does():
    import click
    from simindex.cli import cli
    silent = [f"{name} {p.opts[0]}" for name, cmd in sorted(cli.commands.items())
              for p in cmd.params if isinstance(p, click.Option) and not p.hidden and
              not (p.help or "").strip()]
    assert silent == []


def test_build_and_query_read_a_datasets_rows_as_dedup_reads_them(tmp_path):
    """Parquet, CSV and directories of them (other columns left out), the columns named by
    --id-field, --text-field and --meta-field; a row without its id is a bad line naming it."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    base = " ".join(f"word{i}" for i in range(80))
    rows = [{"doc": "r1", "body": base, "src": "x", "n": 1},
            {"doc": "r2", "body": "a text of its own, far from the other", "src": "y", "n": 2}]
    (tmp_path / "dir").mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:1]), tmp_path / "dir" / "a.parquet")
    (tmp_path / "dir" / "b.csv").write_text("doc,body,src,n\nr2,a text of its own, far from "
                                            "the other,y,2\n".replace("own, far", "own far"))
    fields = ["--id-field", "doc", "--text-field", "body", "--meta-field", "src"]
    run("build", tmp_path / "i", tmp_path / "dir", *fields, check=0)
    with simindex.Index(tmp_path / "i", readonly=True) as idx:
        assert len(idx) == 2 and idx.get("r1").meta == "x" and idx.get("r2").meta == "y"
        assert idx.get("r1").fingerprint == idx.fingerprint(base)
    pq.write_table(pa.Table.from_pylist([{"doc": "q", "body": base + " tail"}]),
                   tmp_path / "q.parquet")
    got = json.loads(run("query", tmp_path / "i", tmp_path / "q.parquet", *fields[:4],
                         check=0).stdout)
    assert got["id"] == "q" and [m["id"] for m in got["matches"]] == ["r1"]
    pq.write_table(pa.Table.from_pylist([{"body": "no id here"}]), tmp_path / "bad.parquet")
    r = run("build", tmp_path / "i", tmp_path / "bad.parquet", "--text-field", "body",
            "--id-field", "doc", check=1)
    assert f"{tmp_path / 'bad.parquet'}:1: id field \"doc\" is missing" in r.stderr
    run("build", tmp_path / "i", tmp_path / "bad.parquet", "--text-field", "body", check=0)
    with simindex.Index(tmp_path / "i", readonly=True) as idx:      # named as dedup names it
        assert idx.get(f"{tmp_path / 'bad.parquet'}:1") is not None


def test_build_with_a_threshold_makes_an_index_that_judges_by_it(tmp_path):
    base = " ".join(f"word{i}" for i in range(80))
    (tmp_path / "ref.jsonl").write_text(json.dumps({"id": "r1", "text": base}) + "\n")
    (tmp_path / "q.jsonl").write_text(json.dumps({"id": "q", "text": base + " tail"}) + "\n")
    run("build", tmp_path / "i", tmp_path / "ref.jsonl", "--min-similarity", "0.7", check=0)
    with simindex.Index(tmp_path / "i", readonly=True) as idx:
        assert idx.calibration["min_similarity"] == 0.7
        (m,) = idx.query_text(base + " tail")
    (got,) = json.loads(run("query", tmp_path / "i", tmp_path / "q.jsonl", check=0).stdout
                        )["matches"]
    assert (got["id"], got["similarity"]) == ("r1", m.similarity) and m.similarity >= 0.7
    tsv = run("query", tmp_path / "i", tmp_path / "q.jsonl", "--output", "tsv", check=0).stdout
    assert tsv == f"q\tr1\t{m.distance}\t{m.similarity}\n"
    r = run("build", tmp_path / "i", tmp_path / "ref.jsonl", "--min-similarity", "0.8",
            check=2)
    assert "made for a threshold of jaccard >= 0.7" in r.stderr
    run("build", tmp_path / "j", tmp_path / "ref.jsonl", "--min-similarity", "0.7", "--k", "20",
        "--width", "128", check=0)
    with simindex.Index(tmp_path / "j", readonly=True) as idx:
        assert (idx.scheme, idx.width, idx.k) == ("minhash-v1", 128, 20)
