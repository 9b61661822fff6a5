"""``celery -A tasks lanes api``: serve the HTTP API (``tasks.front``);
``celery -A tasks lanes webhooks``: send its webhooks.

Registered on the ``lanes`` group by ``tasks.ops.cli``; uvicorn and the app load only
when the command runs.
"""
from __future__ import annotations

import click

from tasks.ops.group import lanes


@lanes.command("api")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 in a container).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Server processes sharing the port.")
@click.option("--access-log/--no-access-log", default=False, show_default=True,
              help="Log a line per request.")
def api(host: str, port: int, workers: int, access_log: bool) -> None:
    """Serve the HTTP API (http://HOST:PORT/v1/predictions, its docs at /docs) until
    Ctrl-C. Callers send `Authorization: Bearer <key>` (`lanes keys create`)."""
    from tasks.front.serve import serve

    serve(host, port, workers, access_log)


@lanes.command("webhooks")
def webhooks() -> None:
    """Send the predictions' webhooks (signed, retried with backoff) until Ctrl-C. Run
    one or more beside the API: a delivery a stopped sender held is sent by another."""
    import logging

    from tasks.front.hooks import serve

    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve()
