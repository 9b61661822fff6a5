"""Every gpulanes setting, typed, built once from the ``GPULANES_*`` environment.

``from tasks.settings import settings`` and read ``settings.max_job_s``: the
settings in force, read at the moment they are used, so a test changes one with
``with override(max_job_s=5):`` and no subprocess. A bad value raises
``tasks.errors.ConfigError`` naming the variable (``GPULANES_MAX_JOB_S``).
``celeryconfig`` derives Celery's own settings from these.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tasks.errors import ConfigError

PROJECT_DIR = Path(__file__).resolve().parent.parent
PREFIX = "GPULANES_"
#: The built-in family: ``demo`` and ``demo-0`` ... ``demo-15``, one architecture with
#: different deterministic weights, so multi-model serving can be tried here.
DEMO_MODELS = {name: "gpu_worker.demo_model:load"
               for name in ["demo", *(f"demo-{i}" for i in range(16))]}
#: The models known without GPULANES_MODELS: the demo family and ``echo``.
BUILT_IN_MODELS = {**DEMO_MODELS, "echo": "tasks.models.echo:Echo"}

Positive = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]
Pairs = Annotated[dict, NoDecode]  # our own "a=b,c=d" text, not JSON
Names = Annotated[tuple[str, ...], NoDecode]


def _pairs(raw: str, what: str) -> list[tuple[str, str]]:
    pairs = [item.split("=", 1) for item in raw.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"expected {what}")
    return [(name.strip(), value.strip()) for name, value in pairs]


class Settings(BaseSettings):
    """The settings; field ``x`` is read from ``GPULANES_X``."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, env_ignore_empty=True,
                                      extra="forbid", case_sensitive=False)

    # --- where things live ----------------------------------------------------
    state_dir: Path = PROJECT_DIR / ".gpulanes"
    artifact_dir: Path = PROJECT_DIR / "artifacts"
    #: An fsspec URL (s3://, gs://, file://, memory://) artifacts are stored at, readable
    #: from any host; unset: the local ARTIFACT_DIR (see ``artifact_root``).
    artifact_url: str | None = None
    model_dir: Path | None = None  #: unset: ``<state_dir>/models``
    #: An fsspec URL (http://, s3://, file://) to fetch checkpoints from; unset: MODEL_DIR.
    model_store: str | None = None
    broker_url: str | None = None  #: unset: the embedded Redis on ``<state_dir>/redis.sock``
    result_backend: str | None = None  #: unset: the broker
    #: The master's name when the URLs are ``sentinel://h1:26379;sentinel://h2:26379``.
    sentinel_master: str | None = None

    # --- devices and models ---------------------------------------------------
    device: Literal["auto", "cpu", "cuda"] = "auto"
    models: Pairs = Field(default_factory=lambda: dict(BUILT_IN_MODELS))
    warm_models: Names = ("demo",)
    #: Models a worker keeps loaded; the least recently used one makes room.
    model_slots: PositiveInt = 2
    #: Route jobs to the worker that holds their model (consistent hashing with
    #: bounded loads: a worker over (1 + epsilon) x the mean load passes jobs on).
    route_hashing: bool = True
    hash_epsilon: Positive = 0.25
    #: Models beat keeps warm on at least this many workers ("demo-0=2,demo-1=1").
    min_replicas: Pairs = Field(default_factory=dict)
    torch_threads: PositiveInt = 1
    #: Dynamic batching (gpu_worker.batching): up to MAX_BATCH compatible jobs of a
    #: model in one pass, held at most MAX_QUEUE_DELAY_MS for company; ``*``: the rest.
    max_batch: Pairs = Field(default_factory=lambda: {"*": 1})
    max_queue_delay_ms: Pairs = Field(default_factory=lambda: {"*": 10.0})

    # --- job limits (checked before anything is enqueued) ----------------------
    max_prompt_chars: PositiveInt = 2000
    max_account_chars: PositiveInt = 64
    max_steps: PositiveInt = 150
    min_side: PositiveInt = 64
    max_side: PositiveInt = 1024
    max_job_s: Positive = 300.0
    #: Largest a job's inputs may be, as JSON (bytes): checked before enqueue and by workers.
    max_input_bytes: PositiveInt = 64 * 1024

    # --- retries --------------------------------------------------------------
    max_retries: Annotated[int, Field(ge=0)] = 3
    retry_base_s: Positive = 0.5
    retry_cap_s: Positive = 30.0

    # --- a running job's lifecycle (tasks.worker.progress, gpu_worker.preempt) ----
    #: Least time between two progress reports of one job (state PROGRESS, an event).
    progress_s: Positive = 0.25
    #: Stop a running relaxed or standard job at a step boundary for a waiting fast one.
    preempt: bool = True
    #: Times one job may be preempted; then it runs to its end (relaxed work never starves).
    max_preemptions: Annotated[int, Field(ge=0)] = 2
    #: A run steps aside only while it expects at least this long still to run: one that
    #: ends sooner finishes first (the fast job waits less than this, and no work is set
    #: aside and resumed). Unset: a tenth of GPULANES_MAX_WAIT_FAST_S.
    preempt_min_left_s: Annotated[float, Field(ge=0)] | None = None

    # --- lane policy (routing.policy) ------------------------------------------
    max_wait_fast_s: Positive = 10.0
    max_wait_standard_s: Positive = 60.0
    release_ratio: Positive = 0.9
    release_samples: PositiveInt = 3
    max_depth_fast: PositiveInt = 500
    max_depth_standard: PositiveInt = 2000
    max_depth_relaxed: PositiveInt = 10000
    default_service_s: Positive = 1.0
    fast_seconds_default: float = 3600.0
    #: Fast jobs one account may have waiting to start (0: no limit); more run in standard.
    fast_jobs_per_account: Annotated[int, Field(ge=0)] = 8
    fair_window_s: PositiveInt = 900
    fair_unit_s: Positive = 60.0
    fair_aging_s: Positive = 60.0

    # --- result cache and in-flight coalescing (tasks.jobs.cache) ----------------
    cache: bool = True
    cache_ttl_s: PositiveInt = 24 * 3600
    cache_max_entries: PositiveInt = 100_000
    cache_bloom_capacity: PositiveInt = 100_000
    cache_bloom_error: Annotated[float, Field(gt=0, lt=1)] = 0.001

    # --- beat -----------------------------------------------------------------
    #: Celery beat schedules in whole seconds: periods under 1 s act as 1 s.
    heartbeat_s: Positive = 1.0
    heartbeat_reply_s: Positive = 0.5
    #: A worker that misses this many heartbeats in a row is dead to routing.
    misses_allowed: PositiveInt = 2
    #: Routers fall back to plain tier routing past this age; unset: 3 heartbeats, a
    #: leader's lease (a standby takes over within it) and 2 s.
    snapshot_stale_s: Positive | None = None
    #: Any number of beats run; the leader's lease lapses this long after its last
    #: renewal (renewed 4 times as often, from its own thread), and a standby leads.
    beat_lease_s: Positive = 2.0

    # --- outages and faults ---------------------------------------------------
    #: Longest one Redis command may take, on every client (ours, kombu's, Celery's
    #: backend): ``submit()`` raises ``BrokerUnavailable`` within about this long.
    redis_timeout_s: Positive = 3.0
    redis_connect_timeout_s: Positive = 3.0
    #: When the embedded Redis fsyncs its AOF: ``always`` before it answers (an accepted
    #: job survives a crash of Redis or of the machine), or ``everysec`` (faster; a crash
    #: may lose the last second's writes).
    redis_fsync: Literal["always", "everysec"] = "always"
    #: Replicas that must hold a write before it counts (Redis ``WAIT``): a job
    #: accepted, a run begun or settled, beat's lead. 0: the primary's word is enough
    #: (one Redis); 1 or more behind Sentinel, so that a failover loses none of them.
    redis_replicas: int = Field(default=0, ge=0)
    #: How long such a write waits for its replicas before it is refused (``NOREPLICAS``).
    redis_replica_wait_s: Positive = 1.0
    #: Failures of a worker's own making in a row (disk, device, local files) after
    #: which it stops taking jobs until a self-check passes again.
    sick_after: PositiveInt = 3
    #: How often a worker that stepped aside checks whether it can serve again.
    sick_probe_s: Positive = 5.0
    #: A worker stuck this long while Redis takes its writes (a finished run never let
    #: go of its job slot: ``gpu_worker.stuck``) exits, for its supervisor to restart.
    stuck_exit_s: Positive = 60.0
    #: New jobs are refused while Redis uses more than this share of its ``maxmemory``
    #: (as beat last measured it): the rest is kept for the outcomes of accepted jobs.
    redis_memory_limit: float = Field(default=0.9, gt=0, le=1)
    #: Celery's task-sent events (one more publish per submit).
    sent_events: bool = False

    # --- operators and retention ----------------------------------------------
    #: Basic-auth login (user:password) of the Prometheus exporter; without it the
    #: exporter listens on loopback addresses only.
    exporter_auth: str | None = None
    #: How long Redis keeps a finished job's result (about 2 kB a job).
    result_ttl_s: PositiveInt = 24 * 3600
    #: How long a revoke is remembered; unset: RESULT_TTL_S.
    revoke_ttl_s: PositiveInt | None = None
    #: Artifacts older than this are swept from the store by workers; unset: as long as a
    #: result may name them (RESULT_TTL_S, plus CACHE_TTL_S: a cache hit's result does).
    artifact_ttl_s: PositiveInt | None = None
    #: Redis' redelivery of an unacked job; unset: 2 x MAX_JOB_S + RETRY_CAP_S.
    visibility_timeout_s: PositiveInt | None = None
    #: A run holding its job this long is hung (a step that never returned: steps stop
    #: at MAX_JOB_S): its message goes back, its lease is lost. Unset: 2 x MAX_JOB_S.
    run_hung_s: Positive | None = None
    #: How long a dead letter is kept (beat drops older ones).
    dead_ttl_s: PositiveInt = 7 * 24 * 3600

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, raw: Any) -> Any:
        if not isinstance(raw, str):
            return raw
        pairs = _pairs(raw, "name=module:factory[,name=module:factory]")
        if any(":" not in spec for _, spec in pairs):
            raise ValueError("expected name=module:factory[,name=module:factory]")
        return dict(pairs)

    @field_validator("warm_models", mode="before")
    @classmethod
    def _names(cls, raw: Any) -> Any:
        return tuple(n.strip() for n in raw.split(",") if n.strip()) if isinstance(raw, str) \
            else raw

    @field_validator("min_replicas", mode="before")
    @classmethod
    def _counts(cls, raw: Any) -> Any:
        if not isinstance(raw, str):
            return raw
        counts = {name: int(count) for name, count in _pairs(raw, "name=count[,name=count]")}
        if any(count < 1 for count in counts.values()):
            raise ValueError("every count must be at least 1")
        return counts

    @field_validator("max_batch", "max_queue_delay_ms", mode="before")
    @classmethod
    def _per_model(cls, raw: Any, info: Any) -> Any:
        """``8`` or ``demo=8,demo-0=4,*=2``; ``*`` is every other model."""
        default = {"max_batch": 1, "max_queue_delay_ms": 10.0}[info.field_name]
        parse = type(default)
        if isinstance(raw, str):
            raw = {"*": raw} if "=" not in raw else dict(_pairs(raw, "model=number[,...]"))
        table = {"*": default, **{name: parse(value) for name, value in raw.items()}}
        if any(value < (1 if parse is int else 0) for value in table.values()):
            raise ValueError("must be at least 1" if parse is int else "must not be negative")
        return table

    @field_validator("artifact_url")
    @classmethod
    def _store_url(cls, raw: str | None) -> str | None:
        if raw is not None and "://" not in raw:
            raise ValueError("must be an fsspec URL such as s3://bucket/artifacts "
                             "(a local folder: GPULANES_ARTIFACT_DIR)")
        return raw

    @field_validator("exporter_auth")
    @classmethod
    def _login(cls, raw: str | None) -> str | None:
        if raw is not None and not all(raw.partition(":")[::2]):
            raise ValueError("must be user:password")
        return raw

    @model_validator(mode="after")
    def _derived(self) -> "Settings":
        """Defaults that follow other settings, and rules across settings."""
        self.model_dir = self.model_dir or self.state_dir / "models"
        self.broker_url = self.broker_url or f"redis+socket://{self.embedded_socket}"
        self.result_backend = self.result_backend or self.broker_url
        self.snapshot_stale_s = (self.snapshot_stale_s
                                 or 3 * self.heartbeat_s + self.beat_lease_s + 2)
        self.revoke_ttl_s = self.revoke_ttl_s or self.result_ttl_s
        self.artifact_ttl_s = self.artifact_ttl_s or (
            self.result_ttl_s + (self.cache_ttl_s if self.cache else 0))
        self.run_hung_s = self.run_hung_s or 2 * self.max_job_s
        if self.preempt_min_left_s is None:
            self.preempt_min_left_s = self.max_wait_fast_s / 10
        self.visibility_timeout_s = self.visibility_timeout_s or int(
            2 * self.max_job_s + self.retry_cap_s)
        _check_across(self)
        return self

    # --- derived --------------------------------------------------------------
    @property
    def embedded_socket(self) -> Path:
        """The embedded Redis' Unix socket (used when no broker URL is set)."""
        return self.state_dir / "redis.sock"

    @property
    def embedded_broker(self) -> bool:
        """No broker URL was given: the embedded Redis on ``embedded_socket``."""
        return self.broker_url == f"redis+socket://{self.embedded_socket}"

    @property
    def artifact_root(self) -> str:
        """Where artifacts are stored: ARTIFACT_URL, else ARTIFACT_DIR as a plain path
        (so results name local artifacts by path, as they always did)."""
        return self.artifact_url or str(self.artifact_dir)

    @property
    def max_depth(self) -> dict[str, int]:
        return {"fast": self.max_depth_fast, "standard": self.max_depth_standard,
                "relaxed": self.max_depth_relaxed}

    @property
    def max_wait_s(self) -> dict[str, float]:
        """The lanes with a wait budget (relaxed has none: it takes what is left)."""
        return {"fast": self.max_wait_fast_s, "standard": self.max_wait_standard_s}

    @property
    def keepalive_s(self) -> float:
        """How often a worker marks the jobs it holds as still held."""
        return min(self.heartbeat_s, self.visibility_timeout_s / 4)

    @property
    def lease_ttl_s(self) -> int:
        """A running job's lease lapses this long after its worker last extended it."""
        return max(1, min(math.ceil(3 * self.keepalive_s), self.visibility_timeout_s - 1))

    @property
    def runs_kept_s(self) -> int:
        """How long a job's run records are kept: past every copy of it, its
        redeliveries, each retry's run and backoff, and sick workers' runs."""
        return math.ceil(2 * self.visibility_timeout_s + (2 * self.max_retries + self.sick_after
                                                          + 1) * (self.max_job_s
                                                                  + self.retry_cap_s))

    def for_model(self, table: dict[str, Any], model: str) -> Any:
        """``model``'s entry of a per-model table (``max_batch``...), else its ``*``."""
        return table.get(model, table["*"])


def _check_across(s: Settings) -> None:
    if not s.sentinel_master and any(url.startswith("sentinel://")
                                     for url in (s.broker_url, s.result_backend)):
        raise ConfigError(f"{PREFIX}SENTINEL_MASTER", "a sentinel:// broker or result backend "
                          "needs the name of the master the Sentinels watch")
    if s.redis_replicas and s.redis_replica_wait_s >= s.redis_timeout_s:
        raise ConfigError(f"{PREFIX}REDIS_REPLICA_WAIT_S", f"{s.redis_replica_wait_s} s must "
                          f"be below {PREFIX}REDIS_TIMEOUT_S ({s.redis_timeout_s} s): a "
                          "write's client would give up before Redis says how many replicas "
                          "hold it")
    if unknown := set(s.min_replicas) - set(s.models):
        raise ConfigError(f"{PREFIX}MIN_REPLICAS", f"unknown models {sorted(unknown)}")
    if len(s.warm_models) > s.model_slots:
        raise ConfigError(f"{PREFIX}WARM_MODELS", f"{len(s.warm_models)} models but only "
                          f"{PREFIX}MODEL_SLOTS={s.model_slots} slots")
    for name in ("max_batch", "max_queue_delay_ms"):
        if unknown := set(getattr(s, name)) - {"*"} - set(s.models):
            raise ConfigError(f"{PREFIX}{name.upper()}", f"unknown models {sorted(unknown)}")
    if s.min_side % 8 or s.max_side % 8 or s.min_side > s.max_side:
        raise ConfigError(f"{PREFIX}MIN_SIDE", f"{s.min_side}..{s.max_side} must be multiples "
                          f"of 8, the minimum not above {PREFIX}MAX_SIDE")


def load(**values: Any) -> Settings:
    """Settings from the environment, ``values`` (by field name) over it; a bad value
    raises :class:`ConfigError` naming its variable."""
    try:
        return Settings(**values)
    except ValidationError as exc:
        raise _config_error(exc) from None


def _config_error(exc: ValidationError) -> ConfigError:
    first = exc.errors()[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError):
        return cause
    field = str(first["loc"][0]) if first["loc"] else "?"
    given = first.get("input")
    shown = f"cannot read {given!r}: " if isinstance(given, (str, int, float)) else ""
    return ConfigError(f"{PREFIX}{field.upper()}", f"{shown}{first['msg']}")


_changes: list[dict[str, Any]] = [{}]
_current: list[Settings] = []


def current() -> Settings:
    """The settings in force (built from the environment on first use)."""
    if not _current:
        _current.append(load(**_changes[-1]))
    return _current[0]


@contextmanager
def override(**values: Any) -> Iterator[Settings]:
    """These settings (by field name) in force inside the block, validated as from the
    environment; derived values follow."""
    changed = load(**_changes[-1], **values)
    before = current()
    _changes.append({**_changes[-1], **values})
    _current[0] = changed
    try:
        yield changed
    finally:
        _changes.pop()
        _current[0] = before


class _InForce:
    """``settings.x``: attribute ``x`` of the settings in force at the moment of reading."""

    def __getattr__(self, name: str) -> Any:
        return getattr(current(), name)


settings: Any = _InForce()

