"""Cluster: an index served by Ray actors, one per shard plus one for the records."""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any, Callable, Iterable, Optional, Union

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..engine import environments, manifest
from ..engine._layout import ledger_dir
from ..engine.ledgers import check_kept, ledger_of, to_local
from ..engine.codec import (
    Packed, check_fp, check_wide_fp, encode_id, encode_records, pack_meta,
)
from ..values import fps_array
from ..errors import (
    Error, InputError, MissingIndexError, ParameterError, ReadOnlyError, StorageError,
    closed_error,
)
from ..signatures.fingerprints import fingerprint
from ..engine.protocol import LAG_LIMIT
from ..engine.results import (
    Id, Match, Record, check_where, match_of, record_of, kept_where, kept_where_many,
)
from ..scheme_names import lsh_rows
from ..textcheck import TextCheck, keeps_sketches, text_check, text_matches, text_sketch
from ..engine.transactions import is_io
from . import route
from .batch import clusters, pairs
from .parts import PART_RECORDS
from .route import fetch
from .servers import LedgerServer, ShardServer
from .connection import connect, release

# Actors hold an environment, not a CPU: they wait on disk and network, so they reserve
# none (a 2-core node can serve 16 shards). Ray restarts one that dies and retries its calls
# (the ledger's writes are idempotent, see LedgerServer._once).
ACTOR_OPTIONS = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": -1}
# records a replay fetches from the ledger and sends to every shard at once (each shard
# keeps only its own entries: protocol.Entries)
REPLAY_CHUNK = 1 << 24

class Cluster:
    """An index whose shards are served by Ray actors: the answers of simindex.Index.

    Each actor opens its environment where it runs, so the index directory must be on the
    local disk of the node(s) the actors are placed on (`nodes`: a dict from shard number,
    or "records", to a Ray node id; unplaced actors go where Ray puts them, which is only
    right on a single node or with the index replicated to every node's local disk).
    `readonly=True` opens every environment read-only and refuses writes.

    `ledgers` > 1 splits the records of an index that has never held any (and that nothing
    else has open for writing; see environments.split_ledgers) over that many
    ledgers (records/, records-1/, ...; each a Ray actor, placed by `nodes` under its
    directory name): a record's ledger follows from its id, so adds commit in every ledger
    at once and each resolves its own part of a query batch (simindex/engine/ledgers.py).
    Such an index opens read-only with simindex.Index.
    """

    def __init__(self, index_path: Union[str, os.PathLike], *, address: Optional[str] = None,
                 nodes: Optional[dict] = None, readonly: bool = False,
                 ledgers: Optional[int] = None) -> None:
        # actors resolve paths in their own working directory: send an absolute one
        self.path = os.path.abspath(os.fspath(index_path))
        if not os.path.exists(os.path.join(self.path, manifest.NAME)):
            raise MissingIndexError(f"no simindex index at {self.path} (create it with "
                                    f"simindex.Index or simindex.distributed.build)")
        # read once here: the servers get it from the driver and never read the file
        self._manifest = manifest.read(self.path)
        if ledgers is not None and (isinstance(ledgers, bool) or not isinstance(ledgers, int)
                                    or not 1 <= ledgers <= manifest.MAX_LEDGERS):
            raise ParameterError(f"ledgers must be an int from 1 to {manifest.MAX_LEDGERS}, "
                                 f"got {ledgers!r}")
        if ledgers is not None and ledgers != self._manifest.ledgers:
            if readonly:
                raise ParameterError(f"ledgers={ledgers} was given, but the index at "
                                     f"{self.path} has {self._manifest.ledgers} and "
                                     f"readonly=True cannot split it")
            self._manifest = environments.split_ledgers(self._manifest, ledgers)
        self.plan = self._manifest.plan
        self.readonly = bool(readonly)
        self._client = uuid.uuid4().bytes
        self._requests = 0
        self._req_lock = threading.Lock()
        self._closed = False
        self._failed: Optional[tuple] = None   # (errno, message) of a failed write to disk
        self._started = connect(address)
        nodes = dict(nodes or {})

        def placed(where):
            node = nodes.get(where)
            if node is None:
                return ACTOR_OPTIONS
            return dict(ACTOR_OPTIONS, scheduling_strategy=NodeAffinitySchedulingStrategy(
                node_id=node, soft=False))
        # actor handles (Ray types them loosely: their methods exist only at run time)
        self.ledgers: list[Any] = []
        self.shards: list[Any] = []
        n = self._manifest.ledgers
        try:
            self.ledgers = [ray.remote(LedgerServer).options(**placed(ledger_dir(j))).remote(
                self._manifest, self.readonly, j) for j in range(n)]
            self.shards = [ray.remote(ShardServer).options(**placed(s)).remote(
                self._manifest, s, self.readonly) for s in range(self.plan.shards)]
            self._read_applied()
            check_kept(self.path, self._applied,
                       fetch([ledger.last.remote() for ledger in self.ledgers]),
                       fetch([s.durable.remote() for s in self.shards]) if n == 1 else None)
            # per ledger and shard, (lo, hi): that ledger's seqs with nothing for the shard
            self._clean = [[(0, -1)] * self.plan.shards for _ in range(n)]
            if not self.readonly:
                fetch([ledger.not_before.remote(int(top)) for ledger, top in
                       zip(self.ledgers, self._applied.max(axis=1))])
                self.catch_up()
            else:
                fetch([ledger.count.remote() for ledger in self.ledgers])
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ life cycle
    def close(self) -> None:
        """Stop the actors (their environments flush and close) and a Ray started here."""
        if self._closed:
            return
        self._closed = True
        if len(self.ledgers) == 1 and not self.readonly and self._failed is None:
            # what the shards may say records/ holds on disk (an index of several ledgers
            # counts what they applied: only the ledgers write there, and they sync)
            try:
                last = fetch(self.ledger.synced_last.remote())
                fetch([s.mark_durable.remote(last) for s in self.shards])
            except (Error, ray.exceptions.RayError):
                pass
        actors = [*self.ledgers, *self.shards]
        for ref in [a.close.remote() for a in actors]:
            try:
                ray.get(ref)
            except ray.exceptions.RayError:
                pass                   # a server that never opened has nothing to close
        for a in actors:
            ray.kill(a)
        release(self._started)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<simindex.distributed.Cluster {self.path!r} shards={self.plan.shards} "
                f"ledgers={len(self.ledgers)}>")

    @property
    def ledger(self) -> Any:
        """The server of ledger 0 (records/): in an index of one ledger, its only one."""
        return self.ledgers[0]

    def _ledger_of(self, idk: bytes) -> Any:
        return self.ledgers[int(ledger_of([idk], len(self.ledgers))[0])]

    def _read_applied(self) -> np.ndarray:
        """(ledgers, shards): each shard's applied local seq of each ledger, from the
        shards themselves."""
        self._applied = np.array(fetch([s.applied.remote() for s in self.shards]),
                                 dtype=np.int64).T.copy()
        return self._applied

    def _check(self, write=False):
        if self._closed:
            raise closed_error(f"cluster on {self.path}")
        if write and self.readonly:
            raise ReadOnlyError(f"cluster on {self.path} is read-only")
        if write and self._failed is not None:
            raise StorageError(
                self._failed[0],
                f"cluster on {self.path} refuses writes since a write to disk failed "
                f"({self._failed[1]}); close it and open it again (its servers reopen their "
                f"environments and the shards catch up from the ledger)")

    def _written(self, refs):
        """fetch() of write calls. An I/O error in a server (whose handle then refuses
        writes, as a single process's does) makes this cluster refuse writes too, before
        the ledger commits anything, until it is opened again."""
        try:
            return fetch(refs)
        except StorageError as e:
            if is_io(e):
                self._failed = (e.errno, e.strerror or str(e))
            raise

    def _request(self):
        """A request id for an idempotent ledger write: (client and thread, counter)."""
        with self._req_lock:
            self._requests += 1
            n = self._requests
        return self._client + threading.get_ident().to_bytes(8, "little"), n

    @property
    def k(self) -> int:
        return self.plan.k

    @property
    def blocks(self) -> int:
        return self.plan.blocks

    @property
    def width(self) -> int:
        """Bits per fingerprint: 64, 128 or 256 (the index's)."""
        return self.plan.width

    @property
    def scheme(self) -> Optional[str]:
        return self._manifest.scheme

    def fingerprint(self, text: str) -> int:
        return fingerprint(text, scheme=self.scheme, width=self.plan.width)

    def _fp(self, fp: Any) -> int:
        """A fingerprint checked against the index's width, as an int (as Index._fp)."""
        return check_fp(fp) if self.plan.width == 64 else check_wide_fp(fp, self.plan.width)

    def _fps(self, fps: Any) -> np.ndarray:
        """Fingerprints checked against the index's width: (n,) uint64 at 64 bits, (n,
        width/64) above (as Index.query_many takes them)."""
        return fps_array(fps, self.plan.width)

    def _k(self, k):
        if k is None:
            return self.plan.k
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= self.plan.k:
            raise ParameterError(f"k must be an int between 0 and the index's k "
                                 f"({self.plan.k}), got {k!r}")
        return k

    # ------------------------------------------------------------ writes
    def catch_up(self) -> None:
        """Bring every shard up to the records committed when the call began (the replay
        after an actor restart); flush() for the whole index."""
        self._check(write=True)
        n = len(self.ledgers)
        targets = fetch([ledger.last.remote() for ledger in self.ledgers])
        for j, (ledger, target) in enumerate(zip(self.ledgers, targets)):
            while True:
                applied = self._read_applied()[j]
                low = int(applied.min())
                if low >= target:
                    break
                seqs, fps = fetch(ledger.tail.remote(low + 1, REPLAY_CHUNK))
                # no live record above: the shards may claim everything up to the target
                last = int(to_local(seqs[-1:], n)[1][0]) if len(seqs) else target
                got = self._written([
                    s.apply.remote([(j, seqs, fps, int(a), last)]) if a < last
                    else s.applied.remote() for s, a in zip(self.shards, applied)])
                self._applied = np.array(got, dtype=np.int64).T.copy()
                self._clean[j] = [(0, -1)] * self.plan.shards

    flush = catch_up

    def compact(self) -> None:
        """As Index.compact: bring every shard level, then merge each table's runs in each
        shard into one, dropping the entries of records removed before the ledgers'
        snapshots. Each shard is one write transaction (a failed one leaves it as it was);
        removals stay counted until a compaction completes."""
        self.catch_up()
        got = fetch([ledger.removals.remote() for ledger in self.ledgers])
        live = ray.put(np.sort(np.concatenate([g[0] for g in got])))
        newest = [g[1] for g in got]
        self._written([s.compact.remote(live, newest, sum(g[2] for g in got))
                       for s in self.shards])
        self._written([ledger.forget_removals.remote(self._request(), g[2])
                       for ledger, g in zip(self.ledgers, got)])

    def _apply(self, rounds):
        """Send committed batches to the shards that hold their entries: `rounds` is a list
        of [(ledger, prev, seqs, fps, owners or None)], batches of different ledgers whose
        parts each shard applies in one transaction.

        A shard with no entry in a batch is skipped while it lags that ledger by less than
        LAG_LIMIT records (queries check those in the ledger), saving its commit. The driver
        then vouches that the skipped range holds nothing for it, but only for ranges it
        committed back to back itself (another client's records in between may belong).
        """
        gap = False
        n = len(self.ledgers)
        for batches in rounds:
            parts: dict = {}
            for j, prev, seqs, fps, own in batches:
                if own is None:
                    own = route.owners(self.plan, fps)
                last = int(to_local(seqs[-1:], n)[1][0])
                applied, clean = self._applied[j], self._clean[j]
                for s in range(self.plan.shards):
                    lo, hi = clean[s]
                    since = lo if hi == prev else prev
                    if not own[s].any() and last - applied[s] < LAG_LIMIT:
                        clean[s] = (lo if hi == prev else int(applied[s]), last) \
                            if applied[s] >= since else (0, -1)
                        continue
                    parts.setdefault(s, []).append((j, seqs[own[s]], fps[own[s]], since,
                                                    last))
            calls = {s: self.shards[s].apply.remote(p) for s, p in parts.items()}
            for s, applied in zip(calls, self._written(list(calls.values()))):
                self._applied[:, s] = applied
                for j, _seqs, _fps, _since, last in parts[s]:
                    self._clean[j][s] = (0, -1)
                    gap |= applied[j] < last
        if gap:
            self.catch_up()

    def add_many(self, items: Iterable[Any], fingerprints: Any = None) -> None:
        """As Index.add_many: everything is checked first; records commit in the ledgers in
        atomic chunks (durable), then the shards apply their parts."""
        self._check(write=True)
        idks, fps, metas = encode_records(items, fingerprints, self.plan.width)
        self.add_columns(idks, fps, metas)

    def add_columns(self, idks: list, fps: np.ndarray, metas: list,
                    owners: Optional[np.ndarray] = None) -> None:
        """add_many of records already encoded (simindex.engine.codec.encode_records), with, when
        known, `owners`: the (shards, n) bools of route.owners (distributed.build has its
        map tasks compute them). With several ledgers, each chunk's records commit in their
        ledgers at once (each ledger's part atomic)."""
        self._check(write=True)
        shape = (len(idks),) if self.plan.width == 64 else (len(idks), self.plan.words)
        if not isinstance(fps, np.ndarray) or fps.dtype != np.uint64 or fps.shape != shape:
            raise InputError(f"add_columns takes the fingerprints as a uint64 array of shape "
                             f"{shape} (width {self.plan.width}), got "
                             f"{getattr(fps, 'shape', type(fps).__name__)}")
        n = len(self.ledgers)
        rounds = []
        for i in range(0, len(idks), PART_RECORDS):
            ik, fp, mt = idks[i:i + PART_RECORDS], fps[i:i + PART_RECORDS], \
                metas[i:i + PART_RECORDS]
            own = None if owners is None else owners[:, i:i + PART_RECORDS]
            # each ledger's records of the chunk, committed in every ledger at once
            if n == 1:
                split = [(0, np.arange(len(ik)))]
            else:
                home = ledger_of(ik, n)
                split = [(j, np.flatnonzero(home == j)) for j in range(n)]
                split = [(j, at) for j, at in split if len(at)]
            commits = [self.ledgers[j].commit.remote(
                self._request(), ik if n == 1 else [ik[x] for x in at.tolist()], fp[at],
                mt if n == 1 else [mt[x] for x in at.tolist()]) for j, at in split]
            rounds.append([(j, prev, seqs, fp[at], None if own is None else own[:, at])
                           for (j, at), (prev, seqs) in zip(split, self._written(commits))])
        if rounds:
            self._apply(rounds)

    def add(self, id: Id, fingerprint: int, meta: Any = None) -> None:
        self.add_many([(id, fingerprint, meta)])

    def add_unique(self, id: Id, fingerprint: int, meta: Any = None,
                   k: Optional[int] = None) -> list[Match]:
        """As Index.add_unique: atomic across clients (the ledger holds the records write
        lock while the shards scan)."""
        self._check(write=True)
        return self._add_unique(encode_id(id), self._fp(fingerprint), pack_meta(meta, id),
                                self._k(k))

    def _add_unique(self, idk: bytes, fp: int, mb: bytes, k: int,
                    check: Optional[TextCheck] = None,
                    sketch: Optional[tuple] = None) -> list[Match]:
        n = len(self.ledgers)
        home = int(ledger_of([idk], n)[0])
        across = dict(servers=self.ledgers, home=home) if n > 1 else {}
        added, hits = self._written(self.ledger.add_unique.remote(
            self._request(), idk, fp, mb, k, self.shards, check, sketch, **across))
        if added is not None:
            prev, seqs = added
            self._apply([[(home, prev, seqs, self._fps([fp]), None)]])
        if sketch is not None:           # a text's: each with its similarity
            return text_matches(hits, sketch[0], sketch[1],
                                check.measure if check is not None else "jaccard")
        return [match_of(h) for h in hits]

    def remove(self, id: Id) -> bool:
        """Remove the record of `id`; returns whether there was one."""
        self._check(write=True)
        idk = encode_id(id)
        return self._written(self._ledger_of(idk).remove.remote(self._request(), idk))

    # ------------------------------------------------------------ text (as Index's)
    def text_check(self, min_similarity: Optional[float] = None,
                   k: Optional[int] = None) -> Optional[TextCheck]:
        """As Index.text_check."""
        return text_check(self.scheme, self.plan.width, self.plan.k,
                          self._manifest.calibration, min_similarity,
                          None if k is None else self._k(k))

    def _keeps_sketches(self) -> bool:
        return keeps_sketches(self.scheme, self._manifest.calibration)

    def text_record(self, text: str, meta: Any = None, id: Optional[Id] = None) -> tuple:
        """As Index.text_record."""
        if not self._keeps_sketches():
            return self.fingerprint(text), meta
        fp, sketch = text_sketch(text, self.scheme, self.plan.width)
        return fp, Packed(pack_meta(meta, id, sketch))

    def add_text(self, id: Id, text: str, meta: Any = None) -> int:
        """As Index.add_text."""
        fp, stored = self.text_record(text, meta, id)
        self.add(id, fp, stored)
        return fp

    def add_unique_text(self, id: Id, text: str, meta: Any = None, k: Optional[int] = None,
                        min_similarity: Optional[float] = None) -> list[Match]:
        """As Index.add_unique_text: the ledger judges the candidates' sketches under the
        records write lock."""
        self._check(write=True)
        check = self.text_check(min_similarity, k)
        if check is None and not self._keeps_sketches():
            return self.add_unique(id, self.fingerprint(text), meta, k)
        fp, sketch = text_sketch(text, self.scheme, self.plan.width)
        mb = pack_meta(meta, id, sketch)
        if check is None:
            return self._add_unique(encode_id(id), fp, mb, self._k(k), sketch=sketch)
        return self._add_unique(encode_id(id), fp, mb, check.k, check, sketch)

    # ------------------------------------------------------------ reads
    def query_many(self, fingerprints: Any, k: Optional[int] = None,
                   where: Optional[Callable[[int, Match], bool]] = None
                   ) -> list[list[Match]]:
        """As Index.query_many: shards scan their parts at once, then the ledger resolves."""
        self._check()
        k = self._k(k)
        q = self._fps(fingerprints)
        if where is not None:
            check_where(where)
        if not len(q):
            return []
        # every shard snapshot is taken before the ledgers' records snapshots (see resolve)
        hits = self._hits(q, k)
        out = [[match_of(h) for h in hs] for hs in hits]
        if where is not None:
            out = kept_where_many(out, where)
        return out

    def _hits(self, q: np.ndarray, k: int) -> list:
        """The core's hits of each query: the shards scan, then every ledger resolves."""
        qidx, seqs, dists, applied = route.scan(self.plan, self.shards, q, k,
                                                len(self.ledgers))
        return route.resolve(self.ledgers, q, qidx, seqs, dists, applied, k)

    def query(self, fingerprint: int, k: Optional[int] = None,
              where: Optional[Callable[[Match], bool]] = None) -> list[Match]:
        ms = self.query_many(self._fps([self._fp(fingerprint)]), k)[0]
        return kept_where(ms, where)

    def query_text(self, text: str, k: Optional[int] = None,
                   where: Optional[Callable[[Match], bool]] = None,
                   min_similarity: Optional[float] = None) -> list[Match]:
        """As Index.query_text."""
        self._check()
        check = self.text_check(min_similarity, k)
        if check is None and (lsh_rows(self.scheme) is not None or
                              not self._keeps_sketches()):
            return self.query(self.fingerprint(text), k, where)
        fp, (sketch, size) = text_sketch(text, self.scheme, self.plan.width)
        q = self._fps([fp])
        if check is None:
            return kept_where(text_matches(self._hits(q, self._k(k))[0], sketch, size), where)
        hits = self._hits(q, check.k)[0]
        return kept_where(check.similar(sketch, size, hits, fp), where)

    def get(self, id: Id) -> Optional[Record]:
        """The stored Record of `id`, or None."""
        self._check()
        idk = encode_id(id)
        return record_of(fetch(self._ledger_of(idk).get.remote(idk)), self.plan.words)

    def __contains__(self, id: object) -> bool:
        try:
            idk = encode_id(id)
        except InputError:
            return False
        self._check()
        return fetch(self._ledger_of(idk).get.remote(idk)) is not None

    def __len__(self) -> int:
        self._check()
        return sum(fetch([ledger.count.remote() for ledger in self.ledgers]))

    def pairs(self, k: Optional[int] = None, partitions: Optional[int] = None
              ) -> list[tuple[Id, Id, int]]:
        """distributed.pairs over this index's stored records."""
        self._check()
        return pairs(self.path, k=self._k(k), partitions=partitions)

    def clusters(self, k: Optional[int] = None, partitions: Optional[int] = None
                 ) -> list[list[Id]]:
        """distributed.clusters over this index's stored records."""
        self._check()
        return clusters(self.path, k=self._k(k), partitions=partitions)

    def busy(self) -> dict:
        """{actor: {method: (calls, seconds)}} of every ledger (under its directory name)
        and shard server (under its number): the calls each served and the wall seconds
        spent in them since it started (a restarted actor starts again at zero), to find
        the busiest."""
        self._check()
        actors = [*self.ledgers, *self.shards]
        names = [ledger_dir(j) for j in range(len(self.ledgers))] + \
            list(range(len(self.shards)))
        return dict(zip(names, fetch([a.busy.remote() for a in actors])))

    def pids(self) -> dict:
        """{"records": pid, "records-1": pid, ..., shard: pid, ...} of the actor processes
        (for operations and tests): the ledgers' under their directory names."""
        self._check()
        out: dict = {ledger_dir(j): pid for j, pid in
                     enumerate(fetch([ledger.pid.remote() for ledger in self.ledgers]))}
        out.update(enumerate(fetch([s.pid.remote() for s in self.shards])))
        return out
