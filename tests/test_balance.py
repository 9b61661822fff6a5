"""Idle workers take queued jobs of the models they hold: the choice (pure) and the
move on real messages in the test Redis."""
from __future__ import annotations

import json
import time

from conftest import SMALL, bind_own_queues

from beat.balance import READ_PER_LIST, give_idle_work, target_key
from routing.balance import COLD_FACTOR, Queued, hand_out, idle, per_worker, rescue_fast
from routing.names import worker_queue
from tasks.broker.keys import LIST_DEPTHS_KEY, PRIORITY_SEP, due_key, parse_entry
from tasks.jobs.schema import validate
from tasks.worker.generate import generate


def _q(model: str, wait_s: float, lane: int = 1, key: str = "standard.gpu0@a") -> Queued:
    return Queued(key, model, wait_s, (lane, 0), ref=f"{model}/{wait_s}")


def test_idle_means_serving_with_nothing_running_loading_or_queued():
    workers = {
        "idle": {"alive": True, "in_flight": {"fast": 0}, "queued": 0},
        "running": {"alive": True, "in_flight": {"relaxed": 1}, "queued": 0},
        "queued": {"alive": True, "in_flight": {}, "queued": 2},
        "loading": {"alive": True, "in_flight": {}, "loading_models": ["m"]},
        "dead": {"alive": False, "in_flight": {}},
        "sick": {"alive": True, "sick": "cuda error", "in_flight": {}},
        "silent": {"alive": True, "missed": 1, "in_flight": {}},  # frozen? stale stats
    }
    assert idle(workers) == ["idle"]


def test_an_idle_worker_takes_a_job_of_a_model_it_holds_the_longest_waiting_first():
    jobs = [_q("a", 5.0), _q("b", 50.0), _q("a", 30.0), _q("a", 100.0, lane=2)]
    moves = hand_out({"w": ("a",)}, jobs, {"b": 10.0}, 10.0)
    assert [(job.ref, host) for job, host in moves] == [("a/30.0", "w")]  # standard first


def test_a_job_moves_cold_only_when_it_would_wait_longer_than_loading_its_model_twice():
    load_s = 10.0
    short, long = _q("b", COLD_FACTOR * load_s), _q("c", COLD_FACTOR * load_s + 1)
    assert hand_out({"w": ("a",)}, [short], {"b": load_s}, 0.0) == []
    assert hand_out({"w": ("a",)}, [short, long], {}, load_s) == [(long, "w")]
    assert hand_out({"w": ("a",)}, [long], {}, 0.0) == []  # a load never measured


def test_each_job_moves_once_and_a_worker_gets_its_share_oldest_first():
    jobs = [_q("a", float(w)) for w in range(5)]  # the one that waits 0: it runs next
    moves = hand_out({"w1": ("a",), "w2": ("a",)}, jobs, {}, 100.0, per_host=3)
    assert [(job.wait_s, host) for job, host in moves] == [  # in the order to run in
        (2.0, "w1"), (3.0, "w1"), (4.0, "w1"), (1.0, "w2")]


def test_a_worker_whose_pace_is_not_known_yet_goes_at_the_others_pace(clean_redis, app):
    """A worker that has measured no job yet: its queue waits as long as the others'
    measured pace says; with none measured, nothing moves (a guess, a second a job,
    moved the youngest jobs of a fresh cluster's queues of millisecond jobs ahead of
    older ones that were about to run)."""
    busy = "gpu0@fresh"
    bind_own_queues(app, worker_queue("standard", busy))
    for _ in range(3):
        _publish(worker_queue("standard", busy))
    workers = {busy: {**_record(3, 1, ["demo"]), "service_ms": {}},
               "gpu1@idle": {**_record(0, 0, ["demo"]), "service_ms": {}}}
    assert give_idle_work(clean_redis, workers, _lengths(clean_redis), 1.0, 1.0) == 0
    workers["gpu1@idle"]["service_ms"] = {"standard": 10.0}  # 40 ms of queue: it stays
    assert give_idle_work(clean_redis, workers, _lengths(clean_redis), 1.0, 1.0) == 0
    workers["gpu1@idle"]["service_ms"] = {"standard": 1000.0}
    assert give_idle_work(clean_redis, workers, _lengths(clean_redis), 1.0, 1.0) == 1


def test_a_job_that_would_wait_less_than_a_heartbeat_stays():
    """Beat decides from a record up to a heartbeat old: a job due to start sooner than
    that may have started, or its idle worker be busy again, when the move lands."""
    soon, later = _q("a", 0.5), _q("a", 1.5)
    assert hand_out({"w": ("a",)}, [soon, later], {}, 1.0, per_host=2, min_wait_s=1.0) == \
        [(later, "w")]


def test_no_idle_worker_takes_a_job_cold_that_another_holds_warm():
    job = _q("m2", 1000.0)
    assert hand_out({"gpu0": ("m1",), "gpu1": ("m2",)}, [job], {}, 1.0) == [(job, "gpu1")]
    assert per_worker(1.0, None) == 1 and per_worker(1.0, 5.0) == 1
    assert per_worker(1.0, 0.25) == 4 and per_worker(1.0, 0.001) == 8


def test_the_target_is_the_idle_workers_own_list_of_the_same_lane_and_step():
    assert target_key("standard.gpu0@a", "gpu1@b") == "standard.gpu1@b"
    assert target_key(f"relaxed.gpu0@a{PRIORITY_SEP}3", "gpu1@b") == \
        f"relaxed.gpu1@b{PRIORITY_SEP}3"


def _publish(queue: str, model: str = "demo") -> str:
    job = validate("p", tier="standard", account="acct", model=model, seed=1, **SMALL)
    return generate.apply_async(kwargs={
        "job": job.encode(), "route": {"lane": "standard", "requested_tier": "standard"},
        "submitted_at": time.time()}, exchange=queue, routing_key=queue).id


def _ids(client, key: str) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in client.lrange(key, 0, -1)]


def _record(queued: int, running: int, warm: list[str]) -> dict:
    return {"alive": True, "in_flight": {"standard": running}, "queued": queued,
            "warm_models": warm, "service_ms": {"standard": 1000.0}, "concurrency": 1}


def _lengths(client) -> dict[str, dict[str, int]]:
    from beat.heartbeat import list_lengths

    return list_lengths(client)


def test_an_idle_worker_takes_the_youngest_job_of_a_busy_holders_queue(clean_redis, app):
    busy, free, cold = "gpu0@busy", "gpu1@free", "gpu2@cold"
    source = worker_queue("standard", busy)
    bind_own_queues(app, source)
    queued = [_publish(source) for _ in range(3)]
    workers = {busy: {**_record(3, 1, ["demo"]), "load_ms": {"demo": 10_000.0}},
               free: _record(0, 0, ["demo"]), cold: _record(0, 0, ["other"])}
    assert give_idle_work(clean_redis, workers, _lengths(clean_redis), 1.0, 1.0) == 1
    assert _ids(clean_redis, worker_queue("standard", free)) == [queued[-1]]
    assert _ids(clean_redis, source) == queued[-2::-1]  # the older two stay, in order
    assert clean_redis.llen(worker_queue("standard", cold)) == 0  # 4 s: not worth a load
    # the due index follows the message: its entry names the new list, the depths count it
    (raw,) = clean_redis.lrange(worker_queue("standard", free), 0, -1)
    entries = [parse_entry(e) for e in clean_redis.zrange(due_key("standard"), 0, -1)]
    assert sorted(key for key, _ in entries) == sorted([source, source,
                                                        worker_queue("standard", free)])
    assert (worker_queue("standard", free), raw.decode()) in entries
    assert _lengths(clean_redis)["standard"] == {source: 2, worker_queue("standard", free): 1}
    assert {k.decode(): int(v) for k, v in clean_redis.hgetall(LIST_DEPTHS_KEY).items()} == \
        {source: 2, worker_queue("standard", free): 1}


def test_nothing_is_read_or_moved_while_no_worker_is_idle(clean_redis, app, monkeypatch):
    busy = "gpu0@busy"
    bind_own_queues(app, worker_queue("standard", busy))
    for _ in range(READ_PER_LIST + 2):
        _publish(worker_queue("standard", busy))
    reads = []
    monkeypatch.setattr(type(clean_redis), "pipeline",
                        lambda *a, **k: reads.append(1) or (_ for _ in ()).throw(AssertionError))
    workers = {busy: _record(6, 1, ["demo"]), "gpu1@x": _record(0, 1, ["demo"])}
    assert give_idle_work(clean_redis, workers, _lengths(clean_redis), 1.0, 1.0) == 0
    assert reads == []


def test_a_job_taken_before_the_move_is_not_moved(clean_redis, app):
    from tasks.broker import handover
    from tasks.broker.moves import hand_over

    source = worker_queue("standard", "gpu0@busy")
    bind_own_queues(app, source)
    _publish(source)
    raw = clean_redis.lrange(source, 0, 0)[0]
    handover.take(clean_redis, "gpu0@busy/1/1.0", [source], "t1")  # its worker took it meanwhile
    assert hand_over(clean_redis, [(source, worker_queue("standard", "gpu1@free"), raw)]) == 0
    assert clean_redis.llen(worker_queue("standard", "gpu1@free")) == 0
    assert handover.held(clean_redis, "gpu0@busy/1/1.0") == {"t1": (source, raw.decode())}
    assert not clean_redis.hgetall(LIST_DEPTHS_KEY)  # nothing counted in either list


def test_a_stuck_fast_job_goes_to_the_least_busy_holder_without_fast_work():
    workers = {
        "src": {"alive": True, "in_flight": {"fast": 1}, "queued_fast": 1,
                "warm_models": ["a"]},
        "fast_busy": {"alive": True, "in_flight": {"fast": 1}, "warm_models": ["a"]},
        "loading": {"alive": True, "in_flight": {}, "loading_models": ["b"],
                    "warm_models": ["a"]},
        "relaxed_busy": {"alive": True, "in_flight": {"relaxed": 1}, "queued": 3,
                         "warm_models": ["a"]},
        "light": {"alive": True, "in_flight": {"relaxed": 1}, "warm_models": ["a"]},
        "cold": {"alive": True, "in_flight": {}, "warm_models": ["b"]},
        "silent": {"alive": True, "missed": 1, "in_flight": {}, "warm_models": ["a"]},
    }
    first, second, third = (_q("a", w, lane=0, key="fast.src") for w in (3.0, 2.0, 1.0))
    moves = rescue_fast(workers, [third, first, second])
    assert [(job.wait_s, host) for job, host in moves] == [(3.0, "light"), (2.0, "relaxed_busy")]


def test_a_fast_job_stuck_behind_a_fast_run_moves_and_its_new_worker_is_told(clean_redis, app):
    from tasks.broker.keys import fast_news_channel

    busy, free = "gpu0@busy", "gpu1@free"
    source = worker_queue("fast", busy)
    bind_own_queues(app, source)
    job = validate("p", tier="fast", account="acct", model="demo", seed=1, **SMALL)
    stuck = generate.apply_async(kwargs={
        "job": job.encode(), "route": {"lane": "fast", "requested_tier": "fast"},
        "submitted_at": time.time() - 2.0}, exchange=source, routing_key=source).id
    news = clean_redis.pubsub()
    news.subscribe(fast_news_channel(free))
    news.get_message(timeout=1.0)  # the subscription's confirmation
    workers = {busy: {"alive": True, "in_flight": {"fast": 1}, "queued": 1, "queued_fast": 1,
                      "warm_models": ["demo"]},
               free: {"alive": True, "in_flight": {"relaxed": 1}, "queued": 0,
                      "warm_models": ["demo"]}}
    assert give_idle_work(clean_redis, workers, _lengths(clean_redis), 1.0, 1.0) == 1
    assert _ids(clean_redis, worker_queue("fast", free)) == [stuck]
    told = news.get_message(timeout=2.0)
    assert told is not None and told["data"] == worker_queue("fast", free).encode()
    news.close()
    # one that waited less than a heartbeat stays: it may yet start where it is
    again = generate.apply_async(kwargs={
        "job": job.encode(), "route": {"lane": "fast", "requested_tier": "fast"},
        "submitted_at": time.time()}, exchange=source, routing_key=source).id
    assert give_idle_work(clean_redis, workers, _lengths(clean_redis), 1.0, 1.0) == 0
    assert _ids(clean_redis, source) == [again]


def test_jobs_queued_for_a_worker_beat_never_heard_of_go_back_to_the_shared_lane(
        clean_redis, app, leading):
    """No one consumes the own queue of a worker missing from the record (forgotten after
    a long silence): beat's heartbeat hands its jobs back to the shared lane."""
    from beat.heartbeat import heartbeat

    own = worker_queue("standard", "gpu9@forgotten")
    bind_own_queues(app, own)
    queued = [_publish(own) for _ in range(2)]
    heartbeat()  # in this process, as beat's scheduler runs it (no worker answers)
    assert clean_redis.llen(own) == 0
    assert _ids(clean_redis, "standard") == queued[::-1]  # in order, the oldest next
