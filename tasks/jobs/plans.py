"""Plans: what an account's API key lets it do (fast seconds per period, jobs at once,
jobs queued, whether relaxed is open to it), modelled on Midjourney's.

A plan is named by the key that carries it (``tasks.jobs.apikeys``). The figures are
the defaults of a service that sells GPU time by the hour; an operator who sells
otherwise sets their own in code.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tasks.errors import InvalidJob

HOUR_S = 3600
#: A plan's period: its fast seconds are renewed at the start of each, with no rollover.
MONTH_S = 30 * 24 * HOUR_S


class Plan(BaseModel):
    """What an account on this plan may do."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    #: Fast GPU seconds each period, renewed at its start (no rollover).
    fast_seconds: float = Field(ge=0)
    period_s: int = Field(default=MONTH_S, gt=0)
    #: Fast jobs running at once.
    concurrent_fast: int = Field(ge=0)
    #: Jobs running at once, every lane.
    concurrent_jobs: int = Field(ge=1)
    #: Jobs waiting in the lanes at once.
    queued_jobs: int = Field(ge=1)
    #: Whether the relaxed lane is open to it: without it, spent fast time refuses.
    relax: bool = True


#: The plans a key may carry, from the smallest.
PLANS: dict[str, Plan] = {plan.name: plan for plan in (
    Plan(name="basic", fast_seconds=3.3 * HOUR_S, concurrent_fast=3, concurrent_jobs=3,
         queued_jobs=10, relax=False),
    Plan(name="standard", fast_seconds=15 * HOUR_S, concurrent_fast=3, concurrent_jobs=3,
         queued_jobs=10),
    Plan(name="pro", fast_seconds=30 * HOUR_S, concurrent_fast=12, concurrent_jobs=12,
         queued_jobs=10),
    Plan(name="mega", fast_seconds=60 * HOUR_S, concurrent_fast=12, concurrent_jobs=12,
         queued_jobs=10),
)}
DEFAULT_PLAN = "standard"


def plan(name: str) -> Plan:
    """The plan called ``name``, or :class:`InvalidJob` naming ``plan``."""
    found = PLANS.get(name) if isinstance(name, str) else None
    if found is None:
        raise InvalidJob("plan", f"must be one of {', '.join(PLANS)}, got {name!r}")
    return found
