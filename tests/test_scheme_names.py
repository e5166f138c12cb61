"""Scheme names say what a scheme is compatible with (pypi-simhash, seomoz-simhash,
md5-128-notebook), and each also answers to an alias (1e0ng, seomoz, memosstilvi): every
call that takes a scheme takes the alias and fingerprints alike, a new index records the
name, and an index whose manifest records an alias opens, fingerprints and answers as one
that records the name (its file keeps what it records)."""

import os
import shutil
import tarfile

import msgpack
import pytest

import simindex
from test_cli import run
from test_fingerprints import real_texts

NAMES = {"1e0ng": "pypi-simhash", "seomoz": "seomoz-simhash", "memosstilvi": "md5-128-notebook"}
DOC = " ".join(f"word{i}, clause{i % 7}; part{i % 3}" for i in range(120))


def recorded(path):
    with open(os.path.join(path, "manifest.msgpack"), "rb") as f:
        return msgpack.unpackb(f.read())


def record(path, **fields):
    """Rewrite fields of an index's manifest as a file made under an alias would hold them."""
    m = recorded(path)
    m.update(fields)
    with open(os.path.join(path, "manifest.msgpack"), "wb") as f:
        f.write(msgpack.packb(m))


def test_schemes_lists_each_scheme_once_under_its_name():
    assert list(simindex.schemes) == ["simindex-v1", "minhash-v1", "pypi-simhash",
                                      "seomoz-simhash", "md5-128-notebook"]
    assert len(simindex.schemes) == 5 and len(dict(simindex.schemes)) == 5
    for alias, name in NAMES.items():
        s = simindex.schemes[name]
        assert s.name == name and s.aliases == (alias,)
        assert alias in simindex.schemes and simindex.schemes[alias] is s
        assert simindex.schemes.get(alias) is s and alias not in list(simindex.schemes)
    assert simindex.schemes["simindex-v1"].aliases == ()
    assert "nope" not in simindex.schemes and simindex.schemes.get("nope") is None
    with pytest.raises(TypeError):
        simindex.schemes["seomoz"] = None                    # read-only
    with pytest.raises(simindex.ParameterError, match="known: simindex-v1, minhash-v1, "
                                                       "pypi-simhash, seomoz-simhash, "
                                                       "md5-128-notebook$"):
        simindex.fingerprint("a b c d", scheme="seomoz-v1")


@pytest.mark.parametrize("alias,name", NAMES.items())
def test_an_alias_fingerprints_and_tokenizes_as_its_scheme(alias, name):
    texts = [t for t in real_texts(120) if len(t.split()) >= 4] + [DOC, "Ünïcode, tëxt; ok go"]
    for width in simindex.schemes[name].widths:
        for text in texts:
            assert simindex.fingerprint(text, scheme=alias, width=width) == \
                simindex.fingerprint(text, scheme=name, width=width)
    for text in texts[:20]:
        assert simindex.tokenize(text, scheme=alias) == simindex.tokenize(text, scheme=name)
    with pytest.raises(simindex.InputError, match=f"under scheme '{name}'"):
        simindex.fingerprint("   ", scheme=alias)
    assert simindex.fingerprint(DOC, scheme=simindex.schemes[alias]) == \
        simindex.fingerprint(DOC, scheme=name)


@pytest.mark.parametrize("alias,name", NAMES.items())
def test_a_new_index_made_with_an_alias_records_the_name(tmp_path, alias, name):
    width = simindex.schemes[name].widths[0]
    k = 3 if width == 64 else 8
    with simindex.Index(tmp_path / "i", scheme=alias, width=width, k=k) as idx:
        assert idx.scheme == name and idx.stats()["scheme"] == name
        assert idx.add_text("d", DOC) == simindex.fingerprint(DOC, scheme=name, width=width)
    assert recorded(tmp_path / "i")["scheme"] == name
    for given in (alias, name, None):                         # reopened under either name
        with simindex.Index(tmp_path / "i", scheme=given, width=width) as idx:
            assert idx.scheme == name and [m.id for m in idx.query_text(DOC)] == ["d"]
    with pytest.raises(simindex.ParameterError, match=f"scheme='simindex-v1' was given, but "
                                                       f"the index was built with "
                                                       f"scheme='{name}'"):
        simindex.Index(tmp_path / "i", scheme="simindex-v1")


@pytest.mark.parametrize("alias,name", NAMES.items())
def test_an_index_that_records_an_alias_opens_and_answers_as_one_that_records_the_name(
        tmp_path, alias, name):
    width = simindex.schemes[name].widths[0]
    k = 3 if width == 64 else 8
    texts = [t for t in real_texts(80) if len(t.split()) >= 4]
    made = {}
    for which in ("named", "aliased"):
        path = str(tmp_path / which)
        with simindex.Index(path, scheme=name, width=width, k=k) as idx:
            made[which] = [idx.add_text(f"t{i}", t) for i, t in enumerate(texts[:40])]
        if which == "aliased":
            record(path, scheme=alias)
    assert made["named"] == made["aliased"]
    answers = {}
    for which in ("named", "aliased"):
        path = str(tmp_path / which)
        with simindex.Index(path, readonly=True) as idx:
            assert idx.scheme == name and idx.stats()["scheme"] == name
            assert idx.verify() == []
            answers[which] = [[(m.id, m.distance) for m in idx.query_text(t)] for t in texts]
        with simindex.Index(path, scheme=alias, width=width) as idx:   # a writer, either name
            idx.add_text("more", texts[-1] + " and a tail")
            assert idx.fingerprint(DOC) == simindex.fingerprint(DOC, scheme=name, width=width)
        with simindex.Index(path, scheme=name, width=width) as idx:
            answers[which].append(sorted((a, b) for a, b, _ in idx.pairs()))
    assert answers["named"] == answers["aliased"]
    assert recorded(tmp_path / "aliased")["scheme"] == alias        # the file keeps it
    with pytest.raises(simindex.ParameterError, match="was built with scheme="):
        simindex.Index(str(tmp_path / "aliased"), scheme="minhash-v1")


def test_an_index_of_slab_layout_v1_that_records_an_alias_keeps_it_when_upgraded(tmp_path):
    data = os.path.join(os.path.dirname(__file__), "data", "index-v1.tar.gz")
    with tarfile.open(data) as t:
        t.extractall(tmp_path, filter="data")
    path = str(tmp_path / "index-v1")
    record(path, scheme="seomoz")
    with simindex.Index(path) as idx:                         # a writable open upgrades
        assert idx.scheme == "seomoz-simhash"
        idx.add_text("doc", DOC)
        assert [m.id for m in idx.query_text(DOC)] == ["doc"]
    m = recorded(path)
    assert m["layout"] == "packed-blocks-v2" and m["scheme"] == "seomoz"


def test_a_calibration_under_an_alias_is_the_scheme_s(tmp_path):
    texts = [t for t in real_texts(60) if len(t.split()) >= 4]
    cal = simindex.calibrate(texts, 0.8, scheme="seomoz")
    assert cal.scheme == "seomoz-simhash" and cal.stored()["scheme"] == "seomoz-simhash"
    path = str(tmp_path / "i")
    with simindex.Index(path, calibration=cal) as idx:
        assert idx.scheme == "seomoz-simhash"
        idx.add_text("d", DOC)
    stored = dict(cal.stored(), scheme="seomoz")
    record(path, scheme="seomoz", calibration=stored)       # as made under the alias
    with simindex.Index(path, calibration=stored) as idx:
        assert idx.calibration == cal.stored()
        assert idx.text_check() == (cal.k, 0.8, "jaccard", False)
        assert [m.id for m in idx.query_text(DOC)] == ["d"]
    with simindex.Index(path, calibration=cal) as idx:
        assert idx.scheme == "seomoz-simhash"


def test_the_command_line_takes_an_alias_and_lists_the_names(tmp_path):
    p = run("build", tmp_path / "i", "--scheme", "1e0ng",
            input='{"id": "x", "text": "' + DOC + '"}\n', check=0)
    assert recorded(tmp_path / "i")["scheme"] == "pypi-simhash"
    info = run("info", tmp_path / "i", check=0)
    assert "pypi-simhash" in info.stdout + info.stderr and "1e0ng" not in info.stdout
    record(tmp_path / "i", scheme="1e0ng")
    q = run("query", tmp_path / "i", input='{"id": "q", "text": "' + DOC + '"}\n', check=0)
    assert '"id": "x"' in q.stdout and '"distance": 0' in q.stdout
    (tmp_path / "rows.jsonl").write_text("".join(
        f'{{"text": "{DOC} {i % 2}"}}\n' for i in range(6)))
    d = run("dedup", tmp_path / "rows.jsonl", "--output", tmp_path / "out.jsonl",
            "--scheme", "seomoz", "--k", "3", check=0)
    assert "seomoz-simhash 64 bits" in d.stderr
    bad = run("build", tmp_path / "j", "--scheme", "nope", input="", check=2)
    assert "simindex-v1" in bad.stderr and "md5-128-notebook" in bad.stderr
    helped = run("build", "--help", check=0).stdout
    assert "1e0ngforpypi-simhash" in "".join(helped.split())      # however click wraps it
    assert p.returncode == 0


def test_dedup_and_the_scrapy_setting_take_an_alias(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"text": "{DOC} {i % 2}"}}\n' for i in range(4)))
    summary = simindex.datasets.run.Summary()
    kept = [d for d in simindex.decisions(str(rows), scheme="memosstilvi", width=128, k=8,
                                          summary=summary) if d.kept]
    assert len(kept) == 1 and summary.radius["scheme"] == "md5-128-notebook"
    pytest.importorskip("scrapy")
    from scrapy.settings import Settings

    from simindex.scrapy import _scheme
    assert _scheme(Settings({"SIMINDEX_SCHEME": "seomoz"})) == "seomoz-simhash"
    assert _scheme(Settings({})) is None
    with pytest.raises(simindex.ParameterError, match="known: simindex-v1"):
        _scheme(Settings({"SIMINDEX_SCHEME": "nope"}))


def test_the_server_answers_text_on_an_index_that_records_an_alias(tmp_path):
    pytest.importorskip("uvicorn")
    from test_server import Server
    path = str(tmp_path / "idx")
    with simindex.Index(path, scheme="seomoz-simhash") as idx:
        idx.add_text("doc", DOC)
    record(path, scheme="seomoz")
    s = Server(path, workers=1)
    try:
        with s.client() as c:
            assert c.get("/stats").json()["scheme"] == "seomoz-simhash"
            got = c.post("/query", json={"text": DOC}).json()["matches"]
            assert [(m["id"], m["distance"]) for m in got] == [("doc", 0)]
    finally:
        s.stop()
    shutil.rmtree(path)


def test_the_names_every_layer_reads_are_the_schemes_defined():
    """The engine reads scheme names from manifests through simindex.scheme_names; the
    schemes the signatures define are exactly those names, with those aliases."""
    from simindex import scheme_names
    assert tuple(simindex.schemes) == scheme_names.NAMES
    assert {a: s.name for s in simindex.schemes.values() for a in s.aliases} == \
        dict(scheme_names.ALIASES)
