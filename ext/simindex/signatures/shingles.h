/* One pass over a text, free of the interpreter: its tokens, their shingles, and what the
 * signatures make of each shingle's hash.
 *
 * Tokens are the casefolded runs of word characters (str.isalnum() or "_"), except that each
 * Han, Hiragana or Katakana character is a token of its own. A shingle is a window of
 * `width` consecutive tokens joined by single spaces (a text with fewer tokens has one
 * shingle of them all). The caller normalizes the text (NFKC) first; case folding happens
 * here, character by character, as str.casefold() does it (it has no context rules).
 *
 * The pass keeps only the last `width` tokens' bytes, so its memory does not grow with the
 * text (except for what the caller asks it to collect). Each shingle's bytes are hashed and
 * handed to the sinks the caller turned on:
 *   - the simhash vote (simindex-v1): per bit, how many shingle hashes set it; bit i of the
 *     fingerprint is set when more than half of the votes set it (the +1/-1 sum is > 0);
 *   - the one-bit MinHash code (minhash-v1), see si_mh_* below;
 *   - every shingle's xxh3-64, in order (for an exact Jaccard check).
 *
 * Python's unicode classification (Py_UNICODE_ISALNUM) is a pure table lookup: callable
 * without the GIL. Normalization and case folding of characters above ASCII come from tables
 * the caller builds once from unicodedata and str.casefold() (si_tables_t).
 */
#ifndef SIMINDEX_SHINGLES_H
#define SIMINDEX_SHINGLES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#define SI_MAX_SHINGLE 16        /* tokens per shingle, at most */
#define SI_MAX_WORDS 4           /* 64-bit words of the widest simhash (256 bits); its
                                    MinHash bins, 64 a word, hold every band code's */
#define SI_COMPACT (1 << 16)     /* bytes of token text kept before the oldest is dropped */
#define SI_GOLDEN 0x9E3779B97F4A7C15ULL

/* ---- tables for characters above ASCII (built by the caller from unicodedata) ------- */

/* What a character becomes, by code point below 65536: one code point, SI_MAP_SEQ | i where
 * seq[i] is a count followed by the code points, or SI_MAP_COMPLEX. Two tables: `nf` maps a
 * character of a text not known to be normalized to its NFKC form, case folded, where that
 * form does not depend on the characters around it (its decomposition starts with a starter
 * that composes with nothing before it), and says COMPLEX otherwise (the caller normalizes
 * the whole text and reads it again); `fold` maps a character of a normalized text to its
 * case folding. Above the BMP, `nf` is COMPLEX and `fold` looks up the sorted astral list. */
typedef struct {
    const uint32_t *nf;
    const uint32_t *fold;
    const uint32_t *seq;
    const uint32_t *astral_cp;   /* sorted code points above the BMP that fold ... */
    const uint32_t *astral_to;   /* ... and what each folds to (one code point) */
    size_t n_astral;
} si_tables_t;

#define SI_MAP_SEQ 0x80000000u
#define SI_MAP_COMPLEX 0x40000000u

/* ---- the pass ------------------------------------------------------------------------ */

typedef struct {
    /* what to make */
    int width;                   /* tokens per shingle, 1..SI_MAX_SHINGLE */
    int vote_kind;               /* -1: no simhash; 0: xxh3-64; 3: xxh3-128; 4: 2 x xxh3-128 */
    int vote_words;              /* words of the simhash, 1, 2 or 4 */
    int mh_words;                /* words of the MinHash code, 0 (none), 1, 2 or 4; band
                                    keys: 4, 8, 12 or 16 */
    int mh_bins;                 /* its bins: 64 per word, or fewer for band keys */
    int want_all;
    int normalized;              /* 0: read through `nf`, stopping at a character that needs
                                    its neighbours; 1: the text is NFKC already, `fold`
                                    only; 2: the stretches around such characters are NFKC
                                    already: `nf` elsewhere, `fold` for them */
    int needs_nf;                /* a character needs the whole text normalized first */
    /* the token window */
    char *buf;
    size_t len, cap;
    size_t start[SI_MAX_SHINGLE], end[SI_MAX_SHINGLE];   /* ring of the last tokens */
    int64_t ntok;                /* tokens completed */
    int in_tok;
    int64_t windows;             /* shingles emitted */
    /* the simhash vote: byte counters (8 per uint64) flushed into exact counts */
    uint64_t cnt8[SI_MAX_WORDS * 8];
    int64_t ones[SI_MAX_WORDS * 64];
    int pending;
    uint64_t votes[64];          /* a 64-bit vote's hashes not yet counted (si_vote_block) */
    int nvotes;
    /* the MinHash code */
    int mh_shift;                /* 64 - log2(bins) */
    int mh_filled;
    int32_t mh_attempt[SI_MAX_WORDS * 64];
    uint64_t mh_val[SI_MAX_WORDS * 64];
    uint64_t *xs;                /* the shingle hashes, while bins are still empty */
    size_t nxs, capxs;
    /* every shingle hash */
    uint64_t *all;
    size_t nall, capall;
    int oom;
} si_pass;

static const uint64_t si_spread[256] = {
#define SI_S(v) ((uint64_t)((v) & 1) | ((uint64_t)(((v) >> 1) & 1) << 8) | \
    ((uint64_t)(((v) >> 2) & 1) << 16) | ((uint64_t)(((v) >> 3) & 1) << 24) | \
    ((uint64_t)(((v) >> 4) & 1) << 32) | ((uint64_t)(((v) >> 5) & 1) << 40) | \
    ((uint64_t)(((v) >> 6) & 1) << 48) | ((uint64_t)(((v) >> 7) & 1) << 56))
#define SI_S4(v) SI_S(v), SI_S(v + 1), SI_S(v + 2), SI_S(v + 3)
#define SI_S16(v) SI_S4(v), SI_S4(v + 4), SI_S4(v + 8), SI_S4(v + 12)
#define SI_S64(v) SI_S16(v), SI_S16(v + 16), SI_S16(v + 32), SI_S16(v + 48)
    SI_S64(0), SI_S64(64), SI_S64(128), SI_S64(192)
#undef SI_S64
#undef SI_S16
#undef SI_S4
#undef SI_S
};

/* splitmix64's output function at state x + golden: the hash of one attempt of the MinHash
 * code */
static inline uint64_t si_mh_mix(uint64_t x) {
    x += SI_GOLDEN;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static inline int si_is_cjk(uint32_t c) {
    return (0x3040 <= c && c <= 0x30FF) || (0x3400 <= c && c <= 0x4DBF) ||
           (0x4E00 <= c && c <= 0x9FFF) || (0xF900 <= c && c <= 0xFAFF) ||
           (0x20000 <= c && c <= 0x2FA1F);
}

/* 0: not a word character; else its lowercase form (ASCII) */
static const unsigned char si_ascii[128] = {
    0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,
    0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0, '0','1','2','3','4','5','6','7','8','9',0,0,0,0,0,0,
    0,'a','b','c','d','e','f','g','h','i','j','k','l','m','n','o',
    'p','q','r','s','t','u','v','w','x','y','z',0,0,0,0,'_',
    0,'a','b','c','d','e','f','g','h','i','j','k','l','m','n','o',
    'p','q','r','s','t','u','v','w','x','y','z',0,0,0,0,0,
};

static int si_pass_init(si_pass *s, int width, int vote_kind, int vote_words, int mh_words,
                        int want_all, int mh_bins) {
    memset(s, 0, sizeof(*s));
    s->width = width;
    s->vote_kind = vote_kind;
    s->vote_words = vote_words;
    s->mh_words = mh_words;
    s->want_all = want_all;
    s->cap = 4096;
    s->buf = (char *)malloc(s->cap);
    if (!s->buf) return -1;
    if (mh_words) {
        int bins = mh_bins > 0 ? mh_bins : 64 * mh_words, lg = 0;
        s->mh_bins = bins;
        while ((1 << lg) < bins) lg++;
        s->mh_shift = 64 - lg;
        for (int b = 0; b < bins; b++) s->mh_attempt[b] = -1;
    }
    return 0;
}

static void si_pass_free(si_pass *s) {
    free(s->buf);
    free(s->xs);
    free(s->all);
    s->buf = NULL; s->xs = NULL; s->all = NULL;
}

static inline int si_push64(uint64_t **a, size_t *n, size_t *cap, uint64_t v) {
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 1024;
        uint64_t *p = (uint64_t *)realloc(*a, c * sizeof(uint64_t));
        if (!p) return -1;
        *a = p; *cap = c;
    }
    (*a)[(*n)++] = v;
    return 0;
}

static inline void si_vote_flush(si_pass *s) {
    int n8 = s->vote_words * 8;
    for (int j = 0; j < n8; j++) {
        uint64_t c = s->cnt8[j];
        for (int t = 0; t < 8; t++) s->ones[8 * j + t] += (c >> (8 * t)) & 0xFF;
        s->cnt8[j] = 0;
    }
    s->pending = 0;
}

/* The 64-bit vote's waiting hashes counted, eight byte lanes at a time in registers
 * (at most 64 hashes: no lane of a counter overflows). */
static inline void si_vote_block(si_pass *s) {
    uint64_t c[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < s->nvotes; i++) {
        uint64_t x = s->votes[i];
        for (int j = 0; j < 8; j++) c[j] += si_spread[(x >> (8 * j)) & 0xFF];
    }
    for (int j = 0; j < 8; j++)
        for (int t = 0; t < 8; t++) s->ones[8 * j + t] += (c[j] >> (8 * t)) & 0xFF;
    s->nvotes = 0;
}

/* ones[64 * q + i] counts bit i of hash word q (word 0 the most significant) */
static inline void si_vote_add(si_pass *s, const uint64_t *h) {
    for (int q = 0; q < s->vote_words; q++) {
        uint64_t x = h[q];
        uint64_t *c = s->cnt8 + 8 * q;
        for (int j = 0; j < 8; j++) c[j] += si_spread[(x >> (8 * j)) & 0xFF];
    }
    if (++s->pending == 255) si_vote_flush(s);
}

static inline void si_mh_offer(si_pass *s, uint64_t g, int32_t attempt) {
    int b = (int)(g >> s->mh_shift);
    uint64_t v = g & ((~0ULL) >> (64 - s->mh_shift));
    int32_t r = s->mh_attempt[b];
    if (r < 0) {
        s->mh_attempt[b] = attempt;
        s->mh_val[b] = v;
        s->mh_filled++;
    } else if (r == attempt && v < s->mh_val[b]) {
        s->mh_val[b] = v;
    }
}

/* One shingle hash into the MinHash code: its first hash (attempt 0 of the bins) at once;
 * the later attempts that fill empty bins need the shingle only while a bin is empty. */
static inline void si_mh_add(si_pass *s, uint64_t x) {
    si_mh_offer(s, si_mh_mix(x), 0);
    if (s->mh_filled < s->mh_bins && si_push64(&s->xs, &s->nxs, &s->capxs, x))
        s->oom = 1;
}

/* ---- sorting ---------------------------------------------------------------------- */

static inline void si_insertion64(uint64_t *a, size_t n) {
    for (size_t i = 1; i < n; i++) {
        uint64_t v = a[i];
        size_t j = i;
        while (j > 0 && a[j - 1] > v) { a[j] = a[j - 1]; j--; }
        a[j] = v;
    }
}

/* LSD radix sort of n 64-bit keys, a byte per pass; tmp holds n keys. A pass whose byte is
 * the same in every key is skipped. */
static void si_radix64(uint64_t *a, uint64_t *tmp, size_t n) {
    if (n <= 32) {
        si_insertion64(a, n);
        return;
    }
    uint64_t *src = a, *dst = tmp;
    for (int b = 0; b < 8; b++) {
        size_t count[256] = {0};
        int shift = 8 * b;
        for (size_t i = 0; i < n; i++) count[(src[i] >> shift) & 0xFF]++;
        if (count[(src[0] >> shift) & 0xFF] == n) continue;
        size_t sum = 0;
        for (int c = 0; c < 256; c++) { size_t x = count[c]; count[c] = sum; sum += x; }
        for (size_t i = 0; i < n; i++) dst[count[(src[i] >> shift) & 0xFF]++] = src[i];
        uint64_t *t = src; src = dst; dst = t;
    }
    if (src != a) memcpy(a, src, n * sizeof(uint64_t));
}

/* Sort n 64-bit keys ascending; tmp holds n keys. Shingle hashes spread evenly, so one
 * counting pass on the top bits (about n / 4 buckets, at most 256) and one scatter leave
 * buckets of a few keys each, finished by insertion sort (a bucket of more than 32 by the
 * radix sort of its keys) and copied back: about four passes over the keys where the
 * radix sort alone makes sixteen, and few buckets to count for a text's few hundred. */
static void si_sort64(uint64_t *a, uint64_t *tmp, size_t n) {
    if (n <= 32) {
        si_insertion64(a, n);
        return;
    }
    int bits = 3;
    while (bits < 8 && ((size_t)4 << bits) < n) bits++;
    int shift = 64 - bits, buckets = 1 << bits;
    size_t start[257], at[256];
    memset(start, 0, (size_t)(buckets + 1) * sizeof(size_t));
    for (size_t i = 0; i < n; i++) start[(a[i] >> shift) + 1]++;
    for (int c = 0; c < buckets; c++) start[c + 1] += start[c];
    memcpy(at, start, (size_t)buckets * sizeof(size_t));
    for (size_t i = 0; i < n; i++) tmp[at[a[i] >> shift]++] = a[i];
    for (int c = 0; c < buckets; c++) {   /* a is free: each bucket's scratch */
        size_t m = start[c + 1] - start[c];
        if (m > 32) si_radix64(tmp + start[c], a + start[c], m);
        else if (m > 1) si_insertion64(tmp + start[c], m);
    }
    memcpy(a, tmp, n * sizeof(uint64_t));
}

/* Sort and drop repeats; returns the count left. */
static size_t si_unique64(uint64_t *a, uint64_t *tmp, size_t n) {
    si_sort64(a, tmp, n);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (m == 0 || a[i] != a[m - 1]) a[m++] = a[i];
    return m;
}

static inline void si_emit(si_pass *s, const char *p, size_t n) {
    uint64_t h[SI_MAX_WORDS];
    uint64_t x = 0;
    s->windows++;
    if (s->mh_words || s->want_all || s->vote_kind == 0)
        x = (uint64_t)XXH3_64bits(p, n);
    if (s->vote_kind >= 0) {
        if (s->vote_kind == 0) {
            s->votes[s->nvotes++] = x;
            if (s->nvotes == 64) si_vote_block(s);
        } else {
            XXH128_hash_t y = XXH3_128bits_withSeed(p, n, 0);
            h[0] = y.high64; h[1] = y.low64;
            if (s->vote_kind == 4) {
                y = XXH3_128bits_withSeed(p, n, 1);
                h[2] = y.high64; h[3] = y.low64;
            }
            si_vote_add(s, h);
        }
    }
    if (s->mh_words) si_mh_add(s, x);
    if (s->want_all && si_push64(&s->all, &s->nall, &s->capall, x)) s->oom = 1;
}

static inline int si_reserve(si_pass *s, size_t more) {
    if (s->len + more <= s->cap) return 0;
    size_t c = s->cap;
    while (c < s->len + more) c *= 2;
    char *p = (char *)realloc(s->buf, c);
    if (!p) { s->oom = 1; return -1; }
    s->buf = p; s->cap = c;
    return 0;
}

/* A token starts: drop the bytes no later shingle needs, then separate it with a space. */
static inline void si_token_start(si_pass *s) {
    int keep = s->width - 1;             /* complete tokens the next shingle still needs */
    if (s->len > SI_COMPACT && s->ntok >= keep) {
        size_t from = keep ? s->start[(s->ntok - keep) % SI_MAX_SHINGLE] : s->len;
        memmove(s->buf, s->buf + from, s->len - from);
        s->len -= from;
        for (int t = 0; t < SI_MAX_SHINGLE; t++) {
            s->start[t] = s->start[t] >= from ? s->start[t] - from : 0;
            s->end[t] = s->end[t] >= from ? s->end[t] - from : 0;
        }
    }
    if (s->len) s->buf[s->len++] = ' ';  /* room: every caller reserved it */
    s->start[s->ntok % SI_MAX_SHINGLE] = s->len;
    s->in_tok = 1;
}

static inline void si_token_end(si_pass *s) {
    s->end[s->ntok % SI_MAX_SHINGLE] = s->len;
    s->ntok++;
    s->in_tok = 0;
    if (s->ntok >= s->width) {
        size_t a = s->start[(s->ntok - s->width) % SI_MAX_SHINGLE];
        si_emit(s, s->buf + a, s->len - a);
    }
}

static inline size_t si_utf8(uint32_t c, char *o) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | (c >> 6)); o[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12)); o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F)); return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18)); o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F)); o[3] = (char)(0x80 | (c & 0x3F)); return 4;
}

/* One character of the folded text (after case folding). */
static inline void si_folded_char(si_pass *s, uint32_t c) {
    if (si_reserve(s, 8)) return;
    if (c < 128) {
        unsigned char l = si_ascii[c];
        if (l) {
            if (!s->in_tok) si_token_start(s);
            s->buf[s->len++] = (char)l;
        } else if (s->in_tok) {
            si_token_end(s);
        }
    } else if (si_is_cjk(c)) {
        if (s->in_tok) si_token_end(s);
        si_token_start(s);
        s->len += si_utf8(c, s->buf + s->len);
        si_token_end(s);
    } else if (Py_UNICODE_ISALNUM((Py_UCS4)c)) {
        if (!s->in_tok) si_token_start(s);
        s->len += si_utf8(c, s->buf + s->len);
    } else if (s->in_tok) {
        si_token_end(s);
    }
}

/* One character above ASCII: mapped by the tables, then tokenized. */
static inline void si_wide_char(si_pass *s, const si_tables_t *t, uint32_t c) {
    uint32_t to;
    if (c < 0x10000) {
        to = s->normalized == 1 ? t->fold[c] : t->nf[c];
        if (s->normalized == 2 && (to & SI_MAP_COMPLEX)) to = t->fold[c];
    } else if (!s->normalized) {
        to = SI_MAP_COMPLEX;
    } else {
        size_t lo = 0, hi = t->n_astral;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (t->astral_cp[mid] < c) lo = mid + 1; else hi = mid;
        }
        to = lo < t->n_astral && t->astral_cp[lo] == c ? t->astral_to[lo] : c;
    }
    if (to & SI_MAP_COMPLEX) {
        s->needs_nf = 1;
    } else if (to & SI_MAP_SEQ) {
        const uint32_t *e = t->seq + (to & ~SI_MAP_SEQ);
        for (uint32_t i = 1; i <= e[0]; i++) si_folded_char(s, e[i]);
    } else {
        si_folded_char(s, to);
    }
}

/* The characters P[FROM..TO) of a PEP 393 string's data, CHAR_T each: ASCII inline, in
 * stretches of 48 (which write 97 bytes at most: each character its byte and a separating
 * space). The buffer and its length live in locals inside a stretch (a store through
 * char * could alias them), written back around every call that reads them. */
#define SI_FEED_RANGE(CHAR_T, P, FROM, TO)                                                \
    do {                                                                                  \
        const CHAR_T *p = (const CHAR_T *)(P);                                            \
        size_t si_from_ = (FROM), si_to_ = (TO);                                          \
        size_t i = si_from_, n = si_to_;                                                  \
        while (i < n && !s->oom && !s->needs_nf) {                                        \
            if (si_reserve(s, 128)) return;                                               \
            size_t stop = i + 48 < n ? i + 48 : n;                                        \
            char *buf = s->buf;                                                           \
            size_t len = s->len;                                                          \
            int in_tok = s->in_tok;                                                       \
            for (; i < stop; i++) {                                                       \
                uint32_t c = p[i];                                                        \
                if (c >= 128) break;                                                      \
                unsigned char l = si_ascii[c];                                            \
                if (l) {                                                                  \
                    if (!in_tok) {                                                        \
                        s->len = len;                                                     \
                        si_token_start(s);                                                \
                        len = s->len;                                                     \
                        in_tok = 1;                                                       \
                    }                                                                     \
                    buf[len++] = (char)l;                                                 \
                } else if (in_tok) {                                                      \
                    s->len = len;                                                         \
                    si_token_end(s);                                                      \
                    in_tok = 0;                                                           \
                }                                                                         \
            }                                                                             \
            s->len = len;                                                                 \
            s->in_tok = in_tok;                                                           \
            if (i < stop) {                                                               \
                si_wide_char(s, t, p[i]);         /* reserves for itself */               \
                i++;                                                                      \
            }                                                                             \
        }                                                                                 \
    } while (0)

#if defined(__SSE2__)
#include <emmintrin.h>

/* The characters of a one-byte-per-character string: 16 at a time where all 16 are ASCII,
 * each run of word characters found from a mask of the 16 and copied lowercased in one
 * 16-byte store (the bytes past the run are overwritten by what follows, or lie past the
 * buffer's length), so the work is per token, not per character; other stretches and the
 * last characters as SI_FEED_RANGE reads them. */
static void si_feed_ascii(si_pass *s, const si_tables_t *t, const uint8_t *data, size_t n) {
    const __m128i before_A = _mm_set1_epi8('A' - 1), after_Z = _mm_set1_epi8('Z' + 1);
    const __m128i before_a = _mm_set1_epi8('a' - 1), after_z = _mm_set1_epi8('z' + 1);
    const __m128i before_0 = _mm_set1_epi8('0' - 1), after_9 = _mm_set1_epi8('9' + 1);
    const __m128i under = _mm_set1_epi8('_'), case_bit = _mm_set1_epi8(0x20);
    unsigned char lowered[32];
    size_t i = 0;
    while (i + 16 <= n && !s->oom && !s->needs_nf) {
        __m128i v = _mm_loadu_si128((const __m128i *)(data + i));
        if (_mm_movemask_epi8(v)) {           /* a character above ASCII among them */
            SI_FEED_RANGE(uint8_t, data, i, i + 16);
            i += 16;
            continue;
        }
        if (si_reserve(s, 64)) return;        /* 16 bytes, 8 spaces, a store's 16 past */
        __m128i upper = _mm_and_si128(_mm_cmpgt_epi8(v, before_A), _mm_cmplt_epi8(v, after_Z));
        __m128i low = _mm_or_si128(v, _mm_and_si128(upper, case_bit));
        __m128i word = _mm_or_si128(
            _mm_or_si128(_mm_and_si128(_mm_cmpgt_epi8(low, before_a),
                                       _mm_cmplt_epi8(low, after_z)),
                         _mm_and_si128(_mm_cmpgt_epi8(v, before_0),
                                       _mm_cmplt_epi8(v, after_9))),
            _mm_cmpeq_epi8(v, under));
        uint32_t m = (uint32_t)_mm_movemask_epi8(word);
        _mm_storeu_si128((__m128i *)lowered, low);
        int pos = 0;
        while (pos < 16) {
            uint32_t rest = m >> pos;
            if (!(rest & 1)) {                 /* a run of other characters */
                if (s->in_tok) si_token_end(s);
                if (!rest) break;
                pos += __builtin_ctz(rest);
            }
            int run = __builtin_ctz(~m >> pos);   /* ~m has bit 16 set: run <= 16 - pos */
            if (!s->in_tok) si_token_start(s);
            _mm_storeu_si128((__m128i *)(s->buf + s->len),
                             _mm_loadu_si128((const __m128i *)(lowered + pos)));
            s->len += run;
            pos += run;
        }
        i += 16;
    }
    SI_FEED_RANGE(uint8_t, data, i, n);
}
#endif

/* Feed a text's characters: kind 1, 2 or 4 bytes each (a PEP 393 string's data). Stops
 * early, with s->needs_nf set, at a character whose normal form depends on its neighbours
 * (only when s->normalized is 0). */
static void si_feed(si_pass *s, const si_tables_t *t, int kind, const void *data, size_t n) {
#if defined(__SSE2__)
    if (kind == 1) { si_feed_ascii(s, t, (const uint8_t *)data, n); return; }
#else
    if (kind == 1) SI_FEED_RANGE(uint8_t, data, 0, n);
#endif
    else if (kind == 2) SI_FEED_RANGE(uint16_t, data, 0, n);
    else SI_FEED_RANGE(uint32_t, data, 0, n);
}

/* The text ended: close its last token; a text with fewer tokens than the width makes one
 * shingle of them all. Then finish the MinHash code's attempts and the vote. */
static void si_finish(si_pass *s) {
    if (s->in_tok) si_token_end(s);
    if (s->ntok > 0 && s->ntok < s->width) {
        size_t a = s->start[0];
        si_emit(s, s->buf + a, s->end[(s->ntok - 1) % SI_MAX_SHINGLE] - a);
    }
    if (s->vote_kind >= 0) {
        si_vote_block(s);
        si_vote_flush(s);
    }
    if (s->mh_words && s->windows && s->mh_filled < s->mh_bins) {
        int bins = s->mh_bins;
        /* the attempts read every distinct shingle once (a text of few distinct shingles
         * repeated would otherwise have every repeat read in every attempt) */
        uint64_t *tmp = (uint64_t *)malloc((s->nxs ? s->nxs : 1) * sizeof(uint64_t));
        if (!tmp) { s->oom = 1; return; }
        s->nxs = si_unique64(s->xs, tmp, s->nxs);
        free(tmp);
        /* Attempt r offers every shingle again, hashed at x + r * golden, to the bins still
         * empty when the attempt began: any attempt-r entry is smaller than every later one,
         * so stopping once every bin holds one changes nothing. 64 * bins attempts leave a
         * bin empty with probability below bins * e**-64. */
        for (int32_t r = 1; s->mh_filled < bins && r < 64 * bins; r++) {
            for (size_t i = 0; i < s->nxs; i++) {
                uint64_t g = si_mh_mix(s->xs[i] + (uint64_t)r * SI_GOLDEN);
                int b = (int)(g >> s->mh_shift);
                int32_t br = s->mh_attempt[b];
                if (br < 0 || br == r) si_mh_offer(s, g, r);
            }
        }
    }
}

/* The simhash: bit i set when the vote is positive, i.e. more than half the shingles set
 * it. out[q] is word q, most significant first. */
static void si_vote_bits(const si_pass *s, uint64_t *out) {
    for (int q = 0; q < s->vote_words; q++) {
        uint64_t r = 0;
        for (int i = 0; i < 64; i++)
            if (2 * s->ones[64 * q + i] > s->windows) r |= 1ULL << i;
        out[q] = r;
    }
}

/* The MinHash code: bit b (value 2**b) is the lowest bit of bin b's minimum (0 if empty).
 * out[q] is word q, most significant first. */
static void si_mh_bits(const si_pass *s, uint64_t *out) {
    int words = s->mh_words;
    for (int q = 0; q < words; q++) out[q] = 0;
    for (int b = 0; b < 64 * words; b++)
        if (s->mh_attempt[b] >= 0 && (s->mh_val[b] & 1))
            out[words - 1 - b / 64] |= 1ULL << (b % 64);
}

/* MinHash LSH band keys (minhash-lsh-v1): the bins of a MinHash code (as minhash-v1's, but
 * as many as the least power of two >= bands * rows) cut into `bands` bands of `rows`
 * bins each (bands: two per word of the code, 8 at 256 bits to 32 at 1024; bins
 * t * rows .. t * rows + rows - 1 for band t); a band's key is the high 32 bits of h,
 * where h starts at (t + 1) * golden and takes each of its bins in order as
 * h = mix(mix(h ^ value) + attempt), value and attempt those of the bin's smallest pair
 * (an empty bin: value 2**64 - 1, attempt -1 as an unsigned 64-bit integer), mix being
 * si_mh_mix. Two texts share a band's key when they share its bins' minima, each with
 * probability J, so a band with probability J ** rows (and a 32-bit collision besides).
 * Band 0 is the most significant 32 bits of out[0]. */
#define SI_MAX_BINS (SI_MAX_WORDS * 64)
static void si_mh_bands(const si_pass *s, int rows, uint64_t *out) {
    int bands = 2 * s->mh_words;
    for (int q = 0; q < s->mh_words; q++) out[q] = 0;
    for (int t = 0; t < bands; t++) {
        uint64_t h = (uint64_t)(t + 1) * SI_GOLDEN;
        for (int j = 0; j < rows; j++) {
            int b = t * rows + j;
            int32_t a = s->mh_attempt[b];
            uint64_t v = a >= 0 ? s->mh_val[b] : ~0ULL;
            h = si_mh_mix(si_mh_mix(h ^ v) + (uint64_t)(int64_t)a);
        }
        out[t / 2] |= (h >> 32) << (t % 2 ? 0 : 32);
    }
}

#endif
