"""The Celery router (``task_routes``) for callers that bypass ``submit()``."""
from __future__ import annotations

from typing import Any

from routing.lanes import lane_for
from routing.names import JOB_TASK_NAMES, STANDARD


def route_task(name: str, args: Any, kwargs: dict | None, options: dict,
               task: Any = None, **_: Any) -> dict[str, str] | None:
    """Send a job (under the task's name or an earlier one) to the lane of its tier;
    leave others alone."""
    if name not in JOB_TASK_NAMES or options.get("queue"):
        return None
    tier = ((kwargs or {}).get("job") or {}).get("tier", STANDARD)
    try:
        return {"queue": lane_for(tier)}
    except KeyError:
        return {"queue": STANDARD}
