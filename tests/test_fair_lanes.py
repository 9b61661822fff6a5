"""Fair fast and standard lanes: a new job enters at a level raised by its account's jobs
already waiting in the lane (counted live by the publish), and workers take a lane's
levels in order before the next lane's, so a flooding account waits behind everyone
else's job or two."""
from __future__ import annotations

import math

import pytest
from conftest import SMALL, bind_own_queues

from routing.names import FAST, RELAX_LEVEL_PRIORITIES, STANDARD, worker_queue, worker_queues
from routing.fair import queued_level
from tasks import submit
from tasks.broker import handover, runs
from tasks.broker.bindings import lists
from tasks.broker.keys import LANE_DEPTHS_KEY, list_key, queued_key, waiting_accounts_key
from tasks.jobs.fastlimit import release_queued


def job_ids(client, key: str) -> list[str]:
    from kombu.utils.json import loads

    return [loads(raw)["headers"]["id"] for raw in reversed(client.lrange(key, 0, -1))]


def level_list(lane: str, level: int) -> str:
    return list_key(lane, RELAX_LEVEL_PRIORITIES[level])


@pytest.mark.parametrize("waiting, depth, accounts, level", [
    (0, 0, 0, 0), (1, 1, 1, 0), (2, 2, 1, 1), (2, 3, 2, 0), (4, 5, 2, 1), (8, 9, 2, 2),
    (16, 17, 2, 3), (2000, 2001, 2, 3), (7, 28, 4, 0), (12, 27, 4, 1), (300, 800, 400, 3)])
def test_a_flooding_account_enters_at_higher_levels(waiting, depth, accounts, level):
    assert queued_level(waiting, depth, accounts) == level


def test_a_flood_enters_behind_and_a_light_job_goes_ahead_of_it(clean_redis):
    flood = [submit("p", account="heavy", **SMALL).id for _ in range(10)]
    light = submit("p", account="light", **SMALL).id
    # down a level at each doubling of its jobs waiting, against a typical other's
    assert job_ids(clean_redis, level_list(STANDARD, 0)) == [*flood[:2], light]
    assert job_ids(clean_redis, level_list(STANDARD, 1)) == flood[2:4]
    assert job_ids(clean_redis, level_list(STANDARD, 2)) == flood[4:8]
    assert job_ids(clean_redis, level_list(STANDARD, 3)) == flood[8:]
    assert clean_redis.zcard(queued_key(STANDARD, "heavy")) == 10
    assert clean_redis.smembers(waiting_accounts_key(STANDARD)) == {b"heavy", b"light"}
    # a worker takes them level by level: the light job third, the flood after it
    order = lists(["standard"], RELAX_LEVEL_PRIORITIES)
    taken = [handover.take(clean_redis, "h", order, f"t{i}") for i in range(11)]
    from kombu.utils.json import loads

    assert [loads(t.raw)["headers"]["id"] for t in taken] == [*flood[:2], light, *flood[2:]]


def test_accounts_alike_stay_first_come_first_served(clean_redis):
    sent = [submit("p", account=f"a{i % 4}", **SMALL).id for i in range(12)]
    assert job_ids(clean_redis, level_list(STANDARD, 0)) == sent


def test_a_job_that_starts_no_longer_weighs_on_its_accounts_next(clean_redis):
    first, second = (submit("p", account="heavy", **SMALL).id for _ in range(2))
    third = submit("p", account="heavy", **SMALL).id
    assert third in job_ids(clean_redis, level_list(STANDARD, 1))
    assert runs.begin(first, "h", "t1", "heavy")[0] == "run"
    release_queued("heavy", second)  # revoked before it started
    assert clean_redis.zcard(queued_key(STANDARD, "heavy")) == 1
    fourth = submit("p", account="heavy", **SMALL).id  # one waits: level 0 again
    assert fourth in job_ids(clean_redis, level_list(STANDARD, 0))
    assert clean_redis.sismember(waiting_accounts_key(STANDARD), "heavy")
    for job in (third, fourth):  # its last one starts: it has none waiting there
        runs.begin(job, "h", f"t-{job}", "heavy")
    assert not clean_redis.sismember(waiting_accounts_key(STANDARD), "heavy")


def test_fast_jobs_are_levelled_by_the_accounts_fast_jobs_waiting(clean_redis):
    flood = [submit("p", tier=FAST, account="heavy", **SMALL).id for _ in range(3)]
    light = submit("p", tier=FAST, account="light", **SMALL).id
    assert job_ids(clean_redis, level_list(FAST, 0)) == [*flood[:2], light]
    assert job_ids(clean_redis, level_list(FAST, 1)) == [flood[2]]
    # the same set holds the account's fast places
    assert clean_redis.zcard(queued_key(FAST, "heavy")) == 3


def test_a_lanes_levels_never_pass_the_lane_above(app):
    node = "gpu0@h"
    order = lists(worker_queues(node), (0, *RELAX_LEVEL_PRIORITIES))
    lanes = [key.split(".")[0].split("\x06")[0] for key in order]
    assert lanes == sorted(lanes, key=["fast", "standard", "relaxed"].index)
    # within a lane: level by level, a worker's own queue before the shared one
    assert order[:3] == [worker_queue(FAST, node), FAST, list_key(worker_queue(FAST, node), 1)]


def test_a_job_routed_to_a_workers_own_queue_is_levelled_there(app, clean_redis):
    from tasks.broker.enqueue import _fair

    own = worker_queue(STANDARD, "gpu0@h")
    bind_own_queues(app, own)
    fair = _fair(own, "heavy", STANDARD, 1)
    assert fair.lists[0] == list_key(own, RELAX_LEVEL_PRIORITIES[0])
    assert fair.spec.split()[0] == "1"  # its usage level is the least it enters at


def test_an_admission_counts_only_what_waits_at_the_jobs_level_or_before(
        clean_redis, monkeypatch):
    """A flood fills the standard lane past its admission: the flood's next jobs move
    down a lane, a light account's job is still let in, at its level, ahead of them."""
    from routing.fair import depths_ahead
    from routing.policy import Admission, PolicyView
    from tasks.broker import enqueue as enqueue_module

    admission = Admission(4.0, (("fast", 1.0), ("standard", 1.0)), 3.0)  # 4 jobs ahead
    monkeypatch.setattr(enqueue_module, "TIER_LANES_ONLY",
                        PolicyView(admit={STANDARD: admission}))
    for _ in range(8):
        submit("p", account="heavy", **SMALL)
    levels = {k.decode(): int(v) for k, v in clean_redis.hgetall(LANE_DEPTHS_KEY).items()}
    assert levels["standard"] == 4 and levels["standard@1"] == 2  # two at level 0
    assert levels["relaxed"] == 4  # the flood's jobs past the admission moved down
    light = submit("p", account="light", **SMALL).id
    assert light in job_ids(clean_redis, level_list(STANDARD, 0))
    assert depths_ahead(levels, levels, STANDARD, 0)["standard"] == 2
    assert depths_ahead(levels, levels, STANDARD, None)["standard"] == 4


def test_a_flood_finds_its_lane_full_before_a_light_account_does(clean_redis, monkeypatch):
    from conftest import vary

    from routing.fair import LEVEL_ROOM

    vary(monkeypatch, max_depth={"fast": 20, "standard": 100, "relaxed": 100},
         fast_jobs_per_account=0)
    for _ in range(30):  # from its third job on, at level 3: it fills 17 of the 20 places
        submit("p", tier=FAST, account="heavy", **SMALL)
    levels = {k.decode(): int(v) for k, v in clean_redis.hgetall(LANE_DEPTHS_KEY).items()}
    assert levels["fast"] == math.ceil(20 * LEVEL_ROOM[3]) == 17 and levels["standard"] == 13
    for i in range(3):  # light accounts still enter the fast lane, at level 0
        submit("p", tier=FAST, account=f"light{i}", **SMALL)
    assert int(clean_redis.hget(LANE_DEPTHS_KEY, "fast")) == 20
