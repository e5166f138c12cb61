"""simindex.dedup on data in memory: a list of dicts, pandas and polars DataFrames, pyarrow
Tables and Hugging Face datasets give back the same kind, holding the rows the CLI keeps from
the same rows in a JSON lines file (annotated as its --annotate annotates them), with their
own columns, types, index and features; a bad row is named by its position."""

import json
import random
import subprocess
import sys

import datasets
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import simindex
from trials import ENV

ANNOTATIONS = ("simindex_duplicate_of", "simindex_distance", "simindex_cluster",
               "simindex_cluster_size", "simindex_similarity", "simindex_evidence")


def corpus(seed=7, bases=60):
    """Rows of random words, with near-copies (a word changed, dropped or added at the
    end) and exact copies of earlier rows, and a score column."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(400)]
    rows = []
    for b in range(bases):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(30, 80)))
        rows.append(text)
        for _ in range(rng.randint(0, 3)):
            t = rows[rng.randrange(len(rows))].split()
            edit = rng.randrange(4)
            if edit == 0:
                t[rng.randrange(len(t))] = rng.choice(words)
            elif edit == 1:
                del t[rng.randrange(len(t))]
            elif edit == 2:
                t.append(rng.choice(words))
            rows.append(" ".join(t))
    return [{"id": f"r{i}", "text": t, "score": rng.randint(0, 9)} for i, t in enumerate(rows)]


def cli(rows, tmp_path, *options):
    """The CLI's output rows for `rows` written as JSON lines (every row, annotated)."""
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = subprocess.run([sys.executable, "-m", "simindex", "dedup", str(src), "-o", str(out),
                        "--id-field", "id", "--annotate", *map(str, options)],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


KINDS = {
    "list": (lambda rows: rows, lambda out: out),
    "pandas": (pd.DataFrame, lambda out: out.to_dict("records")),
    "polars": (pl.DataFrame, lambda out: out.to_dicts()),
    "arrow": (pa.Table.from_pylist, lambda out: out.to_pylist()),
    "dataset": (datasets.Dataset.from_list, lambda out: out.to_list()),
    "iterable": (lambda rows: datasets.Dataset.from_list(rows).to_iterable_dataset(),
                 lambda out: list(out)),
}
RULES = {
    "k3": (["--k", "3"], dict(k=3)),
    "similarity": (["--min-similarity", "0.8"], dict(min_similarity=0.8)),
    "components-longest": (["--min-similarity", "0.8", "--keep", "longest"],
                           dict(min_similarity=0.8, keep="longest")),
    "keep-score": (["--k", "3", "--keep", "score"], dict(k=3, keep="score")),
}


def plain(row):
    """A row's values as JSON gives them back (NaN and None alike: pandas' missing)."""
    return {k: None if isinstance(v, float) and v != v else v for k, v in row.items()}


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_keeps_and_annotates_the_rows_the_cli_does(tmp_path, kind, rule):
    rows = corpus()
    flags, options = RULES[rule]
    want = cli(rows, tmp_path, *flags)
    make, back = KINDS[kind]
    kept = back(simindex.dedup(make(rows), id_field="id", **options))
    assert kept == [{c: r[c] for c in ("id", "text", "score")} for r in want
                    if r["simindex_duplicate_of"] is None]
    assert len(kept) < len(rows)                          # the corpus has near-copies
    annotated = [plain(r) for r in
                 back(simindex.dedup(make(rows), id_field="id", annotate=True, **options))]
    assert annotated == want


@pytest.mark.parametrize("kind", KINDS)
def test_without_an_id_a_row_is_known_by_its_position(kind):
    rows = [{"text": "the same words in the same order here"}, {"text": "another text"},
            {"text": "the same words in the same order here"}]
    make, back = KINDS[kind]
    got = back(simindex.dedup(make(rows), k=3, annotate=True))
    assert [(r["simindex_duplicate_of"], r["simindex_cluster"]) for r in got] == \
        [(None, 0), (None, 1), (0, 0)]
    assert back(simindex.dedup(make(rows), k=3)) == rows[:2]


def test_a_dataframe_keeps_its_index_and_types_and_a_dataset_its_features():
    rows = corpus(seed=3, bases=20)
    df = pd.DataFrame(rows, index=[f"x{i}" for i in range(len(rows))]).astype(
        {"score": "int8"})
    out = simindex.dedup(df, min_similarity=0.8)
    assert list(out.columns) == ["id", "text", "score"] and out["score"].dtype == "int8"
    assert set(out.index) < set(df.index)
    assert out.equals(df.loc[out.index])
    ds = datasets.Dataset.from_list(rows).cast_column("score", datasets.Value("int16"))
    got = simindex.dedup(ds, min_similarity=0.8)
    assert got.features == ds.features and got["id"] == list(out["id"])
    table = pa.Table.from_pylist(rows)
    assert simindex.dedup(table, min_similarity=0.8).schema == table.schema
    frame = pl.DataFrame(rows)
    assert simindex.dedup(frame, min_similarity=0.8).schema == frame.schema
    assert simindex.dedup(pd.DataFrame({"text": []}, dtype=str), k=3).empty


def test_a_bad_row_is_named_by_its_position_or_skipped_as_asked():
    rows = [{"text": "one two three four"}, {"text": b"raw bytes"}, {"text": None},
            "not a row", {"text": "five six seven eight"}]
    with pytest.raises(simindex.BadLine, match=r"^row 1: field \"text\" holds a bytes"):
        simindex.dedup(rows, k=3)
    seen = []
    kept = simindex.dedup(rows, k=3, on_error=seen.append)
    assert kept == [rows[0], rows[4]]
    assert [str(e) for e in seen] == [
        'row 1: field "text" holds a bytes, not a string or a number',
        'row 2: text field "text" is missing or not text (got NoneType)',
        "row 3: the row is a str, not a mapping"]
    assert simindex.dedup(rows, k=3, on_error="skip") == [rows[0], rows[4]]
    df = pd.DataFrame({"text": ["alpha beta gamma", None, "delta epsilon"]})
    with pytest.raises(simindex.BadLine, match="^row 1: text field"):
        simindex.dedup(df, k=3)


def test_what_cannot_be_asked_of_data_in_memory_is_refused_by_name(tmp_path):
    df = pd.DataFrame({"body": ["a b c d"], "simindex_cluster": [1]})
    with pytest.raises(simindex.ParameterError, match="no column 'text' .*body"):
        simindex.dedup(df, k=3)
    with pytest.raises(simindex.ParameterError, match="already has the column "
                                                      "'simindex_cluster'"):
        simindex.dedup(df, text_field="body", k=3, annotate=True)
    with pytest.raises(simindex.ParameterError, match="not a dict"):
        simindex.dedup({"text": "a"}, k=3)
    with pytest.raises(simindex.ParameterError, match="annotate=True is for data in memory"):
        simindex.dedup(str(tmp_path / "in.jsonl"), annotate=True)
    with pytest.raises(simindex.ParameterError, match="fmt= is not an option"):
        simindex.dedup([{"text": "a b"}], fmt="csv")


def test_an_index_kept_by_a_call_in_memory_serves_the_next_call_and_the_cli(tmp_path):
    rows = corpus(seed=5, bases=30)
    half = len(rows) // 2
    idx = str(tmp_path / "idx")
    first = simindex.dedup(rows[:half], id_field="id", min_similarity=0.8, index=idx)
    second = simindex.dedup(pd.DataFrame(rows[half:]), id_field="id", min_similarity=0.8,
                            index=idx)
    whole = simindex.dedup(rows, id_field="id", min_similarity=0.8)
    assert first + second.to_dict("records") == whole
    with simindex.Index(idx, readonly=True) as index:
        assert len(index) == len(whole)
    (tmp_path / "again.jsonl").write_text(json.dumps(dict(rows[0], id="again")) + "\n")
    r = subprocess.run([sys.executable, "-m", "simindex", "dedup",
                        str(tmp_path / "again.jsonl"), "-o", str(tmp_path / "out.jsonl"),
                        "--index", idx, "--id-field", "id", "--min-similarity", "0.8"],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0 and "kept 0, removed 1" in r.stderr, r.stderr


def test_what_users_hold_is_read_as_they_hold_it_or_refused_by_name(tmp_path):
    """numpy scalars read as numbers and text; a subclass of a DataFrame is one; an id
    column of any name is the user's; an id taken twice, text that is not Unicode and a
    stream with skipped rows are named by the row's position; what is not rows is refused."""
    import numpy as np
    rows = [{"text": np.str_("one two three four"), "s": np.float64(2.0), "id": np.int64(5)},
            {"text": "one two three four", "s": 3, "id": 6}]
    assert simindex.dedup(rows, id_field="id", k=3, keep="s") == [rows[1]]

    class Frame(pd.DataFrame):
        pass
    assert len(simindex.dedup(Frame({"text": ["a b c d", "a b c d"]}), k=3)) == 1
    named = [{"simindex_row": "a", "text": "p q r s"}, {"simindex_row": "b", "text": "p q r s"}]
    (_, b) = simindex.dedup(named, id_field="simindex_row", k=3, annotate=True)
    assert (b["simindex_duplicate_of"], b["simindex_cluster"]) == ("a", "a")
    with pytest.raises(simindex.IdExistsError, match=r"^row 2: the id 'a'"):
        simindex.dedup([{"id": "a", "text": "x y z w"}, {"id": "b", "text": "q r s t"},
                        {"id": "a", "text": "far other words"}], id_field="id", k=3)
    with pytest.raises(simindex.BadLine, match=r"^row 0: a value holds text that is not "
                                               r"valid Unicode"):
        simindex.dedup([{"text": "bad \udc80 text"}], k=3)
    assert simindex.dedup([{"text": "bad \udc80"}, {"text": "good text"}], k=3,
                          on_error="skip") == [{"text": "good text"}]
    stream = datasets.Dataset.from_list([{"text": "a b c d"}, {"text": None},
                                         {"text": "a b c d"}]).to_iterable_dataset()
    got = list(simindex.dedup(stream, k=3, annotate=True, on_error="skip"))
    assert [r["simindex_duplicate_of"] for r in got] == [None, 0]
    with pytest.raises(simindex.ParameterError, match="with index=, give id_field"):
        simindex.dedup([{"text": "a b c d"}], k=3, index=str(tmp_path / "i"))
    with pytest.raises(simindex.ParameterError, match="the Series holds strs"):
        simindex.dedup(pd.Series(["a b", "c d"]), k=3)
    with pytest.raises(simindex.ParameterError, match="named by a string, not 0"):
        simindex.dedup(pd.DataFrame({0: ["a b c"]}), text_field=0, k=3)
    with pytest.raises(simindex.ParameterError, match="two columns named 'text'"):
        simindex.dedup(pd.DataFrame([["a b c", "x"]], columns=["text", "text"]), k=3)
