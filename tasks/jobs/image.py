"""An image model's inputs (the built-in demo family, any factory named in
``GPULANES_MODELS``), typed, with the limits of the model they describe: a job's
``prompt``, ``seed``, ``steps``, ``width`` and ``height`` (``tasks.jobs.schema``
checks them before enqueue)."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

#: Longest prompt, in characters.
MAX_PROMPT_CHARS = 2000
#: Most denoising steps a job may ask for.
MAX_STEPS = 150
#: An image side's bounds, in pixels; every side is a multiple of SIDE_STEP.
MIN_SIDE = 64
MAX_SIDE = 1024
SIDE_STEP = 8
#: Largest seed: a signed 64-bit integer, as every JSON reader and the model take it.
MAX_SEED = 2**63 - 1


class ImageInput(BaseModel):
    """An image job's inputs. Strict: ``"20"`` or ``20.0`` is no number of steps."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)  #: None: one is drawn at submit
    steps: int = Field(20, ge=1, le=MAX_STEPS)
    width: int = Field(256, ge=MIN_SIDE, le=MAX_SIDE, multiple_of=SIDE_STEP)
    height: int = Field(256, ge=MIN_SIDE, le=MAX_SIDE, multiple_of=SIDE_STEP)
