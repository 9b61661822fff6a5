"""Class models that declare their size (``memory_mb``) and hold next to nothing: a
worker's memory budget is tested with them on any machine, no allocation needed."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, ClassVar

from pydantic import BaseModel, ConfigDict, Field


class SizedInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int = Field(0, ge=0)  #: tells jobs apart


class Small:
    """Declares 90 MB: three share a worker of 300 MB."""

    Input = SizedInput
    memory_mb: ClassVar[int | None] = 90

    def __init__(self, *, device: str, model_dir: Path) -> None:
        self.device = device

    def warmup(self) -> None:
        pass

    def predict(self, inputs: SizedInput, progress: Callable[[int, int], None]) -> dict:
        progress(1, 1)
        return {"n": inputs.n}


class Large(Small):
    """Declares 250 MB: it fills a worker of 300 MB alone."""

    memory_mb: ClassVar[int | None] = 250


class Huge(Small):
    """Declares more than any test worker holds."""

    memory_mb: ClassVar[int | None] = 100_000
