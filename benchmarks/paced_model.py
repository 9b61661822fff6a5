"""``paced``: a resumable torch model whose steps take a set time, as a GPU's do.

Each step runs a small torch layer on the job's state, then waits out the rest of
``step_ms``: on a GPU the CPU waits for the kernel, here it sleeps. So a host with few
cores still runs several workers side by side at the pace a fleet of GPUs would, and
a benchmark of scaling measures the scaling, not how the CPUs are shared. The state
goes with each step (``progress(done, total, state)``), so a stopped worker hands its
job on and another resumes it: the output is the same, bit for bit.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import torch
from pydantic import BaseModel, ConfigDict, Field

#: The state's width: one layer of WIDTH x WIDTH a step.
WIDTH = 64


class PacedInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int = Field(0, ge=0, le=10**9)  #: the job's seed
    steps: int = Field(20, ge=1, le=500)
    step_ms: int = Field(100, ge=1, le=2000)  #: the time one step takes


class Paced:
    Input = PacedInput
    memory_mb = 2
    resumable = True

    def __init__(self, *, device: str, model_dir: Path) -> None:
        self.device = device
        weights = torch.Generator().manual_seed(0)
        self.layer = (torch.randn(WIDTH, WIDTH, generator=weights) / WIDTH ** 0.5).to(device)

    def warmup(self) -> None:
        self._step(torch.zeros(WIDTH, device=self.device))

    def _step(self, state: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.layer @ state + 0.1)

    def predict(self, inputs: PacedInput, progress: Callable[..., None],
                resume: tuple[int, torch.Tensor] | None = None) -> dict:
        done, state = resume or (0, torch.randn(
            WIDTH, generator=torch.Generator().manual_seed(inputs.n)).to(self.device))
        for step in range(done + 1, inputs.steps + 1):
            began = time.perf_counter()
            state = self._step(state)
            time.sleep(max(0.0, inputs.step_ms / 1000 - (time.perf_counter() - began)))
            progress(step, inputs.steps, state)
        return {"n": inputs.n, "checksum": float(state.double().sum())}
