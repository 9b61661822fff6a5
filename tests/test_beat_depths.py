"""Beat's reading of the lists' depths a round at a time: the lists whose depth changed
move the workers' queued counts, and the idle and unserved workers follow the records
that changed."""
from __future__ import annotations

from beat.depths import Depths
from beat.heartbeat import lane_depths, list_lengths
from beat.standing import Standing
from routing.names import worker_queue
from tasks.broker.keys import LIST_DEPTHS_KEY, PRIORITY_SEP


def _worker(**extra) -> dict:
    return {"alive": True, "missed": 0, "in_flight": {}, **extra}


def test_depths_follow_the_lists_that_changed_as_a_whole_read_counts_them(clean_redis):
    own_fast, own_std = worker_queue("fast", "gpu0@a"), worker_queue("standard", "gpu0@a")
    clean_redis.hset(LIST_DEPTHS_KEY, mapping={own_fast: 2, own_std + PRIORITY_SEP + "3": 4,
                                               "relaxed": 5, worker_queue("relaxed", "gone@b"): 1})
    depths, workers = Depths(), {"gpu0@a": _worker(), "gpu1@a": _worker()}
    assert depths.read(clean_redis) == {"gpu0@a", "", "gone@b"}
    assert depths.read(clean_redis) == set()  # nothing changed: nothing to take in
    assert depths.counted(workers, workers) == {"gpu0@a", "gpu1@a"}
    assert depths.lengths == list_lengths(clean_redis)
    assert depths.unknown(workers) == {"gone@b"}
    expected = {host: dict(w) for host, w in workers.items()}
    assert depths.totals() == lane_depths(clean_redis, expected) == {
        "fast": 2, "standard": 4, "relaxed": 6}
    assert workers == expected
    clean_redis.hdel(LIST_DEPTHS_KEY, own_fast)
    clean_redis.hset(LIST_DEPTHS_KEY, "fast", 1)
    assert depths.read(clean_redis) == {"gpu0@a", ""}
    assert depths.counted(workers, ["gpu0@a"]) == {"gpu0@a"}
    assert (workers["gpu0@a"]["queued"], workers["gpu0@a"]["queued_fast"]) == (4, 0)
    clean_redis.delete(LIST_DEPTHS_KEY)
    assert depths.read(clean_redis) == {"gpu0@a", "", "gone@b"}
    assert depths.lengths == {"fast": {}, "standard": {}, "relaxed": {}} and not depths.owners


def test_standing_follows_the_changed_records():
    workers = {"idle@a": _worker(queued=0), "busy@a": _worker(queued=2),
               "sick@a": _worker(sick="oom", queued=1)}
    standing = Standing()
    standing.update(workers, None)
    assert (standing.idle, standing.unserved) == ({"idle@a"}, {"sick@a"})
    workers["idle@a"]["in_flight"] = {"standard": 1}
    workers["busy@a"]["queued"] = 0
    del workers["sick@a"]
    standing.update(workers, ["idle@a", "busy@a", "sick@a"])
    assert (standing.idle, standing.unserved) == ({"busy@a"}, set())
