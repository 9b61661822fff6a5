"""The model interfaces, and the registry that builds models from configuration.

Any model: a class named in ``GPULANES_MODELS`` as ``name=module:Class`` with a
pydantic ``Input``, ``__init__(*, device, model_dir)`` (load weights, once per
worker), ``warmup()`` and ``predict(inputs, progress) -> dict`` (see
``tasks.jobs.catalog`` and ``tasks.worker.outputs``). An image model, below, is the
older and narrower shape the built-in demo family keeps.

A model is anything with this shape, built once per worker by a *factory*
named in ``GPULANES_MODELS`` as ``name=module:factory``::

    def factory(*, name: str, device: str, model_dir: pathlib.Path) -> ImageModel

The factory loads weights onto ``device`` (``"cpu"`` or ``"cuda"``/``"cuda:0"``)
and returns a ready model. The worker calls ``warmup()`` once before it
consumes any job, then ``generate()`` per job. A model may also offer
``generate_batch(prompts, seeds, *, steps, width, height, on_step)``, one
forward pass returning one image per prompt, each bit-for-bit what
``generate`` gives it alone; only such a model is batched (see
``gpu_worker.batching``). To serve a diffusers pipeline,
write a ten-line factory that loads it and wraps ``pipe(prompt, ...)`` in
``generate`` and point ``GPULANES_MODELS`` at it.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from gpu_worker.store import checkpoint_folder
from tasks.errors import ModelError
from tasks.settings import settings

#: Called with the index of each finished step; may raise to stop the run.
StepCallback = Callable[[int], None]
#: Called with the number of finished steps and the model's state after them (what a
#: resumable model starts again from: ``resume=(step, state)``).
Keep = Callable[[int, Any], None]


class ImageModel(Protocol):
    """A loaded, device-resident model that turns a prompt into an image."""

    name: str
    device: str

    def warmup(self) -> None:
        """Run one small pass so kernels, allocators and caches are hot."""

    def generate(self, prompt: str, *, seed: int, steps: int, width: int,
                 height: int, on_step: StepCallback | None = None) -> np.ndarray:
        """Return an ``(height, width, 3)`` ``uint8`` RGB image; same inputs, same image."""


def model_target(name: str, specs: dict[str, str]) -> Any:
    """The class or factory ``name``'s spec names, imported."""
    spec = specs.get(name)
    if spec is None:
        raise ModelError(f"unknown model {name!r}; GPULANES_MODELS knows {sorted(specs)}")
    module_name, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ModelError(f"model {name!r}: cannot import {spec!r}: {exc}") from exc


def load_model(name: str, specs: dict[str, str], device: str, model_dir: Path) -> Any:
    """Build model ``name`` as its spec says: a class (``Input`` and ``predict``) is
    instantiated on ``device`` (its weights load in ``__init__``); a factory is called.
    A class may declare what it holds, ``memory_mb: ClassVar[int | None]`` (MB; see
    ``gpu_worker.memory``), so that room is made before it loads."""
    target = model_target(name, specs)
    if is_predictor(target):
        return target(device=device, model_dir=_class_model_dir(name, target, Path(model_dir)))
    return target(name=name, device=device, model_dir=Path(model_dir))


def _class_model_dir(name: str, cls: type, model_dir: Path) -> Path:
    """The model dir a class loads from, unchanged. With ``GPULANES_MODEL_STORE`` set, a
    class that names its saved folder (``folder``, relative) has it fetched from the
    store into the model dir first: verified, once per host, its manifest pinned for
    the cluster under the folder's name. A class without one loads as it always does."""
    folder = str(getattr(cls, "folder", "") or "")
    if settings.model_store and folder and not Path(folder).is_absolute():
        checkpoint_folder(folder, model_dir, settings.model_store)
    return model_dir


def is_predictor(target: Any) -> bool:
    """A model of the general contract: a class with ``Input`` and ``predict``."""
    return isinstance(target, type) and hasattr(target, "predict") and hasattr(target, "Input")
