"""A stopping worker's hand-over of a run's state (``tasks.worker.handoff``): written to
the artifact store as safetensors or JSON, read back exactly, or refused."""
from __future__ import annotations

import uuid

import torch
from conftest import vary

from tasks.broker.message import JobRoute
from tasks.worker import handoff


def test_tensors_and_json_come_back_exactly(tmp_path, monkeypatch):
    vary(monkeypatch, artifact_dir=tmp_path)
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    for state in (latents, {"x": latents, "t": torch.arange(5)}, {"done": [1, 2], "s": "a"}):
        job_id = str(uuid.uuid4())
        resume = handoff.hand_over(job_id, 1, 7, state)
        assert resume["step"] == 7 and resume["url"].startswith(str(tmp_path))
        step, back = handoff.taken_up(job_id, resume, "cpu")
        assert step == 7
        if isinstance(state, torch.Tensor):
            assert torch.equal(back, state) and back.dtype == state.dtype
        elif isinstance(next(iter(state.values())), torch.Tensor):
            assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
        else:
            assert back == state


def test_a_state_that_would_need_pickle_is_not_handed_over(tmp_path, monkeypatch):
    vary(monkeypatch, artifact_dir=tmp_path)
    assert handoff.hand_over(str(uuid.uuid4()), 1, 3, object()) is None
    assert not list(tmp_path.iterdir())  # nothing written


def test_a_state_changed_in_the_store_is_not_taken_up(tmp_path, monkeypatch):
    vary(monkeypatch, artifact_dir=tmp_path)
    job_id = str(uuid.uuid4())
    resume = handoff.hand_over(job_id, 2, 4, torch.ones(3))
    with open(resume["url"], "r+b") as file:
        file.seek(-1, 2)
        file.write(b"\x00")
    assert handoff.taken_up(job_id, resume, "cpu") is None  # it starts again
    assert handoff.taken_up(job_id, {**resume, "url": str(tmp_path / "gone")}, "cpu") is None


def test_the_route_carries_the_resume_and_the_result_does_not_show_it():
    resume = {"step": 4, "url": "/x", "sha256": "ab", "media_type": handoff.TENSORS}
    route = JobRoute("relaxed", "relaxed").preempted_copy(resume)
    assert JobRoute.decode(route.encode()) == route and route.preempted == 1
    assert "resume" not in route.reported()
    assert JobRoute.decode(route.preempted_copy().encode()).resume is None
