"""The names of the fingerprint schemes, and the older names an index may record for them.
The engine reads names from manifests and the signatures define the schemes under them;
both take the names from here, so a name means one scheme in every layer."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Optional

NAMES = ("simindex-v1", "minhash-v1", "pypi-simhash", "seomoz-simhash", "md5-128-notebook")
# MinHash LSH band keys, one scheme per rows per band: "minhash-lsh-v1-r1" ... "-r32"
LSH_PREFIX = "minhash-lsh-v1-r"
LSH_ROWS = range(1, 33)
# older names, kept so that indexes recording them open: each is another name of a scheme
ALIASES = MappingProxyType({"1e0ng": "pypi-simhash", "seomoz": "seomoz-simhash",
                            "memosstilvi": "md5-128-notebook"})


def known(name: Any) -> Optional[str]:
    """The name of the scheme `name` names (itself or an alias), or None for anything else."""
    if not isinstance(name, str):
        return None
    name = ALIASES.get(name, name)
    return name if name in NAMES or lsh_rows(name) is not None else None


def lsh_rows(name: Any) -> Optional[int]:
    """The rows per band of a minhash-lsh-v1 scheme's name, or None for any other name."""
    if not isinstance(name, str) or not name.startswith(LSH_PREFIX):
        return None
    digits = name[len(LSH_PREFIX):]
    if not (digits.isascii() and digits.isdigit()) or digits != str(int(digits)) or int(digits) not in LSH_ROWS:
        return None
    return int(digits)


def lsh_name(rows: int) -> str:
    """The name of the minhash-lsh-v1 scheme of `rows` rows per band."""
    return f"{LSH_PREFIX}{rows}"


def aliases_of(name: str) -> tuple[str, ...]:
    """The older names of the scheme `name`."""
    return tuple(a for a, n in ALIASES.items() if n == name)
