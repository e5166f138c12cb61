"""Text to fingerprints under frozen, named schemes, and simhash over weighted features.

The simhash bit rule: bit i (value 2**i) of the fingerprint is set when the sum, over
features, of +w (the feature's token hash has bit i set) or -w (it has not) is strictly
positive. A tie (sum exactly 0) leaves the bit clear. The minhash-v1 scheme makes a one-bit
MinHash code instead, whose Hamming distance estimates the Jaccard similarity of shingle
sets (see its `bit_rule`).
"""

from __future__ import annotations

import math
import numbers
import re
import unicodedata
from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Optional, Sequence, Union

import numpy as np

from . import _fingerprint, _text
from ..errors import InputError, InputTypeError, ParameterError
from ..scheme_names import LSH_ROWS, aliases_of, lsh_name, lsh_rows, lsh_shape

WIDTHS = (64, 128, 256)
DEFAULT_SCHEME = "simindex-v1"     # what a new index records unless told otherwise
_MAX_INT_WEIGHT_SUM = 1 << 62


class Scheme(NamedTuple):
    """Everything that decides a scheme's fingerprints; frozen once released.

    `name` is what a new index records; `aliases` are other names every call that takes a
    scheme also takes for it, and an index whose manifest records an alias opens as this
    scheme and fingerprints alike."""
    name: str
    version: int
    tokenizer: str
    shingle_width: int
    joiner: str
    hash: str
    weighting: str
    bit_rule: str
    short_text: str
    widths: tuple[int, ...] = (64,)
    aliases: tuple[str, ...] = ()


_BIT_RULE = "bit i set when sum(+w if bit i of the token hash else -w) > 0; ties clear"
_WORDS = ("NFKC normalization, then str.casefold(); tokens are runs of word characters "
          "(regex \\w), except that each Han, Hiragana or Katakana character is a token of "
          "its own")

class _Schemes(Mapping[str, Scheme]):
    """The read-only mapping name -> Scheme of every scheme under its name; a lookup (`[]`,
    `in`, `get`) also takes an alias, and the name of each minhash-lsh-v1 scheme
    ("minhash-lsh-v1-r1" to "-r32", 8 bands of that many rows, and "minhash-lsh-v1-b16-r1"
    to "-b16-r16", "-b24-r1" to "-b24-r10", "-b32-r1" to "-b32-r8"), which iterating and
    `len` leave out (the similarity threshold's calibration chooses among them)."""

    def __init__(self, *entries: Scheme) -> None:
        self._by_name = MappingProxyType({s.name: s for s in entries})
        self._aliases = MappingProxyType({a: s.name for s in entries for a in s.aliases})

    def __getitem__(self, name: str) -> Scheme:
        shape = lsh_shape(name)
        if shape is not None:
            return lsh_scheme(shape[1], shape[0])
        return self._by_name[self._aliases.get(name, name)]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def __repr__(self) -> str:
        return f"simindex.schemes({', '.join(self._by_name)})"


schemes = _Schemes(
    Scheme(
        name="simindex-v1", version=1, tokenizer=_WORDS, shingle_width=3, joiner="single space",
        hash="of the UTF-8 shingle, as an unsigned integer: xxh3-64 (seed 0) at width 64; "
             "xxh3-128 (seed 0) at 128; at 256, xxh3-128 with seed 0 (the high 128 bits) "
             "then with seed 1 (the low 128 bits)",
        weighting="each shingle occurrence counts 1 (repeats add up)",
        bit_rule=_BIT_RULE,
        short_text="fewer than 3 tokens: one shingle of all of them; no token: InputError",
        widths=(64, 128, 256)),
    Scheme(
        name="minhash-v1", version=1, tokenizer=_WORDS, shingle_width=3,
        joiner="single space",
        hash="xxh3-64 (seed 0) of the UTF-8 shingle, as an unsigned integer x",
        weighting="none: the set of distinct shingles (a repeat changes nothing)",
        bit_rule="one-bit MinHash with one bin per bit, at width w: in attempt r = 0, 1, "
                 "2, ... each shingle's g = splitmix64 output of x + r * 0x9E3779B97F4A7C15 "
                 "(the state plus that constant, then the xor-shift-multiply finalizer) "
                 "offers the pair (r, low 64 - log2(w) bits of g) to bin g >> (64 - "
                 "log2(w)); bit b (value 2**b) is the lowest bit of bin b's smallest pair. "
                 "Every attempt-r pair is below every later one, so attempts end once every "
                 "bin holds one (at most 64 * w attempts; a bin still empty, with probability "
                 "below w * e**-64, gives 0). Two texts' bits differ with probability "
                 "(1 - J) / 2, J the Jaccard similarity of their shingle sets",
        short_text="fewer than 3 tokens: one shingle of all of them; no token: InputError",
        widths=(64, 128, 256)),
    Scheme(
        name="pypi-simhash", version=1,
        tokenizer="str.lower(); keep the runs of regex [\\w\\u4e00-\\u9fcc]+ and join "
                  "them without spaces; tokens are the characters",
        shingle_width=4, joiner="none (character 4-grams)",
        hash="MD5 of the UTF-8 shingle as a big-endian integer, its low `width` bits (the "
             "last 8 bytes at 64, all 16 at 128: PyPI simhash's f=64 and f=128)",
        weighting="count of each distinct 4-gram",
        bit_rule=_BIT_RULE + " (PyPI simhash 2.1.2's weighted majority, exact for the "
                             "integer counts text gives)",
        short_text="1 to 3 characters: one shingle of them; none: InputError "
                   "(PyPI simhash would hash the empty string)",
        widths=(64, 128), aliases=aliases_of("pypi-simhash")),
    Scheme(
        name="seomoz-simhash", version=1,
        tokenizer="str.split() (runs of whitespace); no case folding",
        shingle_width=4, joiner="single space",
        hash="MD5 of the UTF-8 shingle, first 8 bytes, big-endian (simhash-py unsigned_hash)",
        weighting="each shingle occurrence counts 1 (simhash-py compute)",
        bit_rule=_BIT_RULE,
        short_text="fewer than 4 tokens: InputError (simhash-py would return 0)",
        aliases=aliases_of("seomoz-simhash")),
    Scheme(
        name="md5-128-notebook", version=1,
        tokenizer="',' and ';' become spaces, then runs of whitespace split (str.split()); "
                  "no case folding (the memosstilvi/simhash notebook)",
        shingle_width=1, joiner="none (single tokens)",
        hash="MD5 of the UTF-8 token, all 128 bits, big-endian (the notebook's bit string "
             "is this integer's binary digits, most significant first)",
        weighting="term frequency (each occurrence counts 1)",
        bit_rule=_BIT_RULE,
        short_text="no token: InputError (the notebook would give 128 zero bits)",
        widths=(128,), aliases=aliases_of("md5-128-notebook")),
)

@lru_cache(maxsize=None)
def lsh_scheme(rows: int, bands: int = 8) -> Scheme:
    """The minhash-lsh-v1 scheme of `bands` bands (8, 16, 24 or 32) of `rows` rows (see
    scheme_names.LSH_ROWS): 32 bits a band, so a code of 256 to 1024 bits."""
    if bands not in LSH_ROWS:
        raise ParameterError(f"a minhash-lsh-v1 scheme has {', '.join(map(str, LSH_ROWS))} "
                             f"bands, not {bands!r}")
    if rows not in LSH_ROWS[bands]:
        raise ParameterError(f"a minhash-lsh-v1 scheme of {bands} bands has 1 to "
                             f"{LSH_ROWS[bands][-1]} rows per band, not {rows!r}")
    bins = 1 << (bands * rows - 1).bit_length()
    return Scheme(
        name=lsh_name(rows, bands), version=1, tokenizer=_WORDS, shingle_width=3,
        joiner="single space",
        hash="xxh3-64 (seed 0) of the UTF-8 shingle, as an unsigned integer x",
        weighting="none: the set of distinct shingles (a repeat changes nothing)",
        bit_rule=f"MinHash LSH band keys: the bins of minhash-v1's rule, {bins} of them "
                 f"(the least power of two that holds {bands} bands of {rows}; each "
                 f"bin's smallest pair (attempt, value)), cut into {bands} bands of "
                 f"{rows} bins, band t holding bins t*{rows} to t*{rows}+{rows - 1}; a band's key "
                 f"is the high 32 bits of h, which starts at (t + 1) * 0x9E3779B97F4A7C15 "
                 f"and takes each bin in order as h = mix(mix(h ^ value) + attempt) (mix: "
                 f"splitmix64's output at state + that constant; an empty bin: value and "
                 f"attempt 2**64 - 1); band 0 is the most significant 32 bits. Two texts "
                 f"share a band's key with probability J**{rows} (J the Jaccard similarity "
                 f"of their shingle sets), or by a 32-bit collision",
        short_text="fewer than 3 tokens: one shingle of all of them; no token: InputError",
        widths=(32 * bands,))


class _WordSchemes:
    """The names of the schemes the compiled text pass makes (`in` takes every name of the
    minhash-lsh-v1 family)."""

    _names = ("simindex-v1", "minhash-v1")

    def __contains__(self, name: object) -> bool:
        return name in self._names or lsh_shape(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __repr__(self) -> str:
        family = ", ".join(f"{lsh_name(1, b)} .. {lsh_name(LSH_ROWS[b][-1], b)}"
                           for b in LSH_ROWS)
        return f"({', '.join(self._names)}, {family})"


_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"
_V1_TOKEN = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+")
_PYPI_SIMHASH_TOKEN = re.compile("[\\w\u4e00-\u9fcc]+")
_NOTEBOOK_SEPARATORS = re.compile("[,;]")

# Token hashes by name: (kind in the compiled module, natural width in bits). A hash wider
# than the fingerprint gives its low `width` bits (PyPI simhash's truncation).
HASHES = MappingProxyType({
    "xxh3": (0, 64), "md5-last8": (1, 64), "md5-first8": (2, 64), "md5": (1, 128),
    "xxh3-128": (3, 128), "xxh3-128x2": (4, 256), "sha256": (5, 256),
})
DEFAULT_HASH = MappingProxyType({64: "xxh3", 128: "xxh3-128", 256: "xxh3-128x2"})
_MD5, _MD5_FIRST8 = 1, 2                 # hash kinds of the compiled vote loops
_V1_HASH = {64: 0, 128: 3, 256: 4}
WORD_SCHEMES = _WordSchemes()     # read by the compiled text pass (_text)


def scheme_name(scheme: Union[str, "Scheme"]) -> str:
    """The name of a known scheme given as a name, an alias or a Scheme; ParameterError
    otherwise."""
    return _scheme(scheme).name




def _scheme(scheme: Union[str, "Scheme", None]) -> "Scheme":
    if isinstance(scheme, Scheme):
        scheme = scheme.name
    try:
        return schemes[scheme]  # type: ignore[index]   # a wrong type is a KeyError here
    except (KeyError, TypeError):
        raise ParameterError(
            f"unknown fingerprint scheme {scheme!r}; known: {', '.join(schemes)}") from None


def pass_args(scheme: str, width: int) -> dict:
    """The compiled text pass's arguments that make `scheme`'s code at `width` bits (for
    the schemes in WORD_SCHEMES)."""
    if scheme == "minhash-v1":
        return {"mh_words": width // 64}
    rows = lsh_rows(scheme)
    if rows is not None:
        return {"mh_words": width // 64, "mh_rows": rows}
    return {"vote_kind": _V1_HASH[width], "vote_words": width // 64}


def _utf8(text):
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"text is not valid Unicode (a lone surrogate at {e.start}): it has "
                         f"no UTF-8 form to hash") from None


def _text_arg(text):
    if not isinstance(text, str):
        raise InputTypeError(f"text must be str, got {type(text).__name__} {text!r:.60}")
    return text


def tokenize(text: str, *, scheme: Union[str, "Scheme"] = DEFAULT_SCHEME) -> list[str]:
    """The tokens a scheme shingles, hashes and votes over (see `schemes`)."""
    s = _scheme(scheme)
    text = _text_arg(text)
    if s.name in WORD_SCHEMES:
        return _V1_TOKEN.findall(unicodedata.normalize("NFKC", text).casefold())
    if s.name == "pypi-simhash":
        return list("".join(_PYPI_SIMHASH_TOKEN.findall(text.lower())))
    if s.name == "md5-128-notebook":
        return _NOTEBOOK_SEPARATORS.sub(" ", text).split()
    return text.split()


def shingles(tokens: Sequence[str], width: int = 3) -> Iterator[tuple[str, ...]]:
    """Every window of `width` consecutive tokens, as tuples.

    Fewer tokens than `width` (but at least one) make one shingle of them all, so a short
    text still has a fingerprint; no tokens make none.
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ParameterError(f"shingle width must be an int >= 1, got {width!r}")
    tokens = list(tokens)
    if 0 < len(tokens) < width:
        yield tuple(tokens)
        return
    for i in range(len(tokens) - width + 1):
        yield tuple(tokens[i:i + width])


def check_width(width):
    if isinstance(width, bool) or not isinstance(width, int):
        raise ParameterError(f"width must be an int, got {width!r}")
    if width not in WIDTHS:
        raise ParameterError(f"width {width} is not supported; supported: "
                             f"{', '.join(map(str, WIDTHS))}")
    return width // 64


def _named_hash(hash, width):
    """The compiled kind of a named token hash, refusing one narrower than `width`."""
    if hash not in HASHES:
        raise ParameterError(f"unknown token hash {hash!r}; known: {', '.join(HASHES)}, "
                             f"or a callable")
    kind, bits = HASHES[hash]
    if bits < width:
        wide = ", ".join(n for n, (_, b) in HASHES.items() if b >= width)
        raise ParameterError(f"token hash {hash!r} has {bits} bits, fewer than the width "
                             f"{width}: its high bits would never vote; use one of {wide}")
    return kind


_PROBES = tuple(f"simindex probe {i}".encode() for i in range(8))
_probed: dict = {}


def _probe(fn, width):
    """Refuse a hash callable that looks narrower than the width: on 8 fixed inputs the
    highest bit it sets must be among the top 8 of the width (a true `width`-bit hash
    fails this with probability 2**-64), or it must return at least width/8 bytes."""
    key = (fn, width)
    try:
        if key in _probed:
            return
    except TypeError:            # an unhashable callable: probed on every call
        key = None
    top = 0
    for p in _PROBES:
        h = fn(p)
        if isinstance(h, (bytes, bytearray, memoryview)):
            top = max(top, 8 * len(h))
        elif isinstance(h, numbers.Integral) and not isinstance(h, bool):
            top = max(top, int(h).bit_length())
        else:
            raise ParameterError(f"hash callable returned {type(h).__name__} {h!r:.40}; it "
                                 f"must return an int >= 0 or bytes")
    if top <= width - 8:
        raise ParameterError(f"hash callable looks narrower than the width {width}: its "
                             f"values on 8 probe inputs have at most {top} bits")
    if key is not None:
        if len(_probed) > 64:
            _probed.clear()
        _probed[key] = True


def token_hashes(features, hash, width):
    """The (n, width/64) uint64 token hashes, most significant word first, of a list of
    str/bytes features under a named hash or a callable."""
    words = width // 64
    raw = [f.encode("utf-8") if isinstance(f, str) else f for f in features]
    if not callable(hash):
        return _fingerprint.hash_many(raw, _named_hash(hash, width), words)
    _probe(hash, width)
    nbytes, mask = width // 8, (1 << width) - 1
    out = bytearray()
    for n, b in enumerate(raw):
        h = hash(b)
        if isinstance(h, (bytes, bytearray, memoryview)):
            h = bytes(h)
            if len(h) < nbytes:
                raise InputError(f"hash of feature {n} is {len(h)} bytes; width {width} "
                                 f"needs at least {nbytes}")
            out += h[-nbytes:]
        elif isinstance(h, numbers.Integral) and not isinstance(h, bool) and h >= 0:
            out += (int(h) & mask).to_bytes(nbytes, "big")
        else:
            raise InputError(f"hash of feature {n} is {h!r:.40}; a hash callable must "
                             f"return an int >= 0 or bytes")
    return np.frombuffer(bytes(out), dtype=">u8").astype(np.uint64).reshape(len(raw), words)


def _feature(f, n):
    if isinstance(f, str):
        try:
            f.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(f"feature {n} is not valid Unicode text: {e.reason}") from None
        return f
    if isinstance(f, (bytes, bytearray, memoryview)):
        return bytes(f)
    raise InputTypeError(f"feature {n} must be str or bytes, got {type(f).__name__} {f!r:.60}")


def _weight(w, n):
    if isinstance(w, bool) or not isinstance(w, numbers.Real):
        raise InputTypeError(f"weight of feature {n} must be an int or float, got "
                             f"{type(w).__name__} {w!r:.60}")
    if isinstance(w, numbers.Integral):
        w = int(w)
    else:
        w = float(w)
        if not math.isfinite(w):
            raise InputError(f"weight of feature {n} is {w}; weights must be finite")
    if w < 0:
        raise InputError(f"weight of feature {n} is {w}; weights must be >= 0")
    return w


HashArg = Union[str, Callable[[bytes], Union[int, bytes]], None]


def simhash(features: Iterable[Any], *, width: int = 64, hash: HashArg = None) -> int:
    """The simhash of weighted features, `width` (64, 128 or 256) bits as an int.

    `features`: an iterable of str/bytes (weight 1 each; repeats add up), an iterable of
    (feature, weight) pairs with int or float weights >= 0, or a dict feature -> weight.
    `hash`: a name in HASHES (default: DEFAULT_HASH[width]; "md5-last8" is PyPI simhash at
    64 bits, "md5" at 128, "md5-first8" simhash-py) at least `width` bits wide, or a
    callable taking the UTF-8 bytes and returning an int or bytes (as PyPI simhash's
    `hashfunc`; the low `width` bits, or the last width/8 bytes, are used).
    Integer weights are summed exactly; float weights in float64, in the given order (PyPI
    simhash rounds float weights differently, so only integer weights match it bit for bit).
    """
    check_width(width)
    if hash is None:
        hash = DEFAULT_HASH[width]
    elif not callable(hash):
        _named_hash(hash, width)
    if features is None or isinstance(features, (str, bytes)):
        raise InputTypeError(
            f"features must be an iterable of features, (feature, weight) pairs or a dict, "
            f"got {type(features).__name__}" +
            (" (did you mean fingerprint(text)?)" if isinstance(features, str) else ""))
    items = features.items() if isinstance(features, dict) else features
    feats, weights, weighted = [], [], None
    try:
        iterator = iter(items)
    except TypeError:
        raise InputTypeError(f"features must be iterable, got {type(features).__name__}") \
            from None
    for n, item in enumerate(iterator):
        pair = isinstance(item, tuple)
        if weighted is None:
            weighted = pair
        elif weighted != pair:
            raise InputTypeError(f"feature {n} mixes weighted and unweighted features")
        if pair:
            if len(item) != 2:
                raise InputTypeError(f"feature {n} must be a (feature, weight) pair, got "
                                     f"{item!r:.60}")
            feats.append(_feature(item[0], n))
            weights.append(_weight(item[1], n))
        else:
            feats.append(_feature(item, n))
    if not feats:
        raise InputError("no features: an empty feature set has no fingerprint")
    hashes = token_hashes(feats, hash, width)
    if not weighted:
        return _fingerprint.vote(hashes)
    if all(isinstance(w, int) for w in weights):
        if sum(weights) > _MAX_INT_WEIGHT_SUM:
            raise InputError(f"integer weights sum to {sum(weights)}; the limit is 2**62")
        return _fingerprint.vote(hashes, np.array(weights, dtype=np.int64))
    return _fingerprint.vote(hashes, np.array(weights, dtype=np.float64))


def compute(hashes: Union[Iterable[Any], np.ndarray], *, width: int = 64) -> int:
    """The simhash of precomputed unsigned token hashes, each counting 1 (simhash-py's
    compute). Hashes are ints in [0, 2**width), big-endian bytes of width/8, or an array
    of shape (n, width/64) uint64, most significant word first (or (n,) at width 64)."""
    from ..values import words_array
    check_width(width)
    arr = words_array(hashes, width, what="hash")
    if len(arr) == 0:
        raise InputError("no hashes: an empty hash list has no fingerprint")
    return _fingerprint.vote(arr)


def scheme_width(scheme: Union[str, "Scheme"], width: Optional[int]) -> int:
    """`width` checked against the scheme's widths; None is the scheme's first width."""
    s = _scheme(scheme)
    if width is None:
        return s.widths[0]
    if width not in s.widths or width <= 256:     # band codes of 16 bands and more: wider
        check_width(width)
    if width not in s.widths:
        raise ParameterError(f"scheme {s.name!r} makes {', '.join(map(str, s.widths))}-bit "
                             f"fingerprints, not {width}")
    return width


def fingerprint(text: str, *, scheme: Union[str, "Scheme", None] = DEFAULT_SCHEME,
                width: Optional[int] = None) -> int:
    """The fingerprint of `text` under a frozen scheme (see `schemes`), `width` bits (one
    of the scheme's widths; default its first: 64, or 128 for "md5-128-notebook")."""
    s = _scheme(scheme)
    words = scheme_width(s, width) // 64
    if s.name in WORD_SCHEMES:
        # the compiled pass: tokens, shingles, hashes and the code without a Python object
        fp, windows, _ = _text.signature(_text_arg(text), s.shingle_width,
                                            **pass_args(s.name, 64 * words))
        if not windows:
            raise InputError(f"text has no tokens under scheme {s.name!r} (empty, or no "
                             f"word characters): it has no fingerprint")
        assert fp is not None
        return fp
    if s.name == "pypi-simhash":
        content = "".join(_PYPI_SIMHASH_TOKEN.findall(_text_arg(text).lower()))
        if not content:
            raise InputError(f"text has no tokens under scheme {s.name!r} (empty, or no word "
                             f"characters): it has no fingerprint")
        # each 4-gram occurrence votes once: the same sums as its count as a weight
        fp, _ = _fingerprint.char_gram_vote(_utf8(content), s.shingle_width, _MD5, words)
        return fp
    tokens = tokenize(text, scheme=s)
    if not tokens:
        raise InputError(f"text has no tokens under scheme {s.name!r} (empty, or no word "
                         f"characters): it has no fingerprint")
    if s.name == "md5-128-notebook":
        # each occurrence votes once: the notebook's term-frequency weights
        fp, _ = _fingerprint.shingle_vote(_utf8(" ".join(tokens)), 1, _MD5, words)
        return fp
    if len(tokens) < s.shingle_width:
        raise InputError(f"text has {len(tokens)} tokens; scheme {s.name!r} needs at least "
                         f"{s.shingle_width} (simhash-py would give 0)")
    fp, _ = _fingerprint.shingle_vote(_utf8(" ".join(tokens)), s.shingle_width, _MD5_FIRST8)
    return fp
