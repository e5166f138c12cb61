"""simindex on Ray: shards served by actors, distributed builds, batch near-duplicate joins
and dataset dedup.

Installed with `pip install "simindex[ray]"`. The core package never imports Ray; this
package does, and raises a clear ImportError when it is missing.
"""

try:
    import ray  # noqa: F401
except ImportError as e:                     # pragma: no cover - depends on the install
    raise ImportError("simindex.distributed needs Ray: pip install 'simindex[ray]'") from e

from .batch import clusters, pairs
from .build import build
from .cluster import Cluster
from .raydata import dedup

__all__ = ["Cluster", "build", "clusters", "dedup", "pairs"]
