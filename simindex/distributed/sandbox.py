"""A loopback-only network namespace for local Ray runs (tests, benchmarks, rehearsals).

Ray binds the machine's external address even when told 127.0.0.1. A process moved into a
new network namespace with only `lo` up has no other address, so nothing it or its child
processes (the local Ray it starts) send can leave 127.0.0.0/8. Needs root (CAP_SYS_ADMIN).
"""

import ctypes
import os
import subprocess

CLONE_NEWNET = 0x40000000


def loopback_only():
    """Move this process into a new network namespace with only `lo` up.

    Returns None on success, or the reason it could not (the process is then unchanged).
    Call it before starting Ray, from the thread that starts it.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        return f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())} (needs root)"
    try:
        up = subprocess.run(["ip", "link", "set", "lo", "up"], capture_output=True, text=True,
                            check=False)
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True,
                               check=False).stdout
    except FileNotFoundError:
        return "the `ip` command (iproute2) is not installed"
    if up.returncode:
        return f"ip link set lo up failed: {up.stderr.strip()}"
    names = [line.split(":")[1].strip() for line in links.splitlines()]
    if names != ["lo"]:
        return f"the new namespace has links {names}, not just lo"
    return None
