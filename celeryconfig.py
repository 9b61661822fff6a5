"""Every gpulanes setting, read once from ``GPULANES_*`` environment variables.

Celery reads the lower-case names below (``app.config_from_object``); the
upper-case constants are gpulanes' own settings. A bad value raises
``tasks.errors.ConfigError`` naming the variable.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable, TypeVar

from routing.names import LANES, RELAX_PRIORITIES
from tasks.errors import ConfigError

T = TypeVar("T")
PROJECT_DIR = Path(__file__).resolve().parent


def setting(name: str, parse: Callable[[str], T], default: T) -> T:
    """Read ``GPULANES_<name>`` with ``parse``; unset or empty gives ``default``."""
    variable = f"GPULANES_{name}"
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    try:
        return parse(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(variable, f"cannot read {raw!r}: {exc}") from exc


def positive(parse: Callable[[str], T]) -> Callable[[str], T]:
    def read(raw: str) -> T:
        value = parse(raw)
        if value <= 0:
            raise ValueError("must be greater than zero")
        return value
    return read


def at_least(low: int) -> Callable[[str], int]:
    def read(raw: str) -> int:
        value = int(raw)
        if value < low:
            raise ValueError(f"must be at least {low}")
        return value
    return read


def choice(*allowed: str) -> Callable[[str], str]:
    def read(raw: str) -> str:
        if raw not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return raw
    return read


def mapping(raw: str) -> dict[str, str]:
    """``name=module:factory,name2=...`` -> {name: "module:factory"}."""
    pairs = [item.split("=", 1) for item in raw.split(",") if item.strip()]
    if any(len(pair) != 2 or ":" not in pair[1] for pair in pairs):
        raise ValueError("expected name=module:factory[,name=module:factory]")
    return {name.strip(): spec.strip() for name, spec in pairs}


def counts(raw: str) -> dict[str, int]:
    """``name=2,name2=1`` -> {name: 2, name2: 1}."""
    pairs = [item.split("=", 1) for item in raw.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError("expected name=count[,name=count]")
    return {name.strip(): at_least(1)(count.strip()) for name, count in pairs}


def fraction(raw: str) -> float:
    """A probability strictly between 0 and 1."""
    value = float(raw)
    if not 0 < value < 1:
        raise ValueError("must be between 0 and 1 (exclusive)")
    return value


def flag(raw: str) -> bool:
    value = raw.lower()
    if value not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise ValueError("expected true or false")
    return value in ("1", "true", "yes", "on")


def per_model(parse: Callable[[str], T]) -> Callable[[str], dict[str, T]]:
    """``8`` or ``demo=8,demo-0=4,*=2`` -> {"*": 8} or {...}; ``*`` is every other model."""
    def read(raw: str) -> dict[str, T]:
        if "=" not in raw:
            return {"*": parse(raw)}
        pairs = [item.split("=", 1) for item in raw.split(",") if item.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError("expected a number or model=number[,model=number][,*=number]")
        return {name.strip(): parse(value.strip()) for name, value in pairs}
    return read


def for_model(table: dict[str, T], model: str) -> T:
    """``model``'s entry of a :func:`per_model` table, else its ``*`` entry."""
    return table.get(model, table["*"])


def non_negative(raw: str) -> float:
    value = float(raw)
    if value < 0:
        raise ValueError("must not be negative")
    return value


def names(raw: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def login(raw: str) -> str:
    user, _, password = raw.partition(":")
    if not user or not password:
        raise ValueError("must be user:password")
    return raw


# --- where things live -------------------------------------------------------
STATE_DIR = setting("STATE_DIR", Path, PROJECT_DIR / ".gpulanes")
ARTIFACT_DIR = setting("ARTIFACT_DIR", Path, PROJECT_DIR / "artifacts")
MODEL_DIR = setting("MODEL_DIR", Path, STATE_DIR / "models")
#: An fsspec URL (http://, s3://, file://) to fetch checkpoints from; unset: MODEL_DIR.
MODEL_STORE = setting("MODEL_STORE", str, None)
# Unset: the embedded Redis that the launcher starts on this Unix socket.
EMBEDDED_SOCKET = STATE_DIR / "redis.sock"
broker_url = setting("BROKER_URL", str, f"redis+socket://{EMBEDDED_SOCKET}")
result_backend = setting("RESULT_BACKEND", str, broker_url)
#: The master's name when the URLs are ``sentinel://h1:26379;sentinel://h2:26379``.
SENTINEL_MASTER = setting("SENTINEL_MASTER", str, None)
if not SENTINEL_MASTER and any(url.startswith("sentinel://")
                               for url in (broker_url, result_backend)):
    raise ConfigError("GPULANES_SENTINEL_MASTER", "a sentinel:// broker or result backend "
                      "needs the name of the master the Sentinels watch")

# --- devices and models ------------------------------------------------------
DEVICE = setting("DEVICE", choice("auto", "cpu", "cuda"), "auto")
# The built-in family: ``demo`` and ``demo-0`` ... ``demo-15``, one architecture
# with different deterministic weights, so multi-model serving can be tried here.
DEMO_MODELS = {name: "gpu_worker.demo_model:load"
               for name in ["demo", *(f"demo-{i}" for i in range(16))]}
MODELS = setting("MODELS", mapping, DEMO_MODELS)
WARM_MODELS = setting("WARM_MODELS", names, ("demo",))
#: Models a worker keeps loaded; the least recently used one makes room.
MODEL_SLOTS = setting("MODEL_SLOTS", positive(int), 2)
#: Route jobs to the worker that holds their model (consistent hashing with
#: bounded loads: a worker over (1 + epsilon) x the mean load passes jobs on).
ROUTE_HASHING = setting("ROUTE_HASHING", flag, True)
HASH_EPSILON = setting("HASH_EPSILON", positive(float), 0.25)
#: Models beat keeps warm on at least this many workers ("demo-0=2,demo-1=1").
MIN_REPLICAS = setting("MIN_REPLICAS", counts, {})
if set(MIN_REPLICAS) - set(MODELS):
    raise ConfigError("GPULANES_MIN_REPLICAS",
                      f"unknown models {sorted(set(MIN_REPLICAS) - set(MODELS))}")
if len(WARM_MODELS) > MODEL_SLOTS:
    raise ConfigError("GPULANES_WARM_MODELS", f"{len(WARM_MODELS)} models but only "
                      f"GPULANES_MODEL_SLOTS={MODEL_SLOTS} slots")
TORCH_THREADS = setting("TORCH_THREADS", positive(int), 1)
#: Dynamic batching (see gpu_worker.batching): up to MAX_BATCH compatible jobs
#: of a model in one forward pass, held at most MAX_QUEUE_DELAY_MS for company.
#: 1 (the default) runs every job alone, as without batching.
MAX_BATCH = {"*": 1, **setting("MAX_BATCH", per_model(at_least(1)), {})}
MAX_QUEUE_DELAY_MS = {"*": 10.0, **setting("MAX_QUEUE_DELAY_MS", per_model(non_negative), {})}
for _name, _table in (("MAX_BATCH", MAX_BATCH), ("MAX_QUEUE_DELAY_MS", MAX_QUEUE_DELAY_MS)):
    if set(_table) - {"*"} - set(MODELS):
        raise ConfigError(f"GPULANES_{_name}",
                          f"unknown models {sorted(set(_table) - {'*'} - set(MODELS))}")

# --- job limits (checked before anything is enqueued) ------------------------
MAX_PROMPT_CHARS = setting("MAX_PROMPT_CHARS", positive(int), 2000)
MAX_ACCOUNT_CHARS = setting("MAX_ACCOUNT_CHARS", positive(int), 64)
MAX_STEPS = setting("MAX_STEPS", positive(int), 150)
MIN_SIDE = setting("MIN_SIDE", positive(int), 64)
MAX_SIDE = setting("MAX_SIDE", positive(int), 1024)
if MIN_SIDE % 8 or MAX_SIDE % 8 or MIN_SIDE > MAX_SIDE:
    raise ConfigError("GPULANES_MIN_SIDE", f"{MIN_SIDE}..{MAX_SIDE} must be multiples of 8, "
                      "the minimum not above GPULANES_MAX_SIDE")
MAX_JOB_S = setting("MAX_JOB_S", positive(float), 300.0)

# --- retries -----------------------------------------------------------------
MAX_RETRIES = setting("MAX_RETRIES", at_least(0), 3)
RETRY_BASE_S = setting("RETRY_BASE_S", positive(float), 0.5)
RETRY_CAP_S = setting("RETRY_CAP_S", positive(float), 30.0)

# --- lane policy (see routing.policy) -----------------------------------------
MAX_WAIT_FAST_S = setting("MAX_WAIT_FAST_S", positive(float), 10.0)
MAX_WAIT_STANDARD_S = setting("MAX_WAIT_STANDARD_S", positive(float), 60.0)
#: The lanes with a wait budget (relaxed has none: it takes what is left).
MAX_WAIT_S = {"fast": MAX_WAIT_FAST_S, "standard": MAX_WAIT_STANDARD_S}
RELEASE_RATIO = setting("RELEASE_RATIO", positive(float), 0.9)
RELEASE_SAMPLES = setting("RELEASE_SAMPLES", positive(int), 3)
MAX_DEPTH = {lane: setting(f"MAX_DEPTH_{lane.upper()}", positive(int), default)
             for lane, default in (("fast", 500), ("standard", 2000), ("relaxed", 10000))}
DEFAULT_SERVICE_S = setting("DEFAULT_SERVICE_S", positive(float), 1.0)
FAST_SECONDS_DEFAULT = setting("FAST_SECONDS_DEFAULT", float, 3600.0)
#: Fast jobs one account may have waiting to start (0: no limit); more run in standard.
FAST_JOBS_PER_ACCOUNT = setting("FAST_JOBS_PER_ACCOUNT", at_least(0), 8)
FAIR_WINDOW_S = setting("FAIR_WINDOW_S", positive(int), 900)
FAIR_UNIT_S = setting("FAIR_UNIT_S", positive(float), 60.0)
FAIR_AGING_S = setting("FAIR_AGING_S", positive(float), 60.0)

# --- result cache and in-flight coalescing (see tasks.jobs.cache) -------------------
#: Seeded jobs: serve a finished identical image, or join an identical run in flight.
CACHE = setting("CACHE", flag, True)
#: How long a cached result is served after it entered the cache.
CACHE_TTL_S = setting("CACHE_TTL_S", positive(int), 24 * 3600)
#: Size budget: beyond it the least recently hit entries go.
CACHE_MAX_ENTRIES = setting("CACHE_MAX_ENTRIES", positive(int), 100_000)
#: Sightings (LRU-K admission, K=2) per submitting process: Bloom filter sizing.
CACHE_BLOOM_CAPACITY = setting("CACHE_BLOOM_CAPACITY", positive(int), 100_000)
CACHE_BLOOM_ERROR = setting("CACHE_BLOOM_ERROR", fraction, 0.001)

# --- beat --------------------------------------------------------------------
# Celery beat schedules in whole seconds: periods under 1 s act as 1 s.
HEARTBEAT_S = setting("HEARTBEAT_S", positive(float), 1.0)
HEARTBEAT_REPLY_S = setting("HEARTBEAT_REPLY_S", positive(float), 0.5)
#: A worker that misses this many heartbeats in a row is dead to routing.
MISSES_ALLOWED = setting("MISSES_ALLOWED", positive(int), 2)
#: Routers fall back to plain tier routing when the snapshot is older than this.
SNAPSHOT_STALE_S = setting("SNAPSHOT_STALE_S", positive(float), 3 * HEARTBEAT_S + 2)

# --- outages and faults -------------------------------------------------------
#: Longest one Redis command may take: gpulanes' own clients, kombu's transport and
#: Celery's result backend all give up after it. ``submit()`` raises
#: ``BrokerUnavailable`` within about this long when Redis does not answer.
REDIS_TIMEOUT_S = setting("REDIS_TIMEOUT_S", positive(float), 3.0)
REDIS_CONNECT_TIMEOUT_S = setting("REDIS_CONNECT_TIMEOUT_S", positive(float), 3.0)
#: Failures of a worker's own making in a row (disk, device, local files) after
#: which it stops taking jobs until a self-check passes again.
SICK_AFTER = setting("SICK_AFTER", positive(int), 3)
#: How often a worker that stepped aside checks whether it can serve again.
SICK_PROBE_S = setting("SICK_PROBE_S", positive(float), 5.0)
#: Celery's task-sent events (one more publish per submit); Flower reads queue
#: lengths from Redis itself and workers send their own events (``-E``).
SENT_EVENTS = setting("SENT_EVENTS", flag, False)

# --- operators ---------------------------------------------------------------
#: Basic-auth login (user:password) the Prometheus exporter asks for; without it
#: the exporter listens on loopback addresses only.
EXPORTER_AUTH = setting("EXPORTER_AUTH", login, None)
#: How long a dead letter is kept before beat drops it (``lanes dead purge`` sooner).
DEAD_TTL_S = setting("DEAD_TTL_S", positive(int), 7 * 24 * 3600)

# --- Celery ------------------------------------------------------------------
task_serializer = "json"
result_serializer = "json"
accept_content = ["json"]
result_accept_content = ["json"]
event_serializer = "json"
result_extended = True
#: How long Redis keeps a finished job's result (Celery's and gpulanes' copy,
#: about 2 kB a job): size Redis for this many seconds of completed jobs.
RESULT_TTL_S = setting("RESULT_TTL_S", positive(int), 24 * 3600)
result_expires = RESULT_TTL_S
#: How long a revoke is remembered in Redis; workers load it when they start and
#: check it before every run (a revoked job never runs, whatever restarted).
REVOKE_TTL_S = setting("REVOKE_TTL_S", positive(int), RESULT_TTL_S)
# Every Redis call has a timeout: a Redis that stops answering without closing
# the connection must not hang a submitter, a worker or beat.
redis_socket_timeout = REDIS_TIMEOUT_S
redis_socket_connect_timeout = REDIS_CONNECT_TIMEOUT_S
broker_connection_timeout = REDIS_CONNECT_TIMEOUT_S
# submit() threads wait this long at most for a pooled broker connection (all of them
# may be waiting on a Redis that stopped answering).
broker_pool_acquire_timeout = REDIS_TIMEOUT_S
timezone = "UTC"
enable_utc = True

# The lanes: declared here, consumed in this order (see gpu_worker.launcher).
task_queues = {lane: {"exchange": lane, "routing_key": lane} for lane in LANES}
task_create_missing_queues = False
task_default_queue = "standard"
task_routes = ("routing.router.route_task",)

# One job in hand per worker thread, acked only when done. (With the threads
# pool a dead worker's jobs come back through beat's health check, or at worst
# the visibility timeout; reject_on_worker_lost covers prefork deployments.)
worker_prefetch_multiplier = 1
task_acks_late = True
task_reject_on_worker_lost = True
task_track_started = True
task_send_sent_event = SENT_EVENTS
worker_send_task_events = True
worker_hijack_root_logger = False
# JSON only, above; and what a worker refuses (bad JSON, pickle, unknown tasks,
# items that are not messages) is dead-lettered with its reason (tasks.worker.rejects).
worker_consumer = "tasks.worker.rejects:LanesConsumer"

# Redis has no real acks: an unacked job comes back after the visibility
# timeout. A job can run at most MAX_JOB_S (enforced between steps) and a
# retry waits at most RETRY_CAP_S in the worker, so by default twice that;
# live workers also keep the jobs they hold fresh (gpu_worker.hooks.KeepHeld),
# so a job that outlives a shorter timeout is not handed out again either.
VISIBILITY_TIMEOUT_S = setting("VISIBILITY_TIMEOUT_S", positive(int),
                               int(2 * MAX_JOB_S + RETRY_CAP_S))
#: How often a worker marks the jobs it holds as still held (gpu_worker.hooks.KeepHeld).
KEEPALIVE_S = min(HEARTBEAT_S, VISIBILITY_TIMEOUT_S / 4)
#: A running job's lease (one copy at a time) lapses this long after its worker
#: last extended it: beat takes a held lease for a live runner, and Redis'
#: visibility timeout must not return a job before its dead runner's lease lapses.
LEASE_TTL_S = max(1, min(math.ceil(3 * KEEPALIVE_S), VISIBILITY_TIMEOUT_S - 1))
#: A run holding its job this long is hung (a step that never returned: steps stop
#: at GPULANES_MAX_JOB_S): its worker stops extending its lease and puts its message back.
RUN_HUNG_S = 2 * MAX_JOB_S
#: How long a job's run records (its run counter, a handed-over lease) are kept: past
#: every copy of it, its redeliveries and each retry's run and backoff, the runs on
#: workers that failed it for their own reasons included.
RUNS_KEPT_S = math.ceil(2 * VISIBILITY_TIMEOUT_S + (2 * MAX_RETRIES + SICK_AFTER + 1)
                        * (MAX_JOB_S + RETRY_CAP_S))
broker_transport_options = {
    "queue_order_strategy": "priority",  # honour the -Q order: fast first
    # Lanes do priority; message priority only orders accounts inside relaxed
    # (fast and standard always use step 0, so lane order holds).
    "priority_steps": list(RELAX_PRIORITIES),
    "visibility_timeout": VISIBILITY_TIMEOUT_S,
    # sweep for abandoned jobs every few seconds, not every 100 s
    "unacked_restore_interval": max(1, min(10, VISIBILITY_TIMEOUT_S // 4)),
    "unacked_restore_throttle": 1,
    "socket_timeout": REDIS_TIMEOUT_S,
    "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_S,
    # A publisher's connection is tried once, not again and again for seconds: a
    # submit during an outage fails at once (workers' consumers retry on their own).
    "max_retries": 0,
    **({"master_name": SENTINEL_MASTER} if SENTINEL_MASTER else {}),
}
result_backend_transport_options = {"master_name": SENTINEL_MASTER} if SENTINEL_MASTER else {}
broker_connection_retry_on_startup = True

beat_scheduler = "beat.scheduler:LanesScheduler"
beat_schedule = {
    "heartbeat": {"task": "gpulanes.heartbeat", "schedule": HEARTBEAT_S},
    "move-queued": {"task": "gpulanes.move_queued", "schedule": HEARTBEAT_S},
}
