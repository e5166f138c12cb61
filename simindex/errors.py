"""The one exception hierarchy of simindex, rooted at :class:`Error`.

Each class also inherits the builtin a caller would naturally catch (``ValueError`` for bad
parameters and input, ``TypeError`` for wrong types, ``OSError`` for storage), so code that
does not know simindex still handles its errors.
"""

from __future__ import annotations

from typing import Optional


class Error(Exception):
    """Base class of every error simindex raises on purpose."""


class ParameterError(Error, ValueError):
    """An index parameter (k, blocks, shards, ...) breaks a rule, or differs from the stored one."""


class ParameterTypeError(ParameterError, TypeError):
    """An index parameter or flag has the wrong type (k="3", sync="yes")."""


class InputError(Error, ValueError):
    """A fingerprint, id or meta value given by the caller is out of range or malformed."""


class InputTypeError(InputError, TypeError):
    """A fingerprint, id or meta value has a type simindex does not accept."""


class IdExistsError(InputError):
    """An id already names a stored record (or is given twice) where a call must not
    replace one: `add_unique`, `add_unique_text`, `add_many(replace=False)`, dedup's kept
    rows. `id` is the id."""

    def __init__(self, message: str, id: object = None) -> None:
        super().__init__(message)
        self.id = id

    def __reduce__(self):            # picklable: it crosses processes (Ray tasks)
        return type(self), (str(self), self.id)


class BadLine(InputError):
    """One input line (of `simindex build`, `query` or a Ray build) broke a rule.

    `where` is "file:line" (or the file alone when it cannot be read), `reason` the rule.
    """

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason

    def __reduce__(self):            # picklable: it crosses processes (Ray tasks)
        return type(self), (self.where, self.reason)


class ClosedError(Error, ValueError):
    """The index (or a handle on it) was used after close(), or in a child after fork()."""


def closed_error(what: str, opened_in: Optional[int] = None) -> ClosedError:
    """The ClosedError of a handle on `what` ("index /path") used after close(), or, with
    `opened_in` (the pid that opened it), in a child after fork()."""
    if opened_in is None:
        return ClosedError(f"{what} is closed")
    return ClosedError(f"{what} was opened in process {opened_in} and cannot be used after "
                       f"fork(); open the index again in this process")


class ReadOnlyError(Error, PermissionError):
    """A write was attempted through an index opened with readonly=True."""


class StorageError(Error, OSError):
    """The storage layer (LMDB or the file system) reported an error.

    `errno` is the operating system's error number when it reported one (EIO, ENOSPC...);
    `code` the return code behind the error: LMDB's (negative, MDB_MAP_FULL and the like),
    the errno, or the core's own for damage it found; None when there is neither.
    """

    def __init__(self, *args: object, code: Optional[int] = None) -> None:
        super().__init__(*args)
        self.code = code if code is not None else self.errno


class MapFullError(StorageError):
    """An LMDB environment ran out of map space (simindex grows it by itself and retries)."""


class DiskFullError(StorageError):
    """A write ran out of space: the file system is full, or a quota or file size limit was hit."""


class MapResizedError(StorageError):
    """Another process grew an environment's map; simindex adopts the new size and retries."""


class CorruptError(StorageError):
    """A file of the index is damaged, truncated, missing, or not a simindex index at all."""


class RecordsLostError(CorruptError):
    """A records environment holds fewer records than the index's tables say were committed
    (emptied, replaced, or restored from an older copy): refused rather than answered
    without them."""


class FormatError(CorruptError):
    """The manifest names an on-disk format or a value this version cannot read."""


class MissingIndexError(Error, FileNotFoundError):
    """No index exists at the path, and create=False (or readonly=True) forbids making one."""


class NotAnIndexError(CorruptError):
    """The path holds something that is not a simindex index (a file, another directory)."""
