"""Every gpulanes setting, typed, built once from the ``GPULANES_*`` environment.

``settings.max_job_s``: the settings in force, read when used (a test changes one with
``with override(max_job_s=5):``). A bad value raises ``tasks.errors.ConfigError`` naming
the variable (``GPULANES_MAX_JOB_S``). ``celeryconfig`` derives Celery's from these.
"""
from __future__ import annotations

import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal, cast

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tasks.errors import ConfigError
from tasks.settings_cells import parse_cells
from tasks.settings_defaults import (BUILT_IN_MODELS, DEMO_MODEL_MB, DEMO_MODELS, DEMO_TARGET,
                                     MAX_DEPTH_DEFAULT, MAX_WAIT_DEFAULT_S, PREFIX, PROJECT_DIR,
                                     RETRY_BASE_S, RETRY_CAP_S, SICK_AFTER)
from tasks.settings_derived import Derived
from tasks.settings_retired import retired_in

__all__ = ["BUILT_IN_MODELS", "DEMO_MODEL_MB", "DEMO_MODELS", "DEMO_TARGET", "MAX_DEPTH_DEFAULT",
           "MAX_WAIT_DEFAULT_S", "PREFIX", "PROJECT_DIR", "RETRY_BASE_S", "RETRY_CAP_S",
           "SICK_AFTER", "Settings", "current", "load", "override", "settings"]

Positive = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]
# tables read from our own "a=b,c=d" text, not JSON
Pairs = Annotated[dict[str, str], NoDecode]
Counts = Annotated[dict[str, int], NoDecode]
Amounts = Annotated[dict[str, float], NoDecode]
Names = Annotated[tuple[str, ...], NoDecode]


def _pairs(raw: str, what: str) -> list[tuple[str, str]]:
    pairs = [item.split("=", 1) for item in raw.split(",") if item.strip()]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"expected {what}")
    return [(name.strip(), value.strip()) for name, value in pairs]


class Settings(Derived, BaseSettings):
    """The settings; field ``x`` is read from ``GPULANES_X``; the values derived from
    them are :class:`tasks.settings_derived.Derived`'s properties."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, env_ignore_empty=True,
                                      extra="forbid", case_sensitive=False,
                                      use_attribute_docstrings=True)

    # --- where things live -------------------------------------------------------
    state_dir: Path = PROJECT_DIR / ".gpulanes"
    """Local state: the embedded Redis' socket and AOF, cluster logs, models by default."""
    artifact_dir: Path = PROJECT_DIR / "artifacts"
    """The local folder artifacts (images, files) are written to, unless ARTIFACT_URL."""
    artifact_url: str | None = None
    """An fsspec URL (s3://, gs://, file://, memory://) artifacts are stored at, readable
    from any host. Unset: the local ARTIFACT_DIR."""
    model_dir: Path | None = None
    """Where workers keep model checkpoints. Unset: ``<STATE_DIR>/models``."""
    model_store: str | None = None
    """An fsspec URL (http://, s3://, file://) workers fetch checkpoints from into
    MODEL_DIR; unset: MODEL_DIR only."""
    broker_url: str | None = None
    """The Redis jobs go through (``redis://``, ``rediss://``, ``sentinel://``), or
    several, one per pool: ``pool=url`` pairs separated by commas (cells, see
    ``docs/scaling.md``). Unset: the embedded Redis on ``<STATE_DIR>/redis.sock``,
    started by the launcher."""
    result_backend: str | None = None
    """The Redis results are kept in. Unset: the broker (with cells, each cell's)."""
    sentinel_master: str | None = None
    """The master's name when the URLs are ``sentinel://h1:26379;sentinel://h2:26379``."""

    # --- devices and models ------------------------------------------------------
    pool: str = Field(default="default", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    """The pool this worker belongs to: workers that serve the same models, which beat
    scales together (``lanes status``, ``/scaling``). A DNS label, as Kubernetes names."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where models run: ``cuda`` when a GPU is present (``auto``), or as named."""
    models: Pairs = Field(default_factory=lambda: dict(BUILT_IN_MODELS))
    """The models a job may name: ``name=module:Class`` (a model class) or
    ``name=module:function`` (an image model's factory), comma-separated."""
    warm_models: Names = ()
    """Models a worker loads and warms before it takes a job; they must fit its budget.
    Unset: MODELS in order while their declared sizes fit (built-in list: ``demo``)."""
    model_memory_mb: PositiveInt = 2048
    """A CPU worker's budget for loaded models, in MB (on CUDA: free VRAM at start, less
    a margin); the least recently used ones make room for a model that does not fit."""
    min_replicas: Counts = Field(default_factory=dict)
    """Models beat keeps warm on at least this many workers (``demo-0=2,demo-1=1``)."""
    torch_threads: PositiveInt = 1
    """CPU threads torch uses in each worker process."""
    max_batch: Counts = Field(default_factory=lambda: {"*": 1})
    """Dynamic batching: up to this many compatible jobs of a model in one pass
    (``8`` or ``demo=8,*=2``; ``*``: every other model)."""
    max_queue_delay_ms: Amounts = Field(default_factory=lambda: {"*": 10.0})
    """How long a batch's first job waits for company, per model like MAX_BATCH."""

    # --- jobs and retries --------------------------------------------------------
    max_job_s: Positive = 300.0
    """Longest a job may run; a run stops at its next step past it. A run that holds its
    job 2 x MAX_JOB_S is hung: its job goes back to its lane."""
    max_input_bytes: PositiveInt = 64 * 1024
    """Largest a job's inputs may be, as JSON (bytes): checked before enqueue and by
    workers."""
    max_retries: Annotated[int, Field(ge=0)] = 3
    """Retries of a job that failed transiently, with exponential backoff, each one lane
    lower (down to relaxed)."""

    # --- the HTTP API's webhooks (tasks.front.hooks) -----------------------------
    webhook_allow_private: bool = False
    """Let a webhook point into the cluster's own network (loopback, link-local and
    private addresses), refused otherwise."""

    # --- preemption (gpu_worker.preempt) -----------------------------------------
    preempt: bool = True
    """Stop a running relaxed or standard job at a step boundary for a waiting fast one."""
    max_preemptions: Annotated[int, Field(ge=0)] = 2
    """Times one job may be preempted; then it runs to its end (relaxed work never
    starves)."""

    # --- lanes (routing.policy) --------------------------------------------------
    max_wait_s: Amounts = Field(default_factory=lambda: dict(MAX_WAIT_DEFAULT_S))
    """Each budgeted lane's wait budget in seconds (``fast=10,standard=60``; a lane not
    named keeps its default): past it the lane is overloaded and downgradable work
    moves down. The standard budget is also the relaxed lane's aging bound; a run steps
    aside for a fast job only while a tenth of the fast budget or more is left of it."""
    max_depth: Counts = Field(default_factory=lambda: dict(MAX_DEPTH_DEFAULT))
    """Most jobs each lane may hold (``fast=500,standard=2000,relaxed=10000``; a lane
    not named keeps its default); a full lane refuses new jobs (``LaneFull``)."""
    fast_seconds_default: float = 3600.0
    """Fast-lane GPU seconds an account starts with (``lanes accounts grant`` adds more);
    once spent, its fast jobs run in relaxed."""
    fast_jobs_per_account: Annotated[int, Field(ge=0)] = 8
    """Fast jobs one account may have waiting to start (0: no limit); more run in
    standard."""

    # --- result cache (tasks.jobs.cache) -----------------------------------------
    cache: bool = True
    """Serve a deterministic model's repeated job (same seed and inputs) from the cache,
    and join a job to the same one running."""
    cache_ttl_s: PositiveInt = 24 * 3600
    """How long a cached result is kept."""
    cache_max_entries: PositiveInt = 100_000
    """Most cached results; the least recently hit go first."""

    # --- beat and Redis ----------------------------------------------------------
    heartbeat_s: Positive = 1.0
    """Beat's round: worker stats, lane loads, policy, snapshot, health. Beat schedules
    in whole seconds: under 1 s acts as 1 s. A standby beat takes the lead within 2
    heartbeats; routers trust a snapshot for 5 heartbeats and 2 s; a worker stuck on a
    finished run it cannot let go of exits after 3."""
    redis_timeout_s: Positive = 3.0
    """Longest one Redis command or connect may take, on every client (ours, kombu's,
    Celery's backend): ``submit()`` raises ``BrokerUnavailable`` within about this long.
    A write waits a third of it for its replicas (REDIS_REPLICAS)."""
    redis_replicas: int = Field(default=0, ge=0)
    """Replicas that must hold a write before it counts (Redis ``WAIT``): a job
    accepted, a run begun or settled, beat's lead. 0: the primary's word is enough (one
    Redis); 1 or more behind Sentinel, so that a failover loses none of them."""

    # --- operators and retention -------------------------------------------------
    exporter_auth: str | None = None
    """Basic-auth login (user:password) of the Prometheus exporter; without it the
    exporter listens on loopback addresses only."""
    result_ttl_s: PositiveInt = 24 * 3600
    """How long Redis keeps a finished job's result (about 2 kB a job); revokes are
    remembered as long, and artifacts swept after it (plus CACHE_TTL_S with the cache
    on: a cache hit's result names them)."""

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

    @field_validator("max_wait_s", "max_depth", mode="before")
    @classmethod
    def _per_lane(cls, raw: Any, info: Any) -> Any:
        """``lane=number[,lane=number]`` over the defaults; every number above 0."""
        waits = info.field_name == "max_wait_s"
        default: dict[str, Any] = MAX_WAIT_DEFAULT_S if waits else MAX_DEPTH_DEFAULT
        parse = float if waits else int
        given = dict(_pairs(raw, "lane=number[,lane=number]")) if isinstance(raw, str) \
            else raw
        if unknown := sorted(set(given) - set(default)):
            raise ValueError(f"unknown lane {unknown[0]!r}; use {', '.join(default)}")
        table = {**default, **{lane: parse(value) for lane, value in given.items()}}
        if not all(math.isfinite(value) and value > 0 for value in table.values()):
            raise ValueError("every number must be above 0")
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

    _cells: dict[str, str] = PrivateAttr(default_factory=dict)

    @field_validator("broker_url")
    @classmethod
    def _cells_named(cls, raw: str | None) -> str | None:
        parse_cells(raw or "")  # ValueError: a malformed list of cells
        return raw

    @model_validator(mode="after")
    def _derived(self) -> "Settings":
        """Defaults that follow other settings, and rules across settings."""
        self.model_dir = self.model_dir or self.state_dir / "models"
        if cells := parse_cells(self.broker_url or ""):
            if self.result_backend:
                raise ConfigError(f"{PREFIX}RESULT_BACKEND", "with cells, each keeps its own "
                                  "results: leave it unset")
            self._cells = cells
            self.broker_url = cells.get(self.pool) or next(iter(cells.values()))
        self.broker_url = self.broker_url or f"redis+socket://{self.embedded_socket}"
        self.result_backend = self.result_backend or self.broker_url
        _check_across(self)
        return self


def _check_across(s: Settings) -> None:
    if not s.sentinel_master and any(str(url).startswith("sentinel://")
                                     for url in (s.broker_url, s.result_backend)):
        raise ConfigError(f"{PREFIX}SENTINEL_MASTER", "a sentinel:// broker or result backend "
                          "needs the name of the master the Sentinels watch")
    if unknown := set(s.min_replicas) - set(s.models):
        raise ConfigError(f"{PREFIX}MIN_REPLICAS", f"unknown models {sorted(unknown)}")
    if unknown := set(s.warm_models) - set(s.models):
        raise ConfigError(f"{PREFIX}WARM_MODELS", f"unknown models {sorted(unknown)}: a warm "
                          f"model must be one of {PREFIX}MODELS")
    # sizes known without importing a model: the built-in family's (workers check all)
    if s.device != "cuda" and (known_mb := DEMO_MODEL_MB * sum(
            s.models[name] == DEMO_TARGET for name in s.warm_models)) > s.model_memory_mb:
        raise ConfigError(f"{PREFIX}WARM_MODELS", f"the warm models need {known_mb} MB, more "
                          f"than {PREFIX}MODEL_MEMORY_MB={s.model_memory_mb}")
    for name in ("max_batch", "max_queue_delay_ms"):
        if unknown := set(getattr(s, name)) - {"*"} - set(s.models):
            raise ConfigError(f"{PREFIX}{name.upper()}", f"unknown models {sorted(unknown)}")


def load(**values: Any) -> Settings:
    """Settings from the environment, ``values`` (by field name) over it; a bad value
    raises :class:`ConfigError` naming its variable."""
    if retired := retired_in(os.environ, PREFIX):
        raise ConfigError(*retired)
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
    environment; derived values follow. Inside another override, these win."""
    values = {**_changes[-1], **values}
    changed = load(**values)
    before = current()
    _changes.append(values)
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


#: The settings in force, typed as :class:`Settings` (an unknown name is a type error).
settings: Settings = cast(Settings, _InForce())

