"""The pieces a dedup run reads and keeps rows with: a JSON line reads as the json module
reads it (the same object, or a BadLine where the json module fails), and its line is written
back byte for byte; the shingle sets of judged rows come back from the spill as they were
put, across flushes and rewinds, and a check against them reads a set only when the set
sizes leave the similarity asked possible."""

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simindex.datasets.check import Check, Shingles, Spill
from simindex.datasets.rows import JsonRow, RowWriter, read_rows
from simindex.errors import BadLine

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**80, 2**80) |
    st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)

# lines the json module reads that stricter decoders refuse, and lines nobody reads
ODD_LINES = [
    b'{"a": NaN, "b": Infinity, "c": -Infinity}', b'{"a": 1e400}',
    b'{"t": "\\ud800 lone"}', b'{"t": "\\udfff"}', b'{"n": 123456789012345678901234567890}',
    b'{"n": -9223372036854775809}', b'{"a": 1, "a": 2, "b": 3}', b'  {"a": 1}\t ',
    b'{"t": "\\u0000"}', b'{"t": "caf\xc3\xa9"}', b'\xef\xbb\xbf{"bom": 1}', b'[1, 2]',
    b'"text"', b'{"a": 1} x', b'{"t": "\xff"}', b'{"t": "a\x01b"}', b'{not json}', b' \t',
    b'', b'{"a": 1}\r', b'{"a": [' * 3000 + b']' * 3000 + b'}',
]


def reference(raw: bytes, n: int):
    """What the json module makes of line n: the object, an error, or None (blank)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "error"
    if n == 1 and line.startswith("\ufeff"):
        line = line[1:]
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return "error"
    return obj if isinstance(obj, dict) else "error"


def read_back(tmp_path, lines):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(raw + b"\n" for raw in lines))
    bad = []
    rows = {row.number: row for row in read_rows(str(path), on_error=bad.append)}
    return rows, {int(b.where.rsplit(":", 1)[1]) for b in bad}


def same(a, b):
    """Equal as JSON values, NaN equal to itself and int apart from float."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) and \
        type(a) is type(b)


@pytest.mark.parametrize("first", [False, True])
def test_odd_lines_read_as_the_json_module_reads_them(tmp_path, first):
    for raw in ODD_LINES:
        lines = [raw] if first else [b'{"x": 0}', raw]
        n = len(lines)
        rows, bad = read_back(tmp_path, lines)
        want = reference(raw, n)
        if want == "error":
            assert bad == {n}, raw
        elif want is None:
            assert n not in rows and not bad, raw
        else:
            assert not bad and same(dict(rows[n].data), want), raw
            assert all(type(x) is type(y) for x, y in zip(rows[n].data.values(),
                                                          want.values())), raw


@settings(max_examples=150, deadline=None)
@given(st.lists(st.dictionaries(st.text(), json_values, max_size=5), min_size=1, max_size=5),
       st.booleans())
def test_any_json_object_reads_back_equal_with_its_line(tmp_path_factory, objs, ascii_only):
    lines = [json.dumps(o, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
             for o in objs]
    rows, bad = read_back(tmp_path_factory.mktemp("j"), lines)
    assert not bad
    for n, (raw, obj) in enumerate(zip(lines, objs), 1):
        assert same(dict(rows[n].data), json.loads(raw.decode("utf-8", "surrogatepass")))
        assert type(rows[n].data) is JsonRow and rows[n].data.line == raw


def test_a_jsonl_output_holds_each_line_as_it_was_read(tmp_path):
    lines = [b'{"id": 1,   "text": "spaced  as  written"}', b'{"t": "\\u00e9t\\u00e9"}',
             b'{"t": "\xc3\xa9t\xc3\xa9", "n": 1.50}', b'{"a": NaN}']
    rows, bad = read_back(tmp_path, lines)
    assert not bad
    for name in ("out.jsonl", "out.jsonl.gz"):
        w = RowWriter(str(tmp_path / name), "jsonl")
        for n in sorted(rows):
            w.write(rows[n].data)
        w.write({"plain": "dict", "é": 1})
        w.commit()
        got = list(read_rows(str(tmp_path / name)))
        assert [r.data.line for r in got] == lines + ['{"plain": "dict", "é": 1}'.encode()]


def test_a_broken_line_is_named_with_its_number(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"a": \xe9}\n[1]\n')
    bad = []
    rows = list(read_rows(str(path), on_error=bad.append))
    assert [r.where for r in rows] == [f"{path}:1"]
    assert [b.where for b in bad] == [f"{path}:3", f"{path}:4"]
    assert "invalid UTF-8: byte 0xe9" in str(bad[0]) and "must be an object" in str(bad[1])
    with pytest.raises(BadLine, match=":3: invalid UTF-8"):
        list(read_rows(str(path)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.sampled_from(["put", "mark", "rewind"])),
                max_size=60),
       st.integers(1, 7))
def test_the_spill_gives_back_every_set_put_and_not_rewound(tmp_path_factory, steps, pending):
    """A model: a dict of the sets put, marks as copies of it. The spill holds few sets in
    memory (pending), so most gets read them from its files, which grow (and are mapped
    again) many times."""
    spill = Spill(str(tmp_path_factory.mktemp("s")))
    spill.PENDING = pending
    spill.ROOM = (3, 1)
    model: dict = {}
    marks: list = []
    pos = [0, 0]
    try:
        for size, what in steps:
            if what == "put":
                pos = [pos[0] + (pos[1] % 5 == 4), pos[1] + 1]
                exact = np.arange(size, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
                spill.put(pos, exact)
                model[tuple(pos)] = exact
            elif what == "mark":
                marks.append((spill.mark(), dict(model), list(pos)))
            elif marks:
                mark, model, pos = marks.pop()
                spill.rewind(mark)
            for key, exact in model.items():
                got = spill.get(list(key))
                assert got is not None and got.tolist() == exact.tolist()
                assert spill.holds(list(key))
            assert spill.get([pos[0] + 1, pos[1] + 1]) is None
            assert not spill.holds([pos[0] + 1, pos[1] + 1])
            assert spill.get(None) is None
    finally:
        spill.close()


def test_a_pending_view_counts_the_whole_array_it_holds(tmp_path):
    """The text pass gives a batch's sets as views of one array: a view waiting in the
    spill holds all of it, so the spill counts the array (once) against PENDING_BYTES."""
    spill = Spill(str(tmp_path))
    spill.PENDING_BYTES = 4000
    batch = np.arange(1000, dtype=np.uint64)          # 8,000 bytes
    spill.put([0, 1], batch[:2])
    assert spill.entries == 1                         # written at once, not held
    spill.put([0, 2], np.arange(3, dtype=np.uint64))   # an array of its own: 24 bytes
    assert spill.entries == 1
    assert spill.get([0, 1]).tolist() == [0, 1] and spill.get([0, 2]).tolist() == [0, 1, 2]
    spill.close()


def test_a_set_put_twice_at_one_position_keeps_the_first(tmp_path):
    spill = Spill(str(tmp_path))
    spill.put([0, 1], np.array([1, 2], dtype=np.uint64))
    spill.put([0, 1], np.array([3], dtype=np.uint64))
    spill.flush()
    spill.put([0, 1], np.array([4], dtype=np.uint64))
    assert spill.get([0, 1]).tolist() == [1, 2]
    spill.close()


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 60), max_size=40), st.sets(st.integers(0, 60), max_size=40),
       st.sampled_from([0.1, 0.25, 0.5, 0.6, 2 / 3, 0.75, 0.9, 1.0]),
       st.sampled_from(["jaccard", "containment"]))
def test_a_check_against_a_run_record_is_the_exact_one(tmp_path_factory, a, b, t, measure):
    """Whether the record's set is read or its size rules it out, the answer is the exact
    check's; a set is read only when its size leaves the threshold reachable."""
    check = Check(t, measure, b"run", str(tmp_path_factory.mktemp("c")))
    try:
        mine = Shingles(np.array(sorted(a), dtype=np.uint64))
        theirs = np.array(sorted(b), dtype=np.uint64)
        check.keep([0, 1], theirs)
        reads = []
        get = check.spill.get
        check.spill.get = lambda pos: reads.append(pos) or get(pos)
        ok, sim, how, _ = check.stored(mine, [b"run", [0, 1]], (b"", len(theirs)))
        exact = check(mine, theirs)
        assert ok == exact[0] and how == "exact"
        if ok:
            assert sim == exact[1]
        x, y = len(a), len(b)
        possible = (min(x, y) / max(x, y) >= t if max(x, y) else True) \
            if measure == "jaccard" else (min(x, y) / x >= t if x else True)
        assert bool(reads) == possible
    finally:
        check.close()
