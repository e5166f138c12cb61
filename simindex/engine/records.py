"""Record operations inside a records/ transaction: the log of truth of an index.

records/ maps each id key to the seq of its latest record and each seq to the record
(the codec is compiled: _records.pyx). Its info database counts what the write protocol
needs: the next seq to give out (seqs are never reused) and how many records were removed
or replaced since the last compaction (their table entries are stale).
"""

from __future__ import annotations

from typing import Optional, Union

import numpy as np

from ._layout import (
    DB_IDS, DB_INFO, DB_SEQS, INFO_NEXT_SEQ, INFO_REQUEST, INFO_STALE,
)
from ._lmdb import Txn
from ._records import read_tail, record_get, records_lookup, records_put
from .codec import decode_id, encode_ids
from ..errors import CorruptError, IdExistsError


def _be(n: int) -> bytes:
    return int(n).to_bytes(8, "big")


def next_seq(txn: Txn) -> int:
    """The seq the next record will get (1 in a new index)."""
    v = txn.get(DB_INFO, INFO_NEXT_SEQ)
    return int.from_bytes(v, "big") if v is not None else 1


def last_seq(txn: Txn) -> int:
    """The newest seq given out (0 for none)."""
    return next_seq(txn) - 1


def last_seq_of(next_seq_value: bytes) -> int:
    """last_seq from the stored next-seq value."""
    return int.from_bytes(next_seq_value, "big") - 1


def lost(path: str, where: str, last: Optional[int], applied: list,
         durable: list) -> Optional[str]:
    """Why the records environment `where`/ of the index at `path` holds fewer records
    than its shards say were committed, or None. `last`: its newest seq (None: it never
    gave one out); `applied` and `durable`: each shard's applied seq of it and the seq up
    to which the shard saw it on disk (a sync=False writer's records above its last flush
    may be lost in an OS crash, and are not counted)."""
    if last is None and max(applied, default=0):
        shard = int(np.argmax(applied))
        why = f"holds no record, but shard {shard} applied records up to seq {max(applied)}"
    elif durable and (last or 0) < max(durable):
        shard = int(np.argmax(durable))
        top = max(durable)
        why = (f"ends at seq {last or 0}, but shard {shard} recorded that it held every "
               f"record up to seq {top} on disk: up to {top - (last or 0)} committed records "
               f"are missing (a copy restored from before they were added, another "
               f"index's file, or a damaged one)")
    else:
        return None
    return (f"{path}: {where}/ {why}; restore {where}/ from a backup that holds them "
            f"(nothing was changed), or run `simindex repair --accept-loss` to rebuild the "
            f"tables from the records that remain")


def raise_next_seq(txn: Txn, top: int) -> None:
    """Never give out a seq at or below `top` again (one a shard already applied: after an
    OS crash a shard may hold seqs records/ lost, and their table entries must stay stale)."""
    if next_seq(txn) <= top:
        txn.put(DB_INFO, INFO_NEXT_SEQ, _be(top + 1))


def stale(txn: Txn) -> int:
    """Records removed or replaced since the last compaction."""
    v = txn.get(DB_INFO, INFO_STALE)
    return int.from_bytes(v, "big") if v else 0


def add_stale(txn: Txn, by: int) -> None:
    txn.put(DB_INFO, INFO_STALE, _be(max(0, stale(txn) + by)))


def put(txn: Txn, idkeys: Union[list, np.ndarray], fps: np.ndarray, metas: list,
        replace: bool = True) -> int:
    """Write records (id keys, or a uint64 array of int ids; uint64 fingerprints; packed
    metas) in a records/ write
    transaction; returns the first seq given out: record i gets seq0 + i. An id stored
    before loses its older record, or with replace=False raises IdExistsError (the
    transaction then writes nothing), as does an id given twice."""
    if not replace:
        seen = set()
        for idk in (idkeys if isinstance(idkeys, list) else encode_ids(idkeys.tolist())):
            if idk in seen or txn.get(DB_IDS, idk) is not None:
                id_ = decode_id(idk)
                raise IdExistsError(f"id {id_!r:.80} is "
                                    f"{'given twice' if idk in seen else 'already stored'}",
                                    id_)
            seen.add(idk)
    seq0 = next_seq(txn)
    seq, replaced = records_put(txn, DB_IDS, DB_SEQS, idkeys, fps, metas, seq0)
    txn.put(DB_INFO, INFO_NEXT_SEQ, _be(seq))
    if replaced:
        add_stale(txn, replaced)
    return seq0


def refuse_replacing(txn: Txn, idkey: bytes) -> None:
    """Raise IdExistsError when `idkey` names a stored record: an insert-if-new
    (add_unique) found no near-copy, but adding would replace that record."""
    if txn.get(DB_IDS, idkey) is not None:
        id_ = decode_id(idkey)
        raise IdExistsError(f"id {id_!r:.80} is already stored, and its record is not a "
                            f"near-copy: add_unique never replaces a record (remove() it "
                            f"first, or add() to replace it)", id_)


def remove(txn: Txn, idkey: bytes) -> bool:
    """Delete the record of an id key in a records/ write transaction; whether there was one."""
    old = txn.get(DB_IDS, idkey)
    if old is None:
        return False
    txn.delete(DB_IDS, idkey)
    txn.delete(DB_SEQS, old)
    add_stale(txn, 1)
    return True


def get(txn: Txn, idkey: bytes, words: int = 1) -> Optional[bytes]:
    """The stored record of an id key (its value without the checksum), or None. The
    record must be whole and hold that id key: a damaged id entry is an error, never
    another document's record."""
    got = record_get(txn, DB_IDS, DB_SEQS, idkey, words)
    if got is None or isinstance(got, bytes):
        return got
    why, seq = got
    raise CorruptError(f"{txn.env.path}: the id entry of {decode_id(idkey)!r:.80} " + {
        "size": "is damaged (it holds no 8-byte seq)",
        "missing": f"leads to seq {seq}, which holds no record",
        "other id": f"leads to the record of seq {seq}, which holds another id"}[why])


def count(txn: Txn) -> int:
    """How many records (ids) are stored."""
    return txn.entries(DB_IDS)


def tail(txn: Txn, start: int, limit: int = 0, words: int = 1) -> tuple:
    """(seqs, fingerprints) of the live records with seq >= start, in seq order, at most
    `limit` of them (0: all): uint64 arrays, fingerprints (n, words) when words > 1."""
    return read_tail(txn, DB_SEQS, start, limit, words)


def live(txn: Txn, words: int = 1) -> tuple:
    """(seqs, fingerprints, ids) of every live record, in seq (insertion) order
    (fingerprints (n, words) for wide ones)."""
    seqs, fps = tail(txn, 0, 0, words)
    return seqs, fps, records_lookup(txn, DB_SEQS, seqs, words)[1]


def live_ids(txn: Txn, seqs: np.ndarray, words: int = 1) -> list:
    """The ids of the live records of `seqs` (a uint64 array)."""
    return records_lookup(txn, DB_SEQS, seqs, words)[1]


def request(txn: Txn, client: bytes) -> Optional[bytes]:
    """What a Ray client's latest ledger request stored (see remember_request), or None."""
    return txn.get(DB_INFO, INFO_REQUEST + client)


def remember_request(txn: Txn, client: bytes, value: bytes) -> None:
    """Store, in the transaction of a ledger write, the request id and result of a Ray
    client's write (packed by the ledger), so a retried call returns it instead of writing
    again."""
    txn.put(DB_INFO, INFO_REQUEST + client, value)
