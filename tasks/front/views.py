"""A prediction as the API shows it: its record (``tasks.jobs.predictions``) and what its
job's result says now, in Replicate's words: ``starting`` (queued: its lane and place),
``processing`` (its progress), ``succeeded`` (its output, artifacts as API URLs),
``failed`` (its error) or ``canceled``.

Reading (:func:`seen`) is apart from showing (:func:`prediction_json`): the read
blocks on Redis and runs in a thread; the showing is pure.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from tasks.broker.keys import prediction_key, revoked_key
from tasks.front.errors import iso
from tasks.front.files import artifacts, shown
from tasks.jobs import predictions
from tasks.jobs.predictions import Prediction

#: Celery's states in Replicate's words (PENDING: ``starting``, or ``canceled``).
STATUSES = {"SUCCESS": "succeeded", "FAILURE": "failed", "REVOKED": "canceled",
            "STARTED": "processing", "PROGRESS": "processing", "RETRY": "processing"}
#: Statuses after which nothing changes.
FINAL = frozenset({"succeeded", "failed", "canceled"})
#: What ``progress`` shows of a running job's report.
PROGRESS_FIELDS = ("step", "steps", "eta_s", "lane")
#: What ``run`` shows of where and how a finished job ran.
RUN_FIELDS = ("lane", "requested_tier", "cached", "attempts", "downgraded_from",
              "downgrade_reason")
#: An image model's parameters, shown with its image.
IMAGE_FIELDS = ("seed", "steps", "width", "height")


@dataclass(frozen=True)
class Seen:
    """What one read found of a prediction's job: Celery's state and value, and while
    it waits, its place in its lane and whether it was cancelled."""

    state: str
    value: Any = None
    position: int | None = None
    revoked: bool = False


def seen(celery_app: Any, client: redis.Redis, prediction: Prediction,
         placed: bool = True) -> Seen:
    """Read the job of ``prediction`` (``placed``: also its place while queued)."""
    meta = celery_app.backend.get_task_meta(prediction.id)
    state = meta.get("status") or "PENDING"
    if state != "PENDING":
        return Seen(state, meta.get("result"))
    position = predictions.position(client, prediction) if placed else None
    return Seen(state, None, position, bool(client.exists(revoked_key(prediction.id))))


def seen_many(celery_app: Any, client: redis.Redis, made: list[Prediction]
              ) -> list[tuple[Prediction, Seen]]:
    """:func:`seen` of many predictions at once, where each waits read again (a parked
    job may have entered its lane since): three round trips for them all."""
    backend = celery_app.backend
    with backend.client.pipeline(transaction=False) as pipe:
        for prediction in made:
            pipe.get(backend.get_key_for_task(prediction.id))
        metas = pipe.execute()
    with client.pipeline(transaction=False) as pipe:
        for prediction in made:
            pipe.hmget(prediction_key(prediction.id), *predictions.WHERE_FIELDS)
            pipe.exists(revoked_key(prediction.id))
        read = pipe.execute()
    now = [predictions.placed_now(prediction, fields)
           for prediction, fields in zip(made, read[::2])]
    ahead = predictions.positions(client, now)
    found = []
    for prediction, meta, revoked, places in zip(now, metas, read[1::2], ahead):
        decoded = backend.decode_result(meta) if meta else {}
        state = decoded.get("status") or "PENDING"
        found.append((prediction, Seen(state, decoded.get("result")) if state != "PENDING"
                      else Seen(state, None, places, bool(revoked))))
    return found


def status(prediction: Prediction, found: Seen, now: float | None = None) -> str:
    """The prediction's status: a job still queued past a cancel (or its
    ``Cancel-After``) never runs, so it is ``canceled`` already."""
    if found.state != "PENDING":
        return STATUSES.get(found.state, "processing")
    lapsed = prediction.cancel_after_at is not None and \
        prediction.cancel_after_at <= (time.time() if now is None else now)
    return "canceled" if found.revoked or lapsed else "starting"


def prediction_json(prediction: Prediction, found: Seen, base_url: str) -> dict[str, Any]:
    """The prediction as JSON (``base_url``: this API's, for its URLs)."""
    url = f"{base_url}/v1/predictions/{prediction.id}"
    body: dict[str, Any] = {
        "id": prediction.id, "model": prediction.model, "tier": prediction.tier,
        "input": prediction.input, "status": status(prediction, found),
        "created_at": iso(prediction.created_at), "output": None, "error": None,
        "urls": {"get": url, "cancel": f"{url}/cancel", "stream": f"{url}/events"}}
    if prediction.cancel_after_at is not None:
        body["cancel_after_at"] = iso(prediction.cancel_after_at)
    if prediction.webhook is not None:
        body["webhook"] = prediction.webhook
        body["webhook_events_filter"] = list(prediction.webhook_events_filter or ())
    if body["status"] == "starting" and (found.position is not None or prediction.parked):
        body["queue"] = {"lane": prediction.lane or prediction.tier,
                         "position": found.position, "parked": prediction.parked}
    elif found.state == "PROGRESS" and isinstance(found.value, dict):
        body["progress"] = {k: found.value.get(k) for k in PROGRESS_FIELDS}
    elif found.state == "SUCCESS" and isinstance(found.value, dict):
        body.update(finished(found.value, f"{url}/files"))
    elif found.state == "FAILURE":
        body["error"] = message(found.value)
    return body


def finished(result: dict[str, Any], files_url: str) -> dict[str, Any]:
    """What a succeeded job adds: its output (artifacts as URLs under ``files_url``),
    when and how long it waited and ran, and where."""
    urls = {ref["url"]: f"{files_url}/{name}" for name, ref in artifacts(result).items()}
    if "output" in result:
        output = shown(result["output"], urls)
    else:
        image = {"url": urls.get(result.get("image"), None), "media_type": "image/png",
                 **{k: result[k] for k in ("bytes", "sha256") if k in result}}
        output = {"image": image, **{k: result[k] for k in IMAGE_FIELDS if k in result}}
    fields: dict[str, Any] = {
        "output": output,
        "timing": {k: result.get(k) for k in ("queued_ms", "run_ms")},
        "run": {k: result[k] for k in RUN_FIELDS if result.get(k) is not None}}
    if isinstance(started := result.get("started_at"), (int, float)):
        fields["started_at"] = iso(started)
        fields["completed_at"] = iso(started + (result.get("run_ms") or 0) / 1000)
    return fields


def message(value: Any) -> str:
    """A failed job's error as one text (an exception, or Celery's dict of one)."""
    if isinstance(value, BaseException):
        return str(value) or type(value).__name__
    if isinstance(value, dict):  # an exception this process cannot rebuild
        said = value.get("exc_message") or value.get("exc_type") or "failed"
        return " ".join(map(str, said)) if isinstance(said, (list, tuple)) else str(said)
    return "failed" if value is None else str(value)
