"""Per-process worker state: the warm models and the load figures heartbeats report."""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_worker.models import ImageModel, load_model

log = logging.getLogger(__name__)
#: Weight of the newest sample in the service-time moving average.
EWMA_ALPHA = 0.2


@dataclass
class Runtime:
    """What one worker process holds: its device, warm models and counters."""

    device: str = "unset"
    specs: dict[str, str] = field(default_factory=dict)
    model_dir: Path = Path(".")
    models: dict[str, ImageModel] = field(default_factory=dict)
    load_ms: dict[str, float] = field(default_factory=dict)
    in_flight: int = 0
    served: int = 0
    failed: int = 0
    service_ms: float | None = None
    started_at: float = field(default_factory=time.time)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def configure(self, device: str, specs: dict[str, str], model_dir: Path) -> None:
        self.device, self.specs, self.model_dir = device, dict(specs), Path(model_dir)

    def model(self, name: str) -> tuple[ImageModel, float | None]:
        """The warm model ``name`` and, if this call had to load it, its load time."""
        with self._lock:  # one loader at a time; the others then find it warm
            if name in self.models:
                return self.models[name], None
            load_ms = self._load(name)
            return self.models[name], load_ms

    def _load(self, name: str) -> float:
        began = time.perf_counter()
        model = load_model(name, self.specs, self.device, self.model_dir)
        model.warmup()
        load_ms = (time.perf_counter() - began) * 1000
        self.models[name], self.load_ms[name] = model, load_ms
        log.info("model %s warm on %s in %.0f ms", name, self.device, load_ms)
        return load_ms

    def job_started(self) -> None:
        with self._lock:
            self.in_flight += 1

    def job_finished(self, run_ms: float | None) -> None:
        with self._lock:
            self.in_flight -= 1
            if run_ms is None:
                self.failed += 1
                return
            self.served += 1
            prev = self.service_ms
            self.service_ms = run_ms if prev is None else prev + EWMA_ALPHA * (run_ms - prev)

    def stats(self) -> dict[str, Any]:
        """The heartbeat reply: liveness and load, JSON-ready."""
        with self._lock:
            return {
                "device": self.device, "pid": os.getpid(), "at": time.time(),
                "started_at": self.started_at, "in_flight": self.in_flight,
                "served": self.served, "failed": self.failed,
                "service_ms": self.service_ms, "warm_models": sorted(self.models),
                "load_ms": dict(self.load_ms),
            }


#: The one runtime of this worker process.
RUNTIME = Runtime()
