"""A beat scheduler that runs control-plane tasks inside the beat process.

Heartbeat collection must never queue behind a GPU job in a lane, and it is
singleton work by nature; beat is the one process that is both. Every other
entry is sent to the broker as usual.
"""
from __future__ import annotations

import logging
from typing import Any

from celery.beat import ScheduleEntry, Scheduler

from routing.names import HEARTBEAT_TASK, MOVERS_TASK

log = logging.getLogger(__name__)
IN_BEAT = frozenset({HEARTBEAT_TASK, MOVERS_TASK})


class LanesScheduler(Scheduler):
    """In-memory schedule from ``beat_schedule``; ``IN_BEAT`` tasks run here."""

    def apply_async(self, entry: ScheduleEntry, producer: Any = None,
                    advance: bool = True, **kwargs: Any) -> Any:
        if entry.task not in IN_BEAT:
            return super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        entry = self.reserve(entry) if advance else entry
        try:
            return self.app.tasks[entry.task](*entry.args, **entry.kwargs)
        except Exception:  # noqa: BLE001  one bad round must not stop beat
            log.exception("beat task %s failed; trying again next round", entry.task)
            return None
