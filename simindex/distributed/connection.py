"""This process's use of Ray: connect() joins a cluster or starts a local one, release()
ends a use, and the last use of a Ray this process started shuts it down."""

from __future__ import annotations

import logging
import threading
from typing import Optional

import ray

_ray_lock = threading.Lock()
_ray_users = 0          # Clusters and calls using a Ray that this process started


def connect(address: Optional[str] = None) -> bool:
    """Join the Ray cluster at `address`, or start a local one; True if this process started
    it (then release() shuts it down when its last user is done). ConnectionError when Ray
    does not start or cannot be joined (whatever Ray raised)."""
    global _ray_users
    with _ray_lock:
        if ray.is_initialized():
            if _ray_users:
                _ray_users += 1
                return True
            return False
        try:
            if address in (None, "local"):
                ray.init(include_dashboard=False, logging_level=logging.WARNING)
            else:
                ray.init(address=address, logging_level=logging.WARNING)
        except Exception as e:             # noqa: BLE001 - Ray raises plain Exceptions too
            if ray.is_initialized():
                ray.shutdown()
            raise ConnectionError(f"{type(e).__name__}: {e}") from e
        _ray_users = 1
        return True


def release(started: bool) -> None:
    """The end of a use that connect() reported as started here."""
    global _ray_users
    if not started:
        return
    with _ray_lock:
        _ray_users -= 1
        if _ray_users == 0 and ray.is_initialized():
            ray.shutdown()
