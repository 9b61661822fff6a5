"""The Hugging Face adapters (tasks/models) on tiny random-weight models.

The models are built from configs into a temporary folder (tests/tiny_models.py)
and the adapters are driven directly on the CPU, as a worker would drive them:
no worker process is involved. Input validation needs only pydantic and runs
everywhere; the rest skips where diffusers or transformers is not installed
(``make test`` installs both).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from tasks.errors import ModelError
from tasks.models.diffusion import Diffusion, DiffusionInput
from tasks.models.text import EmbeddingInput, GenerationInput, TextEmbedding, TextGeneration
from tasks.settings import PROJECT_DIR
from tests.tiny_models import build_tiny_bert, build_tiny_diffusion, build_tiny_gpt2

#: The smallest job that still runs every part of the pipeline twice.
SMALL = dict(prompt="a red fox", steps=2, width=64, height=64, seed=7)


class StopJob(Exception):
    """What a progress callback raises to stop a job (as a revoke does)."""


class Steps:
    """A progress callback that records its calls and can raise at one step."""

    def __init__(self, raise_at: int | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.raise_at = raise_at

    def __call__(self, done: int, total: int) -> None:
        self.calls.append((done, total))
        if done == self.raise_at:
            raise StopJob(f"stopped at step {done}")


def pixels(output: dict) -> list[bytes]:
    return [image.tobytes() for image in output["images"]]


# --- inputs: pydantic alone --------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("prompt", ""), ("prompt", "x" * 2001), ("negative_prompt", "x" * 2001),
    ("guidance_scale", -0.5), ("guidance_scale", 30.5), ("steps", 0), ("steps", 151),
    ("width", 60), ("width", 1032), ("height", 100), ("num_images", 0), ("num_images", 5),
    ("seed", -1), ("sede", 3),
])
def test_diffusion_input_rejects_a_bad_value_naming_the_field(field, value):
    with pytest.raises(ValidationError) as info:
        DiffusionInput(**{"prompt": "a fox", field: value})
    assert [err["loc"][0] for err in info.value.errors()] == [field]


def test_diffusion_input_defaults_leave_the_seed_to_draw():
    job = DiffusionInput(prompt="a fox")
    assert (job.seed, job.steps, job.width, job.height, job.num_images) == (None, 25, 512, 512, 1)


@pytest.mark.parametrize("model, kwargs, field", [
    (EmbeddingInput, dict(texts=[]), "texts"),
    (EmbeddingInput, dict(texts=["ok", ""]), "texts"),
    (EmbeddingInput, dict(texts=["x" * 2001]), "texts"),
    (EmbeddingInput, dict(texts=["a"] * 65), "texts"),
    (EmbeddingInput, dict(texts="not a list"), "texts"),
    (GenerationInput, dict(prompt=""), "prompt"),
    (GenerationInput, dict(prompt="hi", max_new_tokens=0), "max_new_tokens"),
    (GenerationInput, dict(prompt="hi", max_new_tokens=257), "max_new_tokens"),
])
def test_text_inputs_reject_a_bad_value_naming_the_field(model, kwargs, field):
    with pytest.raises(ValidationError) as info:
        model(**kwargs)
    assert {err["loc"][0] for err in info.value.errors()} == {field}


@pytest.mark.parametrize("module", ["tasks.models.diffusion",
                                    "tasks.models.text"])
def test_importing_an_adapter_loads_no_heavy_library(module):
    # The submitting process imports the module for its Input class only.
    probe = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=PROJECT_DIR, check=True, timeout=60)
    heavy = {"torch", "diffusers", "transformers", "numpy", "PIL"} & set(json.loads(proc.stdout))
    assert not heavy, f"importing {module} loaded {sorted(heavy)}"


def test_a_missing_folder_fails_at_load_naming_it(tmp_path: Path):
    class Elsewhere(Diffusion):
        folder = "sd-turbo"

    with pytest.raises(ModelError, match="sd-turbo"):
        Elsewhere(device="cpu", model_dir=tmp_path)
    with pytest.raises(ModelError, match="nowhere"):
        TextEmbedding(device="cpu", model_dir=tmp_path / "nowhere")


# --- diffusers ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def diffusion(tmp_path_factory) -> Diffusion:
    pytest.importorskip("diffusers")
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("models")
    build_tiny_diffusion(root / "tiny-sd")

    class TinySD(Diffusion):  # what a team writes: its pipeline's folder under the model dir
        folder = "tiny-sd"

    model = TinySD(device="cpu", model_dir=root)
    model.warmup()
    return model


def test_same_seed_same_images_other_seed_other_images(diffusion: Diffusion):
    first = diffusion.predict(DiffusionInput(**SMALL), Steps())
    assert first["seed"] == 7 and first["seed_drawn"] is False
    assert pixels(diffusion.predict(DiffusionInput(**SMALL), Steps())) == pixels(first)
    other = diffusion.predict(DiffusionInput(**{**SMALL, "seed": 8}), Steps())
    assert pixels(other) != pixels(first)


def test_images_have_the_asked_size_and_count(diffusion: Diffusion):
    out = diffusion.predict(DiffusionInput(**{**SMALL, "height": 80, "num_images": 2}), Steps())
    assert [(image.mode, image.size) for image in out["images"]] == [("RGB", (64, 80))] * 2
    assert out["images"][0].tobytes() != out["images"][1].tobytes()


def test_progress_once_per_step(diffusion: Diffusion):
    steps = Steps()
    diffusion.predict(DiffusionInput(**{**SMALL, "steps": 3}), steps)
    assert steps.calls == [(1, 3), (2, 3), (3, 3)]


def test_an_exception_from_progress_stops_the_run(diffusion: Diffusion):
    steps = Steps(raise_at=1)
    with pytest.raises(StopJob):
        diffusion.predict(DiffusionInput(**{**SMALL, "steps": 3}), steps)
    assert steps.calls == [(1, 3)]


def test_an_unseeded_job_draws_a_seed_that_replays_it(diffusion: Diffusion):
    drawn = diffusion.predict(DiffusionInput(**{**SMALL, "seed": None}), Steps())
    assert drawn["seed_drawn"] is True and isinstance(drawn["seed"], int)
    replay = diffusion.predict(DiffusionInput(**{**SMALL, "seed": drawn["seed"]}), Steps())
    assert pixels(replay) == pixels(drawn)


def test_the_negative_prompt_reaches_the_pipeline(diffusion: Diffusion):
    plain = diffusion.predict(DiffusionInput(**SMALL), Steps())
    negative = diffusion.predict(DiffusionInput(**SMALL, negative_prompt="blurry"), Steps())
    assert pixels(negative) != pixels(plain)


def test_the_model_dir_itself_may_hold_the_pipeline(diffusion: Diffusion):
    model = Diffusion(device="cpu", model_dir=diffusion.path)
    job = DiffusionInput(**SMALL)
    assert pixels(model.predict(job, Steps())) == pixels(diffusion.predict(job, Steps()))


# --- transformers ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def embedding(tmp_path_factory) -> TextEmbedding:
    pytest.importorskip("transformers")
    model = TextEmbedding(device="cpu", model_dir=build_tiny_bert(
        tmp_path_factory.mktemp("models") / "tiny-bert"))
    model.warmup()
    return model


def test_embeddings_are_json_rows_of_the_model_dim(embedding: TextEmbedding):
    out = embedding.predict(EmbeddingInput(texts=["a red fox", "blue ocean waves"]), Steps())
    assert json.loads(json.dumps(out)) == out
    assert out["dim"] == 32 and [len(row) for row in out["embeddings"]] == [32, 32]
    assert all(math.isclose(math.hypot(*row), 1, abs_tol=1e-4) for row in out["embeddings"])
    assert out["embeddings"][0] != out["embeddings"][1]


def test_embeddings_are_deterministic_and_ignore_padding(embedding: TextEmbedding):
    alone = embedding.predict(EmbeddingInput(texts=["a fox"]), Steps())["embeddings"][0]
    again = embedding.predict(EmbeddingInput(texts=["a fox"]), Steps())["embeddings"][0]
    # Batched with a longer text, "a fox" is padded: the mean must skip the padding.
    padded = embedding.predict(EmbeddingInput(texts=["a fox", "a much longer text " * 3]),
                               Steps())["embeddings"][0]
    assert again == alone
    assert max(abs(x - y) for x, y in zip(alone, padded)) < 1e-4


def test_unnormalized_embeddings_and_progress_per_forward_pass(embedding: TextEmbedding):
    steps = Steps()
    out = embedding.predict(EmbeddingInput(texts=["word"] * 20, normalize=False), steps)
    assert len(out["embeddings"]) == 20 and steps.calls == [(1, 2), (2, 2)]
    assert not math.isclose(math.hypot(*out["embeddings"][0]), 1, abs_tol=1e-3)


@pytest.fixture(scope="module")
def generation(tmp_path_factory) -> TextGeneration:
    pytest.importorskip("transformers")
    model = TextGeneration(device="cpu", model_dir=build_tiny_gpt2(
        tmp_path_factory.mktemp("models") / "tiny-gpt2"))
    model.warmup()
    return model


def test_greedy_generation_is_deterministic_with_progress_per_token(generation: TextGeneration):
    steps = Steps()
    out = generation.predict(GenerationInput(prompt="Once upon a", max_new_tokens=5), steps)
    assert isinstance(out["text"], str) and 1 <= out["tokens"] <= 5
    assert steps.calls == [(n, 5) for n in range(1, out["tokens"] + 1)]
    assert generation.predict(GenerationInput(prompt="Once upon a", max_new_tokens=5),
                              Steps()) == out


def test_an_exception_from_progress_stops_generation(generation: TextGeneration):
    steps = Steps(raise_at=2)
    with pytest.raises(StopJob):
        generation.predict(GenerationInput(prompt="Once upon a", max_new_tokens=8), steps)
    assert steps.calls == [(1, 8), (2, 8)]


def test_a_prompt_longer_than_the_context_keeps_its_end(generation: TextGeneration):
    # The tiny model's context is 64 tokens (one per byte here): 2000 bytes would overflow it.
    out = generation.predict(GenerationInput(prompt="x" * 2000, max_new_tokens=3), Steps())
    assert 1 <= out["tokens"] <= 3
