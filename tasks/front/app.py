"""The ASGI app: ``create_app()`` (uvicorn's ``--factory``), its routes, errors and the
limit on a request's body."""
from __future__ import annotations

import gc
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tasks.front import account, catalog, errors, events, hub, page, predictions, signing
from tasks.front.auth import close_key_cache, key_cache
from tasks.settings import settings

#: JSON may spell each byte of an input as ``\\uXXXX``: a body may be this many times
#: the inputs' limit (GPULANES_MAX_INPUT_BYTES), plus room for the rest of the request.
BODY_PER_INPUT_BYTE, BODY_SLACK_BYTES = 6, 16 * 1024


def max_body_bytes() -> int:
    """The largest request body read; a larger one is refused (413) unread."""
    return BODY_PER_INPUT_BYTE * settings.max_input_bytes + BODY_SLACK_BYTES


class BodyLimit:
    """Refuse a request whose body is over ``max_bytes`` (413), by its
    ``Content-Length`` before any of it is read, else as its chunks arrive."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            return await self._too_large(scope, receive, send)
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise errors.Refused(413, self._detail())
            return message

        await self.app(scope, counted, send)

    def _detail(self) -> str:
        return (f"the request body is over {self.max_bytes} bytes (from "
                "GPULANES_MAX_INPUT_BYTES)")

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        await errors.answer(413, self._detail())(scope, receive, send)


#: The API process's garbage collector: a young collection after this many new objects
#: (Python's default, 700, collects every few requests), and the older generations as
#: rarely. Each collection walks every object of its generation: a thousand open event
#: streams made a submit cost 12 % more CPU with the default, 4 % with these.
GC_THRESHOLDS = (20_000, 20, 100)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Listen for revocations before the first request (while not listening, the key
    cache keeps nothing: every lookup reads Redis); collect garbage less often
    (:data:`GC_THRESHOLDS`), the objects of start-up set aside for good."""
    gc.set_threshold(*GC_THRESHOLDS)
    gc.freeze()
    cache = await run_in_threadpool(key_cache)
    await run_in_threadpool(cache.listening.wait, settings.redis_timeout_s)
    yield
    hub.close_hubs()
    close_key_cache()


def create_app() -> FastAPI:
    """The HTTP API (docs at ``/docs``, its OpenAPI document at ``/openapi.json``)."""
    app = FastAPI(title="gpulanes", version="1",
                  description="Predictions on tiered GPU lanes. Every call but these docs "
                              "needs `Authorization: Bearer <key>`.",
                  docs_url="/docs", redoc_url=None, lifespan=lifespan)
    errors.install(app)
    app.include_router(predictions.router)
    app.include_router(events.router)
    app.include_router(signing.router)
    app.include_router(catalog.router)
    app.include_router(page.router)
    app.include_router(account.router)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes())
    return app
