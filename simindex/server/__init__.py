"""`simindex serve`: the index over HTTP (JSON), for crawlers in any language.

app.py holds the endpoints, bodies.py the checks of request bodies, openapi.py the API's
description, page.py the web page, run.py the start-up (uvicorn workers). Needs the
`simindex[server]` extra (Starlette, uvicorn).
"""
