"""``blob``: a model of the general contract that returns ``size_bytes`` random bytes,
stored as a binary artifact. Its runs are counted across processes by ``tag``
(``runs_started``, ``runs_finished``: the model call returned), as
``tests.flaky_model`` counts its own."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field


class BlobInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tag: str = Field(pattern=r"^[a-z0-9-]{1,64}$")
    size_bytes: int = Field(100_000, ge=1, le=4_000_000)


def _run_log(tag: str, what: str) -> Path:
    return Path(os.environ["GPULANES_STATE_DIR"]) / "blob" / f"{tag}.{what}"


def _note(tag: str, what: str) -> None:
    path = _run_log(tag, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as log:  # one line per run, atomic with O_APPEND
        log.write(b"run\n")


def _count(tag: str, what: str) -> int:
    try:
        return _run_log(tag, what).read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def runs_started(tag: str) -> int:
    """Runs of ``tag`` that entered the model, in every worker."""
    return _count(tag, "started")


def runs_finished(tag: str) -> int:
    """Runs of ``tag`` whose model call returned its bytes, in every worker."""
    return _count(tag, "finished")


class Blob:
    Input = BlobInput

    def __init__(self, *, device: str, model_dir: Path) -> None:
        self.device = device

    def warmup(self) -> None:
        pass

    def predict(self, inputs: BlobInput, progress: Callable[[int, int], None]) -> dict:
        _note(inputs.tag, "started")
        progress(1, 1)
        data = os.urandom(inputs.size_bytes)  # random: no file system stores it smaller
        _note(inputs.tag, "finished")
        return {"blob": data}
