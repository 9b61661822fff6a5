"""Variables gpulanes no longer reads, and what took their place: setting one is a
``ConfigError`` naming it, never silently ignored."""
from __future__ import annotations

from typing import Mapping

_DEPTH = "use GPULANES_MAX_DEPTH=fast=N,standard=N,relaxed=N"
_WAIT = "use GPULANES_MAX_WAIT_S=fast=S,standard=S"
_IMAGE = "the image model's own limit now (tasks/jobs/image.py)"
_DERIVED = "no longer a setting: derived from the others (docs/configuration.md)"
_FIXED = "no longer a setting: a fixed value now (docs/configuration.md)"
_MEMORY = ("use GPULANES_MODEL_MEMORY_MB: workers hold models by memory now, not by count "
           "(docs/configuration.md)")
_NO_TIMER = ("no longer a setting: nothing is handed out again on a timer; a job goes back "
             "when the worker that holds it dies (docs/guarantees.md)")

#: Each retired name (after GPULANES_), and what to do instead.
RETIRED = {
    "MAX_DEPTH_FAST": _DEPTH, "MAX_DEPTH_STANDARD": _DEPTH, "MAX_DEPTH_RELAXED": _DEPTH,
    "MAX_WAIT_FAST_S": _WAIT, "MAX_WAIT_STANDARD_S": _WAIT,
    "MAX_PROMPT_CHARS": _IMAGE, "MAX_STEPS": _IMAGE, "MIN_SIDE": _IMAGE,
    "MAX_SIDE": _IMAGE, "VISIBILITY_TIMEOUT_S": _NO_TIMER, "MODEL_SLOTS": _MEMORY,
    **dict.fromkeys(("BEAT_LEASE_S", "SNAPSHOT_STALE_S", "PREEMPT_MIN_LEFT_S", "RUN_HUNG_S",
                     "REVOKE_TTL_S", "ARTIFACT_TTL_S", "REDIS_CONNECT_TIMEOUT_S",
                     "REDIS_REPLICA_WAIT_S", "FAIR_AGING_S", "STUCK_EXIT_S"), _DERIVED),
    **dict.fromkeys(("HASH_EPSILON", "ROUTE_HASHING", "RELEASE_RATIO", "RELEASE_SAMPLES",
                     "FAIR_UNIT_S", "FAIR_WINDOW_S", "DEFAULT_SERVICE_S", "HEARTBEAT_REPLY_S",
                     "MISSES_ALLOWED", "DEAD_TTL_S", "CACHE_BLOOM_CAPACITY",
                     "CACHE_BLOOM_ERROR", "REDIS_MEMORY_LIMIT", "PROGRESS_S", "SICK_AFTER",
                     "SICK_PROBE_S", "RETRY_BASE_S", "RETRY_CAP_S", "SENT_EVENTS",
                     "MAX_ACCOUNT_CHARS"), _FIXED),
}


def retired_in(environ: Mapping[str, str], prefix: str) -> tuple[str, str] | None:
    """The first retired variable set in ``environ`` (``GPULANES_X``, any case), and
    what to do instead; None when there is none."""
    for key in environ:
        name = key.upper().removeprefix(prefix)
        if key.upper().startswith(prefix) and name in RETIRED:
            return prefix + name, RETIRED[name]
    return None
