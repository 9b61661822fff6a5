"""``submit()``: validate, route, enqueue. No network round trip but the publish."""
from __future__ import annotations

import time
import uuid

from celery.result import AsyncResult

from routing.lanes import route
from tasks.generate import generate
from tasks.schema import validate


def submit(prompt: str, *, tier: str = "standard", account: str = "anonymous",
           model: str = "demo", seed: int | None = None, steps: int = 20,
           width: int = 256, height: int = 256) -> AsyncResult:
    """Enqueue one image job and return its ``AsyncResult``.

    ``.get()`` returns a dict with ``image`` (PNG path), ``lane`` (where it
    ran), ``requested_tier``, ``worker``, ``device``, ``queued_ms``,
    ``run_ms``, ``attempts``, ``cached`` and the job's parameters; when the
    job was moved down, also ``downgraded_from`` and ``downgrade_reason``.
    Without a ``seed`` one is drawn here, so the result can be reproduced.

    Raises :class:`tasks.errors.InvalidJob` naming the bad field before
    anything is enqueued.
    """
    job = validate(prompt, tier=tier, account=account, model=model, seed=seed,
                   steps=steps, width=width, height=height)
    where = route(job.tier)
    return generate.apply_async(
        kwargs={"job": job.as_dict(), "route": where.as_dict(),
                "submitted_at": time.time()},
        queue=where.lane,
        task_id=str(uuid.uuid4()),
    )
