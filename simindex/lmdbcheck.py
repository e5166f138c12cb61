"""A structural check of an LMDB data file, read with plain file reads, never the map.

LMDB trusts its pages: stepping a cursor onto a damaged page fails an assertion and aborts
the process. verify() walks every page reachable from the roots first and leaves alone an
environment whose pages are not what their parents say.
"""

import os

P_BRANCH, P_LEAF, P_OVERFLOW, P_LEAF2 = 0x01, 0x02, 0x04, 0x20
F_BIGDATA, F_SUBDATA = 0x01, 0x02
HEADER = 16
NO_PAGE = (1 << 64) - 1


def check(path, meta):
    """Problems found in the data file `path` (a list of str, [] when sound).

    `meta` is (page size, txn id, last page, [free root, main root]) of its newer meta page.
    """
    psize, _txnid, last, roots = meta
    name = os.path.join(os.path.basename(os.path.dirname(path)), "data.mdb")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        todo = [(r, 0, "free-page list" if i == 0 else "main database")
                for i, r in enumerate(roots) if r != NO_PAGE]
        seen = set()
        while todo:
            pgno, depth, what = todo.pop()
            if pgno in seen:
                return [f"{name}: page {pgno} is referenced twice ({what})"]
            seen.add(pgno)
            if pgno < 2 or pgno > last or depth > 64:
                return [f"{name}: {what} points to page {pgno}, outside 2..{last}"]
            if (pgno + 1) * psize > size:
                return [f"{name}: page {pgno} of the {what} lies past the end of the file"]
            page = os.pread(f.fileno(), psize, pgno * psize)
            problem = _page(page, pgno, psize, last, depth, what, todo, f.fileno())
            if problem:
                return [f"{name}: page {pgno} of the {what} is damaged ({problem})"]
    return []


def _page(page, pgno, psize, last, depth, what, todo, fd):
    if int.from_bytes(page[0:8], "little") != pgno:
        return f"its header names page {int.from_bytes(page[0:8], 'little')}"
    flags = int.from_bytes(page[10:12], "little")
    lower = int.from_bytes(page[12:14], "little")
    upper = int.from_bytes(page[14:16], "little")
    if flags & P_LEAF2 or flags & (P_BRANCH | P_LEAF) not in (P_BRANCH, P_LEAF):
        return f"flags {flags:#x}"
    if not HEADER <= lower <= upper <= psize or (lower - HEADER) % 2:
        return f"bounds {lower}..{upper}"
    n = (lower - HEADER) // 2
    if flags & P_BRANCH and n < 1:
        return "an empty branch page"
    for i in range(n):
        off = int.from_bytes(page[HEADER + 2 * i:HEADER + 2 * i + 2], "little")
        if not upper <= off <= psize - 8:
            return f"node {i} at offset {off}"
        lo, hi, nflags, ksize = (int.from_bytes(page[off + j:off + j + 2], "little")
                                 for j in (0, 2, 4, 6))
        data = off + 8 + ksize
        if flags & P_BRANCH:
            if data > psize:
                return f"node {i} runs past the page"
            todo.append((lo | hi << 16 | nflags << 32, depth + 1, what))
            continue
        dsize = lo | hi << 16
        if nflags & F_BIGDATA:
            if data + 8 > psize:
                return f"node {i} runs past the page"
            ov = int.from_bytes(page[data:data + 8], "little")
            need = (dsize + HEADER + psize - 1) // psize
            if not 2 <= ov <= last - need + 1:
                return f"node {i} points to overflow page {ov}, outside 2..{last}"
            head = os.pread(fd, HEADER, ov * psize)
            if len(head) < HEADER or int.from_bytes(head[0:8], "little") != ov or \
                    not int.from_bytes(head[10:12], "little") & P_OVERFLOW or \
                    int.from_bytes(head[12:16], "little") < need:
                return f"node {i}: overflow page {ov} is damaged"
        elif data + dsize > psize:
            return f"node {i} runs past the page"
        elif nflags & F_SUBDATA:
            if dsize != 48:
                return f"node {i}: a database record of {dsize} bytes"
            root = int.from_bytes(page[data + 40:data + 48], "little")
            if root != NO_PAGE:
                key = page[off + 8:off + 8 + ksize].decode("utf-8", "replace")
                todo.append((root, 0, f"database {key!r}"))
    return None
