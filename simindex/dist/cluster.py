"""Cluster: an index served by Ray actors, one per shard plus one for the records."""

import os

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .. import _core, manifest
from ..codec import check_fp, decode_id, encode_id, fp_array, pack_meta, unpack
from ..errors import MissingIndexError, ParameterError, StorageError
from ..fingerprints import fingerprint
from ..index import Record, _match, records_of
from ..store import APPLY_CHUNK, RECORD_CHUNK
from . import route
from .servers import LedgerServer, ShardServer, plan_of

# Actors hold an environment, not a CPU: they wait on disk and network, so they reserve
# none (a 2-core node can serve 16 shards). Ray restarts one that dies and retries its calls.
ACTOR_OPTIONS = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": -1}


def connect(address=None):
    """Join the Ray cluster at `address`, or start a local one; True if this call started it."""
    if ray.is_initialized():
        return False
    if address in (None, "local"):
        ray.init(include_dashboard=False, logging_level="WARNING")
    else:
        ray.init(address=address, logging_level="WARNING")
    return True


class Cluster:
    """An index whose shards are served by Ray actors: the same answers as simindex.Index.

    Each actor opens its environment where it runs, so the index directory must be on the
    local disk of the node(s) the actors are placed on (`nodes`: a dict from shard number,
    or "records", to a Ray node id; unplaced actors go where Ray puts them, which is only
    right on a single node or with the index replicated to every node's local disk).
    """

    def __init__(self, index_path, *, address=None, nodes=None):
        self.path = os.fspath(index_path)
        if not os.path.exists(os.path.join(self.path, manifest.NAME)):
            raise MissingIndexError(f"no simindex index at {self.path} (create it with "
                                    f"simindex.Index or simindex.dist.build)")
        self._manifest = manifest.read(self.path)
        self.plan = plan_of(self.path)
        self._started = connect(address)
        self._closed = False
        nodes = dict(nodes or {})

        def placed(where):
            node = nodes.get(where)
            if node is None:
                return ACTOR_OPTIONS
            return dict(ACTOR_OPTIONS, scheduling_strategy=NodeAffinitySchedulingStrategy(
                node_id=node, soft=False))
        try:
            self.ledger = ray.remote(LedgerServer).options(**placed("records")).remote(self.path)
            self.shards = [ray.remote(ShardServer).options(**placed(s)).remote(self.path, s)
                           for s in range(self.plan.shards)]
            top = max(ray.get([s.applied.remote() for s in self.shards]))
            ray.get(self.ledger.not_before.remote(top))
            self.catch_up()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ life cycle
    def close(self):
        """Stop the actors (their environments close) and a Ray this object started."""
        if self._closed:
            return
        self._closed = True
        for actor in [getattr(self, "ledger", None)] + list(getattr(self, "shards", [])):
            if actor is not None:
                try:
                    ray.get(actor.close.remote())
                except ray.exceptions.RayError:
                    pass
                ray.kill(actor)
        if self._started:
            ray.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check(self):
        if self._closed:
            raise StorageError(f"cluster on {self.path} is closed")

    @property
    def k(self):
        return self.plan.k

    @property
    def scheme(self):
        return self._manifest["scheme"]

    def fingerprint(self, text):
        return fingerprint(text, self.scheme)

    def _k(self, k):
        if k is None:
            return self.plan.k
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= self.plan.k:
            raise ParameterError(f"k must be an int between 0 and the index's k "
                                 f"({self.plan.k}), got {k!r}")
        return k

    # ------------------------------------------------------------ writes
    def catch_up(self):
        """Apply to every shard the committed records it has not seen (after a restart)."""
        self._check()
        while True:
            applied = ray.get([s.applied.remote() for s in self.shards])
            low = min(applied)
            seqs, fps = ray.get(self.ledger.tail.remote(low + 1, APPLY_CHUNK))
            if not len(seqs):
                return
            last = int(seqs[-1])
            ray.get([s.apply.remote(seqs, fps, a, last) for s, a in zip(self.shards, applied)
                     if a < last])

    def _apply(self, batches):
        """Send committed batches [(prev, seqs, fps, owners or None)] to the shards that hold
        their entries."""
        calls = []
        for prev, seqs, fps, own in batches:
            if own is None:
                own = route.owners(self.plan, fps)
            last = int(seqs[-1])
            for s, server in enumerate(self.shards):
                calls.append((prev, server.apply.remote(seqs[own[s]], fps[own[s]], prev, last)))
        gaps = [applied < prev for prev, applied in
                zip([p for p, _ in calls], ray.get([c for _, c in calls]))]
        if any(gaps):
            self.catch_up()

    def add_many(self, items, fingerprints=None):
        """As Index.add_many: records commit in the ledger (durable), then every shard
        applies its part; returns once all of it is done."""
        self._check()
        idks, fps, metas = records_of(items, fingerprints)
        self._add_encoded(idks, fps, metas)

    def _add_encoded(self, idks, fps, metas, owners=None):
        batches = []
        for i in range(0, len(idks), RECORD_CHUNK):
            j = i + RECORD_CHUNK
            prev, seqs = ray.get(self.ledger.commit.remote(idks[i:j], fps[i:j], metas[i:j]))
            batches.append((prev, seqs, fps[i:j], None if owners is None else owners[:, i:j]))
        if batches:
            self._apply(batches)

    def add(self, id, fingerprint, meta=None):
        self.add_many([(id, fingerprint, meta)])

    def add_unique(self, id, fingerprint, meta=None, k=None):
        """As Index.add_unique: atomic, the ledger holds the records write lock meanwhile.

        Not retried if the ledger dies during the call (the outcome is then unknown and a
        StorageError says so); other calls are retried on the restarted actor.
        """
        self._check()
        k = self._k(k)
        idk, fp, mb = encode_id(id), check_fp(fingerprint), pack_meta(meta, id)
        try:
            added, hits = ray.get(self.ledger.add_unique.options(max_task_retries=0).remote(
                idk, fp, mb, k, self.shards))
        except ray.exceptions.RayActorError:
            raise StorageError(f"the records server of {self.path} died during add_unique({id!r}); "
                               f"whether it was stored is unknown: query to find out") from None
        if added is not None:
            prev, seqs = added
            self._apply([(prev, seqs, np.array([fp], dtype=np.uint64), None)])
        return [_match(h) for h in hits]

    def remove(self, id):
        self._check()
        return ray.get(self.ledger.remove.remote(encode_id(id)))

    # ------------------------------------------------------------ reads
    def query_many(self, fingerprints, k=None):
        """As Index.query_many: shards scan their parts at once, then the ledger resolves."""
        self._check()
        k = self._k(k)
        q = fp_array(fingerprints)
        if not len(q):
            return []
        # every shard snapshot is taken before the ledger's records snapshot (see resolve)
        qidx, seqs, dists, applied = route.scan(ray, self.plan, self.shards, q, k)
        hits = ray.get(self.ledger.resolve.remote(q, qidx, seqs, dists, applied, k))
        return [[_match(h) for h in hs] for hs in hits]

    def query(self, fingerprint, k=None):
        return self.query_many(np.array([check_fp(fingerprint)], dtype=np.uint64), k)[0]

    def get(self, id):
        self._check()
        value = ray.get(self.ledger.get.remote(encode_id(id)))
        if value is None:
            return None
        fp, idk, mb = _core.split_record(value)
        return Record(decode_id(idk), fp, unpack(mb, "meta value"))

    def __contains__(self, id):
        return self.get(id) is not None

    def __len__(self):
        self._check()
        return ray.get(self.ledger.count.remote())

    def pids(self):
        """{"records": pid, shard: pid, ...} of the actor processes (for operations and tests)."""
        self._check()
        out = {"records": ray.get(self.ledger.pid.remote())}
        out.update(enumerate(ray.get([s.pid.remote() for s in self.shards])))
        return out
