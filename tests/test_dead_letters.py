"""Dead letters' index, beat's expiry and ``lanes dead purge``, on the test Redis.

Letters are written through the paths that write them in production: a run's
give-up (``tasks.broker.runs.give_up``, with the failure time its letter says) and
``bury`` (refused messages); beat's expiry runs as one real heartbeat round.
"""
from __future__ import annotations

import json
import time

import pytest
from test_cli import bury_one, failed, ok

from tasks.broker import runs
from tasks.broker.keys import DEAD_INDEX_KEY, DEAD_KEY, DEAD_TTL_S
from tasks.jobs import deadletter

HOLDER = "gpu0@h/10/1.0"


def give_up_at(job_id: str, failed_at: float) -> None:
    """Dead-letter ``job_id`` as a worker's run gives up on it, failed at ``failed_at``."""
    verdict, number = runs.begin(job_id, HOLDER, "t1", None)
    assert verdict == "run"
    kwargs = {"job": {"prompt": "x", "tier": "fast"}, "route": {"lane": "fast"}}
    entry = json.loads(deadletter.dead_entry(job_id, kwargs, "error", ValueError("bug"), 1))
    entry["failed_at"] = failed_at
    assert runs.give_up(job_id, runs.token(HOLDER, int(number), "t1"), int(number),
                        json.dumps(entry), "failures|fast")


def letters(client) -> set[str]:
    return {job_id.decode() for job_id in client.hkeys(DEAD_KEY)}


def index(client) -> dict[str, float]:
    return {job_id.decode(): at
            for job_id, at in client.zrange(DEAD_INDEX_KEY, 0, -1, withscores=True)}


def heartbeat_round() -> None:
    from beat.heartbeat import heartbeat

    heartbeat()  # in this process, as beat's scheduler runs it (no workers answer)


def test_give_up_bury_and_requeue_keep_the_index_in_step(clean_redis):
    old_s = time.time() - 3 * 3600
    give_up_at("old", old_s)
    fresh = bury_one(clean_redis)
    assert letters(clean_redis) == set(index(clean_redis)) == {"old", fresh}
    assert index(clean_redis)["old"] == pytest.approx(old_s)
    assert index(clean_redis)[fresh] == pytest.approx(time.time(), abs=60)

    assert ok("dead", "requeue", fresh).startswith(fresh)
    assert letters(clean_redis) == set(index(clean_redis)) == {"old"}


def test_a_requeue_that_fails_puts_letter_and_index_entry_back(clean_redis, monkeypatch):
    job_id = bury_one(clean_redis)
    before = index(clean_redis)
    assert set(before) == {job_id}

    def refuse(job, job_id):
        raise RuntimeError("lane full")

    monkeypatch.setattr(deadletter, "enqueue", refuse)
    with pytest.raises(RuntimeError):
        deadletter.requeue(clean_redis, job_id)
    assert letters(clean_redis) == {job_id} and index(clean_redis) == before


def test_beat_drops_only_letters_past_the_retention_a_batch_per_round(clean_redis,
                                                                    monkeypatch, leading):
    monkeypatch.setattr(deadletter, "EXPIRE_BATCH", 2)
    past_s = time.time() - DEAD_TTL_S
    for i in range(3):
        give_up_at(f"expired-{i}", past_s - 60 - i)
    give_up_at("almost", past_s + 600)
    fresh = bury_one(clean_redis)

    heartbeat_round()
    assert len(letters(clean_redis) - {"almost", fresh}) == 1  # two of three this round
    heartbeat_round()
    assert letters(clean_redis) == set(index(clean_redis)) == {"almost", fresh}
    heartbeat_round()  # nothing due: nothing changes
    assert letters(clean_redis) == set(index(clean_redis)) == {"almost", fresh}


def test_purge_older_than_then_all(clean_redis):
    now = time.time()
    give_up_at("3h", now - 3 * 3600)
    give_up_at("30m", now - 1800)
    fresh = bury_one(clean_redis)

    assert ok("dead", "purge", "--older-than", "2h").strip() == "removed 1 dead job"
    assert letters(clean_redis) == set(index(clean_redis)) == {"30m", fresh}
    assert ok("dead", "purge", "--older-than", "15m").strip() == "removed 1 dead job"
    assert letters(clean_redis) == {fresh}
    assert ok("dead", "purge", "--all").strip() == "removed 1 dead job"
    assert not clean_redis.exists(DEAD_KEY) and not clean_redis.exists(DEAD_INDEX_KEY)
    assert "no dead jobs" in ok("dead", "list")


@pytest.mark.parametrize("args, says", [((), "give --older-than DURATION"),
                                        (("--all", "--older-than", "1d"), "or --all"),
                                        (("--older-than", "7"), "not a duration like")])
def test_purge_refuses_no_option_both_or_a_duration_without_unit(clean_redis, args, says):
    job_id = bury_one(clean_redis)
    err = failed("dead", "purge", *args)
    assert "Usage:" in err and says in err
    assert letters(clean_redis) == set(index(clean_redis)) == {job_id}


def test_letters_written_before_the_index_get_indexed_and_expire(clean_redis, leading):
    now = time.time()
    clean_redis.hset(DEAD_KEY, mapping={  # as the code before the index wrote them
        "legacy-old": json.dumps({"job_id": "legacy-old",
                                  "failed_at": now - DEAD_TTL_S - 60}),
        "legacy-new": json.dumps({"job_id": "legacy-new", "failed_at": now - 60})})
    heartbeat_round()
    assert letters(clean_redis) == set(index(clean_redis)) == {"legacy-new"}
    assert index(clean_redis)["legacy-new"] == pytest.approx(now - 60)

    clean_redis.hset(DEAD_KEY, "legacy-2", "{}")
    assert ok("dead", "purge", "--all").strip() == "removed 2 dead jobs"
    assert not clean_redis.exists(DEAD_KEY)
