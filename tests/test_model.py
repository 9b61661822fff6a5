"""The sharded checkpoint store and the built-in ``demo`` model."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from gpu_worker.demo_model import N_SHARDS, DemoModel, load, make_weights
from gpu_worker.shards import (
    MANIFEST_NAME,
    load_checkpoint,
    load_checkpoint_timed,
    write_checkpoint,
)
from tasks.errors import ShardError

PROJECT_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_thread(one_torch_thread):
    """One torch thread for every test here."""


@pytest.fixture
def tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return {
        "big": torch.randn(64, 64, generator=gen),
        "mid": torch.randn(32, 32, generator=gen),
        "ints": torch.randint(0, 100, (500,), generator=gen, dtype=torch.int64),
        "half": torch.randn(17, 3, generator=gen).to(torch.float16),
        "small": torch.randn(5, generator=gen),
    }


@pytest.fixture
def checkpoint(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    return write_checkpoint(tensors, tmp_path / "ckpt", 3, metadata={"model": "t"})


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoModel:
    return load(name="demo", device="cpu", model_dir=tmp_path_factory.mktemp("models"))


def manifest_of(path: Path) -> dict:
    return json.loads((path / MANIFEST_NAME).read_text())


def shard_path(path: Path, index: int = 0) -> Path:
    return path / manifest_of(path)["shards"][index]["file"]


# --- shards ------------------------------------------------------------------

def test_round_trip_gives_identical_tensors(checkpoint: Path, tensors):
    loaded, load_ms = load_checkpoint_timed(checkpoint, "cpu", max_workers=2)
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype
        assert torch.equal(loaded[name], tensor), name
    assert load_ms > 0


def test_manifest_lists_every_shard_with_its_sha256(checkpoint: Path, tensors):
    manifest = manifest_of(checkpoint)
    assert manifest["metadata"] == {"model": "t"}
    assert len(manifest["shards"]) == 3
    assert sorted(checkpoint.glob("*.safetensors")) == sorted(
        checkpoint / s["file"] for s in manifest["shards"])
    for shard in manifest["shards"]:
        data = (checkpoint / shard["file"]).read_bytes()
        assert shard["sha256"] == hashlib.sha256(data).hexdigest()
        assert shard["size_bytes"] == len(data)
    names = [n for s in manifest["shards"] for n in s["tensors"]]
    assert sorted(names) == sorted(tensors)


def test_shards_are_balanced_by_bytes(tmp_path: Path):
    same = {f"t{i}": torch.zeros(256) for i in range(8)}
    path = write_checkpoint(same, tmp_path / "ckpt", 4)
    assert [len(s["tensors"]) for s in manifest_of(path)["shards"]] == [2, 2, 2, 2]


def test_corrupt_shard_is_refused_naming_the_file(checkpoint: Path):
    victim = shard_path(checkpoint, 1)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=victim.name) as info:
        load_checkpoint(checkpoint, "cpu")
    assert "sha256" in str(info.value) and "delete" in str(info.value)


def test_missing_shard_is_refused_naming_the_file(checkpoint: Path):
    victim = shard_path(checkpoint, 2)
    victim.unlink()
    with pytest.raises(ShardError, match=victim.name) as info:
        load_checkpoint(checkpoint, "cpu")
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_missing_manifest_is_refused(checkpoint: Path):
    (checkpoint / MANIFEST_NAME).unlink()
    with pytest.raises(ShardError, match=MANIFEST_NAME):
        load_checkpoint(checkpoint, "cpu")


def test_tensor_missing_from_its_shard_is_refused(checkpoint: Path):
    manifest = manifest_of(checkpoint)
    manifest["shards"][0]["tensors"].append("ghost")
    (checkpoint / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="ghost"):
        load_checkpoint(checkpoint, "cpu")


def test_losing_writer_discards_its_copy(checkpoint: Path):
    before = manifest_of(checkpoint)
    other = {"different": torch.ones(3)}
    assert write_checkpoint(other, checkpoint, 2) == checkpoint
    assert manifest_of(checkpoint) == before
    assert [p.name for p in checkpoint.parent.iterdir()] == [checkpoint.name]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_round_trip_onto_cuda(checkpoint: Path, tensors):
    loaded = load_checkpoint(checkpoint, "cuda")
    for name, tensor in tensors.items():
        assert loaded[name].is_cuda and torch.equal(loaded[name].cpu(), tensor)


# --- demo model --------------------------------------------------------------

def test_concurrent_first_loads_agree(tmp_path: Path):
    barrier = threading.Barrier(2)
    models: list[DemoModel] = []
    errors: list[BaseException] = []

    def build() -> None:
        barrier.wait()
        try:
            models.append(load(name="demo", device="cpu", model_dir=tmp_path))
        except BaseException as exc:  # surfaced by the asserts below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == [] and len(models) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["demo"]
    assert len(manifest_of(tmp_path / "demo")["shards"]) == N_SHARDS
    expected = make_weights("demo")
    for model in models:
        assert all(torch.equal(model.w[k], v) for k, v in expected.items())


def test_same_inputs_same_image(demo: DemoModel):
    args = dict(seed=42, steps=4, width=96, height=64)
    first = demo.generate("a red fox", **args)
    assert np.array_equal(first, demo.generate("a red fox", **args))


def test_same_image_in_a_fresh_process(demo: DemoModel, tmp_path: Path):
    # A fresh process also builds its own checkpoint: weights must match too.
    script = (
        "import hashlib, torch; from pathlib import Path;"
        "torch.set_num_threads(1);"
        "from gpu_worker.demo_model import load;"
        f"m = load(name='demo', device='cpu', model_dir=Path({str(tmp_path)!r}));"
        "img = m.generate('a red fox', seed=42, steps=4, width=96, height=64);"
        "print(hashlib.sha256(img.tobytes()).hexdigest(), img.shape)"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_DIR, check=True,
                         capture_output=True, text=True, timeout=60).stdout.split()[0]
    img = demo.generate("a red fox", seed=42, steps=4, width=96, height=64)
    assert out == hashlib.sha256(img.tobytes()).hexdigest()


def test_seed_and_prompt_change_the_image(demo: DemoModel):
    args = dict(steps=3, width=64, height=64)
    base = demo.generate("a red fox", seed=1, **args)
    for other in (demo.generate("a red fox", seed=2, **args),
                  demo.generate("blue ocean waves", seed=1, **args)):
        assert np.abs(base.astype(int) - other.astype(int)).mean() > 5


def test_image_shape_dtype_and_colour(demo: DemoModel):
    img = demo.generate("neon city", seed=3, steps=3, width=128, height=64)
    assert img.shape == (64, 128, 3) and img.dtype == np.uint8
    assert img.std() > 20  # not flat grey
    assert img.reshape(-1, 3).std(axis=0).min() > 10  # every channel varies


def test_one_callback_per_step_and_callback_can_stop_the_run(demo: DemoModel):
    for steps in (1, 3, 7):
        seen: list[int] = []
        demo.generate("x", seed=0, steps=steps, width=64, height=64, on_step=seen.append)
        assert seen == list(range(steps))

    def stop(i: int) -> None:
        if i == 1:
            raise KeyboardInterrupt("cancelled")

    with pytest.raises(KeyboardInterrupt):
        demo.generate("x", seed=0, steps=5, width=64, height=64, on_step=stop)


def test_warmup_runs(demo: DemoModel):
    demo.warmup()
    assert demo.name == "demo" and demo.device == "cpu"
