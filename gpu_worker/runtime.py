"""Per-process worker state: the warm models and the load figures heartbeats report."""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any, Callable

from gpu_worker.costfit import CostFit
from gpu_worker.memory import cuda_allocated, declared_mb, tensor_bytes, to_mb
from gpu_worker.models import ImageModel, load_model, model_target
from tasks.errors import ModelError

log = logging.getLogger(__name__)
#: Weight of the newest sample in the service-time moving average.
EWMA_ALPHA = 0.2
#: How many of the latest between-jobs times (``Runtime.between_jobs``) their median
#: is taken over, and how many it needs first.
BETWEEN_SAMPLES = 31
BETWEEN_FIRST = 5
#: A gap between jobs longer than this is no worker's bookkeeping: the job came to it
#: some other way (handed over by beat from another worker's queue) and is left out.
BETWEEN_MAX_MS = 1000.0


@dataclass
class Runtime:
    """What one worker process holds: its device, warm models and counters."""

    device: str = "unset"
    hostname: str = "unset"
    specs: dict[str, str] = field(default_factory=dict)
    model_dir: Path = Path(".")
    #: Warm models, least recently used first; their sizes within ``budget_mb``.
    models: OrderedDict[str, ImageModel] = field(default_factory=OrderedDict)
    #: What models may take on this worker's device, in MB (``gpu_worker.memory``).
    budget_mb: int = 1
    #: Each model's size in MB, declared or measured at its load (kept after eviction:
    #: room is made for it before its next load).
    sizes_mb: dict[str, int] = field(default_factory=dict)
    load_ms: dict[str, float] = field(default_factory=dict)
    #: Models being loaded ahead of traffic (prewarm) in a background thread.
    loading: set[str] = field(default_factory=set)
    in_flight: dict[str, int] = field(default_factory=dict)
    #: Of them, standard jobs of its first level (``routing.names.FIRST_STEPS``).
    in_flight_first: int = 0
    served: int = 0
    failed: int = 0
    #: Moving average of service time per lane (a lane's jobs differ in size): the time
    #: a job holds its slot, its run (prerun to postrun) and the worker's time between
    #: jobs (``between_jobs``) together.
    service_ms: dict[str, float] = field(default_factory=dict)
    #: The latest times from a job's end to the next one's start, while that one waited.
    between_ms: deque[float] = field(default_factory=lambda: deque(maxlen=BETWEEN_SAMPLES))
    #: Per model, service time as a line in the job's cost (``Job.cost``): what beat
    #: prices each queued job by to estimate a lane's wait.
    cost_fits: dict[str, CostFit] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    #: Per lane, its jobs' time in flight summed (job-seconds) up to ``_counted_at``: beat
    #: reads from its growth the slots each lane keeps busy (``beat.record.busy_slots``).
    busy_s: dict[str, float] = field(default_factory=dict)
    _counted_at: dict[str, float] = field(default_factory=dict, repr=False)
    #: The clock of ``busy_s`` and of the replies' ``at`` (a simulation sets its own).
    clock: Callable[[], float] = field(default=time.time, repr=False)
    # Counters and model loading lock apart: the consumer thread reads the
    # counters for heartbeats and must never wait out a model load.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _load_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def configure(self, hostname: str, device: str, specs: dict[str, str],
                  model_dir: Path, budget_mb: int) -> None:
        self.hostname, self.device, self.budget_mb = hostname, device, budget_mb
        self.specs, self.model_dir = dict(specs), Path(model_dir)

    @property
    def held_mb(self) -> int:
        """MB the warm models hold together."""
        return sum(self.sizes_mb.get(name, 0) for name in self.models)

    def size_of(self, name: str) -> int | None:
        """``name``'s size: declared by its class, else as measured at a load; None
        before its first load when it declares none."""
        if name not in self.sizes_mb:
            declared = declared_mb(model_target(name, self.specs), name)
            if declared is None:
                return None
            self.sizes_mb[name] = declared
        return self.sizes_mb[name]

    @property
    def incarnation(self) -> str:
        """This process's identity, "host/pid/start": a restarted worker keeps only its name."""
        return f"{self.hostname}/{os.getpid()}/{self.started_at:.3f}"

    def model(self, name: str) -> tuple[ImageModel, float | None]:
        """The warm model ``name`` and, if this call had to load it, its load time."""
        with self._lock:
            if name in self.models:
                self.models.move_to_end(name)
                return self.models[name], None
        with self._load_lock:  # one loader at a time; the others then find it warm
            if name in self.models:
                return self.models[name], None
            with self._lock:  # reported as loading meanwhile: no fast job can preempt it
                self.loading.add(name)
            try:
                load_ms = self._load(name)
            finally:
                with self._lock:
                    self.loading.discard(name)
            return self.models[name], load_ms

    def prewarm(self, name: str) -> str:
        """Load ``name`` in a background thread unless it is warm or loading already."""
        with self._lock:
            if name in self.models or name in self.loading:
                return "warm" if name in self.models else "loading"
            if name not in self.specs:
                raise KeyError(f"unknown model {name!r}")
            self.loading.add(name)
        threading.Thread(target=self._prewarm, args=(name,), daemon=True,
                         name=f"prewarm-{name}").start()
        return "loading"

    def _prewarm(self, name: str) -> None:
        try:
            self.model(name)
        except Exception:  # noqa: BLE001  a failed prewarm must not kill the worker
            log.exception("prewarm of %s failed", name)
        finally:
            with self._lock:
                self.loading.discard(name)

    def _evict_to_fit(self, size_mb: int, keep: str = "") -> None:
        """Evict least recently used models (never ``keep``) until ``size_mb`` more fits:
        evict before loading, a GPU may not hold both."""
        evicted = False
        while self.held_mb + size_mb > self.budget_mb:
            with self._lock:
                name = next((m for m in self.models if m != keep), None)
                if name is None:
                    break
                del self.models[name]
                self.load_ms.pop(name, None)
            evicted = True
            log.info("model %s evicted (least recently used; %d MB of %d MB held)", name,
                     self.held_mb, self.budget_mb)
        torch = sys.modules.get("torch")
        if evicted and torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _load(self, name: str) -> float:
        known = self.size_of(name)
        if known is not None and known > self.budget_mb:
            raise ModelError(f"model {name!r} needs {known} MB, more than this worker's "
                             f"budget of {self.budget_mb} MB")
        self._evict_to_fit(known or 0)
        began, before = time.perf_counter(), cuda_allocated(self.device)
        model = load_model(name, self.specs, self.device, self.model_dir)
        size = known or declared_mb(model, name) or to_mb(max(
            tensor_bytes(model), cuda_allocated(self.device) - before))
        getattr(model, "warmup", lambda: None)()
        load_ms = (time.perf_counter() - began) * 1000
        with self._lock:
            self.sizes_mb[name] = size
            self.models[name], self.load_ms[name] = model, load_ms
        self._evict_to_fit(0, keep=name)  # a size known only now: the others make room
        log.info("model %s (%d MB) warm on %s in %.0f ms", name, size, self.device, load_ms)
        return load_ms

    def job_started(self, lane: str, first: bool = False) -> None:
        """A job of ``lane`` began (``first``: of standard's first level)."""
        with self._lock:
            self._in_flight_by(lane, 1)
            self.in_flight_first += first

    def _in_flight_by(self, lane: str, step: int) -> None:
        """Change ``lane``'s jobs in flight, its busy time counted up to now first (the
        caller holds the lock)."""
        now = self.clock()
        self.busy_s[lane] = self._busy_until(lane, now)
        self._counted_at[lane] = now
        self.in_flight[lane] = self.in_flight.get(lane, 0) + step

    def _busy_until(self, lane: str, now: float) -> float:
        return self.busy_s.get(lane, 0.0) + self.in_flight.get(lane, 0) * (
            now - self._counted_at.get(lane, now))

    def busy_until(self, now: float) -> dict[str, float]:
        """Each lane's job-seconds in flight since the process began, up to ``now``."""
        with self._lock:
            return {lane: round(self._busy_until(lane, now), 3) for lane in self.busy_s}

    def between_jobs(self, ms: float) -> None:
        """The worker took ``ms`` from a job's end to the start of the next, a job that
        was queued all that while: the message's ack, the next one's fetch, the task's
        set-up. Its slot is busy then, though no run is."""
        if 0.0 <= ms <= BETWEEN_MAX_MS:
            with self._lock:
                self.between_ms.append(ms)

    def _between(self) -> float:
        """Milliseconds between jobs: the median of the latest, once there are a few (a
        job handed over from another worker's queue waited for more than this worker)."""
        return median(self.between_ms) if len(self.between_ms) >= BETWEEN_FIRST else 0.0

    def job_finished(self, lane: str, service_ms: float | None, model: str = "",
                     cost: float = 1.0, first: bool = False) -> None:
        """A job of ``model`` (of ``cost``) left ``lane``: its run took ``service_ms``, or
        it failed (None). A run that came through holds its slot for the time between
        jobs too: its service time and the lane's busy time count both."""
        with self._lock:
            self._in_flight_by(lane, -1)
            self.in_flight_first -= first
            if service_ms is None:
                self.failed += 1
                return
            self.served += 1
            between = self._between()
            self.busy_s[lane] += between / 1000
            service_ms += between
            prev = self.service_ms.get(lane)
            self.service_ms[lane] = service_ms if prev is None else \
                prev + EWMA_ALPHA * (service_ms - prev)
            if model:
                self.cost_fits.setdefault(model, CostFit()).add(cost, service_ms)

    def stats(self) -> dict[str, Any]:
        """The heartbeat reply: liveness and load, JSON-ready."""
        now = self.clock()
        with self._lock:
            return {
                "device": self.device, "pid": os.getpid(), "at": now,
                "busy_s": {lane: round(self._busy_until(lane, now), 3) for lane in self.busy_s},
                "incarnation": self.incarnation, "started_at": self.started_at,
                "in_flight": dict(self.in_flight), "in_flight_first": self.in_flight_first,
                "served": self.served,
                "failed": self.failed, "service_ms": dict(self.service_ms),
                "between_ms": round(self._between(), 3),
                "cost_ms": {model: [round(part, 3) for part in fit.line()]
                            for model, fit in self.cost_fits.items()},
                "warm_models": list(self.models), "memory_mb": self.budget_mb,
                "model_mb": {name: self.sizes_mb[name] for name in self.models
                             if name in self.sizes_mb},
                "loading_models": sorted(self.loading),
                "load_ms": dict(self.load_ms),
            }


#: The one runtime of this worker process.
RUNTIME = Runtime()
