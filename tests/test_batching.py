"""Dynamic batching: grouping and lane order (no processes), then a real batching worker."""
from __future__ import annotations

import threading
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
from celery.exceptions import TaskRevokedError
from conftest import SMALL, new_gate, wait_at_gate, wait_until
from PIL import Image

from gpu_worker.batching import Batcher, Pending, pick
from gpu_worker.demo_model import DemoModel, make_weights
from routing.names import STATS_COMMAND
from tasks import submit
from tasks.broker.message import Job
from tasks.errors import JobFailed
from tasks.worker.png import store_png
from tests.flaky_model import open_gate

BATCH = 4
#: A long delay, so only a full group or a full house (every thread's job held)
#: starts a pass; flaky has none, so a gated job holds the runner at once.
ENV = {"GPULANES_MAX_BATCH": f"demo={BATCH},demo-0=2,flaky={BATCH},odd={BATCH}",
       "GPULANES_MODEL_MEMORY_MB": "64",
       "GPULANES_MAX_QUEUE_DELAY_MS": "*=5000,flaky=0,odd=0", "GPULANES_CACHE": "off"}


def job(model: str = "demo", steps: int = 4, prompt: str = "p", seed: int = 1) -> Job:
    return Job(tier="relaxed", account="a", model=model, downgradable=True,
               inputs={"prompt": prompt, "seed": seed, "steps": steps, "width": 64,
                       "height": 64})


def pending(lane: str, seq: int, arrived: float = 0.0, **kw) -> Pending:
    return Pending(job(**kw), lane, seq, deadline=1e9, arrived=arrived)


# --- grouping and order, no processes ----------------------------------------------
def test_pick_runs_highest_lane_group_once_any_group_is_ready():
    relaxed = [pending("relaxed", i, steps=4) for i in range(2)]  # full: max_batch 2
    fast = pending("fast", 2, steps=5)  # alone, far from its delay
    group, _ = pick([*relaxed, fast], now=1.0, max_batch=lambda m: 2,
                    delay_s=lambda m: 60.0, capacity=None)
    assert group == [fast]
    group, wait_s = pick([fast], now=1.0, max_batch=lambda m: 2, delay_s=lambda m: 60.0,
                         capacity=None)
    assert group == [] and wait_s == pytest.approx(59.0)
    # every thread of the pool is waiting here: nothing more can arrive, so go now
    group, _ = pick([fast], now=1.0, max_batch=lambda m: 2, delay_s=lambda m: 60.0, capacity=1)
    assert group == [fast]


def test_pick_takes_fast_jobs_first_within_a_group_and_caps_its_size():
    items = [pending("relaxed", 0), pending("standard", 1), pending("relaxed", 2),
             pending("fast", 3)]
    group, _ = pick(items, now=0.0, max_batch=lambda m: 2, delay_s=lambda m: 0.0, capacity=None)
    assert [p.seq for p in group] == [3, 1]
    other_model = pending("relaxed", 4, model="demo-0")
    group, _ = pick([items[0], other_model], now=0.0, max_batch=lambda m: 8,
                    delay_s=lambda m: 0.0, capacity=None)
    assert group == [items[0]]  # never mixes models


def test_batcher_forms_one_pass_per_compatible_group_in_lane_order():
    passes: list[list[tuple[str, int]]] = []
    release = threading.Event()

    def execute(group: list[Pending]) -> None:
        release.wait(10)  # the first pass holds the runner while the rest queue up
        passes.append([(p.lane, p.job.inputs["steps"]) for p in group])
        for p in group:
            p.ran, _ = object(), p.done.set()

    batcher = Batcher(execute, capacity=6, max_batch=lambda m: 4,
                      delay_s=lambda m: 0.0 if m == "demo-0" else 60.0)
    # the first (no delay) holds the runner; then a full group and a lone fast job
    jobs = [("relaxed", 3, "demo-0"), *[("relaxed", 4, "demo")] * 3, ("fast", 5, "demo"),
            ("standard", 4, "demo")]
    threads = []
    for lane, steps, model in jobs:
        threads.append(threading.Thread(target=batcher.run,
                                        args=(job(model=model, steps=steps), lane)))
        threads[-1].start()
        if len(threads) == 1:
            wait_until(lambda: batcher.stats()["passes"] == 1, 10, "first pass")
    wait_until(lambda: batcher.stats()["pending"] == 5, 10, "jobs to queue")
    release.set()
    for thread in threads:
        thread.join(10)
    assert passes == [[("relaxed", 3)], [("fast", 5)],
                      [("standard", 4), ("relaxed", 4), ("relaxed", 4), ("relaxed", 4)]]


def test_a_pass_that_settles_nobody_never_strands_a_job():
    batcher = Batcher(lambda group: None, capacity=1, max_batch=lambda m: 1,
                      delay_s=lambda m: 0.0)  # an execute that forgets its jobs
    with pytest.raises(RuntimeError, match="no outcome"):
        batcher.run(job(), "fast")


def test_a_model_returning_too_few_images_fails_the_jobs_it_shorted(monkeypatch):
    from gpu_worker import batch_run
    from gpu_worker.runtime import RUNTIME

    class Short:  # a model whose generate_batch drops the last image
        def generate(self, prompt, **kw):
            return np.zeros((64, 64, 3), np.uint8)

        def generate_batch(self, prompts, seeds, **kw):
            return [np.zeros((64, 64, 3), np.uint8)] * (len(prompts) - 1)

    monkeypatch.setattr(RUNTIME, "model", lambda name: (Short(), None))
    group = [pending("relaxed", i) for i in range(3)]
    batch_run.run_group(group)
    assert all(item.done.is_set() for item in group)  # no thread left waiting
    assert [item.error is None for item in group] == [True, True, True]  # rerun one by one


def test_demo_batch_equals_singles_bit_for_bit():
    model = DemoModel("demo", "cpu", make_weights("demo"), batch_invariant=True)
    prompts, seeds = ["a red fox", "", "blue ocean waves", "a red fox"], [1, 2, 3, 4]
    for shape in (dict(steps=3, width=64, height=64), dict(steps=2, width=96, height=64)):
        batch = model.generate_batch(prompts, seeds, **shape)
        for prompt, seed, image in zip(prompts, seeds, batch):
            assert np.array_equal(image, model.generate(prompt, seed=seed, **shape))
        assert not np.array_equal(batch[0], batch[3])  # same prompt, other seed


# --- a real worker that batches --------------------------------------------------------
@pytest.fixture(scope="module")
def cluster(cluster_factory):
    return cluster_factory(workers=1, env=ENV)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The demo model in this process, one job at a time, as the worker would save it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    model = DemoModel("demo", "cpu", make_weights("demo"), batch_invariant=True)
    folder = tmp_path_factory.mktemp("singles")

    def png(prompt: str, seed: int) -> bytes:
        pixels = model.generate(prompt, seed=seed, **SMALL)
        return Path(store_png(str(uuid.uuid4()), pixels, root=str(folder)).url).read_bytes()
    yield png
    torch.set_num_threads(previous)


def batcher_stats(app, host: str) -> dict:
    for answer in app.control.broadcast(STATS_COMMAND, reply=True, timeout=1.0,
                                        destination=[host]):
        return answer[host]["batching"]
    return {}


def test_worker_batches_and_each_image_equals_its_single_run(cluster, reference):
    results = [submit(f"harbour lights {i}", seed=10 + i, **SMALL) for i in range(BATCH)]
    done = [r.get(timeout=60) for r in results]
    assert [d["batch_size"] for d in done] == [BATCH] * BATCH
    for i, out in enumerate(done):
        assert Path(out["image"]).read_bytes() == reference(f"harbour lights {i}", 10 + i)
    assert len({np.asarray(Image.open(d["image"])).tobytes() for d in done}) == BATCH


def hold_runner(app, host: str, prompt: str = "hold the runner") -> tuple[str, object]:
    gate = new_gate()
    blocker = submit(f"gate:{gate} {prompt}", tier="relaxed", model="flaky", **SMALL)
    wait_at_gate(blocker, gate)
    return gate, blocker


def test_a_class_model_batches_by_its_batch_key(cluster, app):
    """Held behind a busy runner (its pool has one thread per batch place): two ``odd``
    jobs of one key and one of another. Freed, the two share one predict_batch pass
    and the third runs alone."""
    host = cluster.hostnames[0]
    gate, blocker = hold_runner(app, host)
    same = [submit(model="odd", kind="steps", steps=2, tier="relaxed") for _ in range(2)]
    other = submit(model="odd", kind="steps", steps=3, tier="relaxed")
    wait_until(lambda: batcher_stats(app, host).get("pending") == 3, 30, "3 jobs held")
    open_gate(gate)
    outs = [r.get(timeout=60) for r in same]
    assert [o["output"] for o in outs] == [{"steps": 2, "batched_with": 2}] * 2
    assert [o["batch_size"] for o in outs] == [2, 2]
    assert other.get(timeout=60)["output"] == {"steps": 3}  # alone: predict, not the batch
    blocker.get(timeout=60)


def test_poisoned_job_fails_alone(cluster, app, reference):
    host = cluster.hostnames[0]
    gate, blocker = hold_runner(app, host)
    prompts = ["bug in the batch", "good one", "good two"]
    results = [submit(p, model="flaky", seed=i, **SMALL) for i, p in enumerate(prompts)]
    wait_until(lambda: batcher_stats(app, host).get("pending") == 3, 30, "3 jobs held")
    open_gate(gate)
    with pytest.raises(JobFailed, match="simulated bug"):
        results[0].get(timeout=60)
    for i, result in enumerate(results[1:], start=1):
        out = result.get(timeout=60)
        assert out["attempts"] == 1 and out["batch_size"] == 1  # ran again, alone
        assert Path(out["image"]).read_bytes() == reference(prompts[i], i)
    blocker.get(timeout=60)
    log = (cluster.log_dir / "workers.log").read_text()
    assert "batched pass of 3 failed (ValueError: simulated bug" in log


def test_fast_job_runs_before_a_ready_relaxed_batch(cluster, app):
    """Held: a runner busy at a gate; a full relaxed group (demo-0, max_batch 2);
    a lone fast job of another model, far from its 5 s delay. Freed, the fast
    job must go first, and at once."""
    host = cluster.hostnames[0]
    gate, blocker = hold_runner(app, host)
    relaxed = [submit(f"backlog {i}", tier="relaxed", model="demo-0", seed=i, **SMALL)
               for i in range(2)]
    fast = submit("urgent", tier="fast", seed=9, **SMALL)
    wait_until(lambda: batcher_stats(app, host).get("pending") == 3, 30, "3 jobs held")
    open_gate(gate)
    out_fast = fast.get(timeout=60)
    done = [r.get(timeout=60) for r in relaxed]
    blocker.get(timeout=60)
    began = lambda r: r["started_at"] + r["batch_wait_ms"] / 1000  # noqa: E731
    assert out_fast["batch_size"] == 1 and [d["batch_size"] for d in done] == [2, 2]
    assert began(out_fast) < min(began(d) for d in done)
    assert out_fast["batch_wait_ms"] < 4000  # it did not wait out its delay


def test_out_of_memory_pass_is_split_in_halves(monkeypatch):
    from gpu_worker import batch_run
    sizes: list[int] = []

    class SmallCard:
        def generate_batch(self, prompts, seeds, **_):
            sizes.append(len(prompts))
            if len(prompts) > 2:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
            return [f"image {s}" for s in seeds]

    monkeypatch.setattr(batch_run.RUNTIME, "model", lambda name: (SmallCard(), None))
    group = [Pending(job(seed=i), "relaxed", i, deadline=1e12) for i in range(4)]
    batch_run.run_group(group)
    assert sizes == [4, 2, 2]
    assert [(p.ran.pixels, p.ran.batch_size) for p in group] == [
        (f"image {i}", 2) for i in range(4)]


def test_a_job_revoked_in_a_batched_pass_drops_out_alone(cluster, app, reference):
    """Three jobs held for one pass, one revoked: at the pass's first step it drops out
    (REVOKED) and the other two run on together, their images those of their singles."""
    host = cluster.hostnames[0]
    gate, blocker = hold_runner(app, host)
    prompts = ["batch keeper one", "batch quitter", "batch keeper two"]
    results = [submit(p, seed=60 + i, **SMALL) for i, p in enumerate(prompts)]
    wait_until(lambda: batcher_stats(app, host).get("pending") == 3, 30, "3 jobs held")
    results[1].revoke()
    wait_until(lambda: revoked_on(app, host, results[1].id), 30, "the revoke to arrive")
    open_gate(gate)
    with pytest.raises(TaskRevokedError):
        results[1].get(timeout=60)
    for i in (0, 2):
        out = results[i].get(timeout=60)
        assert out["batch_size"] == 2 and out["attempts"] == 1
        assert Path(out["image"]).read_bytes() == reference(prompts[i], 60 + i)
    blocker.get(timeout=60)


def revoked_on(app, host: str, job_id: str) -> bool:
    replies = app.control.inspect(timeout=1.0, destination=[host]).revoked() or {}
    return job_id in replies.get(host, [])
