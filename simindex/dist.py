"""Deprecated: the Ray scale-out package is simindex.distributed (a folder named `dist` is
what packaging tools build into and ignore). This name re-exports it, submodules included
(`simindex.dist.sandbox` is `simindex.distributed.sandbox`), for old imports."""

import importlib
import sys
import warnings

from .distributed import Cluster, build, clusters, pairs  # noqa: F401

warnings.warn("simindex.dist is renamed simindex.distributed; import that instead",
              DeprecationWarning, stacklevel=2)

for _name in ("batch", "build", "cluster", "parts", "route", "sandbox", "servers"):
    _module = importlib.import_module(f"simindex.distributed.{_name}")
    sys.modules[f"{__name__}.{_name}"] = _module
    globals().setdefault(_name, _module)

__all__ = ["Cluster", "build", "clusters", "pairs"]
