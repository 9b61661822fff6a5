"""The remote shard store over real HTTP on loopback: fetch once, verify, cache."""
from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

import celeryconfig as cfg
from gpu_worker import demo_model
from gpu_worker.shards import load_checkpoint, read_manifest
from gpu_worker.store import RemoteStore
from tasks.errors import ShardError


class CountingHandler(SimpleHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # noqa: N802  (http.server's naming)
        CountingHandler.hits.append(self.path)
        super().do_GET()

    def log_message(self, *args):  # keep test output quiet
        pass


@pytest.fixture
def served(tmp_path):
    """An HTTP store on 127.0.0.1 serving ``tmp_path/store`` with demo-0 published."""
    root = tmp_path / "store"
    demo_model.build_checkpoint("demo-0", root / "demo-0")
    CountingHandler.hits = []
    handler = functools.partial(CountingHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_fetch_verifies_and_caches(served, tmp_path):
    root, url = served
    local = RemoteStore(url, tmp_path / "cache").fetch("demo-0")
    assert torch.equal(load_checkpoint(local, "cpu")["embed"],
                       demo_model.make_weights("demo-0")["embed"])
    shards = [s["file"] for s in read_manifest(root / "demo-0")["shards"]]
    assert sorted(h.rsplit("/", 1)[1] for h in CountingHandler.hits
                  if h.endswith(".safetensors")) == sorted(shards)
    CountingHandler.hits = []
    RemoteStore(url, tmp_path / "cache").fetch("demo-0")  # another worker on this host
    assert not [h for h in CountingHandler.hits if h.endswith(".safetensors")]


def test_corrupt_remote_shard_is_refused_and_not_kept(served, tmp_path):
    root, url = served
    shard = sorted((root / "demo-0").glob("*.safetensors"))[1]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=shard.name):
        RemoteStore(url, tmp_path / "cache").fetch("demo-0")
    assert not (tmp_path / "cache" / "demo-0" / shard.name).exists()


def test_missing_shard_or_model_is_a_clear_error(served, tmp_path):
    root, url = served
    victim = sorted((root / "demo-0").glob("*.safetensors"))[0]
    victim.unlink()
    with pytest.raises(ShardError, match=victim.name):
        RemoteStore(url, tmp_path / "cache").fetch("demo-0")
    with pytest.raises(ShardError, match="published"):
        RemoteStore(url, tmp_path / "cache").fetch("demo-7")


def test_demo_model_loads_from_the_store(served, tmp_path, monkeypatch):
    _, url = served
    monkeypatch.setattr(cfg, "MODEL_STORE", url)
    model = demo_model.load(name="demo-0", device="cpu", model_dir=tmp_path / "models")
    assert (tmp_path / "models" / "demo-0" / "manifest.json").exists()
    assert model.generate("x", seed=1, steps=2, width=64, height=64).shape == (64, 64, 3)
