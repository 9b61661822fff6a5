"""Flower settings for gpulanes (read by ``celery -A tasks flower`` from this folder).

Flower never starts open: give it basic auth (``FLOWER_BASIC_AUTH=user:password``
or ``--basic-auth=...``) or OAuth (``FLOWER_AUTH`` with ``FLOWER_OAUTH2_KEY``,
``FLOWER_OAUTH2_SECRET``, ``FLOWER_OAUTH2_REDIRECT_URI``; see Flower's docs), in any
argv form (``tasks.flower_login``).
"""
import os
import sys

from tasks.flower_login import login_problem as _login_problem

_problem = _login_problem(sys.argv, os.environ)
if _problem:
    raise SystemExit(f"gpulanes: Flower will not start without authentication: {_problem}")

# Purge workers that have been gone for a minute from the dashboard.
purge_offline_workers = 60


def _declare_lanes_for_broker_page() -> None:
    """Hand Flower the lanes as kombu queues.

    The broker page lists the queues of the workers Flower inspected; it inspects
    once at start, so a Flower started before its workers (``docker compose up``)
    falls back to ``conf.task_queues`` and reads ``.name`` from each entry. The
    lanes are declared there as a dict (``celeryconfig``), whose keys are strings:
    the page then shows no queue at all. The same queues as ``Queue`` objects fix it.
    """
    from tasks import app

    app.conf.task_queues = list(app.amqp.queues.values())


_declare_lanes_for_broker_page()


def _bare_broker_url_for_broker_page() -> None:
    """Flower's broker page picks its Redis reader by the broker URL's scheme; hand it the
    Redis URL behind the ``gpulanes+`` that names gpulanes' transport (the lists are
    named as kombu names them, so Flower reads their lengths as it would)."""
    from flower.app import Flower

    from tasks.broker.store import bare

    named = Flower.broker_uri_with_password
    Flower.broker_uri_with_password = property(lambda self: bare(named.func(self)))


_bare_broker_url_for_broker_page()
