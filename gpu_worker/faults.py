"""Worker faults: which failures are this worker's own, and how it tells their cause went.

A failure of the worker's own making (disk, device) says nothing about the job.
Each kind has its self-check: an I/O error writes a file where it failed, and in the
artifact store as many bytes as this worker's recent jobs wrote there
(:data:`ARTIFACT_BYTES`: a tiny file still fits on a nearly full disk); a device
error runs a tiny op on the device. A check raises while the cause is still there.
"""
from __future__ import annotations

import os
import sys
import threading
import uuid
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from gpu_worker.runtime import RUNTIME
from tasks.errors import ModelError, WorkerFault
from tasks.jobs.artifacts import local_folder, probe_store
from tasks.settings import settings

#: Words in the message of a device error (torch raises them as RuntimeError).
DEVICE_ERROR_WORDS = ("CUDA error", "device-side assert", "cuDNN error", "CUBLAS_STATUS",
                      "NCCL error", "ECC error")
#: Runs whose artifact bytes a self-check makes room for (the largest of them).
RECENT_RUNS = 8
#: Largest probe a self-check writes to the store: a store with room for this much
#: and not for a huge artifact (a video) shows it at the next refused write.
PROBE_MAX_BYTES = 16 << 20


class ArtifactBytes:
    """The artifact bytes of this worker's last :data:`RECENT_RUNS` runs (written, or
    refused), and those runs waiting for the store hold in memory: what the store must
    have room for before the worker takes jobs again."""

    def __init__(self, recent: int = RECENT_RUNS) -> None:
        self._recent: deque[int] = deque(maxlen=recent)
        self._waiting_bytes = 0
        self._lock = threading.Lock()

    def ran(self, n_bytes: int) -> None:
        """A run has ``n_bytes`` of artifacts to write."""
        with self._lock:
            self._recent.append(n_bytes)

    @contextmanager
    def waiting(self, n_bytes: int) -> Iterator[None]:
        """A run holds ``n_bytes`` the store refused, until it writes them or gives up."""
        with self._lock:
            self._waiting_bytes += n_bytes
        try:
            yield
        finally:
            with self._lock:
                self._waiting_bytes -= n_bytes

    def need_bytes(self) -> int:
        """Room for the waiting runs' bytes and one more run as large as the recent ones."""
        with self._lock:
            return self._waiting_bytes + max(self._recent, default=0)


#: The one record of this worker process.
ARTIFACT_BYTES = ArtifactBytes()


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


def check_store(root: str, need_bytes: int) -> None:
    """Room in the artifact store ``root`` for ``need_bytes`` (at most
    :data:`PROBE_MAX_BYTES`): free space on a local disk, then a probe of that size
    written and removed (``tasks.jobs.artifacts.probe_store``)."""
    probe_store(root, min(need_bytes, PROBE_MAX_BYTES))


def self_check(exc: BaseException, written: ArtifactBytes = ARTIFACT_BYTES) -> Callable[[], None]:
    """The check that must pass before serving again after ``exc``: I/O -> write in
    the folder that failed, and room in the artifact store for what recent jobs wrote
    (``written``, read at each check); anything else (a device error) -> a device op."""
    cause = exc if isinstance(exc, OSError) else exc.__cause__
    if isinstance(exc, WorkerFault) or isinstance(cause, OSError):
        folder = folder_of(cause)
        folders = [] if folder is None or folder == local_folder(settings.artifact_root) \
            else [folder]

        def check() -> None:
            check_folders(folders)
            check_store(settings.artifact_root, written.need_bytes())

        return check
    return check_device
