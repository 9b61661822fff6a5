"""``slow``: a class model that takes a second to load and 50 ms a job, for tests of
where a burst of jobs lands (every cold load is worth avoiding)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

#: Seconds a load takes, and a job.
LOAD_S, RUN_S = 1.0, 0.05


class SlowInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int = Field(0, ge=0)  #: tells jobs apart


class Slow:
    Input = SlowInput

    def __init__(self, *, device: str, model_dir: Path) -> None:
        time.sleep(LOAD_S)  # as weights read from disk would
        self.device = device

    def warmup(self) -> None:
        pass

    def predict(self, inputs: SlowInput, progress: Callable[[int, int], None]) -> dict:
        time.sleep(RUN_S)
        progress(1, 1)
        return {"n": inputs.n}
