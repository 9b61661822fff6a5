"""``slow``: a class model that takes a second to load and 50 ms a job, for tests of
where a burst of jobs lands (every cold load is worth avoiding); ``SlowWarm``, a longer
load that notes when it is warm, for tests of when a new worker takes its first job."""
from __future__ import annotations

import os
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
    memory_mb = 2  #: as a demo model: two fit a worker of GPULANES_MODEL_MEMORY_MB=4

    def __init__(self, *, device: str, model_dir: Path) -> None:
        time.sleep(LOAD_S)  # as weights read from disk would
        self.device = device

    def warmup(self) -> None:
        pass

    def predict(self, inputs: SlowInput, progress: Callable[[int, int], None]) -> dict:
        time.sleep(RUN_S)
        progress(1, 1)
        return {"n": inputs.n}


#: Where a :class:`SlowWarm` notes when it is warm (a file's path, in its worker's env).
WARMED_FILE_ENV = "GPULANES_TEST_WARMED_FILE"
#: Seconds a :class:`SlowWarm` takes to load.
WARM_LOAD_S = 3.0


class SlowWarm(Slow):
    """``slow`` with a longer load, that notes the unix time it is warm in the file
    named by ``GPULANES_TEST_WARMED_FILE``: when its worker could first take a job."""

    def __init__(self, *, device: str, model_dir: Path) -> None:
        time.sleep(WARM_LOAD_S)
        self.device = device

    def warmup(self) -> None:
        if path := os.environ.get(WARMED_FILE_ENV):
            Path(path).write_text(repr(time.time()))
