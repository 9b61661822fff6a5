"""Device discovery and the device a worker process is pinned to."""
from __future__ import annotations

import os

from tasks.errors import ConfigError

#: Set by the launcher for each worker process it starts.
WORKER_DEVICE_ENV = "GPULANES_WORKER_DEVICE"


def gpu_count() -> int:
    """How many CUDA devices this host offers (0 without CUDA)."""
    import torch  # imported here: the supervisor only needs it for this

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve(device: str) -> str:
    """``auto`` becomes ``cuda`` when a GPU is present, else ``cpu``."""
    if device == "auto":
        return "cuda" if gpu_count() else "cpu"
    if device == "cuda" and not gpu_count():
        raise ConfigError("GPULANES_DEVICE", "cuda was asked for but no CUDA device is "
                          "visible; use auto or cpu")
    return device


def worker_device(setting: str) -> str:
    """The torch device of this worker: pinned by the launcher, else resolved."""
    pinned = os.environ.get(WORKER_DEVICE_ENV)
    if pinned:
        return pinned
    # CUDA_VISIBLE_DEVICES (if set) already narrowed the view to one GPU.
    return "cuda:0" if resolve(setting) == "cuda" else "cpu"
