"""A worker told to stop (SIGTERM: scale-down) hands its running job on.

Its run steps aside at its next step, as for a fast job (``gpu_worker.preempt``), but
its next copy goes to the front of the shared lane, for any worker. A resumable
model's state at that step goes to the artifact store, named in the copy's route
(``resume``: step, URL, sha256), and the worker that takes the copy reads it and picks
up at that step: the same output, bit for bit, on the same kind of device. A state is
written as safetensors (a tensor, or a dict of named tensors) or as JSON; never pickled.
A state that is neither, or a store that refuses it, and the job starts again from its
first step. A run in a batch runs to its end.
"""
from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from tasks.jobs.artifacts import ArtifactError, open_artifact, store_bytes

log = logging.getLogger(__name__)
#: The artifact name of a handed-over state.
STATE = "resume-state"
TENSORS, JSON = "application/vnd.safetensors", "application/json"


#: The one name of a state that is a single tensor.
ONE = "__state__"


def encoded(state: Any) -> tuple[bytes, str] | None:
    """(bytes, media type) of ``state``, or None when it is neither tensors nor JSON."""
    import torch

    tensors = {ONE: state} if isinstance(state, torch.Tensor) else state
    if isinstance(tensors, dict) and tensors and all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()):
        from safetensors.torch import save

        return save({k: v.detach().contiguous() for k, v in tensors.items()}), TENSORS
    try:
        return json.dumps(state, allow_nan=False).encode(), JSON
    except (TypeError, ValueError):
        return None


def decoded(data: bytes, media_type: str, device: str) -> Any:
    """The state :func:`encoded` wrote, its tensors on ``device``."""
    if media_type == JSON:
        return json.loads(data)
    from safetensors.torch import load

    tensors = {k: v.to(device) for k, v in load(data).items()}
    return tensors[ONE] if set(tensors) == {ONE} else tensors


def hand_over(job_id: str, attempt: int, step: int, state: Any) -> dict[str, Any] | None:
    """Store the state a run of ``job_id`` (its ``attempt``) reached at ``step``: the
    ``resume`` its next copy's route names, or None (it starts again)."""
    found = encoded(state)
    if found is None:
        log.info("job %s: its state is neither tensors nor JSON; it starts again", job_id)
        return None
    data, media_type = found
    try:
        ref = store_bytes(job_id, attempt, STATE, data, media_type)
    except ArtifactError as exc:
        log.warning("job %s: its state was not stored (%s); it starts again", job_id, exc)
        return None
    return {"step": step, "url": ref.url, "sha256": ref.sha256, "media_type": media_type}


def taken_up(job_id: str, resume: dict[str, Any], device: str) -> tuple[int, Any] | None:
    """(step, state) a worker handed ``job_id`` over at, read from the store; None when
    it cannot be read whole (the job starts again)."""
    try:
        with open_artifact(resume["url"]) as file:
            data = file.read()
        if hashlib.sha256(data).hexdigest() != resume["sha256"]:
            raise ValueError("its sha256 differs from the one its copy names")
        return int(resume["step"]), decoded(data, resume["media_type"], device)
    except Exception as exc:  # noqa: BLE001  any unreadable state: start again
        log.warning("job %s: its handed-over state is unreadable (%s: %s); it starts again",
                    job_id, type(exc).__name__, exc)
        return None
