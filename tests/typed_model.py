"""``typed``: a model of the general contract whose ``Input`` has a field of each type
class models commonly take; the validator's edge cases and fuzz submit to it."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict


class TypedPart(BaseModel):
    """A nested model of :class:`TypedInput`."""

    ratio: float = 0.0
    tags: list[str] = []
    extra: dict[str, Any] = {}


class TypedInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    number: float = 0.0
    count: int = 0
    text: str = ""
    blob: bytes = b""
    items: list[Any] = []
    mapping: dict[str, Any] = {}
    anything: Any = None
    part: TypedPart | None = None
    parts: list[TypedPart] = []
    maybe: Optional[float] = None


class Typed:
    """Returns how many of its inputs were given."""

    Input = TypedInput

    def __init__(self, *, device: str, model_dir: Path) -> None:
        self.device = device

    def warmup(self) -> None:
        """Nothing to warm."""

    def predict(self, inputs: TypedInput, progress: Callable[[int, int], None]) -> dict:
        progress(1, 1)
        return {"fields_set": len(inputs.model_fields_set)}
