"""``odd``: a model of the general contract whose output the test chooses (``kind``):
images and bytes to be stored as artifacts, or something JSON cannot hold."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.models.diffusion import Diffusion  # light: the libraries load in __init__
from tasks.models.text import TextEmbedding
from tasks.models.types import StoredArtifact


class OddInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["artifacts", "not_json", "not_a_dict", "steps", "read"]
    steps: int = Field(3, ge=1, le=20)
    source: StoredArtifact | None = None  #: for "read": an artifact to read back
    lora: str | None = None  #: an adapter its worker would keep loaded: the route key


class Odd:
    Input = OddInput

    def __init__(self, *, device: str, model_dir: Path) -> None:
        self.device = device

    def warmup(self) -> None:
        pass

    def predict(self, inputs: OddInput, progress: Callable[[int, int], None]) -> object:
        for step in range(1, inputs.steps + 1):
            progress(step, inputs.steps)
        if inputs.kind == "artifacts":
            import numpy as np
            from PIL import Image

            red = Image.new("RGB", (8, 8), (255, 0, 0))
            return {"images": [red, np.zeros((4, 4, 3), dtype=np.uint8)],
                    "blob": b"\x00\x01binary", "note": "two images and some bytes"}
        if inputs.kind == "read":
            from tasks.jobs.artifacts import open_artifact

            with open_artifact(inputs.source) as file:
                return {"bytes_read": len(file.read())}
        if inputs.kind == "not_json":
            return {"value": object()}
        if inputs.kind == "not_a_dict":
            return ["a", "list"]
        return {"steps": inputs.steps}

    @staticmethod
    def route_key(inputs: OddInput) -> str | None:
        """Jobs of one LoRA go to one worker (which would keep it loaded)."""
        return f"lora:{inputs.lora}" if inputs.lora else None

    @staticmethod
    def batch_key(inputs: OddInput) -> object:
        """Jobs of one kind and length share a pass."""
        return inputs.kind, inputs.steps

    def predict_batch(self, batch: list[OddInput],
                      progress: Callable[[int, int], None]) -> list[object]:
        """One pass for the whole batch: each output says how many shared it."""
        for step in range(1, batch[0].steps + 1):
            progress(step, batch[0].steps)
        return [{"steps": item.steps, "batched_with": len(batch)} for item in batch]


def unloadable(*, name: str, device: str, model_dir: Path) -> object:
    """A factory that imports but cannot load its weights: its worker cannot warm it."""
    from tasks.errors import ModelError

    raise ModelError(f"model {name!r}: its weights are missing (on purpose)")


class TinySd(Diffusion):
    """A tiny random-weight pipeline the test saves under the workers' model folder."""

    folder, version = "tiny-sd", "tiny-1"


class TinyBert(TextEmbedding):
    """A tiny random-weight BERT the test saves under the workers' model folder."""

    folder, version = "tiny-bert", "tiny-1"


class StoredSd(Diffusion):
    """The tiny pipeline, fetched by the worker from ``GPULANES_MODEL_STORE``."""

    folder, version = "stored-sd", "tiny-1"
