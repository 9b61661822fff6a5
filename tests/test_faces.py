"""The ``faces`` model: trained weights, verified before loading, drawing the faces of a
seed on the CPU as the committed reference shows them; bad inputs named before enqueue.
(``tests/test_demo.py`` runs it through real workers.)"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tasks.errors import InvalidJob, ModelError
from tasks.settings import PROJECT_DIR

pytest.importorskip("gan_face_generate", reason="make demo or make test installs it "
                    "(requirements-models.txt)")
from tasks.models import faces  # noqa: E402  after the skip: its weights come with the package

#: tests/data/faces-seed-3.png: ``Faces.predict(FacesInput(seed=3, count=4))["image"]``.
REFERENCE = Path(__file__).parent / "data" / "faces-seed-3.png"
MIN_PSNR_DB = 30.0


def psnr_db(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 images of one shape, in dB."""
    assert a.shape == b.shape and a.dtype == b.dtype == np.uint8
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


@pytest.fixture(scope="module")
def model() -> faces.Faces:
    return faces.Faces(device="cpu", model_dir=Path("/nonexistent"))


@pytest.fixture(autouse=True)
def one_thread(one_torch_thread):
    """One torch thread for every test here."""


def test_a_fixed_seed_draws_the_reference_faces(model):
    steps: list[tuple[int, int]] = []
    output = model.predict(faces.FacesInput(seed=3, count=4),
                           lambda done, total: steps.append((done, total)))
    reference = np.asarray(Image.open(REFERENCE).convert("RGB"))
    assert psnr_db(output["image"], reference) >= MIN_PSNR_DB
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4)]  # progress per face
    assert output["seed"] == 3 and output["count"] == 4
    other = model.predict(faces.FacesInput(seed=4, count=4), lambda *_: None)["image"]
    assert psnr_db(other, reference) < 20  # another seed: other faces


def test_a_face_does_not_depend_on_how_many_are_drawn(model):
    one = model.predict(faces.FacesInput(seed=3, count=1, grid=False), lambda *_: None)
    four = model.predict(faces.FacesInput(seed=3, count=4, grid=False), lambda *_: None)
    assert len(four["images"]) == 4 and four["images"][0].shape == (64, 64, 3)
    assert np.array_equal(one["images"][0], four["images"][0])
    big = model.predict(faces.FacesInput(seed=3, count=1, scale=2, grid=False),
                        lambda *_: None)["images"][0]
    assert big.shape == (128, 128, 3) and np.array_equal(big[::2, ::2], one["images"][0])


def test_a_submitting_process_imports_only_the_input():
    probe = "import json, sys, tasks.models.faces; print(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=PROJECT_DIR, check=True, timeout=60)
    heavy = {"torch", "numpy", "PIL", faces.PACKAGE} & set(json.loads(proc.stdout))
    assert not heavy, f"importing tasks.models.faces loaded {sorted(heavy)}"


def test_a_tampered_checkpoint_is_refused_before_it_is_read(tmp_path):
    copy = tmp_path / "weights.tar"
    shutil.copyfile(faces.weights_path(), copy)
    assert faces.verified_bytes(copy)  # the copy itself passes: the flip below is what fails
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0x01
    copy.write_bytes(bytes(data))

    class Tampered(faces.Faces):
        weights = copy

    with pytest.raises(ModelError, match=rf"faces weights {copy}: sha256 .* is not the pinned"):
        Tampered(device="cpu", model_dir=tmp_path)


def test_without_the_package_loading_says_what_to_install(monkeypatch):
    monkeypatch.setattr(faces, "PACKAGE", "gan_face_generate_absent")
    with pytest.raises(ModelError, match=r"gan-face-generate==1\.1\.1 .*make demo"):
        faces.Faces(device="cpu", model_dir=Path("/nonexistent"))


@pytest.mark.parametrize("inputs,field", [
    (dict(seed=1, count=0), "count"),
    (dict(seed=1, count=17), "count"),
    (dict(seed=1, count="many"), "count"),
    (dict(seed=1, count="3"), "count"),
    (dict(seed=1, scale=True), "scale"),
    (dict(seed=-1), "seed"),
    (dict(count=2), "seed"),
    (dict(seed=1, scale=5), "scale"),
    (dict(seed=1, colour="red"), "colour"),
])
def test_a_bad_input_is_named_before_anything_is_enqueued(inputs, field, clean_redis,
                                                          monkeypatch):
    from conftest import vary

    from tasks import submit
    from tasks.settings import BUILT_IN_MODELS, settings

    vary(monkeypatch, models={**settings.models, "faces": BUILT_IN_MODELS["faces"]})
    with pytest.raises(InvalidJob) as caught:
        submit(model="faces", tier="fast", **inputs)
    assert caught.value.field == field
    assert not [k for k in clean_redis.scan_iter() if clean_redis.type(k) == b"list"]
    assert not list(clean_redis.scan_iter("celery-task-meta-*"))
