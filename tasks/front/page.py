"""The web page: ``GET /`` and its script and style sheet, for a person who holds an API
key. The page itself needs no key; the person pastes theirs, and every call the page
makes to the API sends it (docs/web-page.md).

Every answer is sent under a strict Content-Security-Policy (no inline script, nothing
from elsewhere), ``nosniff`` and no referrer: a prompt or a key is never run as script
nor sent to another site.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response

from tasks.front.errors import Refused

router = APIRouter(include_in_schema=False)
#: Where the page's files are (package data).
STATIC_DIR = Path(__file__).resolve().parent / "static"
#: The files served under ``/static/``, by name, and their media types.
ASSETS = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
#: Only this origin's script, styles and calls; images also from ``blob:`` (the page
#: fetches each image with the key and shows it from memory).
CONTENT_SECURITY_POLICY = ("default-src 'self'; img-src 'self' blob:; object-src 'none'; "
                           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY,
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}


@lru_cache(maxsize=len(ASSETS) + 1)
def _read(name: str) -> bytes:
    return (STATIC_DIR / name).read_bytes()


def _sent(name: str, media_type: str) -> Response:
    return Response(_read(name), media_type=media_type, headers=HEADERS)


@router.get("/")
def page() -> Response:
    """The page (HTML)."""
    return _sent("index.html", "text/html; charset=utf-8")


@router.get("/static/{name}")
def asset(name: str) -> Response:
    """The page's script or style sheet; any other name is a 404."""
    if name not in ASSETS:
        raise Refused(404, f"the page has no file {name[:80]!r}", headers=HEADERS)
    return _sent(name, ASSETS[name])
