"""Fair fast and standard lanes, as pure functions: the level a new job enters a lane at
(its account's recent usage, raised by its jobs already waiting there against a typical
other account's), and what the lane's limits count for a job at that level. The
publish evaluates the same rules on the live counters (``lua/fair.lua``,
``lua/limits.lua``); the simulator calls these."""
from __future__ import annotations

from typing import Mapping

from routing.lanes import Route
from routing.names import FAIR_LANES, RELAX_LEVEL_PRIORITIES
from routing.policy import MOVED_BY_LOAD, DepthLimit, PolicyView


#: An account's jobs waiting in a fast or standard lane raise the level its next job
#: enters there at once it has ``QUEUED_LEVEL_MIN`` of them, one level for each of these
#: ratios of its count to a typical other account's there it reaches (``queued_level``).
QUEUED_LEVEL_MIN = 2
QUEUED_LEVEL_RATIOS: tuple[float, ...] = (2.0, 4.0, 8.0)


def queued_level(waiting: int, depth: int, accounts: int) -> int:
    """The level an account's new job enters a fast or standard lane at, for ``waiting``
    of its jobs among the ``depth`` waiting there, of ``accounts`` accounts with jobs
    waiting (itself among them, once it has one). Its count is weighed against a typical
    other account's (their mean, plus one): an account with a job or two, or no more
    than twice the others', enters at 0, so accounts alike stay first come, first
    served; one that floods the lane goes down a level at each doubling, to 3. A light
    account's job then waits for at most the flood's first few, whatever its size."""
    if waiting < QUEUED_LEVEL_MIN:
        return 0
    typical = max(depth - waiting, 0) / max(accounts - 1, 1)
    ratio = waiting / (typical + 1)
    return sum(ratio >= bound for bound in QUEUED_LEVEL_RATIOS)


def fair_level(route: Route, account: str, view: PolicyView) -> int | None:
    """The least level a new job enters a fast or standard lane at: its account's level
    by recent usage, as in relaxed; the publish raises it by the account's jobs waiting
    there (``queued_level``, on the live counts). None where such levels do not apply:
    relaxed (``_relaxed_step``), and a job the load moved down (level 0, ahead of the
    lane's own jobs: it keeps its place in time)."""
    if route.lane not in FAIR_LANES or route.downgrade_reason in MOVED_BY_LOAD:
        return None
    return view.levels.get(account, 0)


#: The share of a lane's maximum depth a new job at each level may fill: a flood (level
#: 3) finds the lane full while lighter accounts' jobs still enter (``at_level``).
LEVEL_ROOM: tuple[float, ...] = (1.0, 0.95, 0.9, 0.85)


def at_level(limit: DepthLimit, level: int | None) -> DepthLimit:
    """``limit`` as a job entering at ``level`` meets it: a lane's maximum depth
    (``full``) shrunk to the level's room (``LEVEL_ROOM``); any other limit as it is."""
    if level is None or limit.why != "full":
        return limit
    return limit._replace(bound=limit.bound * LEVEL_ROOM[level])


def depths_ahead(lanes: Mapping[str, int], levels: Mapping[str, int], lane: str,
                 level: int | None) -> Mapping[str, int]:
    """The depths an admission (``Admission.limit``) reads for a job entering ``lane`` at
    ``level``: the other lanes whole; of its own, the jobs the load moved there and its
    levels up to its own (``levels``: "<lane>@<priority step>" -> jobs, as the depth
    counters keep them). The later levels' jobs come after it. None: the lane whole."""
    if level is None:
        return lanes
    steps = (0, *RELAX_LEVEL_PRIORITIES[:level + 1])
    return {**lanes, lane: sum(levels.get(f"{lane}@{step}", 0) for step in steps)}
