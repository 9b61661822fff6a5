"""The Celery app: configured from ``celeryconfig``, worker hooks wired once."""
from __future__ import annotations

from celery import Celery

from gpu_worker import hooks

app = Celery("gpulanes", include=["tasks.generate", "beat.heartbeat", "beat.movers"])
app.config_from_object("celeryconfig")
hooks.install()
