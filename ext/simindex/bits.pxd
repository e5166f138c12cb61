# Byte-order loads and stores, popcount and count-leading-zeros: inline C shared by every
# compiled module (each cimport compiles them into the module, so hot loops stay inlined).
# Little-endian loads are plain unaligned loads on little-endian machines; big-endian ones
# (LMDB keys) go byte by byte.
from libc.stdint cimport uint32_t, uint64_t

cdef enum:
    MAX_WORDS = 16       # 64-bit words of the widest fingerprint (1024 bits)

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    static inline uint64_t si_load64(const void *p) {
        uint64_t v; memcpy(&v, p, 8);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        return v;
    }
    static inline void si_store64(void *p, uint64_t v) {
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap64(v);
    #endif
        memcpy(p, &v, 8);
    }
    static inline uint32_t si_load32(const void *p) {
        uint32_t v; memcpy(&v, p, 4);
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap32(v);
    #endif
        return v;
    }
    static inline void si_store32(void *p, uint32_t v) {
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        v = __builtin_bswap32(v);
    #endif
        memcpy(p, &v, 4);
    }
    static inline uint64_t si_load_be64(const void *p) {
        const uint8_t *b = (const uint8_t *)p; uint64_t v = 0;
        for (int i = 0; i < 8; i++) v = (v << 8) | b[i];
        return v;
    }
    static inline void si_store_be64(void *p, uint64_t v) {
        uint8_t *b = (uint8_t *)p;
        for (int i = 7; i >= 0; i--) { b[i] = (uint8_t)v; v >>= 8; }
    }
    static inline uint32_t si_load_be32(const void *p) {
        const uint8_t *b = (const uint8_t *)p;
        return ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16) | ((uint32_t)b[2] << 8) | b[3];
    }
    static inline void si_store_be32(void *p, uint32_t v) {
        uint8_t *b = (uint8_t *)p;
        b[0] = (uint8_t)(v >> 24); b[1] = (uint8_t)(v >> 16); b[2] = (uint8_t)(v >> 8); b[3] = (uint8_t)v;
    }
    static inline int si_popcount(uint64_t x) { return __builtin_popcountll(x); }
    static inline void si_prefetch(const void *p) { __builtin_prefetch(p, 0, 3); }
    static inline int si_clz64(uint64_t x) { return __builtin_clzll(x); }
    """
    void prefetch "si_prefetch"(const void *p) noexcept nogil
    uint64_t load64 "si_load64"(const void *p) noexcept nogil
    void store64 "si_store64"(void *p, uint64_t v) noexcept nogil
    uint32_t load32 "si_load32"(const void *p) noexcept nogil
    void store32 "si_store32"(void *p, uint32_t v) noexcept nogil
    uint64_t load_be64 "si_load_be64"(const void *p) noexcept nogil
    void store_be64 "si_store_be64"(void *p, uint64_t v) noexcept nogil
    uint32_t load_be32 "si_load_be32"(const void *p) noexcept nogil
    void store_be32 "si_store_be32"(void *p, uint32_t v) noexcept nogil
    int popcount "si_popcount"(uint64_t x) noexcept nogil
    int clz64 "si_clz64"(uint64_t x) noexcept nogil


cdef inline object words_int(const uint64_t *r, int words):
    """A fingerprint's words, most significant first, as a Python int."""
    cdef int q
    if words == 1:
        return r[0]
    v = 0
    for q in range(words):
        v = (v << 64) | r[q]
    return v
