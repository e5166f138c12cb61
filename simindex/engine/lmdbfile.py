"""An LMDB data file read with plain file reads, never through the map.

LMDB trusts its pages: a data file cut short makes a read of the map die of SIGBUS, and a
cursor stepping onto a damaged page fails an assertion and aborts the process. So before
an environment is opened its file is checked against its meta page (`check_size`), and
verify() walks every page reachable from the roots (`walk`) before reading through LMDB.
The page format is LMDB's own (lmdb/mdb.c); the constants simindex reads are in layout.pxd.
"""

from __future__ import annotations

import os
from typing import NamedTuple, Optional

from ._layout import (
    LMDB_F_BIGDATA, LMDB_F_SUBDATA, LMDB_META_MAGIC, LMDB_P_BRANCH, LMDB_P_LEAF,
    LMDB_P_LEAF2, LMDB_P_OVERFLOW, LMDB_PAGE_FLAGS_AT, LMDB_PAGE_HEADER, LMDB_PAGE_PAGES_AT,
)
from ..errors import CorruptError

NO_PAGE = (1 << 64) - 1          # LMDB's P_INVALID: the root of an empty database
DATA_MDB = "data.mdb"
LOCK_MDB = "lock.mdb"
_PAGE_SIZES = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
MAX_UNWRITTEN_TAIL = 1024        # pages a crash may leave unwritten past a small file's end


class Meta(NamedTuple):
    """What a meta page says: page size, transaction id, last page, [free root, main root];
    and the page size each meta page of the file claims (None for one without LMDB's magic)."""
    psize: int
    txnid: int
    last_page: int
    roots: list
    claimed: tuple = ()


def read_meta(path: str, txnid: Optional[int] = None) -> Optional[Meta]:
    """The newer valid meta page of the data file `path` (or the one of transaction
    `txnid`), or None when neither page is valid."""
    with open(path, "rb") as fh:
        head = fh.read(2 * 65536)
    # Each meta page: the page header, then MDB_meta: magic u32, version u32, address,
    # mapsize, two 48-byte MDB_db records (free pages, main; the first one's pad holds the
    # page size, each ends with its root page), last page number, txn id. LMDB trusts the
    # meta with the larger txn id.
    psize = int.from_bytes(head[40:44], "little") if len(head) >= 44 else 0
    if psize not in _PAGE_SIZES:
        psize = 4096
    found: list = []
    claimed: list[Optional[int]] = []
    for i in range(2):
        page = head[i * psize:(i + 1) * psize]
        if len(page) < 152 or int.from_bytes(page[16:20], "little") != LMDB_META_MAGIC:
            claimed.append(None)
            continue
        claimed.append(int.from_bytes(page[40:44], "little"))
        roots = [int.from_bytes(page[o:o + 8], "little") for o in (80, 128)]
        found.append((int.from_bytes(page[144:152], "little"),
                      int.from_bytes(page[136:144], "little"), roots))
    best = None
    for t, last_pg, roots in found:
        if (txnid is None and (best is None or t > best.txnid)) or t == txnid:
            best = Meta(psize, t, last_pg, roots, tuple(claimed))
    return best


def check_size(env_dir: str, readonly: bool = False, existing: bool = False) -> None:
    """Refuse a data file cut short of its root pages (LMDB would SIGBUS reading them), or
    whose meta page claims a size the file cannot have; with `existing` (an index that was
    made), also a data file that is missing, empty or has no valid meta page.

    LMDB may leave free pages at the end of the file unwritten (allocated and freed in one
    transaction), so a file shorter than its last page is normal after a crash; a writable
    open fills the missing tail with zeros, so that a page lost to real damage reads as a
    damaged page (an error) instead of a SIGBUS. That tail is bounded by the file's own
    size: a meta page claiming more is damaged. A read-only open never writes.
    """
    f = os.path.join(env_dir, DATA_MDB)
    try:
        # the meta page first, then the size: another process's commit writes its pages
        # (growing the file) before the meta page that names them, so the size read after
        # holds every page of that meta (read the other way round, a commit in between
        # would make a sound file look cut short)
        meta = read_meta(f)
        size = os.path.getsize(f)
    except FileNotFoundError:
        if existing:
            raise CorruptError(f"{f} is missing") from None
        return
    if size == 0:
        if existing:
            raise CorruptError(f"{f} is empty (0 bytes)")
        return
    if meta is None:
        raise CorruptError(f"{f} is damaged or not an LMDB data file (no valid meta page)")
    # LMDB divides by the page size the meta pages claim, and finds the second by the first's
    for i, claim in enumerate(meta.claimed):
        if claim is not None and claim not in _PAGE_SIZES:
            raise CorruptError(f"{f}: meta page {i} claims a page size of {claim} bytes: it "
                               f"is damaged")
    for root in meta.roots:
        if root != NO_PAGE and (root > meta.last_page or (root + 1) * meta.psize > size):
            raise CorruptError(f"{f} is truncated: {size} bytes, its root page {root} "
                               f"needs {(root + 1) * meta.psize}")
    need = (meta.last_page + 1) * meta.psize
    if size >= need:
        return
    if need - size > max(size, MAX_UNWRITTEN_TAIL * meta.psize):
        raise CorruptError(f"{f}: its meta page claims {need} bytes (last page "
                           f"{meta.last_page}), far beyond the file's {size}: the meta page "
                           f"is damaged")
    if readonly:
        return               # only free pages lie past the end; a read-only open reads none
    try:
        fd = os.open(f, os.O_WRONLY)
        try:
            os.posix_fallocate(fd, size, need - size)     # never shrinks the file
        finally:
            os.close(fd)
    except OSError as e:
        raise CorruptError(f"{f} is truncated: {size} bytes, its meta page needs {need}, "
                           f"and it cannot be extended ({e.strerror})") from None


def never_committed(env_dir: str) -> bool:
    """Whether the environment's data file exists but no transaction ever committed in it
    (a creation that crashed while LMDB was writing its first pages)."""
    f = os.path.join(env_dir, DATA_MDB)
    if not os.path.exists(f):
        return False
    meta = read_meta(f)
    return meta is None or meta.txnid == 0


def remove(env_dir: str) -> None:
    """Delete an environment's data and lock files (those that exist)."""
    for name in (DATA_MDB, LOCK_MDB):
        try:
            os.remove(os.path.join(env_dir, name))
        except FileNotFoundError:
            pass


def problems(env_dir: str) -> list:
    """What is wrong with one environment's data file (a list of str, [] when sound), read
    with plain file reads: its size against its meta page, then every page (walk)."""
    try:
        check_size(env_dir, readonly=True, existing=True)
    except CorruptError as e:
        return [str(e)]
    f = os.path.join(env_dir, DATA_MDB)
    meta = read_meta(f)
    return walk(f, meta) if meta is not None else [f"{f}: no valid meta page"]


def walk(path: str, meta: Meta) -> list:
    """Problems found in the data file `path` by walking every page reachable from the
    roots of `meta` (a list of str, [] when sound): each page's structure, and the order of
    its keys, which must ascend and lie between the keys that lead to the page (a damaged
    key sends LMDB's search to the wrong page, and a stored key reads as absent). Every
    database simindex makes orders its keys as bytes; the free-page list's are integers
    and go unchecked."""
    psize, last, roots = meta.psize, meta.last_page, meta.roots
    name = os.path.join(os.path.basename(os.path.dirname(path)), DATA_MDB)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        todo = [(r, 0, "free-page list" if i == 0 else "main database", None, None)
                for i, r in enumerate(roots) if r != NO_PAGE]
        seen = set()
        while todo:
            pgno, depth, what, lo, hi = todo.pop()
            if pgno in seen:
                return [f"{name}: page {pgno} is referenced twice ({what})"]
            seen.add(pgno)
            if pgno < 2 or pgno > last or depth > 64:
                return [f"{name}: {what} points to page {pgno}, outside 2..{last}"]
            if (pgno + 1) * psize > size:
                return [f"{name}: page {pgno} of the {what} lies past the end of the file"]
            page = os.pread(f.fileno(), psize, pgno * psize)
            problem = _page(page, pgno, psize, last, depth, what, todo, f.fileno(), lo, hi)
            if problem:
                return [f"{name}: page {pgno} of the {what} is damaged ({problem})"]
    return []


def _page(page, pgno, psize, last, depth, what, todo, fd, lo=None, hi=None):
    """What is wrong with one branch or leaf page (None when nothing); queues its children
    with the bounds of their keys. `lo`, `hi`: every key of the page must lie in [lo, hi)
    (None: unbounded)."""
    header = LMDB_PAGE_HEADER
    if int.from_bytes(page[0:8], "little") != pgno:
        return f"its header names page {int.from_bytes(page[0:8], 'little')}"
    flags = int.from_bytes(page[LMDB_PAGE_FLAGS_AT:LMDB_PAGE_FLAGS_AT + 2], "little")
    lower = int.from_bytes(page[LMDB_PAGE_PAGES_AT:LMDB_PAGE_PAGES_AT + 2], "little")
    upper = int.from_bytes(page[LMDB_PAGE_PAGES_AT + 2:LMDB_PAGE_PAGES_AT + 4], "little")
    if flags & LMDB_P_LEAF2 or flags & (LMDB_P_BRANCH | LMDB_P_LEAF) not in (LMDB_P_BRANCH,
                                                                          LMDB_P_LEAF):
        return f"flags {flags:#x}"
    if not header <= lower <= upper <= psize or (lower - header) % 2:
        return f"bounds {lower}..{upper}"
    n = (lower - header) // 2
    if flags & LMDB_P_BRANCH and n < 1:
        return "an empty branch page"
    ordered = what != "free-page list"
    children = []
    prev = lo
    for i in range(n):
        off = int.from_bytes(page[header + 2 * i:header + 2 * i + 2], "little")
        if not upper <= off <= psize - 8:
            return f"node {i} at offset {off}"
        nlo, nhi, nflags, ksize = (int.from_bytes(page[off + j:off + j + 2], "little")
                                   for j in (0, 2, 4, 6))
        data = off + 8 + ksize
        if data > psize:
            return f"node {i} runs past the page"
        # (a branch page's first key is not stored: its child's keys start at `lo`)
        first = i == (1 if flags & LMDB_P_BRANCH else 0)
        if ordered and (i or not flags & LMDB_P_BRANCH):
            key = page[off + 8:data]
            if prev is not None and (key < prev or (key == prev and not first)):
                return f"node {i}'s key is out of order"
            if hi is not None and key >= hi:
                return f"node {i}'s key lies beyond the page's range"
            prev = key
        if flags & LMDB_P_BRANCH:
            children.append((nlo | nhi << 16 | nflags << 32, prev if i else lo))
            continue
        dsize = nlo | nhi << 16
        if nflags & LMDB_F_BIGDATA:
            if data + 8 > psize:
                return f"node {i} runs past the page"
            ov = int.from_bytes(page[data:data + 8], "little")
            need = (dsize + header + psize - 1) // psize
            if not 2 <= ov <= last - need + 1:
                return f"node {i} points to overflow page {ov}, outside 2..{last}"
            head = os.pread(fd, header, ov * psize)
            flags_at, pages_at = LMDB_PAGE_FLAGS_AT, LMDB_PAGE_PAGES_AT
            if len(head) < header or int.from_bytes(head[0:8], "little") != ov or \
                    not int.from_bytes(head[flags_at:flags_at + 2], "little") & \
                    LMDB_P_OVERFLOW or int.from_bytes(head[pages_at:pages_at + 4], "little") < need:
                return f"node {i}: overflow page {ov} is damaged"
        elif data + dsize > psize:
            return f"node {i} runs past the page"
        elif nflags & LMDB_F_SUBDATA:
            if dsize != 48:
                return f"node {i}: a database record of {dsize} bytes"
            root = int.from_bytes(page[data + 40:data + 48], "little")
            if root != NO_PAGE:
                key = page[off + 8:off + 8 + ksize].decode("utf-8", "replace")
                todo.append((root, 0, f"database {key!r}", None, None))
    for j, (child, low) in enumerate(children):
        todo.append((child, depth + 1, what, low,
                     children[j + 1][1] if j + 1 < len(children) else hi))
    return None
