"""A model class whose saved folder lives in the shard store: a real worker fetches a
diffusers pipeline (configs and weights in sub-folders) from ``GPULANES_MODEL_STORE``,
verifies it, warms it at start and serves it."""
from __future__ import annotations

import hashlib

import pytest
from conftest import vary

from tasks import submit
from tasks.broker.keys import MANIFESTS_KEY
from tasks.settings import settings

pytestmark = pytest.mark.cluster


def test_a_diffusers_pipeline_is_fetched_from_the_store_and_served(
        cluster_factory, tmp_path_factory, monkeypatch, clean_redis):
    pytest.importorskip("diffusers")
    from gpu_worker.store import publish_folder
    from tests.tiny_models import build_tiny_diffusion

    root = tmp_path_factory.mktemp("stored")
    saved = build_tiny_diffusion(root / "saved" / "tiny-sd")
    store = f"file://{root / 'store'}"
    manifest = publish_folder(saved, store, "stored-sd")
    assert any("/" in shard["file"] for shard in manifest["shards"])  # unet/, vae/, ...
    models = {**settings.models, "stored-sd": "tests.odd_models:StoredSd"}
    vary(monkeypatch, models=models)
    model_dir = root / "worker-models"  # empty: everything comes from the store
    cluster_factory(workers=1, env={
        "GPULANES_MODEL_STORE": store, "GPULANES_MODEL_DIR": str(model_dir),
        "GPULANES_MODELS": ",".join(f"{name}={target}" for name, target in models.items()),
        "GPULANES_WARM_MODELS": "stored-sd"})
    for shard in manifest["shards"]:  # fetched and verified before the worker took a job
        fetched = (model_dir / "stored-sd" / shard["file"]).read_bytes()
        assert hashlib.sha256(fetched).hexdigest() == shard["sha256"]
    assert clean_redis.hexists(MANIFESTS_KEY, "stored-sd")  # pinned for the cluster
    call = dict(model="stored-sd", prompt="a red fox", steps=2, width=64, height=64, seed=7)
    runs = [submit(**call).get(timeout=120) for _ in range(2)]
    assert [r["cold_start"] for r in runs] == [False, False]  # warm since the start
    digests = [r["output"]["images"][0]["sha256"] for r in runs]
    assert digests[0] == digests[1]
    other = submit(**{**call, "seed": 8}).get(timeout=120)
    assert other["output"]["images"][0]["sha256"] != digests[0]
