"""Heartbeats: ask every worker for its load; write the snapshot routers read.

Each round: read the stats every worker pushed (``gpu_worker.stats``: from a thread of
its own, even mid-job; one read, no broadcast to wait on), fold them into the worker
record (a worker that misses ``MISSES_ALLOWED`` rounds in a row is dead),
measure the lanes from their depth counters and the slots each keeps busy, state each
budgeted lane's admission (what a publish lets in), step the lane policy, and publish it all
as one snapshot in Redis, fenced by the leader's epoch (``tasks.broker.leader``). Jobs
queued for a worker that is dead or sick (it stepped aside, ``sick`` in its
reply) go back to the shared lanes. Fast jobs stuck behind fast work move to another
holder of their model, and idle workers take queued jobs of the models they hold warm
(``beat.balance``). Dead letters past ``DEAD_TTL_S`` are dropped, a bounded
batch per round, read from their index (nothing due: one cheap call).
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any, Mapping

import redis

from beat import scaling
from beat.balance import give_idle_work
from beat.costs import queued_sample
from beat.health import MISSES_ALLOWED, requeue_dead, unheard_holders
from beat.replicas import keep_replicas
from beat.shared import return_to_shared_lanes
from beat.snapshot import QueuedJob, lane_loads, next_policy
from routing.compact import split
from routing.names import FAST, HEARTBEAT_TASK, LANES, first_level
from routing.placement import serving
from routing.policy import (FAIR_UNIT_S, RELEASE_RATIO, RELEASE_SAMPLES, admission_waits,
                            relax_levels)
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
    WORKERS_KEY,
    lane_of_key,
    members_key,
    usage_key,
)
from tasks.jobs.deadletter import drop_dead
from tasks.settings import settings

log = logging.getLogger(__name__)
#: A worker silent this long is dropped from the record altogether.
FORGET_AFTER_S = 600.0
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


def merge(previous: dict[str, dict], replies: dict[str, dict], now: float,
          misses_allowed: int, count_misses: bool = True) -> dict[str, dict]:
    """Fold this round's replies into the record: pure, so tests drive it directly.
    ``count_misses`` False: the first round after a gap, where silence is no miss."""
    record: dict[str, dict] = {}
    for host, old in previous.items():
        if host not in replies and now - old["last_seen"] < FORGET_AFTER_S:
            missed = old.get("missed", 0) + (1 if count_misses else 0)
            alive = missed < misses_allowed and not old.get("unheard")
            record[host] = {**old, "missed": missed, "alive": alive}
    for host, stats in replies.items():
        record[host] = {**stats, "last_seen": now, "missed": 0, "alive": True,
                        "busy": busy_slots(previous.get(host), stats)}
    return record


#: Weight of the newest round in a worker's busy slots (``busy_slots``): a lane's
#: share of the pool moves the wait estimates of the lanes below it, and a round's
#: share alone swings with the few jobs a worker finishes in it.
BUSY_ALPHA = 0.3


def busy_slots(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, float]:
    """The job slots of a worker each lane's jobs hold on average: the growth of their
    time in flight (``busy_s``, ``gpu_worker.runtime.Runtime.busy_until``) since its last
    reply ``old`` over the time between, averaged with the rounds before. A first
    reply, or a restarted worker's, has measured nothing yet."""
    if not old or old.get("incarnation") != new.get("incarnation"):
        return {}
    before = old.get("busy") or {}
    span_s = (new.get("at") or 0.0) - (old.get("at") or 0.0)
    if span_s <= 0:
        return dict(before)
    then, busy = old.get("busy_s") or {}, {}
    for lane, busy_s in (new.get("busy_s") or {}).items():
        share = max(0.0, (busy_s - then.get(lane, 0.0)) / span_s)
        last = before.get(lane)
        busy[lane] = round(share if last is None else last + BUSY_ALPHA * (share - last), 3)
    return busy


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
        key = key.decode() if isinstance(key, bytes) else key
        if lane_of_key(key) in lengths and int(count) > 0:
            lengths[lane_of_key(key)][key] = int(count)
    return lengths


def lane_depths(client: redis.Redis, workers: dict[str, dict] | None = None,
                lengths: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, int]:
    """Queued jobs per lane (from ``lengths``, else read); each worker record gets its
    own ``queued`` count, ``queued_fast``: those of its own fast queue, and
    ``queued_first``: those of its own standard queue's first level
    (``routing.names.FIRST_STEPS``)."""
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
        worker["queued"] = queued.get(host, 0)
        worker["queued_fast"] = queued_fast.get(host, 0)
        worker["queued_first"] = queued_first.get(host, 0)
    return {lane: sum(per_list.values()) for lane, per_list in lengths.items()}


def unknown_owners(lengths: Mapping[str, Mapping[str, int]],
                   workers: Mapping[str, dict]) -> set[str]:
    """Workers not in the record whose own queues hold jobs (a worker forgotten after
    ``FORGET_AFTER_S`` of silence): no one consumes those queues, so beat hands them
    back to the shared lanes like a dead worker's."""
    owners = {key.split(PRIORITY_SEP, 1)[0].partition(".")[2]
              for per_list in lengths.values() for key in per_list}
    return owners - set(workers) - {""}


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
                   sample: dict[str, list[QueuedJob]] | None = None) -> dict[str, Any]:
    """Measure lanes, step the policy, gather accounts: the snapshot for routers
    (``lengths``: the lists' lengths, read here if not given; ``sample``: a dict that
    receives the sample of the queued jobs)."""
    previous = json.loads(client.get(SNAPSHOT_KEY) or "{}").get("policy", {})
    measured_at = time.time()  # routers count their own sends from here on
    lengths = list_lengths(client) if lengths is None else lengths
    queued = queued_sample(client, lengths)
    if sample is not None:
        sample.update(queued)
    loads = lane_loads(workers, lane_depths(client, workers, lengths),
                       DEFAULT_SERVICE_S, queued,
                       admission_waits(settings.max_wait_s, RELEASE_RATIO))
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


def write_round(client: redis.Redis, snapshot: dict, workers: Mapping[str, dict]) -> bool:
    """Store the worker record, the members doc and the compact snapshot routers read
    (``routing.compact``), fenced by beat's epoch (one step); False, having written
    nothing, when another beat leads."""
    compact, members = split({**snapshot, "workers": workers})
    version = members["version"]
    records = [item for host, worker in workers.items() for item in (host, json.dumps(worker))]
    for doc in ("" if _Written.version == version else json.dumps(members), json.dumps(members)):
        written = scripts.run(client, "beat_write",
                              [BEAT_EPOCH_KEY, SNAPSHOT_KEY, WORKERS_KEY, members_key(version)],
                              [leader.epoch(), json.dumps(compact), doc, MEMBERS_TTL_S, *records])
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
    previous = {h: json.loads(v) for h, v in client.hgetall(WORKERS_KEY).items()}
    replies = ask_workers(client)
    now = time.time()
    holding = holders(client)
    last = _last_round_at[0]
    steady = last is not None and now - last <= ROUND_GAP_HEARTBEATS * settings.heartbeat_s
    workers = merge(previous, replies, now, MISSES_ALLOWED, count_misses=steady)
    workers.update(unheard_holders(holding, workers, now))
    lengths, sample = list_lengths(client), {}
    snapshot = build_snapshot(client, workers, now, lengths, sample)
    if not write_round(client, snapshot, workers):
        return "another beat leads: nothing written"
    scaling.write(client, scaling.plan(scaling.read(client), workers, snapshot["lanes"],
                                       sample, settings.max_wait_s, now), now)
    _last_round_at[0] = now
    requeue_dead(client, workers, holding, MISSES_ALLOWED)
    for host, worker in workers.items():
        if not serving(worker) and worker.get("queued"):  # dead, or sick: not consuming
            return_to_shared_lanes(client, host, "is sick" if worker["alive"] else "is gone")
    for host in unknown_owners(lengths, workers):  # forgotten, or never heard of
        return_to_shared_lanes(client, host, "is unknown")
    keep_replicas(app, workers, settings.min_replicas)
    expire_dead_letters(client, now)
    give_idle_work(client, workers, lengths, settings.heartbeat_s, DEFAULT_SERVICE_S)
    alive = sum(w["alive"] for w in workers.values())
    return f"{alive}/{len(workers)} workers alive; " + ", ".join(
        f"{lane} {load['depth']} queued ~{load['expected_wait_s']:.1f}s"
        for lane, load in snapshot["lanes"].items())
