"""The files `simindex dedup` writes: the kept rows (or every row, annotated), the removed
rows' report and the clusters report, all committed together when the run completes."""

from __future__ import annotations

import pickle
import os
from typing import Any, Optional

from .run import Decision
from ..errors import InputError
from ..scheme_names import lsh_bands
from .publish import distinct, publish, temporary_file
from .rows import RowWriter

# the columns --annotate appends to every row: what a removed row copies, at what distance,
# its group and the group's size, and (with a similarity threshold) the similarity to what
# it copies and how it was known ("exact" or "sketch"); empty for a kept row
ANNOTATIONS = ("simindex_duplicate_of", "simindex_distance", "simindex_cluster",
               "simindex_cluster_size", "simindex_similarity", "simindex_evidence")


def id_key(id_: Any) -> tuple:
    """An id as a dict key that keeps 1 and "1" apart."""
    return (type(id_).__name__, id_)


class GroupSizes:
    """The size of each group of a run's decisions: its removed rows and its head (the kept
    row or earlier record they are removed for), unless drop_all removed the head too."""

    def __init__(self) -> None:
        self.removed: dict = {}        # cluster key -> removed rows in it
        self.heads_removed: set = set()

    def add(self, d: Decision) -> None:
        if not d.kept:
            key = id_key(d.cluster)
            self.removed[key] = self.removed.get(key, 0) + 1
            if id_key(d.id) == key:
                self.heads_removed.add(key)

    def size(self, cluster: Any) -> int:
        key = id_key(cluster)
        return self.removed.get(key, 0) + (0 if key in self.heads_removed else 1)


def removed_line(id_: Any, where: str, match: Any, distance: Optional[int], reference: bool,
                 similarity: Optional[float], evidence: Optional[str],
                 radius: Optional[dict]) -> dict:
    """The --removed report's line of a removed row: what it copies and how it was judged,
    with the search the run's threshold chose (`radius`, the summary's) when it chose one."""
    out = {"id": id_, "where": where, "match": match, "distance": distance,
           "reference": reference, "similarity": similarity, "evidence": evidence}
    if radius is not None:
        out.update(scheme=radius["scheme"], width=radius["width"], k=radius["k"],
                   expected_recall=radius["expected_recall"])
        if radius.get("bands"):
            out.update(bands=lsh_bands(radius["scheme"]), rows_per_band=radius["bands"])
    return out


class DedupOutputs:
    """Where a run's decisions go. A group is its removed rows and its head (the kept row or
    earlier record they are removed for, unless drop_all removed the head too); its size
    counts both. Nothing is visible at the outputs' paths until commit()."""

    def __init__(self, output: str, fmt: str, removed: Optional[str] = None,
                 clusters: Optional[str] = None, annotate: bool = False,
                 summary: Any = None) -> None:
        distinct({"--output": output, "--removed": removed, "--clusters": clusters})
        self.writers: list = []
        self.summary = summary        # its radius goes into every removed row
        self.annotate = annotate
        self.out = self._writer(output, fmt)
        self.removed = self._writer(removed, "jsonl") if removed else None
        self.clusters = self._writer(clusters, "jsonl") if clusters else None
        self.groups = GroupSizes()
        self.members: list = []       # (id, cluster id) of the removed rows (for clusters)
        self.scratch = None           # annotated rows before their group sizes are known
        if annotate:
            fd, self.scratch_path = temporary_file(output + ".annotate")
            self.scratch = os.fdopen(fd, "w+b")   # pickled: rows keep their values' types

    def _writer(self, path: str, fmt: str) -> RowWriter:
        w = RowWriter(path, fmt)
        self.writers.append(w)
        return w

    def add(self, d: Decision) -> None:
        self.groups.add(d)
        if not d.kept:
            if self.clusters is not None:
                self.members.append((d.id, d.cluster))
            if self.removed is not None:
                self.removed.write(removed_line(
                    d.id, d.where, d.match, d.distance, d.reference, d.similarity,
                    d.evidence, getattr(self.summary, "radius", None)))
        if self.scratch is not None:
            clash = [c for c in ANNOTATIONS if c in d.row]
            if clash:
                raise InputError(f"{d.where}: the row already has the column {clash[0]!r} "
                                 f"that --annotate adds")
            pickle.dump((dict(d.row), d.match, d.distance, d.cluster, d.similarity,
                         d.evidence), self.scratch, protocol=pickle.HIGHEST_PROTOCOL)
        elif d.kept:
            self.out.write(d.row)

    def add_all(self, decisions: list) -> None:
        """add() of a batch of decisions: its kept rows written together."""
        if self.scratch is not None:
            for d in decisions:
                self.add(d)
            return
        kept = []
        for d in decisions:
            if d.kept:
                kept.append(d.row)
            else:
                self.add(d)             # to the reports only: never to the output
        self.out.write_many(kept)

    def commit(self) -> None:
        """Write what needs every decision (group sizes), then commit every file."""
        if self.scratch is not None:
            self.scratch.seek(0)
            while True:
                try:
                    row, match, distance, cluster, sim, how = pickle.load(self.scratch)
                except EOFError:
                    break
                row.update(zip(ANNOTATIONS, (match, distance, cluster, self.groups.size(cluster),
                                             sim, how)))
                self.out.write(row)
        if self.clusters is not None:
            heads: dict = {}
            for _id, cluster in self.members:
                heads.setdefault(id_key(cluster), cluster)
            for cluster in heads.values():
                self.clusters.write({"id": cluster, "cluster": cluster,
                                     "size": self.groups.size(cluster)})
            for id_, cluster in self.members:
                if id_key(id_) != id_key(cluster):
                    self.clusters.write({"id": id_, "cluster": cluster,
                                         "size": self.groups.size(cluster)})
        for w in self.writers:          # every file written and synced: then all appear
            w.finish()
        publish([(w.tmp, w.path) for w in self.writers])
        for w in self.writers:
            w.release()
        self.writers = []
        self._drop_scratch()

    def abort(self) -> None:
        """Leave every output path as it was."""
        for w in self.writers:
            w.abort()
        self.writers = []
        self._drop_scratch()

    def _drop_scratch(self) -> None:
        if self.scratch is not None:
            self.scratch.close()
            self.scratch = None
            try:
                os.unlink(self.scratch_path)
            except OSError:
                pass
