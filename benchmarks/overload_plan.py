"""What an overload run is set to: its budgets and its command line, resolved.

Shared by ``benchmarks/overload.py`` and the modules it drives (its trials' figures,
gpulanes' side), which import it and never ``overload`` itself.
"""
from __future__ import annotations

from dataclasses import dataclass

from benchmarks.common import JobSize

FAST_BUDGET_JOBS, STANDARD_BUDGET_JOBS = 10, 60


@dataclass(frozen=True)
class Budgets:
    """One job-time and the fast and standard lane budgets, in seconds."""

    job_s: float
    fast_s: float
    standard_s: float

    @classmethod
    def from_capacity(cls, capacity: float, workers: int) -> "Budgets":
        """Budgets in job-times of a pool of ``workers`` serving ``capacity`` jobs/s."""
        job_s = workers / capacity
        return cls(job_s, FAST_BUDGET_JOBS * job_s, STANDARD_BUDGET_JOBS * job_s)

    def env(self) -> dict[str, str]:
        """The budgets beat reads."""
        return {"GPULANES_MAX_WAIT_S": f"fast={self.fast_s:.3f},standard={self.standard_s:.3f}"}


@dataclass(frozen=True)
class Settings:
    """The command line, resolved."""

    workers: int
    duration_s: float
    drain_s: float
    repeats: int
    size: JobSize
    mix: dict[str, float]
    seed: int
    paced: bool = True
