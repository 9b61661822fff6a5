"""Every Redis key gpulanes uses, and kombu's naming of a lane's lists, in one place."""
from __future__ import annotations

from routing.names import (LANES, RELAX_LEVEL_PRIORITIES, RELAX_PRIORITIES, RELAXED, STANDARD,
                           lane_of)


#: kombu's separator between a queue's name and a priority level in a list's name.
PRIORITY_SEP = "\x06\x16"


def lane_of_key(key: str) -> str:
    """The lane a Redis list serves: ``relaxed.gpu0@host\x06\x163`` is ``relaxed``."""
    return lane_of(key.split(PRIORITY_SEP, 1)[0])


def lane_keys(lane: str) -> list[str]:
    """The Redis lists that hold ``lane``, first-served first (kombu's naming)."""
    return [lane if pri == 0 else f"{lane}{PRIORITY_SEP}{pri}" for pri in RELAX_PRIORITIES]


PREFIX = "gpulanes"
#: Hash: worker hostname -> JSON of its last heartbeat reply.
WORKERS_KEY = f"{PREFIX}:workers"
#: Hash: worker hostname -> JSON of the stats it last pushed (``tasks.broker.stats``).
WORKER_STATS_KEY = f"{PREFIX}:stats"
#: Sorted set: worker hostname -> when (Redis' clock, unix s) it last pushed them.
WORKER_STATS_AT_KEY = f"{PREFIX}:stats:at"
#: Sorted set: worker hostname -> when (Redis' clock) the stats it pushed last changed:
#: beat reads only the records changed since its last round.
WORKER_STATS_CHANGED_KEY = f"{PREFIX}:stats:changed"
#: Hash: worker hostname -> its push before its stats last changed (Redis' clock): the
#: stats were the same from then back to that change.
WORKER_STATS_QUIET_KEY = f"{PREFIX}:stats:quiet"
#: String: which beat process and epoch wrote ``WORKERS_KEY`` last: a leader whose own
#: mark is there holds the record in memory; any other reads it whole.
WORKERS_BY_KEY = f"{PREFIX}:workers:by"
#: JSON: the latest load snapshot written by beat.
SNAPSHOT_KEY = f"{PREFIX}:snapshot"
#: JSON: each pool's workers wanted and current, and its scale's state (``beat.scaling``).
SCALING_KEY = f"{PREFIX}:scaling"


def members_key(version: str) -> str:
    """JSON: the routing membership of one version (routing.compact), written by beat
    with a TTL."""
    return f"{PREFIX}:members:{version}"


#: Hash: account -> fast seconds left.
FAST_BALANCE_KEY = f"{PREFIX}:fast:balance"
#: Set: accounts whose fast seconds are spent (read by routers).
FAST_EXHAUSTED_KEY = f"{PREFIX}:fast:exhausted"
#: Sorted sets per account (see ``fast_queued_key``) start with this.
FAST_QUEUED_PREFIX = f"{PREFIX}:fast:queued:"
#: Hash: SHA-256 of an API key -> its record (account, plan: ``tasks.jobs.apikeys``).
API_KEYS_KEY = f"{PREFIX}:apikeys"
#: Channel: the hash of each key revoked, for processes that keep keys they have seen.
API_KEYS_REVOKED_CHANNEL = f"{PREFIX}:apikeys:revoked"
#: Hash: "<store url>/<model>" -> the manifest the cluster pinned for that model.
MANIFESTS_KEY = f"{PREFIX}:manifests"


#: Hash: lane -> messages waiting in its lists, kept by every script that pushes to or
#: takes from a list (``lua/queue.lua``) in the same step: a publish's depth check reads
#: one field.
LANE_DEPTHS_KEY = f"{PREFIX}:depths:lanes"
#: Hash: list key -> messages waiting in that list (a worker's own queue, a
#: relaxed level), kept with ``LANE_DEPTHS_KEY``; a list with none has no field.
LIST_DEPTHS_KEY = f"{PREFIX}:depths:lists"
#: The due index of a lane (``due_key``) is this prefix plus the lane's name.
DUE_PREFIX = f"{PREFIX}:due:"


def due_key(lane: str) -> str:
    """Sorted set: "<list>\n<message>" -> when its job entered ``lane`` (unix s), for every
    message of the lane that beat may move for its wait: a fast or standard job past its
    lane's budget, a relaxed job above the first level past the aging time."""
    return f"{DUE_PREFIX}{lane}"


def due_clock(key: str, entered_at: float) -> float:
    """The score of a message of list ``key`` in its lane's due index: when its job
    entered the lane; 0 (not indexed) in relaxed's first level, where nothing moves."""
    return 0.0 if lane_of_key(key) == RELAXED and PRIORITY_SEP not in key else entered_at


def lists_key(lane: str) -> str:
    """Set: every Redis list key that jobs of ``lane`` were pushed to (its depth is
    the sum of their lengths)."""
    return f"{PREFIX}:lists:{lane}"


def parse_entry(entry: str | bytes) -> tuple[str, str]:
    """(list key, message) of a due index entry or a held record."""
    text = entry.decode() if isinstance(entry, bytes) else entry
    key, _, payload = text.partition("\n")
    return key, payload


#: Hash: job id -> JSON of a job that failed for good.
DEAD_KEY = f"{PREFIX}:dead"
#: Sorted set: job id -> when its dead letter was written (unix s), so expiry reads the
#: oldest letters without scanning ``DEAD_KEY``; changed in the same step as that hash.
DEAD_INDEX_KEY = f"{PREFIX}:dead:index"
#: How long a dead letter is kept (beat drops older ones): a week.
DEAD_TTL_S = 7 * 24 * 3600
#: Hash: job id -> how many more runs of it finished after the first (should stay empty).
DUPLICATES_KEY = f"{PREFIX}:duplicates"
#: Sorted set: revoked job id -> when it was revoked (unix s); kept as long as a result.
REVOKED_KEY = f"{PREFIX}:revoked"


def revoked_key(job_id: str) -> str:
    """Present while job ``job_id`` is revoked (``REVOKED_KEY`` lists them all): a run's
    begin reads it with the job's other records, in one read."""
    return f"{PREFIX}:revoked:{job_id}"
#: Seconds of GPU time per account are counted in buckets this long.
USAGE_BUCKET_S = 60
#: Fair shares count each account's GPU seconds over this window.
FAIR_WINDOW_S = 900


USAGE_PREFIX = f"{PREFIX}:usage:"


def usage_key(bucket: int) -> str:
    """Hash: account -> GPU seconds used in one ``USAGE_BUCKET_S`` bucket."""
    return f"{USAGE_PREFIX}{bucket}"


def fast_queued_key(account: str) -> str:
    """Sorted set: the account's fast jobs not yet started (job id, scored by lapse time)."""
    return f"{FAST_QUEUED_PREFIX}{account}"


def waiting_accounts_key(lane: str) -> str:
    """Set: the accounts with jobs waiting in fast or standard ``lane`` (``queued_key``)."""
    return f"{PREFIX}:{lane}:waiting-accounts"


def queued_key(lane: str, account: str) -> str:
    """Sorted set: the account's jobs waiting in ``lane`` (fast or standard; job id, scored
    by lapse time): its fast places in fast, and in both what raises the level its next
    job enters at (``routing.fair.queued_level``)."""
    return fast_queued_key(account) if lane == "fast" else f"{PREFIX}:{lane}:queued:{account}"


def lease_key(job_id: str) -> str:
    """Held while one copy of a job runs: a second copy never runs beside it."""
    return f"{PREFIX}:lease:{job_id}"


def done_key(job_id: str) -> str:
    """The first result of a job: later runs of the same id return it unchanged."""
    return f"{PREFIX}:done:{job_id}"


def attempts_key(job_id: str) -> str:
    """Counter of runs started for one job (survives redelivery)."""
    return f"{PREFIX}:attempts:{job_id}"


#: Sorted set: result-cache entry key -> when it was last hit (unix s); LRU order.
CACHE_LRU_KEY = f"{PREFIX}:cache:lru"
#: A run's followers live under this prefix plus the leader's job id (see ``run_key``).
RUN_KEY_PREFIX = f"{PREFIX}:run:"


def cache_entry_key(digest: str) -> str:
    """JSON of the finished result of one content digest (model, prompt, seed, steps, size)."""
    return f"{PREFIX}:cache:entry:{digest}"


def inflight_key(digest: str) -> str:
    """The job id of the run now making the image of ``digest`` (queued or running)."""
    return f"{PREFIX}:inflight:{digest}"


def run_key(job_id: str) -> str:
    """Hash of a coalesced run led by ``job_id``: its keys, admission, and followers."""
    return f"{RUN_KEY_PREFIX}{job_id}"


#: Hash of cumulative job counters the workers and submitters add to and the
#: Prometheus exporter reads: fields from ``metric_field``.
METRICS_KEY = f"{PREFIX}:metrics"


def counts_pushed_key(holder: str) -> str:
    """The number of the last batch of job counts worker process ``holder`` added to
    ``METRICS_KEY`` (``tasks.broker.stats.push_stats``)."""
    return f"{PREFIX}:counts-pushed:{holder}"


def metric_field(name: str, *labels: str) -> str:
    """A field of ``METRICS_KEY``: ``queue_wait_bucket|fast|3``, ``downgrades|lane_full``."""
    return "|".join((name, *labels))


#: String: the beat that leads (its identity), set with a lease that lapses unless it
#: is renewed (``tasks.broker.leader``).
BEAT_LEADER_KEY = f"{PREFIX}:beat:leader"
#: Counter: the leader's fencing token, one more with each new lead; every write of
#: beat's checks it in the same step (``lua/fence.lua``).
BEAT_EPOCH_KEY = f"{PREFIX}:beat:epoch"
#: Written first in each of beat's rounds, a write like a worker's stats push: refused,
#: Redis takes no worker's stats either, and the round judges no worker.
BEAT_PROBE_KEY = f"{PREFIX}:beat:probe"
#: Written after each script a replica must confirm, before ``WAIT``
#: (``tasks.broker.scripts.replicated``).
REPLICATED_KEY = f"{PREFIX}:replicated"
#: Pub/sub channels (``fast_news_channel``) start with this.
FAST_NEWS_PREFIX = f"{PREFIX}:fast-waiting:"
#: Sorted set: worker hostname -> its preemptible run's rank (``preemptible_score``):
#: the run told first of a waiting fast job.
PREEMPTIBLE_KEY = f"{PREFIX}:preemptible"


def preemptible_score(lane: str, step: int, began: float) -> float:
    """A run's score in ``PREEMPTIBLE_KEY`` (``ZPOPMAX`` takes the best): its lane
    (relaxed first), then its priority step (the latest level first), then when it began
    (the latest first: the least work set aside)."""
    return LANES.index(lane) * 10 + step + began * 1e-10


#: The least score of a run told of a first-level standard job in the shared lane (one
#: of standard's later levels, or relaxed): a first-level run does not step aside for it.
HEAVIER_SCORE = preemptible_score(STANDARD, RELAX_LEVEL_PRIORITIES[1], 0.0)


def fast_news_channel(host: str) -> str:
    """Pub/sub channel: fast jobs pushed for worker ``host`` to step aside for (the list
    each was pushed to): its own, or shared ones it was picked for (``lua/fast_news.lua``)."""
    return f"{FAST_NEWS_PREFIX}{host}"
#: Sorted set: preemptions under way (worker incarnation -> until when it counts).
PREEMPT_CLAIMS_KEY = f"{PREFIX}:preempt:claims"


#: Hash per holder (a worker process): take token -> "<list>\n<message>" of each message it
#: holds, written in the step that takes it off its list (``tasks.broker.handover``).
HELD_PREFIX = f"{PREFIX}:held:"
#: Set: every holder that takes with records, so that beat finds a dead one's.
HOLDING_KEY = f"{PREFIX}:holding"
#: Sorted sets: a queue's idle consumers, to wake, under this prefix (``wake_key``); a
#: fanout exchange's messages go out on pub/sub channels of ``FANOUT_PREFIX``.
WAKE_PREFIX = f"{PREFIX}:wake:"
FANOUT_PREFIX = f"{PREFIX}:fanout:"
#: Pub/sub channel per consumer (a kombu channel): its own wake-ups, this prefix plus its id.
CONSUMER_WAKE_PREFIX = f"{PREFIX}:wake-consumer:"


def wake_key(queue: str) -> str:
    """Sorted set: the consumers of ``queue`` whose last take found its lists empty, each
    named by its own wake-up channel, scored by when (Redis' clock): a push to the queue
    wakes one of them (``lua/queue.lua``)."""
    return f"{WAKE_PREFIX}{queue}"


#: List: "<list>\n<problem>\n<item>" of each item a consumer took that was not a message.
UNREADABLE_KEY = f"{PREFIX}:unreadable"
#: Set per direct or topic exchange: its bindings, "routing key\x06\x16pattern\x06\x16queue".
BINDINGS_PREFIX = f"{PREFIX}:bindings:"


def held_key(holder: str) -> str:
    """The records of what ``holder`` holds."""
    return f"{HELD_PREFIX}{holder}"


def list_key(queue: str, priority: int = 0) -> str:
    """The Redis list of ``queue`` at a priority level (0: the queue's own name)."""
    return queue if not priority else f"{queue}{PRIORITY_SEP}{priority}"


# --- the front door: predictions, idempotency, plan admission ---------------------------
#: A prediction's record (JSON: its account, model, tier, input, when), kept as long as
#: its result: whose it is, written in the step that publishes it.
PREDICTION_PREFIX = f"{PREFIX}:prediction:"
#: Per account, its predictions scored by when they were made (newest last).
PREDICTIONS_PREFIX = f"{PREFIX}:predictions:"
#: Per account and idempotency key (hashed), the job it made.
IDEMPOTENCY_PREFIX = f"{PREFIX}:idempotency:"
#: Per account on a plan, its jobs admitted to the lanes (queued there or running),
#: scored by when each lapses; its fast ones apart.
ADMITTED_PREFIX = f"{PREFIX}:admitted:"
ADMITTED_FAST_PREFIX = f"{PREFIX}:admitted-fast:"
#: Per account on a plan, its jobs waiting for one of its own to finish (a list).
PARKED_PREFIX = f"{PREFIX}:parked:"
#: Accounts with parked jobs (beat looks at these only), and each one's limits.
PARKED_ACCOUNTS_KEY = f"{PREFIX}:parked:accounts"
#: Per account on a plan, the period its fast time was last renewed in.
FAST_PERIOD_KEY = f"{PREFIX}:fast:period"


def prediction_key(job_id: str) -> str:
    return PREDICTION_PREFIX + job_id


def events_key(job_id: str) -> str:
    """A prediction's event log (a stream; ``lua/events.lua`` names it so), which is
    also the channel its new events are announced on."""
    return f"{PREDICTION_PREFIX}{job_id}:events"


#: The webhook deliveries due, each "<record> <event id> <kind>" scored by when it is
#: due (unix s); one being sent is scored past its delivery's deadline meanwhile.
WEBHOOKS_DUE_KEY = f"{PREFIX}:webhooks:due"
#: Per delivery ("<job id> <event id>"), the attempts made so far.
WEBHOOK_ATTEMPTS_KEY = f"{PREFIX}:webhooks:attempts"
#: Per account, the secret its webhooks are signed with.
WEBHOOK_SECRETS_KEY = f"{PREFIX}:webhooks:secrets"


def predictions_key(account: str) -> str:
    return PREDICTIONS_PREFIX + account


def idempotency_key(account: str, key_digest: str) -> str:
    return f"{IDEMPOTENCY_PREFIX}{account}:{key_digest}"


def admitted_key(account: str) -> str:
    return ADMITTED_PREFIX + account


def admitted_fast_key(account: str) -> str:
    return ADMITTED_FAST_PREFIX + account


def parked_key(account: str) -> str:
    return PARKED_PREFIX + account
