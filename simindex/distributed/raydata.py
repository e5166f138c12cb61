"""`simindex.distributed.dedup` of a Ray Dataset, the Ray Data way (read_parquet -> dedup ->
write_parquet): the dataset is written as Parquet part files into a scratch folder, in its
blocks' order, judged there by the run on files (datasets.py), and its kept rows come back
as a Ray Dataset (or stay written where `output` says)."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Optional

import ray
from ray.data.datasource import FilenameProvider

from ..errors import ParameterError
from .datasets import dedup as dedup_files


class _InOrder(FilenameProvider):
    """Part files named by their write task and block, so that name order is the
    dataset's block order (the order the run judges rows in)."""

    def get_filename_for_block(self, block: Any, write_uuid: str, task_index: int,
                               block_index: int) -> str:
        return f"part-{task_index:06d}-{block_index:06d}.parquet"


def dedup(data: Any, output: Optional[str] = None, *, scratch: Optional[str] = None,
          **options: Any) -> Any:
    """`simindex dedup` on Ray. Of files (a path or a list of paths), with `output` a
    directory: see simindex.distributed.datasets.dedup (the Summary is returned).

    Of a `ray.data.Dataset`: its rows in its blocks' order are judged with the options and
    rules of the files' run (`text_field`, `id_field`, `min_similarity`, `mode`, `keep`,
    `index`, `annotate`, `removed`, `clusters`, ...) and the kept rows come back as a Ray
    Dataset: read from `output` (a directory, where they are written as Parquet part files)
    or, without it, materialized in Ray's object store. Give `id_field`: without it a row is
    known by its place in the scratch part files, a name of no use after the call (and
    refused with `index=`). `scratch`: where the dataset is written to be judged, at the
    same path on every node (a shared filesystem; on a cluster of one node, by default the
    temporary directory). The rows are written in the dataset's order (Ray Data's
    preserve_order is set while they are)."""
    if not isinstance(data, ray.data.Dataset):
        if output is None:
            raise ParameterError("dedup of files needs output, the directory its kept rows "
                                 "are written to")
        if scratch is not None:
            raise ParameterError("scratch= is for a Ray Dataset's run")
        return dedup_files(data, output, **options)
    for name in ("fmt", "output_format"):
        if name in options:
            raise ParameterError(f"{name}= is not an option of a Ray Dataset's run: it is "
                                 f"written and read back as Parquet")
    if options.get("index") is not None and options.get("id_field") is None:
        raise ParameterError("with index=, give id_field: a row's place in the scratch "
                             "files is no id across calls")
    if scratch is None and len([n for n in ray.nodes() if n.get("Alive")]) > 1:
        raise ParameterError("on a cluster of several nodes, give scratch=, a folder at "
                             "the same path on every node (a shared filesystem): the "
                             "dataset is written there to be judged")
    folder = tempfile.mkdtemp(prefix="simindex-raydata-", dir=scratch)
    context = ray.data.DataContext.get_current()
    ordered = context.execution_options.preserve_order
    try:
        rows = os.path.join(folder, "rows")
        context.execution_options.preserve_order = True    # part names in the rows' order
        try:
            data.write_parquet(rows, filename_provider=_InOrder())
        finally:
            context.execution_options.preserve_order = ordered
        if not os.path.isdir(rows) or not os.listdir(rows):      # no rows: nothing kept
            return data.limit(0).materialize()
        out = output if output is not None else os.path.join(folder, "kept")
        dedup_files(rows, out, output_format="parquet", **options)
        parts = sorted(os.listdir(out)) if os.path.isdir(out) else []
        if not parts:
            return data.limit(0).materialize()
        kept = ray.data.read_parquet([os.path.join(out, p) for p in parts])
        return kept if output is not None else kept.materialize()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
