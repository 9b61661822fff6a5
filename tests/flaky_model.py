"""A test model we own: the real demo model, made to fail on request.

The prompt says how: ``transient:N ...`` raises a transient error on the
first N runs of that (prompt, seed) in this worker; ``transient:always`` on
every run; ``oom:N ...`` raises torch's CUDA out-of-memory error on the first N
runs; ``bug ...`` raises a plain bug (never retried); ``gate:NAME ...``
holds the job until the file ``$GPULANES_STATE_DIR/gates/NAME`` exists (see
``open_gate``), so a test can act while it runs, whatever the machine's speed.
"""
from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

#: A gated job gives up waiting after this long, so a failed test never hangs a worker.
GATE_TIMEOUT_S = 60.0


def gate_path(name: str) -> Path:
    return Path(os.environ["GPULANES_STATE_DIR"]) / "gates" / name


def open_gate(name: str) -> None:
    """Let every job held at gate ``name`` run."""
    path = gate_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def at_gate(name: str) -> bool:
    """Whether a job has reached gate ``name`` (it is inside the model, running)."""
    return gate_path(name).with_suffix(".reached").exists()


def _wait_for_gate(name: str) -> None:
    reached = gate_path(name).with_suffix(".reached")
    reached.parent.mkdir(parents=True, exist_ok=True)
    reached.touch()
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not gate_path(name).exists() and time.monotonic() < deadline:
        time.sleep(0.005)

from gpu_worker import demo_model
from tasks.errors import TransientJobError


class FlakyModel:
    def __init__(self, inner: demo_model.DemoModel, name: str) -> None:
        self.inner, self.name, self.device = inner, name, inner.device
        self.runs: Counter[tuple[str, int]] = Counter()

    def warmup(self) -> None:
        self.inner.warmup()

    def generate(self, prompt: str, *, seed: int, **kwargs):
        self._act_on(prompt, seed)
        return self.inner.generate(prompt, seed=seed, **kwargs)

    def generate_batch(self, prompts, seeds, **kwargs):
        """A batch fails if any of its prompts asks to (the whole pass, as a real
        model's would); gates hold the whole pass."""
        for prompt, seed in zip(prompts, seeds):
            self._act_on(prompt, seed)
        return self.inner.generate_batch(prompts, seeds, **kwargs)

    def _act_on(self, prompt: str, seed: int) -> None:
        self.runs[(prompt, seed)] += 1
        how = prompt.split()[0]
        if how == "transient:always" or (
                how.startswith("transient:") and how != "transient:always"
                and self.runs[(prompt, seed)] <= int(how.split(":")[1])):
            raise TransientJobError(f"simulated out-of-memory (run {self.runs[(prompt, seed)]})")
        if how.startswith("oom:") and self.runs[(prompt, seed)] <= int(how.split(":")[1]):
            import torch
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB "
                                              "(simulated)")
        if how.startswith("gate:"):
            _wait_for_gate(how.split(":", 1)[1])
        if how == "bug":
            raise ValueError("simulated bug in the model")


def load(*, name: str, device: str, model_dir: Path) -> FlakyModel:
    return FlakyModel(demo_model.load(name="demo", device=device, model_dir=model_dir), name)
