"""The Celery router (``task_routes``) for callers that bypass ``submit()``."""
from __future__ import annotations

from typing import Any

from routing.lanes import lane_for
from routing.names import GENERATE_TASK, STANDARD


def route_task(name: str, args: Any, kwargs: dict | None, options: dict,
               task: Any = None, **_: Any) -> dict[str, str] | None:
    """Send ``gpulanes.generate`` to the lane of its tier; leave others alone."""
    if name != GENERATE_TASK or options.get("queue"):
        return None
    tier = ((kwargs or {}).get("job") or {}).get("tier", STANDARD)
    try:
        return {"queue": lane_for(tier)}
    except KeyError:
        return {"queue": STANDARD}
