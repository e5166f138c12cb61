"""repair(): rebuild what can be rebuilt. The shards are derived from records/, so a shard
whose data file is missing, empty or damaged, or whose tables disagree with the records,
is set aside (its data file kept as data.mdb.damaged) and made again from the records.
records/ is the log of truth: damage there is refused, never rebuilt from nothing.

Run it while no other process has the index open.
"""

from __future__ import annotations

import os
import re
from typing import Optional, Union

from .engine import environments, ledgers, lmdbfile, manifest
from .engine._layout import RECORDS_DIR, SHARD_PREFIX, ledger_dir, shard_dir
from .errors import CorruptError, MissingIndexError, RecordsLostError
from .index import Index

DAMAGED = "data.mdb.damaged"
_SHARD = re.compile(SHARD_PREFIX + r"(\d+)")


def _remake(path: str, shard: int) -> None:
    """Set shard `shard`'s data file aside and make an empty environment in its place."""
    d = os.path.join(path, shard_dir(shard))
    os.makedirs(d, exist_ok=True)
    f = os.path.join(d, lmdbfile.DATA_MDB)
    if os.path.exists(f):
        os.replace(f, os.path.join(d, DAMAGED))
    lmdbfile.remove(d)
    environments.open_shard(path, shard, readonly=False, sync=True, existing=False).close()


def _caught_up_problems(path: str, m: manifest.Manifest) -> list:
    """verify() of the index after every shard is caught up to the records."""
    if m.ledgers == 1:
        with Index(path) as idx:          # opening catches every shard up to the records
            return idx.verify()
    ledgers.catch_up(path, m)
    with Index(path, readonly=True) as idx:
        return idx.verify()


def repair(path: Union[str, os.PathLike], accept_loss: bool = False) -> list[str]:
    """Rebuild every damaged shard of the index at `path` from its records, then verify it;
    returns what was done ([] when nothing needed it). CorruptError when records/ is
    damaged, RecordsLostError when it holds fewer records than the tables say were
    committed (restore it from a copy that holds them), CorruptError when the index is
    still unsound after. With accept_loss=True, records that hold fewer are taken as they
    are: every shard is rebuilt from them, and the tables forget the records they lost."""
    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(os.path.join(path, manifest.NAME)):
        raise MissingIndexError(f"no simindex index at {path}")
    m = manifest.read(path)
    plan = m.plan
    for j in range(m.ledgers):
        bad = lmdbfile.problems(os.path.join(path, ledger_dir(j)))
        if bad:
            raise CorruptError(f"{bad[0]}: the index's records are damaged or lost and "
                               f"cannot be rebuilt; restore {ledger_dir(j)}/ from a backup "
                               f"(nothing was changed)")
    done = []
    lost = _records_lost(path, m)
    if lost is not None:
        if not accept_loss:
            raise lost
        for s in range(plan.shards):
            _remake(path, s)
        done.append(f"every shard rebuilt from the records that remain ({lost})")
    for s in range(plan.shards):
        found = lmdbfile.problems(os.path.join(path, shard_dir(s)))
        if found:
            _remake(path, s)
            done.append(f"shard {s} rebuilt from the records ({found[0]})")
    for _ in range(plan.shards + 1):
        try:
            found = _caught_up_problems(path, m)
        except RecordsLostError:
            raise
        except CorruptError as e:         # a shard LMDB cannot even open
            found = [str(e)]
        if not found:
            return done
        shards = {int(x) for p in found for x in _SHARD.findall(p)}
        if not shards or any(p.startswith(RECORDS_DIR) for p in found):
            raise CorruptError(f"{path} is still unsound after repair: {found[0]}")
        for s in sorted(shards):          # pages sound, tables or state wrong: made again
            _remake(path, s)
            why = next(p for p in found if shard_dir(s) in p)
            done.append(f"shard {s} rebuilt from the records ({why})")
    raise CorruptError(f"{path} is still unsound after rebuilding every shard")


def _records_lost(path: str, m: manifest.Manifest) -> Optional[RecordsLostError]:
    """The RecordsLostError a read-only open of the index raises, or None (also when a
    damaged shard keeps it from opening: that shard is rebuilt below)."""
    try:
        with Index(path, readonly=True):
            return None
    except RecordsLostError as e:
        return e
    except CorruptError:
        return None
