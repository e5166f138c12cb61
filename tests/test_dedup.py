"""`simindex dedup` and simindex.dedup: the greedy rule against a plain-Python oracle, the
formats, incremental and reference runs, kill -9 and re-run, and bad rows. Real files and
real CLI processes."""

import csv
import gzip
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings, strategies as st

import simindex
from simindex.datasets import run as dedup_module
from conftest import popcount
from trials import ENV


def greedy(fps, k, stored=()):
    """The oracle: per row, (True,) when kept, else (False, position of the kept row it
    matched, distance); the nearest kept row before it, the earliest among equals. `stored`
    are fingerprints kept before the run (positions -1, -2, ...)."""
    kept = [(-1 - i, f) for i, f in enumerate(stored)]
    out = []
    for i, f in enumerate(fps):
        near = [(popcount(f ^ g), n) for n, (j, g) in enumerate(kept) if popcount(f ^ g) <= k]
        if near:
            d, n = min(near)
            out.append((False, kept[n][0], d))
        else:
            kept.append((i, f))
            out.append((True,))
    return out


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "simindex", *map(str, args)], env=ENV,
                          capture_output=True, text=True, timeout=timeout)


def write_jsonl(path, rows):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def read_jsonl(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def planted(rng, n_bases, k, width=64):
    """Fingerprints: bases and near-copies at every distance 0..k+2 (packed, spread, first
    and last bit), shuffled, so kept rows, removed rows and chains all occur."""
    fps = []
    for _ in range(n_bases):
        base = rng.getrandbits(width)
        fps.append(base)
        for d in range(k + 3):
            for bits in (range(d), range(width - d, width), rng.sample(range(width), d)):
                fps.append(base ^ sum(1 << b for b in bits))
    rng.shuffle(fps)
    return fps


# ---------------------------------------------------------------- the rule
@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize("k,width", [(3, 64), (8, 64), (12, 128)])
def test_greedy_equals_the_oracle_across_batches(tmp_path, monkeypatch, k, width, jobs):
    """Also with two jobs: worker processes read and fingerprint the rows, a reader's
    thread prepares each batch while the one before is judged."""
    monkeypatch.setattr(dedup_module, "BATCH", 7)      # many batch boundaries
    rng = random.Random(k)
    fps = planted(rng, 6, k, width)
    path = tmp_path / "in.jsonl"
    write_jsonl(path, [{"id": f"r{i}", "fp": f"{f:x}", "n": i} for i, f in enumerate(fps)])
    got = list(simindex.decisions([str(path)], id_field="id", fingerprint_field="fp", k=k,
                                  width=width, jobs=jobs))
    want = greedy(fps, k)
    assert [d.kept for d in got] == [w[0] for w in want]
    for d, w in zip(got, want):
        if not w[0]:
            assert (d.match, d.distance, d.reference) == (f"r{w[1]}", w[2], False)
    assert [r["n"] for r in simindex.dedup([str(path)], id_field="id", fingerprint_field="fp",
                                           k=k, width=width)] == \
        [i for i, w in enumerate(want) if w[0]]


@settings(max_examples=40, deadline=None)
@given(fps=st.lists(st.builds(lambda b, bits: b ^ sum(1 << x for x in set(bits)),
                              st.sampled_from([0, 2 ** 64 - 1, 0x0123456789ABCDEF]),
                              st.lists(st.integers(0, 63), max_size=5)), max_size=40),
       k=st.integers(0, 4), batch=st.integers(1, 9))
def test_greedy_property(tmp_path_factory, fps, k, batch):
    old, dedup_module.BATCH = dedup_module.BATCH, batch
    try:
        path = tmp_path_factory.mktemp("g") / "in.jsonl"
        write_jsonl(path, [{"fp": f} for f in fps])
        got = list(simindex.decisions([str(path)], fingerprint_field="fp", k=k))
    finally:
        dedup_module.BATCH = old
    want = greedy(fps, k)
    assert [(d.kept,) if d.kept else (d.kept, d.match, d.distance) for d in got] == \
        [w if w[0] else (False, f"{path}:{w[1] + 1}", w[2]) for w in want]


def test_nothing_chains(tmp_path):
    """A kept, B 3 bits from A, C 3 bits from B and 6 from A: at k=3 B goes (it matches A)
    and C stays (B was removed, A is too far), as README's example says."""
    a = 0
    b = a ^ 0b111
    c = b ^ 0b111000
    write_jsonl(tmp_path / "in.jsonl", [{"id": n, "fp": f} for n, f in zip("ABC", (a, b, c))])
    got = list(simindex.decisions(str(tmp_path / "in.jsonl"), id_field="id",
                                  fingerprint_field="fp", k=3))
    assert [(d.id, d.kept, d.match, d.distance) for d in got] == \
        [("A", True, None, None), ("B", False, "A", 3), ("C", True, None, None)]


# ---------------------------------------------------------------- texts and formats
def texts(rng, n, words=500):
    vocab = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ro", "su", "ti", "va", "ze")
             for b in ("bar", "con", "dit", "fen", "gul", "hom", "jis", "kel", "mor", "nat",
                       "pul", "ras", "sen", "tor", "vim")]
    return [" ".join(rng.choice(vocab) for _ in range(words)) for _ in range(n)]


def near_copy(text):
    w = text.split()
    w[len(w) // 2] = "édité"                         # one word changed, non-ASCII
    return " ".join(w) + " ✓"


def test_the_text_fixture_is_unambiguous_at_k_8():
    """Near copies lie within 8 bits of their originals and distinct texts farther, so the
    tests below cannot pass by luck."""
    docs = texts(random.Random(2), 30) + texts(random.Random(4), 30)
    fps = [simindex.fingerprint(t) for t in docs]
    assert max(popcount(f ^ simindex.fingerprint(near_copy(t))) for f, t in zip(fps, docs)) <= 8
    assert min(popcount(a ^ b) for i, a in enumerate(fps) for b in fps[i + 1:]) > 8


@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.gz", "in.csv", "in.csv.gz"])
def test_cli_keeps_columns_and_format(tmp_path, name):
    rng = random.Random(2)
    docs = texts(rng, 30)
    rows = []
    for i, t in enumerate(docs):
        rows.append({"url": f"u{i}", "body": t, "lang": "xx"})
        if i % 3 == 0:
            rows.append({"url": f"u{i}c", "body": near_copy(t), "lang": "yy"})
    path = tmp_path / name
    if ".csv" in name:
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "wt", encoding="utf-8", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["url", "body", "lang"])
            w.writeheader()
            w.writerows(rows)
    else:
        write_jsonl(path, rows)
    out = tmp_path / ("out" + name[2:])
    r = run("dedup", path, "-o", out, "--text-field", "body", "--id-field", "url", "--k", "8",
            "--removed", tmp_path / "rm.jsonl", "-j", "2")
    assert r.returncode == 0, r.stderr
    assert "rows in 40, kept 30, removed 10, skipped 0" in r.stderr
    if ".csv" in name:
        opener = gzip.open if name.endswith(".gz") else open
        with opener(out, "rt", encoding="utf-8", newline="") as f:
            kept = list(csv.DictReader(f))
    else:
        kept = read_jsonl(out)
    assert kept == [r for r in rows if not r["url"].endswith("c")]     # columns as they were
    removed = read_jsonl(tmp_path / "rm.jsonl")
    assert [(x["id"], x["match"], x["reference"]) for x in removed] == \
        [(f"u{i}c", f"u{i}", False) for i in range(0, 30, 3)]
    assert all(0 <= x["distance"] <= 8 for x in removed)


def test_default_ids_name_file_and_row_and_output_format_converts(tmp_path):
    rng = random.Random(3)
    [t] = texts(rng, 1)
    write_jsonl(tmp_path / "a.jsonl", [{"text": t}])
    write_jsonl(tmp_path / "b.jsonl", [{"text": "other words entirely " * 20}, {"text": t}])
    r = run("dedup", tmp_path / "a.jsonl", tmp_path / "b.jsonl", "-o", tmp_path / "o.csv",
            "--removed", tmp_path / "rm.jsonl")
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "o.csv", newline="", encoding="utf-8") as f:
        assert [row["text"][:5] for row in csv.DictReader(f)] == [t[:5], "other"]
    [rm] = read_jsonl(tmp_path / "rm.jsonl")
    assert rm["id"] == f"{tmp_path / 'b.jsonl'}:2" and rm["match"] == f"{tmp_path / 'a.jsonl'}:1"
    assert rm["distance"] == 0


# ---------------------------------------------------------------- runs over time
def test_a_later_run_removes_duplicates_of_earlier_runs_and_a_rerun_repeats_its_output(
        tmp_path):
    rng = random.Random(4)
    first, second = texts(rng, 20), texts(rng, 10)
    write_jsonl(tmp_path / "a.jsonl", [{"id": f"a{i}", "text": t} for i, t in enumerate(first)])
    write_jsonl(tmp_path / "b.jsonl",
                [{"id": f"b{i}", "text": t} for i, t in enumerate(second)] +
                [{"id": f"b{i}c", "text": near_copy(first[i])} for i in range(5)])
    idx = tmp_path / "idx"
    common = ["--id-field", "id", "--index", idx, "--k", "8"]
    assert run("dedup", tmp_path / "a.jsonl", "-o", tmp_path / "oa.jsonl", *common).returncode == 0
    r = run("dedup", tmp_path / "b.jsonl", "-o", tmp_path / "ob.jsonl", "--removed",
            tmp_path / "rb.jsonl", *common)
    assert r.returncode == 0, r.stderr
    assert [x["id"] for x in read_jsonl(tmp_path / "ob.jsonl")] == [f"b{i}" for i in range(10)]
    assert [(x["id"], x["match"]) for x in read_jsonl(tmp_path / "rb.jsonl")] == \
        [(f"b{i}c", f"a{i}") for i in range(5)]
    # the same command again: the same output (its rows are the records it kept)
    r = run("dedup", tmp_path / "b.jsonl", "-o", tmp_path / "ob2.jsonl", *common)
    assert r.returncode == 0, r.stderr
    assert read_jsonl(tmp_path / "ob2.jsonl") == read_jsonl(tmp_path / "ob.jsonl")
    with simindex.Index(idx, readonly=True) as ix:
        assert len(ix) == 30
    # another file reusing a kept id is refused, and nothing is written
    write_jsonl(tmp_path / "c.jsonl", [{"id": "a3", "text": "a different text " * 30}])
    r = run("dedup", tmp_path / "c.jsonl", "-o", tmp_path / "oc.jsonl", *common)
    assert r.returncode == 1, r.stderr
    assert "c.jsonl:1: the id 'a3' of a row to keep already names a record of the index" \
        in r.stderr
    assert not (tmp_path / "oc.jsonl").exists()


@pytest.mark.parametrize("mode", ["greedy", "components"])
@pytest.mark.parametrize("batch", [2, 4096])
def test_an_id_kept_twice_names_the_second_row_and_keeps_nothing(tmp_path, monkeypatch,
                                                                  mode, batch):
    """Two kept rows with one id: within a batch or across batches (the first batch is in
    the index by then), the error names the second row, the one whose id is taken, as
    given twice; and the batch that holds it is not added."""
    monkeypatch.setattr(dedup_module, "BATCH", batch)
    rng = random.Random(9)
    rows = [{"id": i, "text": t} for i, t in zip(["p", "q", "r", "p", "s"], texts(rng, 5))]
    write_jsonl(tmp_path / "in.jsonl", rows)
    idx = tmp_path / "idx"
    with pytest.raises(simindex.IdExistsError) as e:
        list(simindex.decisions(str(tmp_path / "in.jsonl"), id_field="id", index=str(idx),
                                k=3, mode=mode))
    assert "in.jsonl:4: the id 'p' of a row to keep is given twice" in str(e.value)
    assert e.value.id == "p"
    with simindex.Index(idx, readonly=True) as ix:
        assert len(ix) == (2 if batch == 2 and mode == "greedy" else 0)


def test_against_a_reference_removes_its_near_copies_and_leaves_it_alone(tmp_path):
    rng = random.Random(5)
    bench, train = texts(rng, 5), texts(rng, 20)
    (tmp_path / "ref.jsonl").write_text("".join(json.dumps({"id": f"bench{i}", "text": t}) + "\n"
                                                for i, t in enumerate(bench)))
    assert run("build", tmp_path / "ref", tmp_path / "ref.jsonl", "--k", "8").returncode == 0
    write_jsonl(tmp_path / "train.jsonl", [{"id": f"t{i}", "text": t} for i, t in enumerate(train)]
                + [{"id": "leak", "text": near_copy(bench[2])}])
    r = run("dedup", tmp_path / "train.jsonl", "-o", tmp_path / "o.jsonl", "--id-field", "id",
            "--against", tmp_path / "ref", "--k", "8", "--removed", tmp_path / "rm.jsonl")
    assert r.returncode == 0, r.stderr
    assert [x["id"] for x in read_jsonl(tmp_path / "o.jsonl")] == [f"t{i}" for i in range(20)]
    [rm] = read_jsonl(tmp_path / "rm.jsonl")
    assert (rm["id"], rm["match"], rm["reference"]) == ("leak", "bench2", True)
    with simindex.Index(tmp_path / "ref", readonly=True) as ref:
        assert len(ref) == 5


KILLED = 200_000


def stored(path):
    """Records in the index at `path` (0 before it exists)."""
    try:
        with simindex.Index(path, readonly=True) as ix:
            return len(ix)
    except simindex.Error:
        return 0


def test_a_run_killed_and_run_again_writes_what_an_uninterrupted_run_writes(tmp_path):
    rng = random.Random(6)
    fps = [rng.getrandbits(64) for _ in range(KILLED // 2)]
    fps += [f ^ (1 << rng.randrange(64)) for f in fps]            # every row has a twin
    rng.shuffle(fps)
    path = tmp_path / "in.jsonl"
    write_jsonl(path, [{"id": i, "fp": f"{f:x}"} for i, f in enumerate(fps)])
    args = ["--id-field", "id", "--fingerprint-field", "fp", "--k", "2", "--removed"]
    want = run("dedup", path, "-o", tmp_path / "want.jsonl", *args, tmp_path / "want-rm.jsonl",
               "--index", tmp_path / "clean")
    assert want.returncode == 0, want.stderr
    cmd = [sys.executable, "-m", "simindex", "dedup", str(path), "-o", str(tmp_path / "o.jsonl"),
           *map(str, args), str(tmp_path / "rm.jsonl"), "--index", str(tmp_path / "idx")]
    counts = []
    for delay in (0.0, 0.05, 0.15):
        p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        while p.poll() is None and stored(tmp_path / "idx") <= (counts[-1] if counts else 0):
            time.sleep(0.01)                    # until this run has committed a batch
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.communicate()
        assert p.returncode == -signal.SIGKILL, "the run ended before it was killed"
        assert not (tmp_path / "o.jsonl").exists()          # never a partial output
        counts.append(stored(tmp_path / "idx"))
    assert 0 < counts[0] <= counts[-1] < KILLED // 2       # killed midway, progress kept
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert read_jsonl(tmp_path / "o.jsonl") == read_jsonl(tmp_path / "want.jsonl")
    assert read_jsonl(tmp_path / "rm.jsonl") == read_jsonl(tmp_path / "want-rm.jsonl")


# ---------------------------------------------------------------- bad input
def test_a_bad_row_stops_with_its_place_and_writes_nothing(tmp_path):
    write_jsonl(tmp_path / "in.jsonl", [{"text": "some words here " * 5}, {"txt": "oops"}])
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "o.jsonl")
    assert r.returncode == 1
    assert f'{tmp_path / "in.jsonl"}:2: text field "text" is missing or not text' in r.stderr
    assert "no output was written" in r.stderr and not (tmp_path / "o.jsonl").exists()
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "o.jsonl", "--on-error", "skip")
    assert r.returncode == 0, r.stderr
    assert "skipped" in r.stderr and "rows in 2, kept 1, removed 0, skipped 1" in r.stderr
    assert len(read_jsonl(tmp_path / "o.jsonl")) == 1
    # a line that is not JSON, and a CSV row with a field too many, are skipped the same way
    with open(tmp_path / "in.jsonl", "a") as f:
        f.write("{oops\n" + json.dumps({"text": "more words here " * 5}) + "\n")
    (tmp_path / "in.csv").write_text("text,n\nsome words here,1\nother words,2,3\nlast one,4\n")
    for name, rows in (("in.jsonl", 4), ("in.csv", 3)):
        for mode in ("greedy", "components"):
            r = run("dedup", tmp_path / name, "-o", tmp_path / "o.jsonl", "--on-error", "skip",
                    "--mode", mode)
            assert r.returncode == 0, r.stderr
            assert f"rows in {rows}, kept 2, removed 0, skipped {rows - 2}" in r.stderr, r.stderr
            assert (f"{tmp_path / name}:3: not valid JSON" if name == "in.jsonl" else
                    f"{tmp_path / name}:3: 3 fields, the header has 2") in r.stderr


@pytest.mark.parametrize("jobs", [1, 2])
def test_bad_rows_are_reported_in_input_order_whatever_made_them_bad(tmp_path, jobs):
    """A row whose column breaks a rule, then a line that is no JSON: skipped, they are
    reported in input order; stopped, the earlier one is the error."""
    lines = [json.dumps({"text": "first words of a row " * 5}), json.dumps({"txt": "oops"}),
             "{not json", json.dumps({"text": ""}), json.dumps({"text": "last words " * 5})]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    bad = []
    kept = [d.kept for d in simindex.decisions(str(tmp_path / "in.jsonl"), jobs=jobs,
                                               on_error=bad.append)]
    assert kept == [True, True]
    assert [(b.where.rsplit(":", 1)[1], b.reason[:20]) for b in bad] == [
        ("2", 'text field "text" is'), ("3", "not valid JSON: Expe"), ("4", "text has no tokens u")]
    with pytest.raises(simindex.BadLine, match=r"in\.jsonl:2: text field"):
        list(simindex.decisions(str(tmp_path / "in.jsonl"), jobs=jobs))


@pytest.mark.parametrize("content,why", [
    ("{not json}\n", "in.jsonl:1: not valid JSON"),
    ('[1, 2]\n', "in.jsonl:1: a JSON line must be an object"),
    ('{"text": ""}\n', "in.jsonl:1: text has no tokens"),
    ('{"text": 5}\n', 'in.jsonl:1: text field "text" is missing or not text (got int)'),
])
def test_bad_rows_are_named(tmp_path, content, why):
    (tmp_path / "in.jsonl").write_text(content)
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "o.jsonl")
    assert r.returncode == 1 and why in r.stderr, r.stderr


def test_parquet_in_and_out(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = random.Random(7)
    docs = texts(rng, 12)
    rows = [{"id": i, "text": t, "score": i / 2} for i, t in enumerate(docs)]
    rows.insert(5, {"id": 100, "text": near_copy(docs[1]), "score": -1.0})
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    r = run("dedup", tmp_path / "in.parquet", "-o", tmp_path / "out.parquet", "--id-field",
            "id", "--k", "8", "--removed", tmp_path / "rm.jsonl")
    assert r.returncode == 0, r.stderr
    assert pq.read_table(tmp_path / "out.parquet").to_pylist() == \
        [x for x in rows if x["id"] != 100]
    assert [(x["id"], x["match"]) for x in read_jsonl(tmp_path / "rm.jsonl")] == [(100, 1)]


def test_parquet_without_pyarrow_names_the_extra(tmp_path):
    (tmp_path / "p.parquet").write_bytes(b"PAR1")
    code = ("import sys; sys.modules['pyarrow'] = sys.modules['pyarrow.parquet'] = None; "
            "from simindex.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, "dedup", str(tmp_path / "p.parquet"), "-o",
                        str(tmp_path / "o.jsonl")], env=ENV, capture_output=True, text=True)
    assert r.returncode == 1 and "Parquet needs pyarrow: pip install 'simindex[parquet]'" \
        in r.stderr, r.stderr


def test_empty_inputs_unknown_formats_and_damaged_parquet(tmp_path):
    (tmp_path / "e.jsonl").write_text("")
    r = run("dedup", tmp_path / "e.jsonl", "-o", tmp_path / "o.jsonl")
    assert r.returncode == 0 and (tmp_path / "o.jsonl").read_text() == ""
    assert "rows in 0, kept 0" in r.stderr
    (tmp_path / "x.txt").write_text("hello\n")
    r = run("dedup", tmp_path / "x.txt", "-o", tmp_path / "o.jsonl")
    assert r.returncode == 1 and "cannot tell the format" in r.stderr
    (tmp_path / "p.parquet").write_bytes(b"PAR1")
    r = run("dedup", tmp_path / "p.parquet", "-o", tmp_path / "o.jsonl")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        assert r.returncode == 1 and "pip install 'simindex[parquet]'" in r.stderr
    else:
        assert r.returncode == 1 and "p.parquet" in r.stderr


# ---------------------------------------------------------------- components
def components(fps, k, ranks=None, drop_all=False):
    """The oracle of mode="components": per row None (kept) or the position of the row its
    component keeps (drop_all: every row of a group of two or more goes)."""
    n = len(fps)
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x
    for i in range(n):
        for j in range(i + 1, n):
            if popcount(fps[i] ^ fps[j]) <= k:
                parent[find(j)] = find(i)
    groups = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    out = [None] * n
    for g in groups.values():
        if len(g) < 2:
            continue
        best = g[0] if ranks is None else max(g, key=lambda i: (ranks[i], -i))
        for i in g:
            if i != best or drop_all:
                out[i] = best
    return out


@settings(max_examples=40, deadline=None)
@given(fps=st.lists(st.builds(lambda b, bits: b ^ sum(1 << x for x in set(bits)),
                              st.sampled_from([0, 2 ** 64 - 1, 0x0123456789ABCDEF]),
                              st.lists(st.integers(0, 63), max_size=5)), max_size=40),
       k=st.integers(0, 4), batch=st.integers(1, 9), by_score=st.booleans(),
       drop_all=st.booleans())
def test_components_property(tmp_path_factory, fps, k, batch, by_score, drop_all):
    scores = [(i * 7919) % 13 for i in range(len(fps))]
    old, dedup_module.BATCH = dedup_module.BATCH, batch
    try:
        path = tmp_path_factory.mktemp("c") / "in.jsonl"
        write_jsonl(path, [{"id": i, "fp": f, "score": s} for i, (f, s) in
                           enumerate(zip(fps, scores))])
        got = list(simindex.decisions([str(path)], id_field="id", fingerprint_field="fp", k=k,
                                      mode="components", keep="score" if by_score else "first",
                                      drop_all=drop_all))
    finally:
        dedup_module.BATCH = old
    want = components(fps, k, scores if by_score else None, drop_all)
    assert [d.kept for d in got] == [w is None for w in want]
    for i, (d, w) in enumerate(zip(got, want)):
        if w is not None:
            assert d.cluster == w and d.reference is False
            if w != i:
                assert (d.match, d.distance) == (w, popcount(fps[i] ^ fps[w]))


def test_components_join_records_of_earlier_runs_and_report_clusters(tmp_path):
    a, b, c = 0, 0b111, 0b111000 ^ 0b111        # A-B 3 bits, B-C 3 bits, A-C 6 bits
    far = 2 ** 64 - 1
    write_jsonl(tmp_path / "1.jsonl", [{"id": "A", "fp": a}])
    write_jsonl(tmp_path / "2.jsonl", [{"id": "B", "fp": b}, {"id": "C", "fp": c},
                                       {"id": "X", "fp": far}, {"id": "Y", "fp": far ^ 1}])
    common = ["--id-field", "id", "--fingerprint-field", "fp", "--k", "3"]
    r = run("dedup", tmp_path / "1.jsonl", "-o", tmp_path / "o1.jsonl", "--index",
            tmp_path / "idx", *common)
    assert r.returncode == 0, r.stderr
    # B and C chain to A, kept by the first run: both go; X and Y: Y goes
    r = run("dedup", tmp_path / "2.jsonl", "-o", tmp_path / "o2.jsonl", "--index",
            tmp_path / "idx", "--mode", "components", "--removed", tmp_path / "rm.jsonl",
            "--clusters", tmp_path / "cl.jsonl", *common)
    assert r.returncode == 0, r.stderr
    assert [x["id"] for x in read_jsonl(tmp_path / "o2.jsonl")] == ["X"]
    assert [(x["id"], x["match"], x["distance"]) for x in read_jsonl(tmp_path / "rm.jsonl")] \
        == [("B", "A", 3), ("C", "A", 6), ("Y", "X", 1)]
    assert sorted((x["id"], x["cluster"], x["size"]) for x in read_jsonl(tmp_path / "cl.jsonl")) \
        == [("A", "A", 3), ("B", "A", 3), ("C", "A", 3), ("X", "X", 2), ("Y", "X", 2)]
    # greedy on the same rows: C is kept (only B, removed, is near it)
    r = run("dedup", tmp_path / "1.jsonl", tmp_path / "2.jsonl", "-o", tmp_path / "o3.jsonl",
            "--clusters", tmp_path / "cl3.jsonl", *common)
    assert [x["id"] for x in read_jsonl(tmp_path / "o3.jsonl")] == ["A", "C", "X"]
    assert sorted((x["id"], x["cluster"], x["size"]) for x in read_jsonl(tmp_path / "cl3.jsonl")) \
        == [("A", "A", 2), ("B", "A", 2), ("X", "X", 2), ("Y", "X", 2)]
    # --drop-all: no row of a group stays
    r = run("dedup", tmp_path / "2.jsonl", "-o", tmp_path / "o4.jsonl", "--drop-all",
            "--clusters", tmp_path / "cl4.jsonl", *common)
    assert r.returncode == 0, r.stderr
    assert read_jsonl(tmp_path / "o4.jsonl") == []
    assert sorted((x["id"], x["cluster"], x["size"]) for x in read_jsonl(tmp_path / "cl4.jsonl")) \
        == [("B", "B", 2), ("C", "B", 2), ("X", "X", 2), ("Y", "X", 2)]


def test_keep_longest_and_a_column(tmp_path):
    rng = random.Random(8)
    [t] = texts(rng, 1)
    rows = [{"id": "short", "text": t, "q": "0.5"}, {"id": "long", "text": t + " encore",
                                                      "q": "0.1"}]
    with open(tmp_path / "in.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["id", "text", "q"])
        w.writeheader()
        w.writerows(rows)
    for keep, want in (("longest", "long"), ("q", "short"), ("first", "short")):
        r = run("dedup", tmp_path / "in.csv", "-o", tmp_path / "o.csv", "--id-field", "id",
                "--k", "8", "--keep", keep, "--mode", "components")
        assert r.returncode == 0, r.stderr
        with open(tmp_path / "o.csv", newline="", encoding="utf-8") as f:
            assert [x["id"] for x in csv.DictReader(f)] == [want]
    r = run("dedup", tmp_path / "in.csv", "-o", tmp_path / "o.csv", "--keep", "nope")
    assert r.returncode == 1 and 'keep column "nope" is missing or not a number' in r.stderr
    r = run("dedup", tmp_path / "in.csv", "-o", tmp_path / "o.csv", "--mode", "greedy",
            "--drop-all")
    assert r.returncode == 1 and "need mode='components'" in r.stderr


# ---------------------------------------------------------------- min_similarity
def test_min_similarity_drops_matches_whose_texts_differ(tmp_path):
    """Rows forced to one fingerprint: only the one whose shingles overlap the kept row's is
    removed, in the batch (exact Jaccard) and in a later run (the stored sketch)."""
    rng = random.Random(9)
    a, other = texts(rng, 2)
    b = near_copy(a)
    rows = [{"id": "A", "text": a, "fp": "1"}, {"id": "B", "text": b, "fp": "1"},
            {"id": "C", "text": other, "fp": "1"}]
    write_jsonl(tmp_path / "1.jsonl", rows[:1])
    write_jsonl(tmp_path / "2.jsonl", rows[1:])
    write_jsonl(tmp_path / "all.jsonl", rows)
    common = ["--id-field", "id", "--fingerprint-field", "fp", "--min-similarity", "0.8"]
    for mode in ("greedy", "components"):
        r = run("dedup", tmp_path / "all.jsonl", "-o", tmp_path / "o.jsonl", "--removed",
                tmp_path / "rm.jsonl", "--mode", mode, *common)
        assert r.returncode == 0, r.stderr
        assert [x["id"] for x in read_jsonl(tmp_path / "o.jsonl")] == ["A", "C"]
        [rm] = read_jsonl(tmp_path / "rm.jsonl")
        assert (rm["id"], rm["match"], rm["distance"]) == ("B", "A", 0)
        assert 0.8 <= rm["similarity"] < 1
    assert run("dedup", tmp_path / "1.jsonl", "-o", tmp_path / "o1.jsonl", "--index",
               tmp_path / "idx", *common).returncode == 0
    r = run("dedup", tmp_path / "2.jsonl", "-o", tmp_path / "o2.jsonl", "--index",
            tmp_path / "idx", "--removed", tmp_path / "rm2.jsonl", *common)
    assert r.returncode == 0, r.stderr
    assert [x["id"] for x in read_jsonl(tmp_path / "o2.jsonl")] == ["C"]
    [rm] = read_jsonl(tmp_path / "rm2.jsonl")
    assert (rm["id"], rm["match"]) == ("B", "A") and 0.8 <= rm["similarity"] <= 1
    # without the check, all three are one fingerprint: A alone stays
    r = run("dedup", tmp_path / "all.jsonl", "-o", tmp_path / "o.jsonl", "--id-field", "id",
            "--fingerprint-field", "fp")
    assert [x["id"] for x in read_jsonl(tmp_path / "o.jsonl")] == ["A"]


def test_sketches_are_exact_for_short_texts_and_close_for_long_ones():
    from simindex.signatures.similarity import SKETCH, jaccard, shingle_set, sketch, sketch_jaccard
    rng = random.Random(10)
    short = texts(rng, 1, words=40)[0]
    a, b = shingle_set(short, "simindex-v1"), shingle_set(near_copy(short), "simindex-v1")
    assert len(sketch(a)) == 4 * len(a) < 4 * SKETCH
    assert sketch_jaccard(sketch(a), sketch(b)) == pytest.approx(jaccard(a, b))
    errors = []
    for _ in range(20):
        t = texts(rng, 1, words=3000)[0].split()
        cut = rng.randrange(500, 2500)
        u = " ".join(t[:cut] + texts(rng, 1, words=rng.randrange(100, 2000))[0].split())
        x, y = shingle_set(" ".join(t), "simindex-v1"), shingle_set(u, "simindex-v1")
        assert len(sketch(x)) == 4 * SKETCH
        errors.append(abs(sketch_jaccard(sketch(x), sketch(y)) - jaccard(x, y)))
    assert max(errors) < 0.15 and sum(errors) / len(errors) < 0.06


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab _.\n-é日本ｆß") + ["Ǆ", "\u0301"]),
                    max_size=40))
def test_compiled_shingle_sets_equal_the_schemes_tokens(text):
    """simindex-v1's compiled shingle hashes are xxh3 of the same windows `tokenize` and
    `shingles` give, joined by spaces."""
    from simindex.signatures import _fingerprint
    from simindex.signatures.similarity import shingle_set
    items = [" ".join(sh).encode("utf-8", "surrogatepass")
             for sh in simindex.shingles(simindex.tokenize(text, scheme="simindex-v1"), 3)]
    want = sorted(set(_fingerprint.hash_many(items, 0, 1).reshape(-1).tolist())) if items else []
    assert shingle_set(text, "simindex-v1").tolist() == want


def test_annotate_keeps_every_row_with_its_group(tmp_path):
    a, b, c = 0, 0b111, 0b111000 ^ 0b111
    far = 2 ** 64 - 1
    rows = [{"id": n, "fp": f, "x": i} for i, (n, f) in
            enumerate(zip("ABCXY", (a, b, c, far, far ^ 1)))]
    write_jsonl(tmp_path / "in.jsonl", rows)
    common = ["--id-field", "id", "--fingerprint-field", "fp", "--k", "3", "--annotate"]
    cols = ("simindex_duplicate_of", "simindex_distance", "simindex_cluster",
            "simindex_cluster_size", "simindex_similarity", "simindex_evidence")
    for extra, want in (
            ([], [(None, None, "A", 2, None, None), ("A", 3, "A", 2, None, None),
                  (None, None, "C", 1, None, None), (None, None, "X", 2, None, None),
                  ("X", 1, "X", 2, None, None)]),
            (["--mode", "components"], [(None, None, "A", 3, None, None),
                                        ("A", 3, "A", 3, None, None),
                                        ("A", 6, "A", 3, None, None),
                                        (None, None, "X", 2, None, None),
                                        ("X", 1, "X", 2, None, None)]),
            (["--drop-all"], [("B", 3, "A", 3, None, None), ("A", 3, "A", 3, None, None),
                              ("A", 6, "A", 3, None, None), ("Y", 1, "X", 2, None, None),
                              ("X", 1, "X", 2, None, None)])):
        r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "o.csv", *common, *extra)
        assert r.returncode == 0, r.stderr
        with open(tmp_path / "o.csv", newline="", encoding="utf-8") as f:
            got = list(csv.DictReader(f))
        assert [g["id"] for g in got] == list("ABCXY")                 # every row, in order
        assert [tuple(g[c] for c in cols) for g in got] == \
            [tuple("" if v is None else str(v) for v in w) for w in want], extra
    write_jsonl(tmp_path / "bad.jsonl", [{"id": "A", "fp": 1, "simindex_cluster": 1}])
    r = run("dedup", tmp_path / "bad.jsonl", "-o", tmp_path / "o2.jsonl", *common)
    assert r.returncode == 1 and "already has the column 'simindex_cluster'" in r.stderr
    assert not (tmp_path / "o2.jsonl").exists()
    assert not [n for n in os.listdir(tmp_path) if n.endswith((".tmp", ".annotate"))]


@pytest.mark.parametrize("mode", [[], ["--mode", "components"]])
def test_annotate_gives_each_removed_row_the_similarity_and_evidence_of_its_report(
        tmp_path, mode):
    base = " ".join(f"word{i}" for i in range(60))
    rows = [{"id": "a", "text": base}, {"id": "b", "text": base + " extra tail"},
            {"id": "c", "text": "something else entirely, " + base[:50]},
            {"id": "d", "text": base.replace("word7 ", "")}]
    write_jsonl(tmp_path / "in.jsonl", rows)
    common = ["--id-field", "id", "--min-similarity", "0.8", *mode]
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "o.jsonl", "--annotate",
            *common)
    assert r.returncode == 0, r.stderr
    r = run("dedup", tmp_path / "in.jsonl", "-o", tmp_path / "k.jsonl", "--removed",
            tmp_path / "gone.jsonl", *common)
    assert r.returncode == 0, r.stderr
    got = {g["id"]: g for g in map(json.loads, open(tmp_path / "o.jsonl"))}
    gone = {g["id"]: g for g in map(json.loads, open(tmp_path / "gone.jsonl"))}
    assert set(gone) == {"b", "d"}
    for id_, g in got.items():
        if id_ in gone:
            assert (g["simindex_duplicate_of"], g["simindex_similarity"],
                    g["simindex_evidence"]) == \
                (gone[id_]["match"], gone[id_]["similarity"], gone[id_]["evidence"])
            assert g["simindex_evidence"] == "exact" and g["simindex_similarity"] >= 0.8
        else:
            assert g["simindex_similarity"] is None and g["simindex_evidence"] is None


def test_a_reference_it_refuses_is_named_with_the_command_that_makes_one_it_takes(tmp_path):
    base = " ".join(f"word{i}" for i in range(80))
    ref_rows = [{"id": "r1", "text": base}, {"id": "r2", "text": "a reference text of its own"}]
    write_jsonl(tmp_path / "ref.jsonl", ref_rows)
    rows = [{"id": "a", "text": base + " and a tail"}, {"id": "b", "text": "fresh words here"}]
    write_jsonl(tmp_path / "in.jsonl", rows)
    built = run("build", tmp_path / "built", tmp_path / "ref.jsonl")
    assert built.returncode == 0, built.stderr
    args = ["dedup", tmp_path / "in.jsonl", "-o", tmp_path / "out.jsonl", "--id-field", "id",
            "--min-similarity", "0.7", "--against"]
    r = run(*args, tmp_path / "built")
    assert r.returncode == 1 and "make a reference this run can take" in r.stderr
    build, dedup = r.stderr.split("`")[1::2][:2]
    assert build.startswith("simindex build NEW_REFERENCE REFERENCE_ROWS ")
    assert dedup.startswith("simindex dedup REFERENCE_ROWS ")
    for n, command in enumerate((build, dedup)):
        made = run(*command.replace("REFERENCE_ROWS", str(tmp_path / "ref.jsonl"))
                   .replace("REFERENCE_KEPT.jsonl", str(tmp_path / "ref-kept.jsonl"))
                   .replace("NEW_REFERENCE", str(tmp_path / f"ref{n}")).split()[1:],
                   *(["--id-field", "id"] if command is dedup else []))
        assert made.returncode == 0, made.stderr
        r = run(*args, tmp_path / f"ref{n}", "--removed", tmp_path / "gone.jsonl")
        assert r.returncode == 0, r.stderr
        assert [x["id"] for x in read_jsonl(tmp_path / "out.jsonl")] == ["b"]
        assert [(x["id"], x["match"], x["reference"])
                for x in read_jsonl(tmp_path / "gone.jsonl")] == [("a", "r1", True)]


def test_on_a_terminal_the_progress_tells_the_share_done_even_without_a_width(tmp_path):
    """A pseudo-terminal reports 0 columns and 0 lines (as some CI consoles do): the bar is
    drawn at 80 columns, with the rows read of about how many, the percent and the time
    left, and ends at 100% of the rows read."""
    import pty
    import select
    rows = [{"id": i, "text": f"row {i} of the input with words {i % 97} and {i % 89}"}
            for i in range(30000)]
    write_jsonl(tmp_path / "in.jsonl", rows)
    main, sub = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "simindex", "dedup", str(tmp_path / "in.jsonl"),
                          "-o", str(tmp_path / "out.jsonl"), "--k", "3"],
                         stdin=sub, stdout=sub, stderr=sub, env=ENV)
    os.close(sub)
    out = b""
    while select.select([main], [], [], 120)[0]:
        try:
            got = os.read(main, 65536)
        except OSError:                 # the terminal's other end closed
            break
        if not got:
            break
        out += got
    os.close(main)
    assert p.wait(timeout=120) == 0
    text = out.decode("utf-8", "replace")
    assert "100%|" in text and "30000/30000 [" in text and "rows in 30000" in text
    assert re.search(r"\d+%\|.*\| \d+/\d+ \[\d\d:\d\d<\d\d:\d\d", text)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=300),
       st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), max_size=8))
def test_kept_rows_metas_are_their_token_and_position_as_msgpack(token, positions):
    """The records a run adds hold [token, [file, row]] packed as msgpack packs the value
    (made in parts, for speed, and read back by later runs as that value)."""
    import msgpack
    positions = [list(p) for p in positions]
    metas = dedup_module.kept_metas(token, positions, [None] * len(positions),
                                    [None] * len(positions), False)
    assert metas == [msgpack.packb([token, p], use_bin_type=True) for p in positions]
    assert [msgpack.unpackb(m) for m in metas] == [[token, p] for p in positions]
