"""Deprecated: the Ray scale-out package is simindex.distributed (a folder named `dist` is
what packaging tools build into and ignore). This name re-exports it for old imports."""

import warnings

from .distributed import Cluster, build, clusters, pairs  # noqa: F401

warnings.warn("simindex.dist is renamed simindex.distributed; import that instead",
              DeprecationWarning, stacklevel=2)

__all__ = ["Cluster", "build", "clusters", "pairs"]
