"""``echo``: a model with no weights that returns its text repeated; the smallest
model of the general contract, for trying the lanes and measuring their overhead."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field


class EchoInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=200)
    repeat: int = Field(1, ge=1, le=8)


class Echo:
    """``submit(model="echo", text="hi", repeat=2)`` -> ``output == {"text": "hihi"}``."""

    Input = EchoInput
    deterministic = True  # same text, same output: the result cache applies
    version = "1"

    def __init__(self, *, device: str, model_dir: Path) -> None:
        self.device = device

    def warmup(self) -> None:
        """Nothing to warm."""

    def predict(self, inputs: EchoInput, progress: Callable[[int, int], None]) -> dict:
        progress(1, 1)
        return {"text": inputs.text * inputs.repeat}
