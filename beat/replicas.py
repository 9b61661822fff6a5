"""Keep a minimum of warm replicas per model (``GPULANES_MIN_REPLICAS``)."""
from __future__ import annotations

import logging
from typing import Any, Mapping

from routing.names import PREWARM_COMMAND
from routing.placement import prewarm_targets

log = logging.getLogger(__name__)


def prewarm(app: Any, model: str, hosts: list[str], reply: bool = False) -> list[dict]:
    """Ask ``hosts`` to load ``model`` in the background."""
    return app.control.broadcast(PREWARM_COMMAND, arguments={"model": model},
                                 destination=hosts, reply=reply, timeout=1.0) or []


def keep_replicas(app: Any, workers: Mapping[str, dict], minimum: Mapping[str, int]) -> int:
    """Prewarm every model below its minimum on the least busy workers; returns how many."""
    asked = 0
    for model, replicas in minimum.items():
        hosts = prewarm_targets(workers, model, replicas)
        if hosts:
            log.info("keeping %d warm replica(s) of %s: prewarming on %s", replicas, model, hosts)
            prewarm(app, model, hosts)
            asked += len(hosts)
    return asked
