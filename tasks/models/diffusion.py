"""Any diffusers text-to-image pipeline as a gpulanes model.

``Diffusion`` loads a pipeline saved with ``save_pretrained`` (or downloaded
from the Hub) with ``DiffusionPipeline.from_pretrained``, on the worker's
device, once per worker. A team points it at its own pipeline in one of two ways:

- subclass it, naming the pipeline's folder under the model dir (or an absolute
  path), and pin the weights' version so that cached results follow them::

      # myteam/models.py
      from tasks.models.diffusion import Diffusion

      class SdTurbo(Diffusion):
          folder = "sd-turbo"          # $GPULANES_MODEL_DIR/sd-turbo
          version = "sd-turbo@main-2024-01"

      GPULANES_MODELS="sd-turbo=myteam.models:SdTurbo"

- or use ``Diffusion`` as it is, with the model dir itself holding the saved
  pipeline: ``GPULANES_MODELS="sd=tasks.models.diffusion:Diffusion"``.

Only this module's ``Input`` is imported by submitting processes, so torch and
diffusers are imported inside the methods, never at module level.
"""
from __future__ import annotations

import inspect
import secrets
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from tasks.models.hf import Progress, Saved, saved_folder, torch_dtype

#: The same bound as the ``demo`` family's prompts (``tasks.jobs.image.MAX_PROMPT_CHARS``).
MAX_PROMPT_CHARS = 2000
#: Seeds drawn for unseeded jobs stay below this, short enough to read and retype.
DRAWN_SEED_BOUND = 2**32


class DiffusionInput(BaseModel):
    """One text-to-image job. Unknown fields are refused so a misspelt one is not ignored."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS)
    negative_prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    guidance_scale: float = Field(7.5, ge=0, le=30)
    steps: int = Field(25, ge=1, le=150)
    width: int = Field(512, ge=64, le=1024, multiple_of=8)
    height: int = Field(512, ge=64, le=1024, multiple_of=8)
    num_images: int = Field(1, ge=1, le=4)
    #: Same seed, same images (on the same kind of device); None: one is drawn and returned.
    seed: int | None = Field(None, ge=0, le=2**63 - 1)


class Diffusion(Saved):
    """A diffusers pipeline behind the model contract; see the module docstring."""

    Input: ClassVar[type[DiffusionInput]] = DiffusionInput
    #: A fast job may stop it at a step boundary (it starts again later: a pipeline
    #: cannot start from a step's latents in general).
    preemptible: ClassVar[bool] = True

    def __init__(self, *, device: str, model_dir: str | Path) -> None:
        path = saved_folder(model_dir, self.folder, what="diffusers pipeline")
        from diffusers import DiffusionPipeline  # after the check: a wrong path fails fast

        self.device, self.path = device, path
        self.pipe = DiffusionPipeline.from_pretrained(
            path, dtype=torch_dtype(device, self.cuda_dtype)).to(device)
        # The worker reports progress; tqdm bars would only fill its log.
        self.pipe.set_progress_bar_config(disable=True)
        # Older or unusual pipelines lack per-step callbacks: those report at the end only.
        self._has_step_callback = ("callback_on_step_end"
                                   in inspect.signature(self.pipe.__call__).parameters)

    def warmup(self) -> None:
        """One 1-step 64x64 image, so kernels and allocators are hot before the first job."""
        self.predict(DiffusionInput(prompt="warmup", steps=1, width=64, height=64, seed=0),
                     lambda done, total: None)

    @staticmethod
    def cost(inputs: DiffusionInput) -> float:
        """Relative cost for wait estimates: denoising steps over 512x512 pixels."""
        return inputs.steps * inputs.num_images * inputs.width * inputs.height / 512**2

    def predict(self, inputs: DiffusionInput, progress: Progress) -> dict[str, Any]:
        """Generate ``num_images`` images; ``{"images": [PIL images], "seed", "seed_drawn"}``."""
        drawn = inputs.seed is None
        seed = secrets.randbelow(DRAWN_SEED_BOUND) if drawn else inputs.seed
        images = self.pipe(**self._call_kwargs(inputs, seed, progress)).images
        if not self._has_step_callback:
            progress(inputs.steps, inputs.steps)
        return {"images": list(images), "seed": seed, "seed_drawn": drawn}

    def _call_kwargs(self, inputs: DiffusionInput, seed: int,
                     progress: Progress) -> dict[str, Any]:
        """The pipeline's arguments for one job."""
        import torch

        kwargs: dict[str, Any] = dict(
            prompt=inputs.prompt, guidance_scale=inputs.guidance_scale,
            num_inference_steps=inputs.steps, width=inputs.width, height=inputs.height,
            num_images_per_prompt=inputs.num_images, output_type="pil",
            # On the job's device: the pipeline draws all its noise from this generator.
            generator=torch.Generator(self.device).manual_seed(seed))
        if inputs.negative_prompt is not None:
            # Passed only when given: some pipelines take no negative prompt.
            kwargs["negative_prompt"] = inputs.negative_prompt
        if self._has_step_callback:
            kwargs["callback_on_step_end"] = self._step_callback(inputs.steps, progress)
        return kwargs

    def _step_callback(self, steps: int, progress: Progress) -> Any:
        """A ``callback_on_step_end`` that reports each step; what ``progress`` raises
        propagates out of the pipeline and so stops the run."""
        def on_step_end(pipe: Any, step: int, timestep: Any,
                        callback_kwargs: dict[str, Any]) -> dict[str, Any]:
            # Second-order schedulers (Heun) run more timesteps than steps asked for.
            total = max(steps, int(getattr(pipe, "num_timesteps", 0) or 0))
            progress(step + 1, total)
            return callback_kwargs
        return on_step_end
