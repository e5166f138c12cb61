"""Type stubs of the on-disk format's constants (ext/simindex/engine/_layout.pyx; their one
definition is ext/simindex/layout.pxd)."""

FORMAT_VERSION: int
FORMAT_CLASSIC: int
FORMAT_FLIPS: int
FORMAT_LEDGERS: int
WIDTH: int
MANIFEST: str
MANIFEST_MAGIC: str
LAYOUT_V1: str
LAYOUT_V2: str
RECORDS_DIR: str
LOCK_FILE: str
LOG_DIR: str
LOG_SUFFIX: str
LOG_TOKEN_HEX: int
SHARD_PREFIX: str

def ledger_dir(ledger: int) -> str: ...
def shard_dir(shard: int) -> str: ...

DB_IDS: str
DB_SEQS: str
DB_INFO: str
DB_STATE: str
DB_SLABS: str
INFO_NEXT_SEQ: bytes
INFO_STALE: bytes
INFO_LOG_MARKER: bytes
INFO_REQUEST: bytes
STATE_APPLIED: bytes
STATE_RUNS: bytes
STATE_NEXT_RUN: bytes
STATE_LEDGERS: bytes
STATE_DURABLE: bytes
LOG_MAGIC: bytes
LOG_ENTRY_HEADER: int
RECORD_HEADER: int
RECORD_SUM: int
ID_TAG_STR: bytes
ID_TAG_BYTES: bytes
ID_TAG_INT: bytes
MAX_ID_KEY: int
RUN_ENTRY: int
SLAB_BYTES: int
SLAB_ENTRIES: int
V1_MAX_ENTRIES: int
LMDB_PAGE_HEADER: int
LMDB_PAGE_FLAGS_AT: int
LMDB_PAGE_PAGES_AT: int
LMDB_P_BRANCH: int
LMDB_P_LEAF: int
LMDB_P_OVERFLOW: int
LMDB_P_LEAF2: int
LMDB_F_BIGDATA: int
LMDB_F_SUBDATA: int
LMDB_META_MAGIC: int
