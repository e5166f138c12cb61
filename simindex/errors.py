"""The one exception hierarchy of simindex, rooted at :class:`Error`.

Each class also inherits the builtin a caller would naturally catch (``ValueError`` for bad
parameters and input, ``TypeError`` for wrong types, ``OSError`` for storage), so code that
does not know simindex still handles its errors.
"""


class Error(Exception):
    """Base class of every error simindex raises on purpose."""


class ParameterError(Error, ValueError):
    """An index parameter (k, blocks, shards, ...) breaks a rule, or differs from the stored one."""


class ParameterTypeError(ParameterError, TypeError):
    """An index parameter or flag has the wrong type (k="3", sync="yes")."""


class InputError(Error, ValueError):
    """A fingerprint, id or meta value given by the caller is out of range or malformed."""


class InputTypeError(Error, TypeError):
    """A fingerprint, id or meta value has a type simindex does not accept."""


class ClosedError(Error, ValueError):
    """The index (or a handle on it) was used after close(), or in a child after fork()."""


class ReadOnlyError(Error, PermissionError):
    """A write was attempted through an index opened with readonly=True."""


class StorageError(Error, OSError):
    """The storage layer (LMDB or the file system) reported an error."""


class MapFullError(StorageError):
    """An LMDB environment ran out of map space (simindex grows it by itself and retries)."""


class DiskFullError(StorageError):
    """A write ran out of space: the file system is full, or a quota or file size limit was hit."""


class MapResizedError(StorageError):
    """Another process grew an environment's map; simindex adopts the new size and retries."""


class CorruptError(StorageError):
    """A file of the index is damaged, truncated, missing, or not a simindex index at all."""


class FormatError(CorruptError):
    """The manifest names an on-disk format or a value this version cannot read."""


class MissingIndexError(Error, FileNotFoundError):
    """No index exists at the path, and create=False (or readonly=True) forbids making one."""


class NotAnIndexError(CorruptError):
    """The path holds something that is not a simindex index (a file, another directory)."""
