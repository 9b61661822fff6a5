"""Celery's settings for gpulanes, derived from gpulanes' own (``tasks.settings``).

Celery reads the lower-case names below (``app.config_from_object``). Every
``GPULANES_*`` variable is a field of ``tasks.settings.Settings``, validated once;
a bad value raises ``tasks.errors.ConfigError`` naming the variable.
"""
from __future__ import annotations

from routing.names import LANES, RELAX_PRIORITIES
from tasks.broker.store import result_url
from tasks.settings import current

_settings = current()

task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
result_accept_content = ["json"]
event_serializer = "json"
result_extended = True
#: gpulanes' transport (``tasks.broker.lanes``), named by the URL, on the broker's Redis.
#: A Sentinel URL's nodes travel whole in the transport's ``url`` option: kombu would split
#: them into alternates of its own, and name an unknown transport when it switched.
broker_url = f"gpulanes+{_settings.broker_url.split(';')[0]}"
#: gpulanes' result backend on a Redis URL (``tasks.broker.backend``).
result_backend = result_url(_settings.result_backend)
#: How long Redis keeps a finished job's result (Celery's and gpulanes' copy).
result_expires = _settings.result_ttl_s
#: A worker's result writes wait out an outage (gpu_worker.hooks.WorkerSetup turns the
#: retries on): tried again within a second of Redis taking writes again.
result_backend_max_sleep_between_retries_ms = 1000
# Every Redis call has a timeout: a Redis that stops answering without closing
# the connection must not hang a submitter, a worker or beat.
redis_socket_timeout = _settings.redis_timeout_s
redis_socket_connect_timeout = _settings.redis_connect_timeout_s
redis_backend_health_check_interval = 1
broker_connection_timeout = _settings.redis_connect_timeout_s
# submit() threads wait this long at most for a pooled broker connection (all of them
# may be waiting on a Redis that stopped answering).
broker_pool_acquire_timeout = _settings.redis_timeout_s
timezone = "UTC"
enable_utc = True

# The lanes: declared here, consumed in this order (see gpu_worker.launcher).
task_queues = {lane: {"exchange": lane, "routing_key": lane} for lane in LANES}
task_create_missing_queues = False
task_default_queue = "standard"
task_routes = ("routing.router.route_task",)

# One job in hand per worker thread, acked only when done. (A dead worker's jobs come
# back through beat's health check, from its records; reject_on_worker_lost covers
# prefork deployments.)
worker_prefetch_multiplier = 1
task_acks_late = True
task_reject_on_worker_lost = True
task_track_started = True
#: No task-sent events (one more publish per submit): Flower reads queue lengths from
#: Redis itself and workers send their own events (``-E``).
task_send_sent_event = False
worker_send_task_events = True
worker_hijack_root_logger = False
# How long the worker's timer thread sleeps between looks at its schedule. A warm
# shutdown waits for that sleep to end: at Celery's default, 1 s, a stopping worker
# exits up to a second later than it could.
worker_timer_precision = 0.1
# JSON only, above; and what a worker refuses (bad JSON, pickle, unknown tasks,
# items that are not messages) is dead-lettered with its reason (tasks.worker.rejects).
worker_consumer = "tasks.worker.rejects:LanesConsumer"

# The queue protocol records which worker holds each job in the step that takes it: a
# dead or frozen worker's jobs go back through beat's health check; live workers keep
# the leases of the jobs they run (gpu_worker.hooks.KeepLeases).
broker_transport_options = {
    # Lanes do priority; message priority only orders accounts inside relaxed
    # (fast and standard always use step 0, so lane order holds).
    "priority_steps": list(RELAX_PRIORITIES),
    "url": _settings.broker_url,
    "socket_timeout": _settings.redis_timeout_s,
    "socket_connect_timeout": _settings.redis_connect_timeout_s,
    **({"master_name": _settings.sentinel_master} if _settings.sentinel_master else {}),
}
result_backend_transport_options = ({"master_name": _settings.sentinel_master}
                                    if _settings.sentinel_master else {})
broker_connection_retry_on_startup = True

beat_scheduler = "beat.scheduler:LanesScheduler"
beat_schedule = {
    "heartbeat": {"task": "gpulanes.heartbeat", "schedule": _settings.heartbeat_s},
    "move-queued": {"task": "gpulanes.move_queued", "schedule": _settings.heartbeat_s},
}
