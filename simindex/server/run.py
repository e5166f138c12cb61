"""Starting `simindex serve`: checks, the workers' settings, and uvicorn's process manager.

uvicorn runs the workers (spawned processes, each opening the index once) and stops them on
SIGTERM or SIGINT: each stops accepting connections, finishes the requests in flight (up
to `GRACE` seconds), then closes its index.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
from typing import Any, Optional

from ..errors import MissingIndexError, ParameterError
from ..index import Index
from .app import Settings

GRACE = 30          # seconds a stopping worker waits for the requests in flight


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) only reaches this machine."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def serve(settings: Settings, *, host: str = "127.0.0.1", port: int = 8080,
          token_file: Optional[str] = None, insecure: bool = False,
          access_log: bool = False, log_level: str = "info") -> None:
    """Serve `settings.path` until SIGTERM or SIGINT (blocks)."""
    try:
        import uvicorn
    except ImportError as e:
        raise ParameterError(f"simindex serve needs the 'server' extra: pip install "
                             f"'simindex[server]' ({e})") from None
    if settings.token is None and not insecure and not is_loopback(host):
        raise ParameterError(
            f"--host {host} reaches other machines: give a bearer token (--token-file, or "
            f"the SIMINDEX_TOKEN environment variable), or --insecure to serve without one")
    # Open the index once here: a clear error before any worker starts, and a writable open
    # replays the logs of dead writers before the workers share it.
    try:
        with Index(settings.path, create=False, readonly=settings.readonly):
            pass
    except MissingIndexError:
        raise MissingIndexError(f"no simindex index at {settings.path}: make one first "
                                f"(simindex build, or simindex.Index in Python)") from None
    os.environ["SIMINDEX_SERVE"] = settings.to_env()
    if token_file is not None:
        os.environ["SIMINDEX_TOKEN_FILE"] = os.path.abspath(token_file)
    else:
        os.environ.pop("SIMINDEX_TOKEN_FILE", None)
    # With one worker uvicorn serves in this process and, after its clean stop, raises the
    # SIGTERM again; this handler turns that into exit status 0, as with several workers.
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        uvicorn.run("simindex.server.app:from_environment", factory=True, host=host,
                    port=port, workers=settings.workers if settings.workers > 1 else None,
                    access_log=access_log, log_level=log_level,
                    timeout_graceful_shutdown=GRACE, server_header=False,
                    proxy_headers=False)   # no endpoint reads the client's address
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stopped(signum: int, frame: Any) -> None:
    raise SystemExit(0)
