"""The names of the fingerprint schemes, and the older names an index may record for them.
The engine reads names from manifests and the signatures define the schemes under them;
both take the names from here, so a name means one scheme in every layer."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Optional

NAMES = ("simindex-v1", "minhash-v1", "pypi-simhash", "seomoz-simhash", "md5-128-notebook")
# older names, kept so that indexes recording them open: each is another name of a scheme
ALIASES = MappingProxyType({"1e0ng": "pypi-simhash", "seomoz": "seomoz-simhash",
                            "memosstilvi": "md5-128-notebook"})


def known(name: Any) -> Optional[str]:
    """The name of the scheme `name` names (itself or an alias), or None for anything else."""
    if not isinstance(name, str):
        return None
    name = ALIASES.get(name, name)
    return name if name in NAMES else None


def aliases_of(name: str) -> tuple[str, ...]:
    """The older names of the scheme `name`."""
    return tuple(a for a, n in ALIASES.items() if n == name)
