# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled text pass (shingles.h) for the schemes whose tokens are casefolded words:
simindex-v1's simhash and minhash-v1's one-bit MinHash code, with the shingle hashes of the
similarity check made in the same pass; and the set operations of the check.

Python normalizes a text that is not ASCII (NFKC, which returns the same string when it is
already normalized); everything else runs here without the GIL and without a Python object
per token.
"""

import threading
import unicodedata

import numpy as np

cimport simindex.bits as bits

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_KIND, PyUnicode_DATA, PyUnicode_GET_LENGTH

cdef extern from "shingles.h" nogil:
    ctypedef struct si_tables_t:
        const uint32_t *nf
        const uint32_t *fold
        const uint32_t *seq
        const uint32_t *astral_cp
        const uint32_t *astral_to
        size_t n_astral
    ctypedef struct si_pass:
        char *buf
        uint64_t *xs
        int64_t windows
        int oom
        int needs_nf
        int normalized
        uint64_t *all
        size_t nall
    int SI_MAX_SHINGLE
    uint32_t SI_MAP_SEQ
    uint32_t SI_MAP_COMPLEX
    int si_pass_init(si_pass *s, int width, int vote_kind, int vote_words, int mh_words,
                     int want_all, int mh_bins)
    void si_pass_free(si_pass *s)
    void si_feed(si_pass *s, const si_tables_t *t, int kind, const void *data, size_t n)
    void si_finish(si_pass *s)
    void si_vote_bits(const si_pass *s, uint64_t *out)
    void si_mh_bits(const si_pass *s, uint64_t *out)
    void si_mh_bands(const si_pass *s, int rows, uint64_t *out)
    int SI_MAX_BINS
    void si_mh_add(si_pass *s, uint64_t x)
    size_t si_unique64(uint64_t *a, uint64_t *tmp, size_t n)

# The hash kinds a simhash votes with (as in _fingerprint): xxh3-64, xxh3-128, 2 x xxh3-128.
VOTE_KINDS = (0, 3, 4)
cdef enum:
    _SKETCH = 128                 # values of a bottom-k sketch (simindex.signatures.similarity's)
SKETCH = _SKETCH

cdef si_tables_t _tables
cdef object _table_arrays = None     # keeps the tables' buffers alive
_table_lock = threading.Lock()


def _trailing():
    """The characters that compose with a character before them under NFC: the second of
    every primary composite's two-character canonical decomposition, and the Hangul vowel
    and final jamo (composed algorithmically)."""
    out = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))
    for c in range(0x20000):
        d = unicodedata.decomposition(chr(c))
        if not d or d.startswith("<"):
            continue
        parts = d.split()
        if len(parts) == 2:
            a, b = (chr(int(x, 16)) for x in parts)
            if unicodedata.normalize("NFC", a + b) == chr(c):
                out.add(ord(b))
    return out


def build_tables():
    """The tables of shingles.h for every code point above ASCII: (nf, fold, seq,
    astral_cp, astral_to). `nf` is COMPLEX for a character whose NFKC form can depend on
    its neighbours: one whose decomposition starts with a combining mark or a character
    that composes with the one before it."""
    trailing = _trailing()
    nf = np.zeros(65536, dtype=np.uint32)
    fold = np.arange(65536, dtype=np.uint32)
    seq = [0]

    def mapped(s):
        if len(s) == 1:
            return ord(s)
        seq.append(len(s))
        seq.extend(map(ord, s))
        return SI_MAP_SEQ | (len(seq) - 1 - len(s))
    for c in range(65536):
        ch = chr(c)
        if 0xD800 <= c < 0xE000:               # a lone surrogate: no word character
            nf[c] = c
            continue
        f = ch.casefold()
        if f != ch:
            fold[c] = mapped(f)
        d = unicodedata.normalize("NFKD", ch)
        if unicodedata.combining(d[0]) or ord(d[0]) in trailing:
            nf[c] = SI_MAP_COMPLEX
        else:
            nf[c] = mapped(unicodedata.normalize("NFKC", ch).casefold())
    astral_cp, astral_to = [], []
    step = 4096
    for base in range(0x10000, 0x110000, step):
        s = np.arange(base, base + step, dtype="<u4").tobytes().decode("utf-32-le")
        if s.casefold() == s:
            continue
        for c in range(base, base + step):
            f = chr(c).casefold()
            if f != chr(c):
                if len(f) != 1:
                    raise AssertionError(f"U+{c:X} folds to {len(f)} characters")
                astral_cp.append(c)
                astral_to.append(ord(f))
    return (nf, fold, np.array(seq, dtype=np.uint32), np.array(astral_cp, dtype=np.uint32),
            np.array(astral_to, dtype=np.uint32))


cdef int _ensure_tables() except -1:
    """Build the tables once, under a lock: threads read texts at once, and a second
    build would free the arrays the first one's readers point into."""
    global _table_arrays
    if _table_arrays is not None:
        return 0
    with _table_lock:
        if _table_arrays is None:
            _install_tables()
    return 0


cdef int _install_tables() except -1:
    global _table_arrays
    cdef const uint32_t[::1] nf, fold, seq, ac, at
    arrays = build_tables()
    nf, fold, seq, ac, at = arrays
    _tables.nf = &nf[0]
    _tables.fold = &fold[0]
    _tables.seq = &seq[0]
    _tables.n_astral = ac.shape[0]
    _tables.astral_cp = &ac[0] if ac.shape[0] else NULL
    _tables.astral_to = &at[0] if at.shape[0] else NULL
    _table_arrays = arrays
    return 0


cdef int _check(int width, int vote_kind, int vote_words, int mh_words,
                bint shingles, int mh_rows=0) except -1:
    if mh_rows and not (mh_words in (4, 8, 12, 16) and
                        1 <= mh_rows and _bins(mh_rows, mh_words) <= SI_MAX_BINS):
        raise ValueError(f"MinHash band keys take 4, 8, 12 or 16 words (two bands a word) "
                         f"and rows whose bins fit {SI_MAX_BINS}, not {mh_words} words and "
                         f"{mh_rows} rows")
    if not 1 <= width <= SI_MAX_SHINGLE:
        raise ValueError(f"shingle width must be 1..{SI_MAX_SHINGLE}, got {width}")
    if vote_kind >= 0 and mh_words > 0:
        raise ValueError("a pass makes one code at most: a simhash vote or a MinHash code")
    if vote_kind < 0 and mh_words == 0:
        if not shingles:
            raise ValueError("a pass without a code must collect the shingles")
        return 0
    if vote_kind >= 0:
        if vote_kind not in VOTE_KINDS or vote_words not in (1, 2, 4):
            raise ValueError(f"vote kind {vote_kind} at {vote_words} words is not supported")
        if (vote_kind == 0) != (vote_words == 1) or (vote_kind == 4) != (vote_words == 4):
            raise ValueError(f"vote kind {vote_kind} does not make {vote_words} words")
    elif mh_words not in (1, 2, 4) and not mh_rows:
        raise ValueError(f"a MinHash code has 1, 2 or 4 words, not {mh_words}")
    return 0


SEGMENTS = 256       # stretches normalized one by one before the whole text is, instead

cdef inline bint _needs_neighbours(uint32_t c) noexcept nogil:
    return c >= 0x10000 or (c >= 128 and (_tables.nf[c] & SI_MAP_COMPLEX) != 0)


def complex_runs(str text not None):
    """The [start, end) of each run of characters whose NFKC form depends on their
    neighbours: those the tables mark COMPLEX, and every character above the BMP."""
    cdef Py_ssize_t i, n = PyUnicode_GET_LENGTH(text), start = -1
    cdef int kind = PyUnicode_KIND(text)
    cdef const void *data = PyUnicode_DATA(text)
    cdef uint32_t c
    _ensure_tables()
    out = []
    for i in range(n):
        if kind == 1:
            c = (<const unsigned char *>data)[i]
        elif kind == 2:
            c = (<const unsigned short *>data)[i]
        else:
            c = (<const uint32_t *>data)[i]
        if _needs_neighbours(c):
            if start < 0:
                start = i
        elif start >= 0:
            out.append((start, i))
            start = -1
    if start >= 0:
        out.append((start, n))
    return out


def normalize_around(text):
    """The text with NFKC applied to each stretch that needs its neighbours (a run of such
    characters and the character before it, which may compose with it), as (text, 2); or,
    past SEGMENTS stretches, to the whole text, as (text, 1). Every stretch ends before,
    and starts at, a character that composes with nothing before it, so NFKC of the whole
    is NFKC of the stretches and the characters between them one by one."""
    runs = complex_runs(text)
    if len(runs) > SEGMENTS:
        return unicodedata.normalize("NFKC", text), 1
    pieces = []
    last = 0
    for start, end in runs:
        j = max(start - 1, last)
        pieces.append(text[last:j])
        pieces.append(unicodedata.normalize("NFKC", text[j:end]))
        last = end
    pieces.append(text[last:])
    return "".join(pieces), 2


cdef int _bins(int mh_rows, int mh_words) noexcept:
    """The bins of a band code of `mh_rows` rows per band: the least power of two that
    holds its bands, two per word (0: a minhash-v1 code's, 64 per word)."""
    cdef int bins = 1
    if mh_rows == 0:
        return 0
    while bins < 2 * mh_words * mh_rows:
        bins *= 2
    return bins


cdef int _run(si_pass *s, text, int width, int vote_kind, int vote_words, int mh_words,
             bint shingles, int mh_rows=0) except -1:
    """Initialize a pass and read one text through it. A text with characters above ASCII
    whose NFKC form depends on their neighbours is read again, those stretches normalized
    (see normalize_around)."""
    cdef int kind, mode = 0
    cdef const void *data
    cdef size_t n
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if not text.isascii():
        _ensure_tables()
    while True:
        if si_pass_init(s, width, vote_kind, vote_words, mh_words, shingles, _bins(mh_rows, mh_words)):
            raise MemoryError()
        s.normalized = mode
        kind = PyUnicode_KIND(text)
        data = PyUnicode_DATA(text)
        n = PyUnicode_GET_LENGTH(text)
        with nogil:
            si_feed(s, &_tables, kind, data, n)
            if not s.needs_nf:
                si_finish(s)
        if s.oom:
            raise MemoryError()
        if not s.needs_nf:
            return 0
        if mode:
            raise AssertionError("a normalized text asked to be normalized")
        si_pass_free(s)
        text, mode = normalize_around(text)


cdef int _words(int vote_kind, int vote_words, int mh_words):
    return vote_words if vote_kind >= 0 else mh_words


cdef void _bits(si_pass *s, int vote_kind, int mh_words, uint64_t *out,
               int mh_rows=0) noexcept nogil:
    """The pass's code into out (nothing without one)."""
    if vote_kind >= 0:
        si_vote_bits(s, out)
    elif mh_rows:
        si_mh_bands(s, mh_rows, out)
    elif mh_words:
        si_mh_bits(s, out)


cdef object _all(si_pass *s):
    out = np.empty(s.nall, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    if s.nall:
        memcpy(&o[0], s.all, s.nall * sizeof(uint64_t))
    return out


def signature(text, int width, int vote_kind=-1, int vote_words=1, int mh_words=0,
              bint shingles=False, int mh_rows=0):
    """One text's pass: (code as an int or None, shingle count, every shingle's xxh3-64 in
    order or None). The code is the simhash of `vote_kind` at `vote_words` words, or
    (vote_kind -1) the MinHash code of `mh_words` words (with `mh_rows`, the band keys of
    bands of that many bins instead), or none (mh_words 0: the shingles alone); a text
    without tokens has 0 shingles (and code 0)."""
    cdef si_pass s
    cdef uint64_t r[16]
    cdef int words = _words(vote_kind, vote_words, mh_words)
    _check(width, vote_kind, vote_words, mh_words, shingles, mh_rows)
    s.buf = s.xs = s.all = NULL
    try:
        _run(&s, text, width, vote_kind, vote_words, mh_words, shingles, mh_rows)
        _bits(&s, vote_kind, mh_words, r, mh_rows)
        return (bits.words_int(r, words) if words else None, s.windows,
                _all(&s) if shingles else None)
    finally:
        si_pass_free(&s)


def signatures(list texts, int width, int vote_kind=-1, int vote_words=1, int mh_words=0,
               bint shingles=False, int mh_rows=0, bint distinct=False,
               list sketches=None):
    """The pass of `signature` over many texts: (codes as an (n, words) uint64 array, most
    significant word first; shingle counts as an int64 array; shingle hash arrays or
    None; with `distinct`, each array sorted and without repeats, views of one array).
    `sketches` (with `distinct`): a list each set's sketch_of_set is appended to, in
    order. The GIL is released once for the whole list (a text whose normalization needs
    Python is read after)."""
    cdef Py_ssize_t i, n = len(texts)
    cdef int words = _words(vote_kind, vote_words, mh_words)
    cdef int bins = _bins(mh_rows, mh_words)
    cdef si_pass s
    cdef int *kinds = NULL
    cdef const void **datas = NULL
    cdef size_t *lens = NULL
    cdef uint64_t **sets = NULL
    cdef size_t *sizes = NULL
    cdef char *later = NULL            # 1: read again with the GIL (normalization, memory)
    cdef uint64_t *tmp = NULL
    cdef size_t tmp_cap = 0, m
    cdef size_t total = 0
    cdef uint64_t[::1] f
    _check(width, vote_kind, vote_words, mh_words, shingles, mh_rows)
    if sketches is not None and not (shingles and distinct):
        raise ValueError("sketches are made of distinct shingle sets: pass shingles=True, "
                         "distinct=True")
    codes = np.zeros((n, words), dtype=np.uint64)
    counts = np.zeros(n, dtype=np.int64)
    cdef uint64_t[:, ::1] c = codes
    cdef int64_t[::1] w = counts
    alls = [] if shingles else None
    if n == 0:
        return codes, counts, alls
    try:
        kinds = <int *>calloc(n, sizeof(int))
        datas = <const void **>calloc(n, sizeof(void *))
        lens = <size_t *>calloc(n, sizeof(size_t))
        sets = <uint64_t **>calloc(n, sizeof(uint64_t *))
        sizes = <size_t *>calloc(n, sizeof(size_t))
        later = <char *>calloc(n, 1)
        if not (kinds and datas and lens and sets and sizes and later):
            raise MemoryError()
        for i in range(n):             # the texts' characters, read below without the GIL
            text = texts[i]
            if not isinstance(text, str):
                raise TypeError(f"text must be str, got {type(text).__name__}")
            if not text.isascii():
                _ensure_tables()
            kinds[i] = PyUnicode_KIND(text)
            datas[i] = PyUnicode_DATA(text)
            lens[i] = PyUnicode_GET_LENGTH(text)
        with nogil:
            for i in range(n):
                s.buf = s.xs = s.all = NULL
                if si_pass_init(&s, width, vote_kind, vote_words, mh_words, shingles, bins):
                    si_pass_free(&s)
                    later[i] = 1
                    continue
                s.normalized = 0
                si_feed(&s, &_tables, kinds[i], datas[i], lens[i])
                if not s.needs_nf:
                    si_finish(&s)
                if s.needs_nf or s.oom:
                    si_pass_free(&s)
                    later[i] = 1
                    continue
                if words:
                    _bits(&s, vote_kind, mh_words, &c[i, 0], mh_rows)
                w[i] = s.windows
                if shingles:
                    m = s.nall
                    if distinct and m > 1:
                        if m > tmp_cap:
                            free(tmp)
                            tmp_cap = m if m > 2 * tmp_cap else 2 * tmp_cap
                            tmp = <uint64_t *>malloc(tmp_cap * sizeof(uint64_t))
                            if tmp == NULL:
                                tmp_cap = 0
                                si_pass_free(&s)
                                later[i] = 1
                                continue
                        m = si_unique64(s.all, tmp, m)
                    sets[i] = s.all            # handed over: freed below
                    sizes[i] = m
                    s.all = NULL
                si_pass_free(&s)
        if shingles:                   # the sets read without the GIL, in one array
            for i in range(n):
                if not later[i]:
                    total += sizes[i]
            flat = np.empty(total, dtype=np.uint64)
            f = flat
            total = 0
        for i in range(n):
            if later[i]:
                s.buf = s.xs = s.all = NULL
                try:
                    _run(&s, texts[i], width, vote_kind, vote_words, mh_words, shingles,
                         mh_rows)
                    if words:
                        _bits(&s, vote_kind, mh_words, &c[i, 0], mh_rows)
                    w[i] = s.windows
                    if shingles:
                        got = _all(&s)
                        alls.append(sorted_set(got) if distinct else got)
                        if sketches is not None:
                            sketches.append(sketch_of_set(alls[len(alls) - 1]))
                finally:
                    si_pass_free(&s)
            elif shingles:
                if sizes[i]:
                    memcpy(&f[total], sets[i], sizes[i] * sizeof(uint64_t))
                alls.append(flat[total:total + sizes[i]])
                total += sizes[i]
                if sketches is not None:
                    sketches.append(_sketch(sets[i], sizes[i]))
        return codes, counts, alls
    finally:
        if sets != NULL:
            for i in range(n):
                free(sets[i])
        free(kinds)
        free(datas)
        free(lens)
        free(sets)
        free(sizes)
        free(later)
        free(tmp)


cdef Py_ssize_t _gallop(const uint64_t *a, Py_ssize_t na, const uint64_t *b,
                        Py_ssize_t nb) noexcept nogil:
    """|a & b| for sorted distinct arrays, na much smaller than nb: each element of a
    found in the rest of b by a doubling search, then a binary one."""
    cdef Py_ssize_t i, lo = 0, hi, step, count = 0, mid
    cdef uint64_t x
    for i in range(na):
        x = a[i]
        step = 1
        hi = lo
        while hi < nb and b[hi] < x:
            lo = hi + 1
            hi += step
            step *= 2
        if hi > nb:
            hi = nb
        while lo < hi:
            mid = (lo + hi) // 2
            if b[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        if lo < nb and b[lo] == x:
            count += 1
            lo += 1
    return count


cdef Py_ssize_t _intersection(const uint64_t *a, Py_ssize_t na, const uint64_t *b,
                              Py_ssize_t nb) noexcept nogil:
    cdef Py_ssize_t i = 0, j = 0, count = 0
    cdef uint64_t x, y
    if na * 16 < nb:
        return _gallop(a, na, b, nb)
    if nb * 16 < na:
        return _gallop(b, nb, a, na)
    while i < na and j < nb:
        x = a[i]
        y = b[j]
        count += x == y
        i += x <= y
        j += y <= x
    return count


def intersection_size(const uint64_t[::1] a not None, const uint64_t[::1] b not None):
    """|a & b| of two sorted arrays of distinct values (shingle sets)."""
    cdef Py_ssize_t n
    if a.shape[0] == 0 or b.shape[0] == 0:
        return 0
    with nogil:
        n = _intersection(&a[0], a.shape[0], &b[0], b.shape[0])
    return n


def minhash_codes(list sets, int words, int rows=0):
    """The minhash-v1 code of each shingle set (arrays of xxh3-64 shingle hashes, in any
    order, repeats allowed) as an (n, words) uint64 array, or with `rows` the band keys of
    minhash-lsh-v1: what `signatures` makes of the texts those sets came from."""
    cdef Py_ssize_t i, j, n = len(sets)
    cdef si_pass s
    cdef const uint64_t[::1] h
    _check(1, -1, 1, words, False, rows)
    codes = np.zeros((n, words), dtype=np.uint64)
    cdef uint64_t[:, ::1] c = codes
    for i in range(n):
        h = sets[i]
        if si_pass_init(&s, 1, -1, 1, words, 0, _bins(rows, words)):
            raise MemoryError()
        try:
            s.windows = h.shape[0]
            with nogil:
                for j in range(h.shape[0]):
                    si_mh_add(&s, h[j])
                si_finish(&s)
            if s.oom:
                raise MemoryError()
            if rows:
                si_mh_bands(&s, rows, &c[i, 0])
            else:
                si_mh_bits(&s, &c[i, 0])
        finally:
            si_pass_free(&s)
    return codes


def sorted_set(const uint64_t[::1] raw not None):
    """The sorted distinct values of an array of shingle hashes."""
    cdef Py_ssize_t n = raw.shape[0]
    cdef size_t m
    out = np.empty(n, dtype=np.uint64)
    tmp = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] o = out
    cdef uint64_t[::1] t = tmp
    if n == 0:
        return out
    memcpy(&o[0], &raw[0], n * sizeof(uint64_t))
    with nogil:
        m = si_unique64(&o[0], &t[0], n)
    return out[:m].copy() if m < <size_t>n else out


def sketch_of_set(const uint64_t[::1] exact not None):
    """The bottom-SKETCH sketch (big-endian u32, ascending) of a sorted distinct set of
    xxh3-64 shingle hashes: the distinct high halves of its first values."""
    if exact.shape[0] == 0:
        return b""
    return _sketch(&exact[0], exact.shape[0])


cdef bytes _sketch(const uint64_t *exact, size_t n):
    """sketch_of_set of n sorted distinct values."""
    cdef unsigned char o[4 * _SKETCH]
    cdef size_t i, m = 0
    cdef uint32_t v, last = 0
    for i in range(n):
        v = <uint32_t>(exact[i] >> 32)
        if m and v == last:
            continue
        bits.store_be32(o + 4 * m, v)
        last = v
        m += 1
        if m == _SKETCH:
            break
    return PyBytes_FromStringAndSize(<char *>o, 4 * m)
