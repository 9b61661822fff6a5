"""Messages a worker refuses: each is logged and dead-lettered with what was wrong.

Anything can land on a lane list: a message from an old or broken producer, a
pickle, a hand-typed ``LPUSH``. None of it may crash or stall a worker, and
none of it is deserialized unless it is JSON (``accept_content``). Three layers:

- :class:`LaneGuard` (a consumer bootstep): an item that is not even a kombu
  message would otherwise stop the worker (``Unrecoverable error``) or drop its
  broker connection;
- :class:`LanesConsumer` (``worker_consumer``): Celery's own refusals (a body it
  cannot decode, content other than JSON, an unknown task, a message without
  task headers) are only logged by Celery; here they are dead-lettered too;
- :class:`CheckedTask` (the job task's base): a well-formed call whose job or
  route breaks the schema is dead-lettered before it touches the model.

Operators see them with ``celery -A tasks lanes dead list`` (reason
``invalid_message``); they cannot be requeued, since they would fail again.
"""
from __future__ import annotations

import json
import logging
import math
import uuid
from dataclasses import replace
from typing import Any, Callable, NoReturn

import redis
from celery import Task, bootsteps
from celery.worker.consumer import Consumer

from routing.names import JOB_TASK, LANES, TIERS
from tasks.broker.keys import done_key
from tasks.broker.message import Job, JobMessage, JobRoute
from tasks.errors import InvalidJob, JobFailed
from tasks.jobs.deadletter import bury
from tasks.jobs.schema import check_job, shown

log = logging.getLogger(__name__)
#: The dead-letter reason of every refused message.
INVALID_MESSAGE = "invalid_message"
#: The job task's keyword arguments, the only ones it takes.
CALL_ARGS = frozenset({"job", "route", "submitted_at"})
#: What reading a task message's malformed headers raises (its KeyError, say).
MALFORMED = (KeyError, ValueError, TypeError, AttributeError)
#: A refused job's text fields are kept this long in its dead letter.
KEPT_CHARS = 200


def _kept(value: Any) -> Any:
    """``value`` cut down for a dead letter: long strings shortened, odd types and numbers
    standard JSON has no word for (NaN, infinity) shown as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return shown(value)
    if isinstance(value, dict):
        return {str(k)[:KEPT_CHARS]: _kept(v) for k, v in list(value.items())[:20]}
    if isinstance(value, str) and len(value) > KEPT_CHARS:
        return f"{value[:KEPT_CHARS]}... ({len(value)} characters)"
    return value if isinstance(value, (str, int, float, bool, type(None))) else shown(value)


def dead_letter(job_id: str, job: Any, route: Any, problem: BaseException,
                message: dict[str, Any]) -> None:
    """Log and dead-letter one refused message; a Redis failure here is only logged."""
    log.error("refused message %s from %s: %s: %s (dead-lettered, reason %s)", job_id,
              message.get("queue") or "a lane", type(problem).__name__, problem,
              INVALID_MESSAGE)
    from tasks.broker.app import redis_client  # the worker's client, made once

    kept = {"job": _kept(job) if isinstance(job, dict) else {},
            "route": _kept(route) if isinstance(route, dict) else {}}
    try:
        bury(redis_client(), job_id, kept, INVALID_MESSAGE, problem, 0, message=message)
    except redis.RedisError:
        log.exception("could not dead-letter refused message %s", job_id)


# --- the job task's call --------------------------------------------------------

def check_call(args: Any, kwargs: Any) -> None:
    """The shape of a job task's call: keyword arguments only, exactly its three."""
    if args:
        raise InvalidJob("args", f"{JOB_TASK} takes keyword arguments only, got {len(args)} "
                         "positional argument(s)")
    names = set(kwargs)
    if names != CALL_ARGS:
        missing, extra = sorted(CALL_ARGS - names), sorted(map(str, names - CALL_ARGS))
        raise InvalidJob("kwargs", f"{JOB_TASK} takes job, route and submitted_at; missing "
                         f"{missing or 'none'}, unexpected {shown(extra) if extra else 'none'}")
    if not isinstance(kwargs["route"], dict):
        raise InvalidJob("route", f"must be a mapping, got {type(kwargs['route']).__name__}")


def check_content(kwargs: dict[str, Any]) -> JobMessage:
    """The job against the schema, the route and the submit time as ``submit()`` makes
    them: the message, decoded (once)."""
    job = check_job(kwargs["job"])
    route, submitted_at = kwargs["route"], kwargs["submitted_at"]
    if route.get("lane") not in LANES or route.get("requested_tier") not in TIERS:
        raise InvalidJob("route", f"needs a lane and a requested_tier among {', '.join(LANES)}"
                         f", got {shown(route)}")
    if type(submitted_at) not in (int, float) or not math.isfinite(submitted_at):
        raise InvalidJob("submitted_at", f"must be a unix time, got {shown(submitted_at)}")
    try:
        route = JobRoute.decode(route)
    except TypeError as exc:
        raise InvalidJob("route", f"cannot be read: {exc}") from exc
    return JobMessage(replace(job, leads_run=Job.leads(kwargs)), route,
                      float(submitted_at))


class CheckedTask(Task):
    """Base of the job task: the shape of its call is checked before the task body runs
    (a wrong one would not even reach it); the body decodes its message with
    :meth:`checked`."""

    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        try:
            check_call(args, kwargs)
        except InvalidJob as exc:
            self._refuse(task_id, kwargs, exc)

    def checked(self, kwargs: dict[str, Any]) -> JobMessage | dict[str, Any]:
        """The call's message, decoded; a broken one is refused, unless its job already
        finished: then the result stored before answers it."""
        try:
            return check_content(kwargs)
        except InvalidJob as exc:
            from tasks.broker.app import redis_client

            stored = redis_client().get(done_key(self.request.id))
            if stored is None:
                self._refuse(self.request.id, kwargs, exc)
            return json.loads(stored)

    def _refuse(self, task_id: str, kwargs: Any, exc: InvalidJob) -> NoReturn:
        delivery = self.request.delivery_info or {}
        kwargs = kwargs if isinstance(kwargs, dict) else {}
        dead_letter(task_id, kwargs.get("job"), kwargs.get("route"), exc,
                    {"queue": delivery.get("routing_key"), "task": self.name})
        raise JobFailed(f"job {task_id} was refused: its message is invalid ({exc})") from exc


# --- what Celery refuses before a task is chosen -----------------------------------

def _headers(message: Any) -> dict[str, Any]:
    return message.headers if isinstance(message.headers, dict) else {}


def describe(message: Any) -> dict[str, Any]:
    """What an operator needs to trace a refused message, without deserializing it."""
    headers = _headers(message)
    delivery = message.delivery_info if isinstance(message.delivery_info, dict) else {}
    body = message.body if isinstance(message.body, (bytes, str)) else b""
    return {"queue": delivery.get("routing_key"), "task": _kept(headers.get("task")),
            "content_type": _kept(message.content_type), "body_bytes": len(body),
            "body_head": shown(body)}


def _message_id(message: Any) -> str:
    task_id = _headers(message).get("id")
    if isinstance(task_id, str) and 0 < len(task_id) <= 200:
        return task_id
    return f"message-{message.delivery_tag}"


class LanesConsumer(Consumer):
    """Celery's consumer, dead-lettering what it refuses (it still logs and acks it)."""

    class Blueprint(Consumer.Blueprint):
        default_steps = [*Consumer.Blueprint.default_steps, "tasks.worker.rejects:LaneGuard"]

    def update_strategies(self) -> None:
        super().update_strategies()
        for name, strategy in self.strategies.items():
            self.strategies[name] = self._checked(strategy)

    def _checked(self, strategy: Callable[..., Any]) -> Callable[..., Any]:
        """``strategy``, refusing a message whose headers Celery cannot read (no id,
        a bad eta, ...): raised, that error would drop the broker connection, and the
        restored message would drop it again, forever."""
        def run(message: Any, body: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return strategy(message, body, *args, **kwargs)
            except MALFORMED as exc:
                self.on_invalid_task(body, message, InvalidJob(
                    "headers", f"unreadable task headers ({type(exc).__name__}: {exc})"))
        return run

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        super().on_decode_error(message, exc)
        dead_letter(_message_id(message), None, None, exc, describe(message))

    def on_unknown_message(self, body: Any, message: Any) -> None:
        super().on_unknown_message(body, message)
        problem = InvalidJob("headers", "not a Celery task message (no task name)")
        dead_letter(_message_id(message), None, None, problem, describe(message))

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        problem = InvalidJob("task", f"no task {shown(describe(message)['task'])} here")
        if not isinstance(_headers(message).get("id"), str):
            # Celery's handler needs the id to store the failure: without one it raises,
            # the worker stops, and the restored message stops the next worker too.
            log.error("Received unregistered task %s without an id", shown(describe(message)))
            message.reject_log_error(log, self.connection_errors)
        else:
            super().on_unknown_task(body, message, exc)
        dead_letter(_message_id(message), None, None, problem, describe(message))

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        super().on_invalid_task(body, message, exc)
        dead_letter(_message_id(message), None, None, exc, describe(message))


# --- what is not a kombu message at all ---------------------------------------------

class LaneGuard(bootsteps.StartStopStep):
    """An item taken from a lane that is not valid JSON or not a kombu envelope is
    dead-lettered (``tasks.broker.lanes.Channel.refuse``)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, c: Any) -> None:
        c.task_consumer.channel.on_unreadable = _refuse_item


def _refuse_item(problem: str, details: dict[str, Any]) -> None:
    shown_details = {"queue": details["queue"], "body_head": shown(details["item"])} \
        if "item" in details else {}
    dead_letter(f"unreadable-{uuid.uuid4()}", None, None, InvalidJob("message", problem),
                shown_details)
