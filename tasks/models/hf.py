"""Ready-made models for ``GPULANES_MODELS`` that wrap Hugging Face libraries.

- ``tasks.models.diffusion:Diffusion``: any diffusers
  ``DiffusionPipeline`` saved in a folder (text to image).
- ``tasks.models.text:TextEmbedding``: mean-pooled sentence
  embeddings from an ``AutoModel``.
- ``tasks.models.text:TextGeneration``: greedy decoding from
  an ``AutoModelForCausalLM``.

Each follows the model contract (``Input``, ``__init__(*, device, model_dir)``,
``warmup()``, ``predict(inputs, progress)``). The submitting process imports
these modules for their ``Input`` class only, so they import nothing heavy at
module level: torch, diffusers and transformers load in ``__init__``. Those
libraries come with the ``models`` extra: ``pip install "gpulanes[models]"``.
This package imports none of its modules, for the same reason.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, ClassVar

from tasks.errors import ModelError

#: ``progress(done, total)`` reports a finished step; it may raise to stop the job.
Progress = Callable[[int, int], None]


class Saved:
    """What every adapter declares: the model's saved folder, its version, its dtype."""

    #: A fixed pass (seeded, or greedy) repeats exactly on one device: results are cached.
    deterministic: ClassVar[bool] = True
    #: Part of the result cache's key: set a new one whenever the weights change.
    version: ClassVar[str] = "1"
    #: The saved model's folder under ``model_dir``; empty: ``model_dir`` itself.
    folder: ClassVar[str] = ""
    #: Weights' dtype on CUDA ("bfloat16" suits some newer models); float32 on the CPU.
    cuda_dtype: ClassVar[str] = "float16"


def saved_folder(model_dir: str | Path, folder: str, *, what: str) -> Path:
    """The folder a model class loads from: ``model_dir / folder`` (``folder`` may be
    empty, meaning ``model_dir`` itself, or absolute). Checked here so that a wrong
    path fails at load with a message, not deep inside ``from_pretrained``."""
    path = Path(model_dir) / folder if folder else Path(model_dir)
    if not path.is_dir():
        raise ModelError(f"no saved {what} at {path}: save one there with save_pretrained "
                         f"(or download it, e.g. `huggingface-cli download REPO --local-dir "
                         f"{path}`), or point the class's `folder` or the model dir at it")
    return path


def torch_dtype(device: str, cuda_dtype: str) -> Any:
    """``cuda_dtype`` (a torch dtype name) on CUDA; float32 on the CPU, where half
    precision is slow or unsupported."""
    import torch

    return getattr(torch, cuda_dtype) if device.startswith("cuda") else torch.float32
