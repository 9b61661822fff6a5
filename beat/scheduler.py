"""A beat scheduler that runs control-plane tasks inside the beat process, when it leads.

Heartbeat collection must never queue behind a GPU job in a lane, and it is
singleton work by nature; beat is the one process that is both. Any number of beats
may run: only the leader (``beat.lease``) runs a round, fenced by its epoch
(``tasks.broker.leader``); a standby skips its entries until it leads. Every other
entry is sent to the broker as usual, by the leader only. Beat's tasks are imported
here, so only beat registers them: a control task sent to a GPU worker is refused there.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from celery.beat import ScheduleEntry, Scheduler

from beat import heartbeat, movers  # noqa: F401  beat's tasks: registered in beat only
from beat.lease import Leadership
from routing.names import HEARTBEAT_TASK, MOVERS_TASK
from tasks.broker.app import redis_client
from tasks.broker.eviction import check_when_answered
from tasks.broker.leader import fenced
from tasks.errors import ConfigError

log = logging.getLogger(__name__)
IN_BEAT = frozenset({HEARTBEAT_TASK, MOVERS_TASK})


def refuse_evicting_redis() -> None:
    """Exit with EX_CONFIG (78, as a GPU worker does) on a Redis that may evict keys: it
    would lose lanes and epochs in silence, and starting again cannot help."""
    try:
        check_when_answered(redis_client)
    except ConfigError as exc:
        log.critical("beat will not start: %s: %s", type(exc).__name__, exc)
        raise SystemExit(os.EX_CONFIG) from exc


class LanesScheduler(Scheduler):
    """In-memory schedule from ``beat_schedule``; ``IN_BEAT`` tasks run here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        refuse_evicting_redis()
        self.leadership = Leadership()
        super().__init__(*args, **kwargs)

    def setup_schedule(self) -> None:
        super().setup_schedule()
        self.leadership.start()

    def close(self) -> None:
        self.leadership.stop()
        super().close()

    def apply_async(self, entry: ScheduleEntry, producer: Any = None,
                    advance: bool = True, **kwargs: Any) -> Any:
        epoch = self.leadership.current()
        if not epoch:  # standing by: the leader runs it
            return self.reserve(entry) if advance else None
        if entry.task not in IN_BEAT:
            with fenced(epoch):
                return super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        entry = self.reserve(entry) if advance else entry
        try:
            with fenced(epoch):
                return self.app.tasks[entry.task](*entry.args, **entry.kwargs)
        except Exception:  # noqa: BLE001  one bad round must not stop beat
            log.exception("beat task %s failed; trying again next round", entry.task)
            return None
