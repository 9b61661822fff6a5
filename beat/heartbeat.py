"""Heartbeats: ask every worker for its load; write the snapshot routers read.

Each round: read the stats the workers pushed (``gpu_worker.stats``: from a thread of
its own, even mid-job; no broadcast to wait on) and fold them into the worker record
beat keeps as leader (``beat.record``: only what changed since the last round; a
worker that misses ``MISSES_ALLOWED`` rounds in a row is dead), measure the lanes from
their depth counters (``beat.depths``: only the lists whose depth changed move the
workers' counts) and the slots each keeps busy, state each budgeted lane's admission
(what a publish lets in), step the lane policy, and publish it all as one snapshot in
Redis, fenced by the leader's epoch (``tasks.broker.leader``). Jobs queued for a worker
that is dead or sick (it stepped aside, ``sick`` in its reply) go back to the shared
lanes. Fast jobs stuck behind fast work move to another
holder of their model, and idle workers take queued jobs of the models they hold warm
(``beat.balance``). Dead letters past ``DEAD_TTL_S`` are dropped, a bounded
batch per round, read from their index (nothing due: one cheap call).
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Collection, Mapping

import redis

from beat import scaling
from beat.balance import give_idle_work
from beat.costs import queued_sample
from beat.depths import Depths
from beat.health import MISSES_ALLOWED, requeue_dead, unheard_holders
from beat.record import FORGET_AFTER_S, RECORD
from beat.replicas import keep_replicas
from beat.shared import return_to_shared_lanes
from beat.snapshot import QueuedJob, Sums, lane_loads, next_policy
from beat.standing import Standing
from routing.names import FAST, HEARTBEAT_TASK, LANES, first_level
from routing.policy import (FAIR_UNIT_S, RELEASE_RATIO, RELEASE_SAMPLES, admission_waits,
                            relax_levels)
from routing.splitter import Splitter
from tasks.broker import leader, scripts
from tasks.broker.app import app, redis_client
from tasks.broker.handover import holders
from tasks.broker.eviction import SAFE_POLICY
from tasks.broker.memory import memory_use
from tasks.broker.outage import RedisRefused
from tasks.broker.stats import fresh_stats
from tasks.broker.keys import (
    BEAT_EPOCH_KEY,
    BEAT_PROBE_KEY,
    DEAD_TTL_S,
    FAIR_WINDOW_S,
    FAST_EXHAUSTED_KEY,
    LIST_DEPTHS_KEY,
    PRIORITY_SEP,
    SNAPSHOT_KEY,
    USAGE_BUCKET_S,
    WORKERS_BY_KEY,
    WORKERS_KEY,
    lane_of_key,
    members_key,
    usage_key,
)
from tasks.jobs.deadletter import drop_dead
from tasks.settings import settings

log = logging.getLogger(__name__)
#: Service time assumed for a lane before any of its jobs was measured.
DEFAULT_SERVICE_S = 1.0
#: How late a worker's stats push may be, past a heartbeat, and still count for a round.
PUSH_GRACE_S = 0.5
#: Seconds a members doc outlives the last round that named it: a router reading a
#: snapshot just before a new version finds the doc it names.
MEMBERS_TTL_S = 600


#: Rounds further apart than this many heartbeats (this beat did not lead, or Redis
#: refused writes) count no miss: a worker silent meanwhile had no round to answer
#: (its stats pushes refused too), and gets a full window once rounds resume.
ROUND_GAP_HEARTBEATS = 2.5
#: When this process's last round was written (None: it has not led a round yet).
_last_round_at: list[float | None] = [None]
#: The lists' depths and each worker's queued counts, as this process read them last.
DEPTHS = Depths()
#: The idle workers and those that serve no more, as this process's record has them.
STANDING = Standing()
#: The snapshot's two parts (``routing.compact``), as this process's record gives them.
SPLIT = Splitter()


def ask_workers(client: redis.Redis) -> dict[str, dict]:
    """{hostname: stats} of each worker that pushed its stats this round (within a
    heartbeat and ``PUSH_GRACE_S``: ``tasks.broker.stats``)."""
    return fresh_stats(client, settings.heartbeat_s + PUSH_GRACE_S, FORGET_AFTER_S)


def list_lengths(client: redis.Redis) -> dict[str, dict[str, int]]:
    """Per lane, the jobs in each of its lists that hold any (every priority level of
    the shared lane and of each worker's own queue of it), from the depth counters the
    queue protocol keeps (``tasks.broker.keys.LIST_DEPTHS_KEY``): one read, whatever the number
    of workers and lists."""
    lengths: dict[str, dict[str, int]] = {lane: {} for lane in LANES}
    for key, count in client.hgetall(LIST_DEPTHS_KEY).items():
        if (count := int(count)) > 0:
            key = key.decode() if isinstance(key, bytes) else key
            if (lane := lane_of_key(key)) in lengths:
                lengths[lane][key] = count
    return lengths


def lane_depths(client: redis.Redis, workers: dict[str, dict] | None = None,
                lengths: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, int]:
    """Queued jobs per lane (from ``lengths``, else read); each worker record gets its
    own ``queued`` count, ``queued_fast``: those of its own fast queue, and
    ``queued_first``: those of its own standard queue's first level
    (``routing.names.FIRST_STEPS``); the records whose counts change are marked in
    ``beat.record.RECORD``."""
    workers = {} if workers is None else workers
    lengths = list_lengths(client) if lengths is None else lengths
    queued: dict[str, int] = {}
    queued_fast: dict[str, int] = {}
    queued_first: dict[str, int] = {}
    for lane, per_list in lengths.items():
        for key, count in per_list.items():
            queue, _, step = key.partition(PRIORITY_SEP)
            node = queue.partition(".")[2]
            queued[node] = queued.get(node, 0) + count
            if lane == FAST:
                queued_fast[node] = queued_fast.get(node, 0) + count
            elif node and first_level(lane, int(step or 0)):
                queued_first[node] = queued_first.get(node, 0) + count
    for host, worker in workers.items():
        counts = (queued.get(host, 0), queued_fast.get(host, 0), queued_first.get(host, 0))
        if counts != (worker.get("queued"), worker.get("queued_fast"),
                      worker.get("queued_first")):
            worker["queued"], worker["queued_fast"], worker["queued_first"] = counts
            RECORD.mark_changed([host])
    return {lane: sum(per_list.values()) for lane, per_list in lengths.items()}


def recent_usage(client: redis.Redis, now: float) -> dict[str, float]:
    """GPU seconds per account over the fair-relax window."""
    newest = int(now) // USAGE_BUCKET_S
    buckets = range(newest - FAIR_WINDOW_S // USAGE_BUCKET_S, newest + 1)
    with client.pipeline(transaction=False) as pipe:
        for bucket in buckets:
            pipe.hgetall(usage_key(bucket))
        usage: dict[str, float] = {}
        for counts in pipe.execute():
            for account, seconds in counts.items():
                usage[account] = usage.get(account, 0.0) + float(seconds)
    return usage


def _log_changes(previous: dict, policy: dict, loads: dict) -> None:
    for lane, state in policy.items():
        if state["overloaded"] != previous.get(lane, {}).get("overloaded", False):
            log.warning("%s lane %s: expected wait %.1fs", lane,
                        "overloaded" if state["overloaded"] else "back to normal",
                        loads[lane]["expected_wait_s"])


def build_snapshot(client: redis.Redis, workers: dict, now: float,
                   lengths: Mapping[str, Mapping[str, int]] | None = None,
                   sample: dict[str, list[QueuedJob]] | None = None,
                   sums: Sums | None = None,
                   depths: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Measure lanes, step the policy, gather accounts: the snapshot for routers
    (``lengths``: the lists' lengths, read here if not given; ``sample``: a dict that
    receives the sample of the queued jobs; ``sums``: the serving workers' figures as
    beat keeps them, ``beat.tally``; ``depths``: queued jobs per lane, the workers'
    counts already in their records: else counted here, ``lane_depths``)."""
    previous = json.loads(client.get(SNAPSHOT_KEY) or "{}").get("policy", {})
    measured_at = time.time()  # routers count their own sends from here on
    lengths = list_lengths(client) if lengths is None else lengths
    queued = queued_sample(client, lengths)
    if sample is not None:
        sample.update(queued)
    if depths is None:
        depths = lane_depths(client, workers, lengths)
    loads = lane_loads(workers, depths, DEFAULT_SERVICE_S, queued,
                       admission_waits(settings.max_wait_s, RELEASE_RATIO), sums)
    policy = next_policy(previous, loads, settings.max_wait_s, RELEASE_RATIO, RELEASE_SAMPLES)
    _log_changes(previous, policy, loads)
    return {"at": now, "measured_at": measured_at, "epoch": int(leader.epoch() or 0),
            "lanes": loads, "policy": policy,
            "workers": workers,
            "exhausted": sorted(client.smembers(FAST_EXHAUSTED_KEY)),
            "levels": relax_levels(recent_usage(client, now), FAIR_UNIT_S),
            "redis": _memory(client)}


class _Written:
    """The members version this beat process last wrote whole (its doc then needs only
    its time to live renewed: most rounds change no membership)."""

    version = ""


def write_round(client: redis.Redis, snapshot: dict, workers: Mapping[str, dict],
                changed: Collection[str] | None = None, mark: str = "") -> bool:
    """Store the worker record (whole, or only the workers ``changed``: those gone from
    ``workers`` are dropped), the members doc and the compact snapshot routers read
    (``routing.compact``: only the changed workers worked out again, ``SPLIT``), fenced
    by beat's epoch (one step), marked by ``mark``; False, having written nothing, when
    another beat leads."""
    compact, members = SPLIT.split({**snapshot, "workers": workers}, changed)
    version = members["version"]
    hosts = workers if changed is None else changed
    records = [item for host in hosts for item in
               (host, json.dumps(workers[host]) if host in workers else "")]
    docs = iter((lambda: "" if _Written.version == version else json.dumps(members),
                 lambda: json.dumps(members)))
    for doc in docs:
        written = scripts.run(client, "beat_write",
                              [BEAT_EPOCH_KEY, SNAPSHOT_KEY, WORKERS_KEY, members_key(version),
                               WORKERS_BY_KEY],
                              [leader.epoch(), json.dumps(compact), doc(), MEMBERS_TTL_S,
                               "1" if changed is None else "", mark, *records])
        if written != -1:  # -1: the doc to renew was gone (evicted, flushed): write it whole
            break
    _Written.version = version if written == 1 else ""
    return written == 1


def expire_dead_letters(client: redis.Redis, now: float) -> int:
    """Drop one batch of the dead letters older than the retention; how many (none
    outside a leader's epoch)."""
    if not leader.leading("dead-letter expiry"):
        return 0
    dropped = drop_dead(client, now - DEAD_TTL_S)
    if dropped:
        log.info("dropped %d dead letter(s) older than %ss (DEAD_TTL_S)", dropped, DEAD_TTL_S)
    return dropped


def _memory(client: redis.Redis) -> dict[str, Any]:
    """Redis' memory use, complaining of an evicting policy set since the cluster started
    (it would drop jobs, results and leases in silence)."""
    memory = memory_use(client)
    if memory["policy"] not in (None, SAFE_POLICY):
        log.error("Redis' maxmemory-policy is %r: it may evict jobs, results and leases "
                  "without a trace; set it to %s", memory["policy"], SAFE_POLICY)
    return memory


def takes_no_writes(client: redis.Redis) -> str | None:
    """Why Redis refuses writes now (out of memory, its disk...), or None. Workers' stats
    pushes are refused too, then: a round would count them missed and put back the jobs
    of workers that are alive and running them."""
    try:
        client.set(BEAT_PROBE_KEY, leader.epoch(), px=int(2000 * settings.heartbeat_s))
    except RedisRefused as exc:
        log.warning("Redis refuses writes (%s): no worker is judged until it takes them",
                    exc.said)
        return exc.reason
    return None


@app.task(name=HEARTBEAT_TASK)
def heartbeat() -> str:
    """One heartbeat round: store the snapshot; return a one-line summary. Only under a
    leader's epoch (beat's scheduler): anywhere else it writes nothing."""
    if not leader.leading("the heartbeat round"):
        return leader.NOT_LEADING
    client = redis_client()
    if refused := takes_no_writes(client):
        return f"Redis refuses writes ({refused}): no round, no worker judged"
    now = time.time()
    last = _last_round_at[0]
    steady = last is not None and now - last <= ROUND_GAP_HEARTBEATS * settings.heartbeat_s
    workers = RECORD.round(client, now, settings.heartbeat_s + PUSH_GRACE_S, MISSES_ALLOWED,
                           steady)
    holding = holders(client)
    RECORD.add(unheard_holders(holding, workers, now))
    touched = DEPTHS.read(client)  # the owners of lists whose depth changed
    RECORD.mark_changed(DEPTHS.counted(workers, workers if RECORD.changed is None else
                                       RECORD.changed | touched))
    STANDING.update(workers, RECORD.changed)
    tally, lengths, sample = RECORD.tallied(), DEPTHS.lengths, {}
    snapshot = build_snapshot(client, workers, now, lengths, sample, tally.serving(),
                              DEPTHS.totals())
    mark = RECORD.new_mark(leader.epoch())
    if not write_round(client, snapshot, workers, RECORD.changed, mark):
        return "another beat leads: nothing written"
    RECORD.written(mark)
    scaling.write(client, scaling.plan(scaling.read(client), workers, snapshot["lanes"],
                                       sample, settings.max_wait_s, now, tally), now)
    _last_round_at[0] = now
    requeue_dead(client, workers, holding, MISSES_ALLOWED)
    for host in sorted(STANDING.unserved & DEPTHS.owners.keys()):  # dead, or sick
        return_to_shared_lanes(client, host, "is sick" if workers[host]["alive"] else "is gone")
    for host in DEPTHS.unknown(workers):  # forgotten, or never heard of
        return_to_shared_lanes(client, host, "is unknown")
    keep_replicas(app, workers, settings.min_replicas)
    expire_dead_letters(client, now)
    give_idle_work(client, workers, lengths, settings.heartbeat_s, DEFAULT_SERVICE_S,
                   idle_hosts=sorted(STANDING.idle))
    alive = sum(pool.alive for pool in tally.pools.values())
    return f"{alive}/{len(workers)} workers alive; " + ", ".join(
        f"{lane} {load['depth']} queued ~{load['expected_wait_s']:.1f}s"
        for lane, load in snapshot["lanes"].items())
