"""Beat's worker record as the leader keeps it: each round reads the stats changed since
the last and the workers fallen silent, writes back what changed, and a beat whose mark
is not on the stored record reads it whole."""
from __future__ import annotations

import json
import time

import pytest

from beat.heartbeat import heartbeat
from beat.lease import Leadership
from beat.record import BUSY_ALPHA, RECORD, busy_slots
from beat.tally import Tally
from routing.compact import split
from tasks.broker.keys import (
    SNAPSHOT_KEY,
    WORKER_STATS_AT_KEY,
    WORKER_STATS_CHANGED_KEY,
    WORKERS_BY_KEY,
    WORKERS_KEY,
)
from tasks.broker.leader import fenced
from tasks.broker.stats import push_stats

HOSTS = ("gpu0@h", "gpu1@h", "gpu2@h")


def _stats(host: str, **extra) -> dict:
    return {"incarnation": f"{host}/1/1.0", "started_at": 1.0, "in_flight": {},
            "warm_models": ["demo"], "lanes": ["fast", "standard", "relaxed"],
            "concurrency": 1, **extra}


def _push(client, **changed) -> None:
    for host in HOSTS:
        push_stats(client, host, _stats(host, **changed.get(host, {})))


def _stored(client) -> dict[str, dict]:
    return {h.decode(): json.loads(v) for h, v in client.hgetall(WORKERS_KEY).items()}


def _split_as_written(client) -> None:
    """The snapshot's split parts as written are those of the whole record (beat works
    out only the changed workers' again: ``beat.heartbeat.SPLIT``)."""
    written = json.loads(client.get(SNAPSHOT_KEY))
    compact, members = split({"at": written["at"], "workers": RECORD.workers})
    assert {key: written[key] for key in compact if key != "at"} == \
        {key: value for key, value in compact.items() if key != "at"}


@pytest.fixture
def epoch(clean_redis):
    lead = Leadership(clean_redis)
    yield lead.renew()
    lead.stop()


def test_stats_the_same_as_the_last_are_only_stamped(clean_redis):
    push_stats(clean_redis, "gpu0@h", _stats("gpu0@h", at=1.0))
    changed = clean_redis.zscore(WORKER_STATS_CHANGED_KEY, "gpu0@h")
    push_stats(clean_redis, "gpu0@h", _stats("gpu0@h", at=2.0))  # its clock is no change
    assert clean_redis.zscore(WORKER_STATS_CHANGED_KEY, "gpu0@h") == changed
    assert clean_redis.zscore(WORKER_STATS_AT_KEY, "gpu0@h") > changed
    push_stats(clean_redis, "gpu0@h", _stats("gpu0@h", in_flight={"fast": 1}))
    assert clean_redis.zscore(WORKER_STATS_CHANGED_KEY, "gpu0@h") > changed


def test_a_leader_folds_in_and_writes_back_only_what_changed(clean_redis, epoch):
    _push(clean_redis)
    with fenced(epoch):
        heartbeat()  # its first round: the record read and written whole
        assert RECORD.changed is None and set(_stored(clean_redis)) == set(HOSTS)
        _push(clean_redis, **{"gpu1@h": {"in_flight": {"standard": 1}}})
        heartbeat()
        _split_as_written(clean_redis)
        _push(clean_redis, **{"gpu2@h": {"loading_models": ["other"]}})
        heartbeat()
        _split_as_written(clean_redis)
        _push(clean_redis, **{"gpu1@h": {"in_flight": {"standard": 1}},
                              "gpu2@h": {"loading_models": ["other"]}})
        heartbeat()
    assert RECORD.changed == {"gpu1@h"}  # the others pushed the same stats: not read
    stored = _stored(clean_redis)
    assert stored["gpu1@h"]["in_flight"] == {"standard": 1}
    assert all(w["alive"] and w["missed"] == 0 for w in stored.values())


def test_a_silent_worker_misses_its_rounds_found_by_score(clean_redis, epoch):
    _push(clean_redis)
    with fenced(epoch):
        heartbeat()
        # gpu2's last push falls out of the window from this round on
        clean_redis.zadd(WORKER_STATS_AT_KEY, {"gpu2@h": RECORD.cutoff})
        _push(clean_redis)
        clean_redis.zadd(WORKER_STATS_AT_KEY, {"gpu2@h": RECORD.cutoff})
        heartbeat()
        assert _stored(clean_redis)["gpu2@h"]["missed"] == 1
        heartbeat()
        silent = _stored(clean_redis)["gpu2@h"]
        assert silent["missed"] == 2 and not silent["alive"]  # MISSES_ALLOWED: dead
        _split_as_written(clean_redis)
        _push(clean_redis)  # back, with the same stats as before: heard again
        heartbeat()
    back = _stored(clean_redis)["gpu2@h"]
    assert back["alive"] and back["missed"] == 0 and back["incarnation"] == "gpu2@h/1/1.0"
    kept, afresh = RECORD.tally, Tally.of(RECORD.workers)  # counted a change at a time
    assert {name: (p.members, p.live, p.alive, vars(p.sums)) for name, p in kept.pools.items()} \
        == {name: (p.members, p.live, p.alive, vars(p.sums)) for name, p in afresh.pools.items()}


def test_a_record_written_by_another_beat_is_read_whole(clean_redis, epoch):
    _push(clean_redis)
    with fenced(epoch):
        heartbeat()
        other = {"incarnation": "gpu7@h/1/1.0", "started_at": 1.0,
                 "last_seen": time.time(), "missed": 5, "alive": False}
        clean_redis.hset(WORKERS_KEY, "gpu7@h", json.dumps(other))  # a standby led meanwhile
        clean_redis.set(WORKERS_BY_KEY, "another beat")
        _push(clean_redis)
        heartbeat()
    assert RECORD.changed is None  # read and written whole, not from memory
    assert RECORD.workers["gpu7@h"]["missed"] == 6 and not RECORD.workers["gpu7@h"]["alive"]
    assert set(_stored(clean_redis)) == {*HOSTS, "gpu7@h"}


def test_busy_slots_count_from_the_push_before_a_change():
    old = {"incarnation": "a", "at": 100.0, "busy_s": {"standard": 0.0}, "busy": {}}
    new = {"incarnation": "a", "at": 110.0, "quiet_since": 109.0, "busy_s": {"standard": 0.5}}
    assert busy_slots(old, new) == {"standard": 0.5}  # idle until 109: half of the last second
    waned = {"standard": round(0.5 * (1 - BUSY_ALPHA), 3)}
    assert busy_slots({**new, "busy": {"standard": 0.5}}, {**new, "at": 111.0,
                                                          "quiet_since": 0.0}) == waned
