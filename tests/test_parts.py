"""JSON lines read in parts by worker processes (`--jobs` above 1) decide exactly as one
process reading line by line: the same decisions, rows, places, bad rows and counts, with
parts cut anywhere (tiny parts here, so lines, blank lines, bad lines and a byte-order mark
fall on every side of a cut)."""

import json
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

import simindex
from simindex.datasets import parts, run as runmod
from simindex.datasets.parts import Part, lines_of, parts_of

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi "
         "omicron pi rho sigma tau upsilon phi chi psi omega").split()


def text(rng, n=60):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def near(rng, t):
    words = t.split()
    words[rng.randrange(len(words))] = rng.choice(WORDS)
    return " ".join(words)


def corpus(rng, n=120, odd=True):
    """Lines of a JSON lines file: texts, near and exact copies, and (odd) the lines a
    reader must report or skip."""
    lines = []
    kept = []
    for i in range(n):
        r = rng.random()
        t = rng.choice(kept) if kept and r < 0.1 else \
            near(rng, rng.choice(kept)) if kept and r < 0.3 else text(rng)
        kept.append(t)
        row = {"id": f"r{i}", "text": t, "n": i, "score": rng.randrange(100)}
        lines.append(json.dumps(row, ensure_ascii=rng.random() < 0.5).encode())
        if odd and rng.random() < 0.15:
            lines.append(rng.choice([
                b"", b"   ", b"{not json}", b'{"id": "x%d"}' % i, b'{"text": 5}',
                b'{"id": "n%d", "text": "...  ,,,"}' % i, b"[1, 2]", b'{"text": "\xff"}',
                b'{"id": "m%d", "text": "nan %s", "v": NaN}' % (i, text(rng).encode()),
                b'{"id": "s%d", "text": "\\ud800 %s"}' % (i, text(rng).encode()),
            ]))
    return lines


def decide(path, jobs, **options):
    bad = []
    summary = runmod.Summary()
    got = [(d.id, d.where, d.kept, d.match, d.distance, d.similarity, d.evidence,
            json.dumps(d.row, sort_keys=True), bytes(d.row.line))
           for d in simindex.decisions(str(path), jobs=jobs, on_error=bad.append,
                                       summary=summary, **options)]
    return got, [str(b) for b in bad], (summary.rows, summary.kept, summary.removed,
                                        summary.skipped)


@pytest.mark.parametrize("part_bytes", [1, 700, 5000])
@pytest.mark.parametrize("options", [
    dict(k=8), dict(k=8, id_field="id"), dict(min_similarity=0.8, id_field="id"),
    dict(k=6, mode="components", keep="score"), dict(k=8, keep="longest", drop_all=True)])
def test_parts_decide_as_one_reader(tmp_path, monkeypatch, part_bytes, options):
    monkeypatch.setattr(parts, "PART_BYTES", part_bytes)
    rng = random.Random(part_bytes)
    lines = corpus(rng)
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\n".join(lines) + (b"\n" if part_bytes > 1 else b""))
    cut = []
    real = runmod.parts_of
    monkeypatch.setattr(runmod, "parts_of", lambda p: (cut.append(x) or x for x in real(p)))
    one = decide(path, 1, **options)
    assert not cut
    two = decide(path, 2, **options)
    assert len(cut) > (2 if part_bytes < 5000 else 0)       # read in parts
    assert two == one
    assert one[2][0] > 100 and one[2][3] > 0 and one[2][2] > 0   # rows, skipped, removed


def test_a_bad_row_stops_a_run_read_in_parts_where_it_stops_one_reader(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(parts, "PART_BYTES", 300)
    rng = random.Random(3)
    lines = [json.dumps({"text": text(rng)}).encode() for _ in range(40)]
    lines[25] = b'{"text": "unfinished'
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines))
    for jobs in (1, 2):
        with pytest.raises(simindex.BadLine, match=r"in\.jsonl:26: not valid JSON"):
            list(simindex.decisions(str(path), k=3, jobs=jobs))


def test_parts_are_whole_lines_numbered_as_the_file(tmp_path, monkeypatch):
    rng = random.Random(7)
    lines = [b"x" * rng.randrange(0, 50) for _ in range(300)] + [b"y" * 400]
    data = b"\n".join(lines) + b"\nlast line without a newline"
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    want = data.split(b"\n")
    for size in (1, 17, 64, 1000, 1 << 20):
        monkeypatch.setattr(parts, "PART_BYTES", size)
        got = list(parts_of(str(path)))
        at, start = 1, 0
        for part, lines in got:
            d = data[start:start + part.size]
            assert d.endswith(b"\n") or part is got[-1][0]
            assert part == Part(str(path), start, len(d), at, len(lines_of(d)),
                                parts.digest(d))
            assert lines == lines_of(d) == want[at - 1:at - 1 + part.lines]
            at += part.lines
            start += part.size
        assert at - 1 == len(want) and start == len(data)


# the command, with parts of 3,000 bytes
SMALL_PARTS = ("import sys, simindex.datasets.parts as p, simindex.cli as c; "
               "p.PART_BYTES = 3000; sys.argv[0] = 'simindex'; c.main()")


@pytest.mark.parametrize("options", [["--k", "8"], ["--min-similarity", "0.8"]])
def test_the_command_writes_the_lines_of_parts_as_one_reader_does(tmp_path, options):
    """dedup's JSON lines output of a file read in parts (with one job as with two) is its
    kept lines as read (the run does not decode them again): byte for byte what one reader
    writes (the same file gzipped, which cannot be cut), a byte order mark and CRLF line
    ends included, and the same removed rows with the same evidence."""
    import gzip
    rng = random.Random(11)
    lines = corpus(rng, n=400, odd=False)
    data = b"\xef\xbb\xbf" + b"\r\n".join(lines) + b"\r\n"
    for where, raw in (("whole", gzip.compress(data)), ("1", data), ("2", data)):
        (tmp_path / where).mkdir()
        (tmp_path / where / "in.jsonl").write_bytes(raw)
        subprocess.run([sys.executable, "-c", SMALL_PARTS, "dedup", "in.jsonl", "-o",
                        "out.jsonl", "--removed", "removed.jsonl", "--id-field", "id",
                        "--jobs", "1" if where == "whole" else where, "--quiet", *options],
                       check=True, cwd=tmp_path / where)
    assert not parts.splittable(str(tmp_path / "whole" / "in.jsonl"))
    kept = (tmp_path / "whole" / "out.jsonl").read_bytes()
    removed = (tmp_path / "whole" / "removed.jsonl").read_bytes()
    for jobs in ("1", "2"):
        assert (tmp_path / jobs / "out.jsonl").read_bytes() == kept
        assert (tmp_path / jobs / "removed.jsonl").read_bytes() == removed
    assert 100 < kept.count(b"\n") < 400 and not kept.startswith(b"\xef") \
        and b"\r" not in kept and b'"match"' in removed


SHAPE = (3, 4, 1, 64)           # search_shape of an index at k=3, 64 bits

# lines of every kind a reader meets: good rows of several shapes, rows a rule rejects,
# and lines that are not rows (each of them read row by row, and never in columns)
PART_LINES = [
    b'{"id": "a", "text": "alpha beta gamma delta"}',
    b'{"text": "alpha beta gamma epsilon", "id": 7, "other": [1, {"x": null}]}',
    b'{"id": "c", "text": "caf\xc3\xa9 beta gamma", "n": 1e400}',
    b'{"id": "d", "text": "..., ;;"}', b'{"id": "e", "text": ""}', b'{"id": "f"}',
    b'{"id": "g", "text": 5}', b'{"id": true, "text": "alpha"}', b'{"id": "", "text": "a"}',
    b'{"id": "h\\tb", "text": "alpha"}', b'{"text": "alpha beta", "id": "i", "id": "j"}',
    b'{"x": "\xff", "id": "k", "text": "alpha"}', b'{"\xed\xa0\x80": 1, "text": "a"}',
    b'{"id": "l", "text": "nan", "v": NaN}', b'{"id": "m", "text": "\\ud800 lone"}',
    b'{"id": "n", "text": "a", "x": ' + b"[" * 3000 + b"]" * 3000 + b"}",
    b'\xef\xbb\xbf{"id": "o", "text": "bom"}', b"", b"  ", b"[1]", b"{not json}",
    b'{"id": "p", "text": "alpha"}\r', b'{"id": "q", "te\\u0078t": "escaped key"}',
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PART_LINES), min_size=1, max_size=12),
       st.integers(1, 3), st.sampled_from([None, "id"]), st.sampled_from(["first", "longest"]),
       st.booleans(), st.booleans())
def test_a_part_read_in_columns_is_what_reading_it_row_by_row_makes(
        lines, first, id_field, keep, checked, preparing):
    """A part whose rows need only their text and id is read in columns, with no dict per
    row (the fast decoder checks what it skips, and the UTF-8 of every line): its good
    rows, ids, fingerprints, ranks, sets and bad rows are those of reading it row by row;
    a part with a line the columns cannot read is read row by row."""
    settings_ = dict(fmt=None, text_field="text", id_field=id_field, fingerprint_field=None,
                     keep=keep, width=64, scheme="minhash-v1" if checked else "simindex-v1",
                     shingled=checked, reserved=(), scratch=None, preparing=dict(
                         token=b"t", k=3, shape=SHAPE) if preparing else None)
    rows = runmod._part_by_rows(settings_, lines, first, 0, "in.jsonl")
    got = runmod.part_work(settings_, lines, first, 0, "in.jsonl")
    assert repr(got) == repr(rows)
    columns = runmod._part_in_columns(settings_, lines, first, 0, "in.jsonl")
    assert columns is None or repr(columns) == repr(rows)
    if all(raw in PART_LINES[:2] for raw in lines):
        assert columns is not None


def test_a_file_that_changes_while_workers_read_it_is_an_error(tmp_path, monkeypatch):
    """A worker reading other bytes than the run's process read (the file changed in
    between) stops the run with an error naming the file and the lines, never a decision
    made from other rows."""
    monkeypatch.setattr(parts, "PART_BYTES", 2000)
    rng = random.Random(5)
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(corpus(rng, odd=False)) + b"\n")
    real = runmod.read_part

    def changed(part, shown):                # what a writer's change makes the worker see
        if part.first > 1:
            with open(part.path, "r+b") as f:
                f.seek(part.start)
                f.write(b"[")
        return real(part, shown)
    monkeypatch.setattr(runmod, "read_part", changed)     # forked workers inherit it
    with pytest.raises(simindex.InputError,
                       match=r"in\.jsonl: the file changed while it was read \(lines \d+ to"):
        list(simindex.decisions(str(path), k=3, jobs=2))


def test_gzip_and_csv_inputs_are_read_by_one_reader(tmp_path):
    import gzip
    rng = random.Random(2)
    rows = [{"text": text(rng)} for _ in range(30)]
    gz = tmp_path / "in.jsonl.gz"
    with gzip.open(gz, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    assert not parts.splittable(str(gz)) and not parts.splittable(str(tmp_path))
    assert [d.kept for d in simindex.decisions(str(gz), k=3, jobs=2)] == \
        [d.kept for d in simindex.decisions(str(gz), k=3, jobs=1)]


def test_workers_end_when_the_run_is_killed(tmp_path):
    """A run killed mid-way leaves no worker behind (each watches the run's process):
    orphaned, they would wait for work forever, holding the run's pipes open."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from trials import ENV
    rng = random.Random(4)
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        for i in range(60000):
            f.write(json.dumps({"text": text(rng, 40)}).encode() + b"\n")
    p = subprocess.Popen([sys.executable, "-m", "simindex", "dedup", str(path), "-o",
                          str(tmp_path / "o.jsonl"), "--k", "3", "-j", "2"], env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def workers():
        out = []
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if pid.isdigit() and int(pid) != p.pid and str(path).encode() in cmd:
                out.append(int(pid))
        return out
    deadline = time.time() + 60
    while len(workers()) < 2 and time.time() < deadline:
        time.sleep(0.05)
    assert len(workers()) == 2                  # forked copies of the run's process
    time.sleep(0.1)                             # at work, the run far from its end
    p.send_signal(signal.SIGKILL)
    p.communicate(timeout=30)                   # their pipes close: the workers are gone
    deadline = time.time() + 10
    while workers() and time.time() < deadline:
        time.sleep(0.05)
    assert not workers()
    assert not (tmp_path / "o.jsonl").exists()


def _dies(args):
    import os
    os._exit(3)


def test_a_worker_that_dies_is_an_error_not_a_hang(tmp_path, monkeypatch):
    monkeypatch.setattr(runmod, "prepared_part", _dies)
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"text": "a few words of text here"}) + "\n")
    with pytest.raises(simindex.Error, match="worker process reading .* from byte 0 ended"):
        list(simindex.decisions(str(path), k=3, jobs=2))
