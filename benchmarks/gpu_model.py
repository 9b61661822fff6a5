"""The GPU check's model (``benchmarks/gpu.py``): the demo model on the worker's device,
which the words of a prompt make pace its steps or claim device memory.

- ``pace:MS``: each step takes at least MS milliseconds: a job long enough to be
  preempted mid-run, however fast the device;
- ``claim:F``: for its pass, each job holds F times the device memory that was free
  when the model loaded. On CUDA that is a real allocation, and a pass that does not
  fit raises torch's CUDA out-of-memory error; on the CPU the same error is raised
  (as the tests' models raise it) when the pass's claims add up to more than 1.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from gpu_worker import demo_model


def directive(prompt: str, word: str) -> float:
    """The number of ``word:N`` among the prompt's first words; 0 without one."""
    for token in prompt.split()[:4]:
        name, _, value = token.partition(":")
        if name == word and value:
            return float(value)
    return 0.0


class CheckModel:
    """See the module's docstring. Preemptible and resumable as the demo model is."""

    preemptible = resumable = True

    def __init__(self, inner: demo_model.DemoModel, free_bytes: int | None) -> None:
        self.inner, self.device = inner, inner.device
        #: Device memory free at load; None on the CPU (its claims are simulated).
        self.free_bytes = free_bytes

    def warmup(self) -> None:
        self.inner.warmup()

    def generate(self, prompt: str, *, seed: int, **kwargs: Any) -> Any:
        with self._claim([prompt]):
            return self.inner.generate(prompt, seed=seed, **_paced(prompt, kwargs))

    def generate_batch(self, prompts: Sequence[str], seeds: Sequence[int],
                       **kwargs: Any) -> list[Any]:
        with self._claim(prompts):
            return self.inner.generate_batch(prompts, seeds, **_paced(prompts[0], kwargs))

    @contextmanager
    def _claim(self, prompts: Sequence[str]) -> Iterator[None]:
        """Hold the pass's claims of device memory while it runs."""
        share = sum(directive(prompt, "claim") for prompt in prompts)
        if not share or self.free_bytes is None:
            if share > 1:
                raise torch.cuda.OutOfMemoryError(
                    f"CUDA out of memory (simulated on the CPU): the pass claims {share:.2f}"
                    " x the memory free at load")
            yield
            return
        held = torch.empty(int(share * self.free_bytes), dtype=torch.uint8, device=self.device)
        try:
            yield
        finally:
            del held


def _paced(prompt: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with a step callback that first waits out the prompt's ``pace:MS``."""
    delay_s, on_step = directive(prompt, "pace") / 1000, kwargs.get("on_step")
    if not delay_s:
        return kwargs

    def paced(step: int) -> None:
        time.sleep(delay_s)
        if on_step is not None:
            on_step(step)

    return {**kwargs, "on_step": paced}


def load(*, name: str, device: str, model_dir: Path) -> CheckModel:
    """Factory for ``GPULANES_MODELS`` (``check=benchmarks.gpu_model:load``)."""
    inner = demo_model.load(name="demo", device=device, model_dir=model_dir)
    free = torch.cuda.mem_get_info(torch.device(device))[0] \
        if torch.device(device).type == "cuda" else None
    return CheckModel(inner, free)
