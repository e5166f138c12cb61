# The on-disk format of a simindex index, defined once.
#
# Every number and name that the files hold or are found by lives here. The compiled
# modules cimport this file (`cimport simindex.engine.layout as layout`); Python reads the same
# values from the compiled module simindex._layout, which publishes them. docs/reference/on-disk.md
# describes the format in prose; change a value here only with a new format or layout
# version (and a test that an index written before still opens).
#
# Words: a fingerprint is cut into `blocks` of bits (the paper's blocks: the manifest's
# "blocks" and "prefix_blocks"); a table's sorted entries are stored as runs of slabs, each
# one LMDB value. The names the files hold call a slab a block (the database "blocks", the
# layouts "packed-blocks-v1"/"-v2", the manifest fields "block_bytes"/"block_entries"): they
# are the format, and an index written with them must open, so they stay.
#
# INDEX/
#   manifest.msgpack   magic, format, width, k, blocks, tables, shards, layout, scheme;
#                      format 2 also prefix_blocks
#   lock               serializes index creation
#   records/           LMDB: ids (id key -> seq), seqs (seq -> record), info (counters,
#                      fold markers, request records)
#   shard-NNN/         LMDB: state (applied seq, runs), blocks (the slabs of every run)
#   pending/           the write buffer's logs, <32 hex digits>.log

cdef extern from *:
    """
    #define SI_MANIFEST "manifest.msgpack"
    #define SI_MANIFEST_MAGIC "simindex"
    #define SI_LAYOUT_V1 "packed-blocks-v1"     /* on-disk names: "block" is a slab */
    #define SI_LAYOUT_V2 "packed-blocks-v2"
    #define SI_RECORDS_DIR "records"
    #define SI_LEDGER_DIR SI_RECORDS_DIR "-%d"
    #define SI_SHARD_PREFIX "shard-"
    #define SI_SHARD_DIR SI_SHARD_PREFIX "%03d"
    #define SI_LOCK_FILE "lock"
    #define SI_LOG_DIR "pending"
    #define SI_LOG_SUFFIX ".log"
    #define SI_DB_IDS "ids"
    #define SI_DB_SEQS "seqs"
    #define SI_DB_INFO "info"
    #define SI_DB_STATE "state"
    #define SI_DB_SLABS "blocks"                /* on-disk name: "block" is a slab */
    #define SI_INFO_NEXT_SEQ "next_seq"
    #define SI_INFO_STALE "stale"
    #define SI_INFO_LOG_MARKER "log:"
    #define SI_INFO_REQUEST "req:"
    #define SI_STATE_APPLIED "applied"
    #define SI_STATE_RUNS "runs"
    #define SI_STATE_NEXT_RUN "next_run"
    #define SI_STATE_LEDGERS "ledgers"
    #define SI_STATE_DURABLE "durable"
    #define SI_LOG_MAGIC "SIMLOG\\0\\1"
    #define SI_LMDB_META_MAGIC 0xBEEFC0DEu
    """
    # ---- the manifest (simindex/engine/manifest.py reads and writes it)
    const char *MANIFEST "SI_MANIFEST"                # its file name
    const char *MANIFEST_MAGIC "SI_MANIFEST_MAGIC"    # its "magic" field
    const char *LAYOUT_V1 "SI_LAYOUT_V1"              # slab layouts a manifest may name
    const char *LAYOUT_V2 "SI_LAYOUT_V2"

    # ---- files and directories of an index
    const char *RECORDS_DIR "SI_RECORDS_DIR"           # the records (ledger 0)
    const char *LEDGER_DIR "SI_LEDGER_DIR"            # printf format of ledger 1, 2...'s
    const char *SHARD_PREFIX "SI_SHARD_PREFIX"        # what every shard directory starts with
    const char *SHARD_DIR "SI_SHARD_DIR"              # printf format of a shard's directory
    const char *LOCK_FILE "SI_LOCK_FILE"
    const char *LOG_DIR "SI_LOG_DIR"                  # the write buffer's logs: LOG_TOKEN_HEX
    const char *LOG_SUFFIX "SI_LOG_SUFFIX"            # lowercase hex digits, then LOG_SUFFIX

    # ---- LMDB databases: records/ holds ids, seqs, info; a shard holds state, blocks
    const char *DB_IDS "SI_DB_IDS"                    # id key -> seq (u64 BE)
    const char *DB_SEQS "SI_DB_SEQS"                  # seq (u64 BE) -> record
    const char *DB_INFO "SI_DB_INFO"                  # the keys below
    const char *DB_STATE "SI_DB_STATE"                # the keys below
    const char *DB_SLABS "SI_DB_SLABS"                # slab key -> slab; named "blocks"

    # ---- keys of records/info
    const char *INFO_NEXT_SEQ "SI_INFO_NEXT_SEQ"      # u64 BE: the next seq to give out
    const char *INFO_STALE "SI_INFO_STALE"            # u64 BE: removed or replaced records
    const char *INFO_LOG_MARKER "SI_INFO_LOG_MARKER"  # + log token -> offset folded, u64 BE
    const char *INFO_REQUEST "SI_INFO_REQUEST"        # + Ray client id -> msgpack [n, result]

    # ---- keys of a shard's state (each u64 LE but runs)
    const char *STATE_APPLIED "SI_STATE_APPLIED"      # every record up to this seq is applied
    const char *STATE_RUNS "SI_STATE_RUNS"            # RUN_ENTRY bytes per run, see below
    const char *STATE_NEXT_RUN "SI_STATE_NEXT_RUN"    # the next run id to give out
    const char *STATE_LEDGERS "SI_STATE_LEDGERS"      # index of several ledgers: per ledger,
                                                      # every record up to this local seq is
                                                      # applied (STATE_APPLIED stays 0)
    const char *STATE_DURABLE "SI_STATE_DURABLE"      # records/ held every record up to
                                                      # this seq on disk when it was written

    # ---- the write buffer's log: LOG_MAGIC, then per entry length u32 LE | crc32 u32 LE |
    # msgpack [id key, fingerprint, meta bytes]; the crc covers the length bytes and payload
    const char *LOG_MAGIC "SI_LOG_MAGIC"

    # ---- LMDB's meta page magic (see LMDB_PAGE_HEADER below)
    const unsigned int LMDB_META_MAGIC "SI_LMDB_META_MAGIC"

cdef enum:
    FORMAT_VERSION = 3        # the manifest's "format": what this version writes (every
                              # record carries its checksum, RECORD_SUM below)
    FORMAT_CLASSIC = 1        # formats still read and written as they are: 1 (the paper's
    FORMAT_FLIPS = 2          # plans), 2 (adds prefix_blocks), records without checksums
    FORMAT_LEDGERS = 4        # format 3 with several ledgers ("ledgers" > 1): what an index
                              # whose records are split by id over ledgers writes
    WIDTH = 64                # bits of a fingerprint
    LOG_MAGIC_SIZE = 8
    LOG_ENTRY_HEADER = 8
    LOG_TOKEN_HEX = 32        # a log's name: 32 random hex digits, never reused

    # A record, the value of a seq in records/seqs: fp (u64 LE), id key length (u16 LE),
    # id key, msgpack(meta), then (format 3) its checksum: u32 LE, the low 32 bits of the
    # XXH3-64 of every byte before it, seeded with the record's seq (so a record read under
    # another seq fails it too). An id key is a tag then the UTF-8 text, the bytes, or the
    # 8-byte big-endian int. Seqs are u64 big-endian keys, never reused.
    RECORD_HEADER = 10
    RECORD_SUM = 4
    ID_TAG_STR = 0x73         # b"s"
    ID_TAG_BYTES = 0x62       # b"b"
    ID_TAG_INT = 0x69         # b"i"
    MAX_ID_KEY = 511          # LMDB's key limit: tag + 510 bytes
    MSGPACK_NIL = 0xC0        # a meta of None, stored as one byte

    # A shard's runs (state key "runs"): per run, run id u64, entry count u64, table u32,
    # 0 u32 (LE), sorted by (table, run).
    RUN_ENTRY = 24
    RUN_ID_AT = 0
    RUN_COUNT_AT = 8
    RUN_TABLE_AT = 16

    # A run is a sorted sequence of slabs, each one LMDB value in the shard's slab db
    # (DB_SLABS) under SLAB_KEY bytes: run id (u64 BE), last permuted key of the slab (u64
    # BE), slab number in the run (u32 BE). Seeking (run, lo, 0) lands on the first slab that
    # can hold keys >= lo.
    SLAB_KEY = 20
    # Layout v2 (written): a V2_HEADER-byte header (magic, count u32, crc32 u32 of everything
    # after it but the padding, key width u8, seq width u8, low words u8, 1 zero byte, key
    # base u64, seq base u64; LE), `count` keys as kw-byte offsets from the key base, `count`
    # seqs as sw-byte offsets from the seq base, then (wide fingerprints only) `count` times
    # `low words` u64 LE: the permuted key's words after the first, then V2_PAD zero bytes
    # so every entry is one unaligned 8-byte load. Widths are the fewest bytes that span the
    # slab's keys and seqs. Low words are width/64 - 1: 0 at width 64 to 15 at 1024.
    V2_MAGIC = 0x32424953     # b"SIB2" read little-endian
    V2_HEADER = 32
    V2_PAD = 8
    MAX_LOW_WORDS = 15
    # A full slab: with LMDB's 16-byte page header, exactly four 4 KiB overflow pages.
    SLAB_BYTES = 16368        # the manifest's "block_bytes" (an on-disk name)
    V2_MAX_ENTRIES = SLAB_BYTES - V2_HEADER - V2_PAD
    # Entries of a v2 slab at full width (16 bytes): a run smaller than this costs a slab.
    SLAB_ENTRIES = (SLAB_BYTES - V2_HEADER - V2_PAD) // 16
    # Layout v1 (still read): a 16-byte header (magic, count u32, crc32 u32, 0 u32), then
    # `count` 8-byte keys and `count` 8-byte seqs, at most V1_MAX_ENTRIES.
    V1_MAGIC = 0x31424953     # b"SIB1"
    V1_HEADER = 16
    V1_MAX_ENTRIES = 1022     # the manifest's "block_entries" of layout v1 (on disk)

    # LMDB's own page format, as far as the damage checks read it (lmdb/mdb.c): a page
    # header of 16 bytes, its flags (u16) at offset 10, then an overflow run's page count
    # (u32) at offset 12, where a branch or leaf page has its lower and upper bounds (u16).
    LMDB_PAGE_HEADER = 16
    LMDB_PAGE_FLAGS_AT = 10
    LMDB_PAGE_PAGES_AT = 12
    LMDB_P_BRANCH = 0x01
    LMDB_P_LEAF = 0x02
    LMDB_P_OVERFLOW = 0x04
    LMDB_P_LEAF2 = 0x20
    LMDB_F_BIGDATA = 0x01
    LMDB_F_SUBDATA = 0x02
