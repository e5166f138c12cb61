# cython: language_level=3
"""The on-disk format's constants for Python, published from ext/simindex/layout.pxd (their
one definition, which the compiled modules cimport). See that file for what each one means.
"""

cimport simindex.engine.layout as layout

FORMAT_VERSION = layout.FORMAT_VERSION
FORMAT_CLASSIC = layout.FORMAT_CLASSIC
FORMAT_FLIPS = layout.FORMAT_FLIPS
FORMAT_LEDGERS = layout.FORMAT_LEDGERS
WIDTH = layout.WIDTH

MANIFEST = layout.MANIFEST.decode()
MANIFEST_MAGIC = layout.MANIFEST_MAGIC.decode()
LAYOUT_V1 = layout.LAYOUT_V1.decode()
LAYOUT_V2 = layout.LAYOUT_V2.decode()

RECORDS_DIR = layout.RECORDS_DIR.decode()
LOCK_FILE = layout.LOCK_FILE.decode()
LOG_DIR = layout.LOG_DIR.decode()
LOG_SUFFIX = layout.LOG_SUFFIX.decode()
LOG_TOKEN_HEX = layout.LOG_TOKEN_HEX
SHARD_PREFIX = layout.SHARD_PREFIX.decode()
_SHARD_DIR = layout.SHARD_DIR.decode()


_LEDGER_DIR = layout.LEDGER_DIR.decode()


def ledger_dir(int ledger):
    """The directory name of ledger number `ledger` ("records", "records-1", ...)."""
    return RECORDS_DIR if ledger == 0 else _LEDGER_DIR % ledger


def shard_dir(int shard):
    """The directory name of shard number `shard` ("shard-007")."""
    return _SHARD_DIR % shard


DB_IDS = layout.DB_IDS.decode()
DB_SEQS = layout.DB_SEQS.decode()
DB_INFO = layout.DB_INFO.decode()
DB_STATE = layout.DB_STATE.decode()
DB_SLABS = layout.DB_SLABS.decode()      # "blocks": the on-disk name of the slab database

INFO_NEXT_SEQ = <bytes>layout.INFO_NEXT_SEQ
INFO_STALE = <bytes>layout.INFO_STALE
INFO_LOG_MARKER = <bytes>layout.INFO_LOG_MARKER
INFO_REQUEST = <bytes>layout.INFO_REQUEST

STATE_APPLIED = <bytes>layout.STATE_APPLIED
STATE_RUNS = <bytes>layout.STATE_RUNS
STATE_NEXT_RUN = <bytes>layout.STATE_NEXT_RUN
STATE_LEDGERS = <bytes>layout.STATE_LEDGERS
STATE_DURABLE = <bytes>layout.STATE_DURABLE

LOG_MAGIC = <bytes>layout.LOG_MAGIC[:layout.LOG_MAGIC_SIZE]
LOG_ENTRY_HEADER = layout.LOG_ENTRY_HEADER

RECORD_HEADER = layout.RECORD_HEADER
RECORD_SUM = layout.RECORD_SUM
ID_TAG_STR = bytes([layout.ID_TAG_STR])
ID_TAG_BYTES = bytes([layout.ID_TAG_BYTES])
ID_TAG_INT = bytes([layout.ID_TAG_INT])
MAX_ID_KEY = layout.MAX_ID_KEY

RUN_ENTRY = layout.RUN_ENTRY
SLAB_BYTES = layout.SLAB_BYTES
SLAB_ENTRIES = layout.SLAB_ENTRIES
V1_MAX_ENTRIES = layout.V1_MAX_ENTRIES

LMDB_PAGE_HEADER = layout.LMDB_PAGE_HEADER
LMDB_PAGE_FLAGS_AT = layout.LMDB_PAGE_FLAGS_AT
LMDB_PAGE_PAGES_AT = layout.LMDB_PAGE_PAGES_AT
LMDB_P_BRANCH = layout.LMDB_P_BRANCH
LMDB_P_LEAF = layout.LMDB_P_LEAF
LMDB_P_OVERFLOW = layout.LMDB_P_OVERFLOW
LMDB_P_LEAF2 = layout.LMDB_P_LEAF2
LMDB_F_BIGDATA = layout.LMDB_F_BIGDATA
LMDB_F_SUBDATA = layout.LMDB_F_SUBDATA
LMDB_META_MAGIC = layout.LMDB_META_MAGIC
