"""Worker faults: which failures are this worker's own, and how it tells their cause went.

A failure of the worker's own making (disk, device) says nothing about the job.
Each kind has its self-check: an I/O error writes a file where it failed and where
artifacts go, a device error runs a tiny op on the device. A check raises while
the cause is still there.
"""
from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Callable

from gpu_worker.runtime import RUNTIME
from tasks.errors import ModelError, WorkerFault
from tasks.settings import settings

#: Words in the message of a device error (torch raises them as RuntimeError).
DEVICE_ERROR_WORDS = ("CUDA error", "device-side assert", "cuDNN error", "CUBLAS_STATUS",
                      "NCCL error", "ECC error")


def _is_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")  # only a worker has torch loaded
    return torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError)


def is_worker_fault(exc: BaseException) -> bool:
    """Disk, device: this worker's trouble, not the job's. (A model that does not load
    is not: a broken checkpoint in the shared store would fail it everywhere, and every
    worker stepping aside for it would stop the fleet, other models included.)"""
    if isinstance(exc, ModelError):
        return False
    if isinstance(exc, WorkerFault):
        return True
    if isinstance(exc, OSError) and not isinstance(exc, (ConnectionError, TimeoutError)):
        return True  # PermissionError, NotADirectoryError, ENOSPC, EIO...
    if _is_oom(exc):
        return False  # the job's size: retried one lane down, the device is fine
    if type(exc).__name__ in ("AcceleratorError", "CudaError"):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc) for w in DEVICE_ERROR_WORDS)


def folder_of(exc: BaseException | None) -> Path | None:
    """The folder an I/O error happened in, when the error names a path."""
    name = getattr(exc, "filename", None)
    if not isinstance(name, (str, bytes, os.PathLike)):
        return None
    path = Path(os.fsdecode(name))
    # FileExistsError from mkdir: something else sits where the folder should be
    return path if isinstance(exc, FileExistsError) else path.parent


def check_folders(folders: list[Path]) -> None:
    """Create and delete a file in each folder (made if missing, as a job would)."""
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".gpulanes-probe-{uuid.uuid4().hex}"
        probe.write_bytes(b"probe")
        probe.unlink()


def check_device() -> None:
    """A tiny op on this worker's device, read back (a broken device raises)."""
    import torch

    if float(torch.ones(16, device=RUNTIME.device).mul(2).sum()) != 32.0:
        raise RuntimeError(f"device {RUNTIME.device} computed a wrong sum")


def self_check(exc: BaseException) -> Callable[[], None]:
    """The check that must pass before serving again after ``exc``: I/O -> write in
    the folder that failed and in ``GPULANES_ARTIFACT_DIR``; anything else (a device
    error) -> a device op."""
    cause = exc if isinstance(exc, OSError) else exc.__cause__
    if isinstance(exc, WorkerFault) or isinstance(cause, OSError):
        folders = list(dict.fromkeys(filter(None, (folder_of(cause), Path(settings.artifact_dir)))))
        return lambda: check_folders(folders)
    return check_device
