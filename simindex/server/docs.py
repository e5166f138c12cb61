"""The page at /docs to try the API: Swagger UI, its files served from the swagger-ui-py
package (no CDN: the server may run where nothing outside is reachable), reading the
server's /openapi.json."""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from typing import Optional

# the package's files the page loads, and their types
FILES = {"swagger-ui-bundle.js": b"text/javascript; charset=utf-8",
         "swagger-ui.css": b"text/css; charset=utf-8",
         "favicon-32x32.png": b"image/png"}

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>simindex API</title>
<link rel="icon" href="/docs/favicon-32x32.png">
<link rel="stylesheet" href="/docs/swagger-ui.css">
</head>
<body>
<p style="font-family: sans-serif; margin: 1em 2em"><a href="/">Search page</a></p>
<div id="ui"></div>
<script src="/docs/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({url: "/openapi.json", dom_id: "#ui", deepLinking: true,
                            tryItOutEnabled: true});
</script>
</body>
</html>
"""

MISSING = "the API page needs the swagger-ui-py package: pip install 'simindex[server]'"


def _folder() -> Optional[str]:
    """The package's folder of static files, found without importing it (its import pulls
    in template engines the page does not need), or None when it is not installed."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = os.path.join(list(spec.submodule_search_locations)[0], "static")
    return folder if os.path.isdir(folder) else None


def available() -> bool:
    """Whether the page's files are installed."""
    return _folder() is not None


def file(name: str) -> Optional[tuple]:
    """(bytes, content type) of one of the page's files, or None (not one of them, or the
    package is missing)."""
    return _read(name) if name in FILES else None


@lru_cache(maxsize=len(FILES))
def _read(name: str) -> Optional[tuple]:
    folder = _folder()
    if folder is None:
        return None
    try:
        with open(os.path.join(folder, name), "rb") as f:
            return f.read(), FILES[name]
    except OSError:
        return None
