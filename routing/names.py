"""Lane, tier, queue, task and command names: what routing speaks of (Redis keys
are the broker's: ``tasks.broker.keys``)."""
from __future__ import annotations

FAST = "fast"
STANDARD = "standard"
RELAXED = "relaxed"
#: Lanes in priority order: workers consume them in exactly this order.
LANES: tuple[str, ...] = (FAST, STANDARD, RELAXED)
TIERS: tuple[str, ...] = LANES
#: The kombu priority of each level of an account in a lane (light users first).
RELAX_LEVEL_PRIORITIES: tuple[int, ...] = (1, 3, 6, 9)
#: kombu priority steps; a worker takes a lane's lists before the next lane's (lane
#: order holds), level by level within a lane. 0 is above every account's level: in
#: relaxed, the jobs that aged there, or were moved down past their budget; in standard,
#: the fast jobs the load moved there. So they go before fresh jobs of any list a worker
#: serves ahead of theirs (a worker takes its own queue's jobs before the shared lane's
#: of the same level).
RELAX_PRIORITIES: tuple[int, ...] = (0, *RELAX_LEVEL_PRIORITIES)
#: A standard lane's first level: its step 0 (the fast jobs the load moved there) and the
#: level of the accounts of least recent usage. Such a job is placed by the work it would
#: wait for (``routing.compact.first_work``), and a heavier run of its worker steps aside
#: for it at its next step (``gpu_worker.preempt``), as for a fast job.
FIRST_STEPS: tuple[int, ...] = (0, RELAX_LEVEL_PRIORITIES[0])
#: Lanes whose new jobs enter at a level raised by their account's jobs already waiting
#: there (``routing.fair.queued_level``), checked live by the publish; in relaxed, the
#: level is by recent usage alone (its aging lifts the heaviest users' jobs in time).
FAIR_LANES: tuple[str, ...] = (FAST, STANDARD)


def worker_queue(lane: str, node: str) -> str:
    """A worker's own queue of ``lane``: jobs routed to it for its warm models."""
    return f"{lane}.{node}"


def lane_of(queue: str) -> str:
    """The lane a queue serves: ``fast.gpu0@host`` and ``fast`` are both ``fast``."""
    return queue.split(".", 1)[0]


def worker_queues(node: str) -> list[str]:
    """What a worker consumes, in order: its own queue before each shared lane."""
    return [name for lane in LANES for name in (worker_queue(lane, node), lane)]


#: The one Celery task that runs a job, of any model.
JOB_TASK = "gpulanes.run_job"
#: Its earlier names: a message queued under one still runs as a job.
JOB_TASK_ALIASES: tuple[str, ...] = ("gpulanes.generate",)
#: Every task name a job's message may carry.
JOB_TASK_NAMES = frozenset((JOB_TASK, *JOB_TASK_ALIASES))
HEARTBEAT_TASK = "gpulanes.heartbeat"
MOVERS_TASK = "gpulanes.move_queued"
#: Custom worker inspect command answered by the consumer thread.
STATS_COMMAND = "lanes_stats"
#: Custom worker control command: load a model ahead of traffic.
PREWARM_COMMAND = "lanes_prewarm"
#: Custom worker control command: consume exactly these queues, in this order (a
#: sick worker stepping aside sends itself none, and its queues when it is well).
CONSUME_COMMAND = "lanes_consume"


def worker_hostname(index: int) -> str:
    """Celery node name of the worker pinned to device ``index``."""
    return f"gpu{index}@%h"


def first_level(lane: str, priority: int | None) -> bool:
    """Whether a job of ``lane`` at kombu ``priority`` is of standard's first level."""
    return lane == STANDARD and (priority or 0) in FIRST_STEPS


def heavier(lane: str, priority: int | None) -> bool:
    """Whether a run of ``lane`` at ``priority`` steps aside for a first-level standard
    job (``gpu_worker.preempt``): a relaxed run, or a standard one of a later level."""
    return lane != FAST and not first_level(lane, priority)
