"""A test model we own: the real demo model, made to fail on request.

The prompt's leading words say how (several may be combined, in any order):

- ``transient:N`` raises a transient error on the first N runs of that
  (prompt, seed) in the whole cluster; ``transient:always`` on every run;
  ``transient:N@S`` asks for a retry no sooner than S seconds;
- ``oom:N`` raises torch's CUDA out-of-memory error on the first N runs in
  this worker;
- ``bug`` raises a plain bug (never retried);
- ``gate:NAME`` holds the job until the file ``$GPULANES_STATE_DIR/gates/NAME``
  exists (see ``open_gate``), so a test can act while it runs, whatever the
  machine's speed;
- ``pace:MS`` makes each step take at least MS milliseconds;
- ``io`` writes a scratch file in this worker's own folder first, as a model
  keeping a local cache would: a test that breaks that folder for one worker
  (``break_disk``) gives it real I/O errors, and only it.

Every run is counted across processes (``runs_started``, ``runs_finished``), so
a test can tell how many runs of a job began and how many reached their end.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from collections import Counter
from pathlib import Path

#: A gated job gives up waiting after this long, so a failed test never hangs a worker.
GATE_TIMEOUT_S = 60.0


def _state() -> Path:
    return Path(os.environ["GPULANES_STATE_DIR"])


def gate_path(name: str) -> Path:
    return _state() / "gates" / name


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


def _run_log(prompt: str, seed: int, what: str) -> Path:
    key = hashlib.blake2b(f"{prompt}\n{seed}".encode(), digest_size=8).hexdigest()
    return _state() / "flaky" / f"{key}.{what}"


def _count(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _note(path: Path) -> int:
    """Append one line (atomic with O_APPEND across processes); the lines now."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as log:
        log.write(b"run\n")
    return _count(path)


def runs_started(prompt: str, seed: int) -> int:
    """Runs of (prompt, seed) that entered the model, in every worker."""
    return _count(_run_log(prompt, seed, "started"))


def runs_finished(prompt: str, seed: int) -> int:
    """Runs of (prompt, seed) whose model call returned an image, in every worker."""
    return _count(_run_log(prompt, seed, "finished"))


def scratch_dir(hostname: str) -> Path:
    """The folder an ``io`` job writes to on worker ``hostname``."""
    return _state() / "flaky" / "scratch" / hostname


def break_disk(hostname: str) -> None:
    """Make ``io`` jobs fail on ``hostname`` with a real OS error: its folder becomes a file."""
    path = scratch_dir(hostname)
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a folder\n")


def mend_disk(hostname: str) -> None:
    path = scratch_dir(hostname)
    if path.is_file():
        path.unlink()


from gpu_worker import demo_model  # noqa: E402
from tasks.errors import TransientJobError  # noqa: E402


def _directives(prompt: str) -> list[str]:
    words = prompt.split()
    return [w for w in words[:4] if ":" in w or w in ("bug", "io")]


class FlakyModel:
    def __init__(self, inner: demo_model.DemoModel, name: str) -> None:
        self.inner, self.name, self.device = inner, name, inner.device
        self.runs: Counter[tuple[str, int]] = Counter()

    def warmup(self) -> None:
        self.inner.warmup()

    def generate(self, prompt: str, *, seed: int, **kwargs):
        self._act_on(prompt, seed)
        image = self.inner.generate(prompt, seed=seed, **_paced(prompt, kwargs))
        _note(_run_log(prompt, seed, "finished"))
        return image

    def generate_batch(self, prompts, seeds, **kwargs):
        """A batch fails if any of its prompts asks to (the whole pass, as a real
        model's would); gates hold the whole pass."""
        for prompt, seed in zip(prompts, seeds):
            self._act_on(prompt, seed)
        images = self.inner.generate_batch(prompts, seeds, **_paced(prompts[0], kwargs))
        for prompt, seed in zip(prompts, seeds):
            _note(_run_log(prompt, seed, "finished"))
        return images

    def _act_on(self, prompt: str, seed: int) -> None:
        self.runs[(prompt, seed)] += 1
        here = self.runs[(prompt, seed)]
        cluster_run = _note(_run_log(prompt, seed, "started"))
        for how in _directives(prompt):
            if how.startswith("transient:"):
                times, _, after_s = how.split(":")[1].partition("@")
                if times == "always" or cluster_run <= int(times):
                    raise TransientJobError(f"simulated out-of-memory (run {cluster_run})",
                                            retry_after_s=float(after_s or 0))
            if how.startswith("oom:") and here <= int(how.split(":")[1]):
                import torch
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate "
                                                  "2.00 GiB (simulated)")
            if how == "io":
                _scratch()
            if how.startswith("gate:"):
                _wait_for_gate(how.split(":", 1)[1])
            if how == "bug":
                raise ValueError("simulated bug in the model")


def _paced(prompt: str, kwargs: dict) -> dict:
    """``pace:MS``: each step takes at least MS milliseconds (a job of a known length
    that still reports every step)."""
    pace = [w for w in _directives(prompt) if w.startswith("pace:")]
    if not pace:
        return kwargs
    delay_s, on_step = int(pace[0].split(":")[1]) / 1000, kwargs.get("on_step")

    def paced(step: int) -> None:
        time.sleep(delay_s)
        if on_step is not None:
            on_step(step)

    return {**kwargs, "on_step": paced}


def _scratch() -> None:
    """Write and drop a scratch file in this worker's own folder (real file I/O)."""
    from gpu_worker.runtime import RUNTIME

    folder = scratch_dir(RUNTIME.hostname)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / uuid.uuid4().hex
    path.write_bytes(b"scratch")
    path.unlink()


def load(*, name: str, device: str, model_dir: Path) -> FlakyModel:
    return FlakyModel(demo_model.load(name="demo", device=device, model_dir=model_dir), name)
