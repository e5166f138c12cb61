"""The reference pages state what the code does, and the code is read to check them: the
schemes page's golden vectors, the statistics page's keys, the errors page's hierarchy.
Each test parses its page, so a change to the code that the page does not follow fails
here, naming the page."""

import ast
import inspect
import os
import re

import pytest

import simindex
import simindex.errors
from conftest import ROOT


def page(name):
    return open(os.path.join(ROOT, "docs", "reference", name), encoding="utf-8").read()


def sections(text):
    """{name: body} of the page's `## `name`` sections."""
    parts = re.split(r"^## `([^`]+)`\s*$", text, flags=re.M)
    return {parts[i]: parts[i + 1].split("\n## ")[0] for i in range(1, len(parts), 2)}


def table(body):
    """The rows of the first table in `body`, as lists of cells (header row included)."""
    rows = [line for line in body.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
    return [r for r in cells if not all(set(c) <= set("-: ") for c in r)]


def code(cell):
    m = re.fullmatch(r"`(.*)`", cell)
    assert m, f"not a code span: {cell!r}"
    return m.group(1)


# --- docs/reference/schemes.md -----------------------------------------------------------

SCHEMES = sections(page("schemes.md"))


def test_the_schemes_page_names_every_scheme():
    # the minhash-lsh-v1 family (left out of iteration) by its member of 2 rows per band
    assert sorted(SCHEMES) == sorted([*simindex.schemes, "minhash-lsh-v1-r2"])


def golden_vectors():
    out = []
    for name, body in SCHEMES.items():
        header, *rows = table(body)
        assert header[0] == "input", name
        widths = [int(w) for w in header[1:]]
        for row in rows:
            text = ast.literal_eval(code(row[0]))
            assert len(row) == len(header), f"{name}: {row}"
            for width, cell in zip(widths, row[1:]):
                out.append(pytest.param(name, width, text, code(cell),
                                        id=f"{name}-{width}-{text[:12]!r}"))
    return out


def test_the_schemes_page_gives_each_scheme_its_widths_and_four_inputs():
    for name, body in SCHEMES.items():
        m = re.search(r"^- \*\*Widths:\*\* (.*)$", body, re.M)
        assert m, f"{name}: no Widths line"
        widths = tuple(int(w) for w in m.group(1).split(","))
        assert widths == simindex.schemes[name].widths, name
        header, *rows = table(body)
        assert tuple(int(w) for w in header[1:]) == widths, name
        assert len(rows) == 4 and ast.literal_eval(code(rows[0][0])) == "", name
        assert any(ord(c) > 127 for c in ast.literal_eval(code(rows[-1][0]))), name


@pytest.mark.parametrize("scheme,width,text,expected", golden_vectors())
def test_golden_vector(scheme, width, text, expected):
    if expected == "InputError":
        with pytest.raises(simindex.InputError):
            simindex.fingerprint(text, scheme=scheme, width=width)
        return
    assert re.fullmatch(f"[0-9a-f]{{{width // 4}}}", expected), "width/4 lowercase hex digits"
    assert simindex.fingerprint(text, scheme=scheme, width=width) == int(expected, 16)


def test_token_hash_example():
    """The one-feature example at the end of the schemes page."""
    text = page("schemes.md")
    fp = re.search(r'`simindex.simhash\(\["a"\], hash="md5", width=128\)` is the MD5 of `a`,\s+'
                   r'`([0-9a-f]{32})`', text).group(1)
    assert simindex.simhash(["a"], hash="md5", width=128) == int(fp, 16)
    assert simindex.compute([int(fp, 16)], width=128) == int(fp, 16)


# --- docs/reference/stats.md -------------------------------------------------------------

def test_the_stats_page_lists_exactly_the_keys_of_stats(tmp_path):
    text = page("stats.md")
    header, *rows = table(text[text.index("\n| key |"):])
    assert header[0] == "key"
    documented = [code(r[0]) for r in rows]
    assert len(documented) == len(set(documented))
    for width, k in ((64, 3), (256, 20)):
        with simindex.Index(str(tmp_path / f"w{width}"), width=width, k=k) as idx:
            idx.add_many([(f"d{i}", i * 0x9E3779B97F4A7C15 % 2**64) for i in range(50)])
            idx.remove("d3")
            keys = list(idx.stats())
        assert documented == keys, f"width {width}: page {documented}, stats() {keys}"


# --- docs/reference/errors.md ------------------------------------------------------------

ERRORS = sections(page("errors.md"))


def error_classes():
    """Every Error class simindex.errors defines, and every exception simindex exports."""
    found = {c for _, c in inspect.getmembers(simindex.errors, inspect.isclass)
             if issubclass(c, simindex.Error)}
    found |= {getattr(simindex, n) for n in simindex.__all__
              if inspect.isclass(getattr(simindex, n))
              and issubclass(getattr(simindex, n), BaseException)}
    return sorted(found, key=lambda c: c.__name__)


def test_the_errors_page_holds_every_error_with_its_bases():
    classes = error_classes()
    assert {c.__name__ for c in classes} == set(ERRORS)
    for cls in classes:
        body = ERRORS[cls.__name__]
        m = re.search(r"^\*\*Bases:\*\* (.*)$", body, re.M)
        assert m, f"{cls.__name__}: no Bases line"
        assert [code(b.strip()) for b in m.group(1).split(",")] == \
            [b.__name__ for b in cls.__bases__], cls.__name__
        if cls is not simindex.Error:
            assert "**Raised when**" in body and "**What to do:**" in body, cls.__name__


def test_the_errors_page_tree_is_the_hierarchy():
    """The tree at the top: each class under its first base, its other bases named."""
    tree = re.search(r"```text\n(Error .*?)```", page("errors.md"), re.S).group(1)
    classes = {c.__name__: c for c in error_classes()}
    seen, stack = [], []                 # stack: (column, name)
    for line in tree.splitlines():
        m = re.match(r"^([│├└─\s]*)(\w+)\s*(?:\((?:also )?(\w+)\))?$", line)
        assert m, line
        col, name, extra = len(m.group(1)), m.group(2), m.group(3)
        while stack and stack[-1][0] >= col:
            stack.pop()
        cls = classes[name]
        if stack:
            assert cls.__bases__[0].__name__ == stack[-1][1], line
        others = [b.__name__ for b in cls.__bases__[1:]] or \
            ([cls.__bases__[0].__name__] if not stack else [])
        assert others == ([extra] if extra else []), line
        stack.append((col, name))
        seen.append(name)
    assert sorted(seen) == sorted(classes)
