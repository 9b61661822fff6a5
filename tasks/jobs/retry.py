"""Which failures are worth another attempt, and how long to wait before it."""
from __future__ import annotations

import random
import sys

import redis

from tasks.errors import TransientJobError

_TRANSIENT: tuple[type[BaseException], ...] = (
    TransientJobError, MemoryError, ConnectionError, TimeoutError,
    redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
)


def is_transient(exc: BaseException) -> bool:
    """Out of memory, a lost connection, a lost worker: yes. A bug or bad weights: no."""
    if isinstance(exc, _TRANSIENT):
        return True
    torch = sys.modules.get("torch")  # only a worker has torch loaded
    return torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError)


def backoff_s(attempt: int, base_s: float, cap_s: float,
              rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base * 2**(attempt-1))]."""
    ceiling = min(cap_s, base_s * 2 ** max(attempt - 1, 0))
    return (rng or random).uniform(0, ceiling)
