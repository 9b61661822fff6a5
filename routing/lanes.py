"""Tier -> lane: the first routing decision, a pure function."""
from __future__ import annotations

from dataclasses import dataclass

from routing.names import LANES, worker_queue


@dataclass(frozen=True)
class Route:
    """Where a job goes and, when it was moved, from where and why."""

    lane: str
    requested_tier: str
    downgraded_from: str | None = None
    downgrade_reason: str | None = None
    #: kombu message priority inside the lane (0 first); only relaxed uses it.
    priority: int = 0
    #: The worker whose own queue of the lane takes the job (None: the shared lane).
    node: str | None = None

    @property
    def queue(self) -> str:
        """The kombu queue to publish to."""
        return worker_queue(self.lane, self.node) if self.node else self.lane

    def as_dict(self) -> dict[str, str]:
        """The fields a result reports: where it ran and, if moved, why."""
        return {k: v for k, v in self.__dict__.items()
                if v is not None and k not in ("priority", "node")}


def lane_for(tier: str) -> str:
    """The lane that serves ``tier`` when the cluster is not under pressure."""
    if tier not in LANES:
        raise KeyError(f"unknown tier {tier!r}; expected one of {', '.join(LANES)}")
    return tier


def route(tier: str) -> Route:
    """Route v1: every tier runs in its own lane."""
    return Route(lane=lane_for(tier), requested_tier=tier)
