"""The names of the fingerprint schemes, and the older names an index may record for them.
The engine reads names from manifests and the signatures define the schemes under them;
both take the names from here, so a name means one scheme in every layer."""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any, Optional

NAMES = ("simindex-v1", "minhash-v1", "pypi-simhash", "seomoz-simhash", "md5-128-notebook")
# MinHash LSH band keys, one scheme per bands and rows per band: 8 bands of 1 to 32 rows
# ("minhash-lsh-v1-r1" ... "-r32", 256-bit codes), and 16, 24 or 32 bands ("-b16-r1" ...
# "-b16-r16", "-b24-r1" ... "-b24-r10", "-b32-r1" ... "-b32-r8": 512, 768 and 1024 bits);
# a band's key is 32 bits, and a code's bins (bands x rows, to a power of two) at most 256
LSH_PREFIX = "minhash-lsh-v1-"
LSH_ROWS = MappingProxyType({8: range(1, 33), 16: range(1, 17), 24: range(1, 11),
                             32: range(1, 9)})                        # rows, by bands
_LSH_NAME = re.compile(r"minhash-lsh-v1-(?:b(16|24|32)-)?r([1-9][0-9]*)", re.ASCII)
# older names, kept so that indexes recording them open: each is another name of a scheme
ALIASES = MappingProxyType({"1e0ng": "pypi-simhash", "seomoz": "seomoz-simhash",
                            "memosstilvi": "md5-128-notebook"})


def known(name: Any) -> Optional[str]:
    """The name of the scheme `name` names (itself or an alias), or None for anything else."""
    if not isinstance(name, str):
        return None
    name = ALIASES.get(name, name)
    return name if name in NAMES or lsh_rows(name) is not None else None


def lsh_shape(name: Any) -> Optional[tuple[int, int]]:
    """(bands, rows per band) of a minhash-lsh-v1 scheme's name, or None for any other."""
    m = _LSH_NAME.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        return None
    bands, rows = int(m.group(1) or 8), int(m.group(2))
    return (bands, rows) if bands in LSH_ROWS and rows in LSH_ROWS[bands] else None


def lsh_rows(name: Any) -> Optional[int]:
    """The rows per band of a minhash-lsh-v1 scheme's name, or None for any other name."""
    shape = lsh_shape(name)
    return None if shape is None else shape[1]


def lsh_bands(name: Any) -> Optional[int]:
    """The bands of a minhash-lsh-v1 scheme's name, or None for any other name."""
    shape = lsh_shape(name)
    return None if shape is None else shape[0]


def lsh_name(rows: int, bands: int = 8) -> str:
    """The name of the minhash-lsh-v1 scheme of `bands` bands of `rows` rows."""
    return f"{LSH_PREFIX}r{rows}" if bands == 8 else f"{LSH_PREFIX}b{bands}-r{rows}"


def aliases_of(name: str) -> tuple[str, ...]:
    """The older names of the scheme `name`."""
    return tuple(a for a, n in ALIASES.items() if n == name)
