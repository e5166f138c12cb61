"""The web page at `/`: the index's figures and a box to find a text's or a fingerprint's
near-duplicates (static HTML; its script calls the JSON API)."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def page() -> str:
    return resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
