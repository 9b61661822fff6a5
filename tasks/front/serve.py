"""Serve the HTTP API with uvicorn: ``celery -A tasks lanes api`` or
``python -m tasks.front.serve``, in ``workers`` processes on one port.

Each process keeps its own key cache and listens for revocations itself, so a revoked
key is refused by all of them at once. Redis away at start is no reason not to serve:
requests are answered 503 until it is back. A line per request (uvicorn's access log)
is written only when asked (``--access-log``): it costs every request a formatted write.
"""
from __future__ import annotations

import argparse
import logging

log = logging.getLogger(__name__)
#: The app factory uvicorn imports in each of its processes.
APP = "tasks.front.app:create_app"
#: Seconds a stopping process gives requests in flight (a ``Prefer: wait`` among them).
GRACEFUL_S = 30


def silent_redis() -> list[str]:
    """The Redis that do not answer now: with cells, the names of theirs; with one Redis,
    ``[""]`` if it does not."""
    from tasks.broker.cells import each
    from tasks.broker.outage import OUTAGE

    silent = []
    for name, _, client in each():
        try:
            client.ping()
        except OUTAGE:
            silent.append(name or "")
    return silent


def serve(host: str = "127.0.0.1", port: int = 8000, workers: int = 1,
          access_log: bool = False) -> None:
    """Serve until SIGINT or SIGTERM (requests in flight are finished first);
    ``access_log``: log a line per request."""
    import uvicorn

    if silent := silent_redis():
        cells = f" (cells {', '.join(silent)})" if any(silent) else ""
        log.warning("Redis does not answer%s: requests that need it are answered 503 until "
                    "it does", cells)
    uvicorn.run(APP, factory=True, host=host, port=port, workers=workers,
                timeout_graceful_shutdown=GRACEFUL_S, log_level="info", access_log=access_log)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tasks.front.serve",
                                     description="Serve gpulanes' HTTP API.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--access-log", action="store_true", help="log a line per request")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    serve(args.host, args.port, args.workers, args.access_log)


if __name__ == "__main__":
    main()
