"""Which failures retry, and the backoff between attempts."""
from __future__ import annotations

import random

import pytest
import redis
import torch

from tasks.errors import JobTimeout, TransientJobError
from tasks.jobs.retry import backoff_s, is_transient


@pytest.mark.parametrize("exc", [TransientJobError("x"), MemoryError(), ConnectionError(),
                                 redis.exceptions.ConnectionError(),
                                 torch.cuda.OutOfMemoryError("CUDA out of memory")])
def test_transient(exc):
    assert is_transient(exc)


@pytest.mark.parametrize("exc", [ValueError("bug"), KeyError("w"), JobTimeout("slow")])
def test_not_transient(exc):
    assert not is_transient(exc)


def test_backoff_grows_exponentially_within_full_jitter():
    rng = random.Random(1)
    for attempt, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (10, 30.0)]:
        samples = [backoff_s(attempt, 0.5, 30.0, rng) for _ in range(500)]
        assert 0 <= min(samples) and max(samples) <= ceiling
        # full jitter spreads over the whole window, not a point
        assert max(samples) > 0.8 * ceiling and min(samples) < 0.2 * ceiling
