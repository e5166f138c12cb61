"""Where a dedup run's outputs wait and how they appear: temporary files and folders that
carry a lock while their run lives (so a later run can tell a killed run's leftovers from
a live run's, and remove them), and the publication of every output of a run as one:
all of them appear at their paths, or none does and each path keeps what it held."""

from __future__ import annotations

import ctypes
import fcntl
import glob
import os
import shutil
import tempfile
import uuid
from typing import Optional

from ..errors import ParameterError

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
LOCK = ".simindex-run.lock"        # inside a run's temporary folder, locked while it lives


def distinct(paths: dict) -> None:
    """Refuse two outputs given one path ({option name: path or None}): the second would
    replace the first."""
    seen: dict = {}
    for what, path in paths.items():
        if path is None:
            continue
        real = os.path.realpath(path)
        if real in seen:
            raise ParameterError(f"{what} and {seen[real]} name the same path {path}: each "
                                 f"output needs its own")
        seen[real] = what


def file_mode(path: str) -> int:
    """The mode a new file at `path` gets: an existing file's own mode (it is replaced,
    not changed), else what the umask leaves of 0o666."""
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)           # no /proc: read it by setting it back at once
    os.umask(old)
    return old


def temporary_file(path: str) -> tuple:
    """(fd, name) of a new file beside `path` (".NAME.XXXXXXXX.tmp"), with the mode
    `path` will have, locked while a descriptor of it (this fd, or a dup of it) stays
    open: hold one until the file is published or removed. Stale ones of killed runs
    (unlocked) are removed first."""
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    if not os.path.isdir(directory):
        raise ParameterError(f"cannot write {path}: the folder {directory} does not exist")
    # mkstemp's names: the prefix, 8 random characters, the suffix
    for old in glob.glob(os.path.join(glob.escape(directory),
                                      f".{glob.escape(base)}.{'?' * 8}.tmp")):
        _remove_if_stale(old)
    while True:
        fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=directory)
        try:
            if _locked(fd):
                os.fchmod(fd, file_mode(path))
                return fd, tmp
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)                # another run took it for stale before the lock: again


def _locked(fd: int) -> bool:
    """Lock a new temporary (or a folder's new lock file): False when another run found
    it unlocked first and took it for a killed run's (it then holds it, or removed it)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return os.fstat(fd).st_nlink > 0


def temporary_dir(parent: str, prefix: str) -> tuple:
    """(path, lock fd) of a new folder `prefix` + a unique part in `parent`, holding a lock
    file this process keeps locked (close the fd when done); stale folders of the same
    prefix left by killed runs are removed first."""
    for old in glob.glob(os.path.join(glob.escape(parent), glob.escape(prefix) + "*")):
        if os.path.isdir(old) and not os.path.islink(old):
            _remove_if_stale(old)
    while True:
        path = os.path.join(parent, prefix + uuid.uuid4().hex[:12])
        os.mkdir(path)
        try:
            fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                         0o600)
        except FileNotFoundError:
            continue                # removed as stale before its lock file was made
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        if _locked(fd):
            return path, fd
        os.close(fd)                # taken for a killed run's: a new one


def _remove_if_stale(path: str) -> None:
    """Remove a temporary file or folder whose lock no live process holds."""
    target = os.path.join(path, LOCK) if os.path.isdir(path) else path
    try:
        fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return                  # gone, or a folder without a lock: not one of ours
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return              # a live run holds it
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
    finally:
        os.close(fd)


def publish(moves: list) -> None:
    """Put each finished temporary of `moves` [(temporary, path)] at its path, as one: a
    file replaces an existing one (the old one kept under a link until every move is
    made), a folder is swapped with an existing one (renameat2 RENAME_EXCHANGE). When a
    move fails, the moves made are taken back (each path holds what it held before, each
    temporary is where it was) and the error is raised; so does a failed sync of their
    folders. What was moved out is removed once all are in place and synced."""
    done: list = []                  # (temporary, path, backup or None)
    try:
        for tmp, path in moves:
            done.append(_move(tmp, path))
        for d in {os.path.dirname(os.path.abspath(p)) for _, p in moves}:
            _sync_dir(d)             # the new names on disk before the old go
    except BaseException:
        for tmp, path, backup in reversed(done):
            _undo(tmp, path, backup)
        raise
    for tmp, path, backup in done:
        if backup is None:
            continue
        if os.path.isdir(tmp) and backup == tmp:
            shutil.rmtree(tmp, ignore_errors=True)        # the folder swapped out
        else:
            try:
                os.unlink(backup)
            except OSError:
                pass


def _move(tmp: str, path: str) -> tuple:
    if os.path.isdir(tmp):
        if os.path.lexists(path):
            _exchange(tmp, path)
            return tmp, path, tmp           # the old folder now sits at tmp
        os.rename(tmp, path)
        return tmp, path, None
    backup = None
    if os.path.lexists(path) and not os.path.isdir(path):
        backup = f"{path}.{uuid.uuid4().hex[:8]}.old"
        os.link(path, backup)
    try:
        os.replace(tmp, path)
    except BaseException:
        if backup is not None:
            os.unlink(backup)
        raise
    return tmp, path, backup


def _undo(tmp: str, path: str, backup: Optional[str]) -> None:
    """Take back one move of publish()."""
    if backup is not None and backup == tmp and os.path.isdir(tmp):
        _exchange(tmp, path)               # the new folder back at tmp, the old at path
    elif backup is not None:
        os.replace(backup, path)           # the old file back (the new one is dropped)
    else:
        os.rename(path, tmp)               # back at its temporary name


def _exchange(a: str, b: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b),
                      _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot replace {b}: {os.strerror(err)}")


def _sync_dir(d: str) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
