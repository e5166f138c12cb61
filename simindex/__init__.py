"""simindex: a persistent, sharded, exact near-duplicate index for simhash fingerprints of
64, 128 or 256 bits (and MinHash band codes of 512 to 1024 bits).

Block-permutation tables (Manku, Jain, Das Sarma, WWW 2007) stored in LMDB, scanned by a
compiled core. Every stored fingerprint within k bits of a query is returned, nothing else.
"""

from .engine._layout import FORMAT_VERSION
from ._version import __version__
from .errors import (
    BadLine, ClosedError, CorruptError, DiskFullError, Error, FormatError, IdExistsError,
    InputError, InputTypeError, MapFullError, MissingIndexError, NotAnIndexError, ParameterError,
    ParameterTypeError, ReadOnlyError, RecordsLostError, StorageError,
)
from .signatures.fingerprints import (
    HASHES, WIDTHS, Scheme, compute, fingerprint, schemes, shingles, simhash, tokenize,
)
from .radius import Calibration, calibrate
from .repair import repair
from .textcheck import TextCheck
from .datasets.frames import dedup
from .datasets.run import Decision, decisions
from .index import Index, hamming
from .engine.pairs import find_all
from .engine.results import Match, Record, TextMatch
from .signatures.vectors import (
    Hyperplanes, cosine_for_radius, match_probability, radius_for_cosine, simhash_rows,
)

__all__ = [
    "Decision", "decisions", "dedup", "calibrate", "Calibration", "TextCheck",
    "Index", "Match", "Record", "TextMatch", "find_all", "hamming", "repair", "__version__",
    "FORMAT_VERSION",
    "simhash", "compute", "shingles", "tokenize", "fingerprint", "schemes", "Scheme",
    "HASHES", "WIDTHS", "Hyperplanes", "simhash_rows", "radius_for_cosine",
    "cosine_for_radius", "match_probability",
    "Error", "ParameterError", "ParameterTypeError", "InputError", "InputTypeError",
    "IdExistsError", "BadLine", "ClosedError", "ReadOnlyError", "StorageError", "DiskFullError",
    "MapFullError", "CorruptError", "RecordsLostError", "FormatError", "MissingIndexError", "NotAnIndexError",
]
