"""The remote shard store over real HTTP on loopback: fetch once, verify, cache."""
from __future__ import annotations

import functools
import json
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from conftest import vary

from gpu_worker import demo_model
from gpu_worker.shards import load_checkpoint, read_manifest
from gpu_worker.store import RemoteStore
from tasks.broker.keys import MANIFESTS_KEY
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
    vary(monkeypatch, model_store=url)
    model = demo_model.load(name="demo-0", device="cpu", model_dir=tmp_path / "models")
    assert (tmp_path / "models" / "demo-0" / "manifest.json").exists()
    assert model.generate("x", seed=1, steps=2, width=64, height=64).shape == (64, 64, 3)


def _pins(client):
    from gpu_worker.store import ManifestPins
    return ManifestPins(client)


def _manifest_hits() -> int:
    return sum(h.endswith("manifest.json") for h in CountingHandler.hits)


def _no_partials(folder) -> bool:
    return not list(folder.rglob("*.partial"))


def test_the_first_load_pins_the_manifest_for_every_later_one(served, tmp_path, clean_redis):
    root, url = served
    first = RemoteStore(url, tmp_path / "host-a", pins=_pins(clean_redis)).fetch("demo-0")
    assert _manifest_hits() == 1
    original = load_checkpoint(first, "cpu")["embed"]
    demo_model.build_checkpoint("demo-1", root / "demo-0.next")  # republish other weights
    (root / "demo-0" / "manifest.json").write_bytes(
        (root / "demo-0.next" / "manifest.json").read_bytes())
    CountingHandler.hits = []
    second = RemoteStore(url + "/", tmp_path / "host-b", pins=_pins(clean_redis)).fetch("demo-0")
    assert _manifest_hits() == 0  # another host: the pinned manifest, no store round trip
    assert torch.equal(load_checkpoint(second, "cpu")["embed"], original)  # the same version


def test_unpin_loads_what_is_published_now(served, tmp_path, clean_redis):
    root, url = served
    pins = _pins(clean_redis)
    RemoteStore(url, tmp_path / "a", pins=pins).fetch("demo-0")
    shutil.rmtree(root / "demo-0")  # a new version replaces the pinned one
    demo_model.build_checkpoint("demo-1", root / "demo-0")
    with pytest.raises(ShardError, match="unpin"):
        RemoteStore(url, tmp_path / "b", pins=pins).fetch("demo-0")
    assert _no_partials(tmp_path / "b")
    assert pins.unpin("demo-0")
    fresh = RemoteStore(url, tmp_path / "b", pins=pins).fetch("demo-0")
    assert torch.equal(load_checkpoint(fresh, "cpu")["embed"],
                       demo_model.make_weights("demo-1")["embed"])


def test_a_bad_manifest_is_never_pinned_and_redis_down_still_loads(served, tmp_path,
                                                                   clean_redis):
    import redis as redis_py

    root, url = served
    good = (root / "demo-0" / "manifest.json").read_bytes()
    (root / "demo-0" / "manifest.json").write_text('{"format_version": 1, "shards": {"a": 1}}')
    with pytest.raises(ShardError, match="not a usable checkpoint manifest"):
        RemoteStore(url, tmp_path / "a", pins=_pins(clean_redis)).fetch("demo-0")
    assert not _pins(clean_redis).get("demo-0")
    (root / "demo-0" / "manifest.json").write_bytes(good)
    down = redis_py.Redis(unix_socket_path=str(tmp_path / "nobody.sock"))
    assert RemoteStore(url, tmp_path / "a", pins=_pins(down)).fetch("demo-0").exists()


@pytest.mark.parametrize("file", ["../../escaped.safetensors", "/tmp/abs.safetensors",
                                  ".hidden", "a/../../escaped.bin", "a//b.bin", "a/.hidden",
                                  "a/b/"])
def test_a_manifest_never_names_a_path_outside_its_folder(served, tmp_path, clean_redis, file):
    root, url = served
    manifest = json.loads((root / "demo-0" / "manifest.json").read_text())
    manifest["shards"][0]["file"] = file
    (root / "demo-0" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="plain file name"):  # straight from the store
        RemoteStore(url, tmp_path / "a").fetch("demo-0")
    clean_redis.hset(MANIFESTS_KEY, "demo-0", json.dumps(manifest))  # or planted in Redis
    with pytest.raises(ShardError, match="unpin demo-0"):
        RemoteStore(url, tmp_path / "a", pins=_pins(clean_redis)).fetch("demo-0")
    assert not list(tmp_path.rglob("escaped*")) and not list(tmp_path.rglob("abs*"))


def test_a_file_url_store_and_no_partials_left_by_a_corrupt_shard(tmp_path, clean_redis):
    root = tmp_path / "store"
    demo_model.build_checkpoint("demo-0", root / "demo-0")
    local = RemoteStore(f"file://{root}", tmp_path / "cache", pins=_pins(clean_redis)) \
        .fetch("demo-0")
    assert torch.equal(load_checkpoint(local, "cpu")["embed"],
                       demo_model.make_weights("demo-0")["embed"])
    shard = sorted((root / "demo-0").glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-1] + b"x")
    with pytest.raises(ShardError, match="does not match"):
        RemoteStore(f"file://{root}", tmp_path / "other").fetch("demo-0")
    assert _no_partials(tmp_path / "other") and not (tmp_path / "other" / "demo-0" /
                                                     shard.name).exists()


def test_a_saved_folder_with_sub_folders_round_trips_through_the_store(tmp_path, clean_redis):
    """What save_pretrained writes (configs and weights in sub-folders) published, fetched
    and verified file by file; a changed file in the store is refused, not kept."""
    from gpu_worker.store import publish_folder

    saved = tmp_path / "saved"
    for rel, data in {"model_index.json": b"{}", "unet/config.json": b'{"a": 1}',
                      "unet/diffusion_pytorch_model.safetensors": b"\x00" * 1000,
                      "tokenizer/vocab.json": b"[]", ".cache/junk": b"not published"}.items():
        (saved / rel).parent.mkdir(parents=True, exist_ok=True)
        (saved / rel).write_bytes(data)
    url = f"file://{tmp_path / 'store'}"
    manifest = publish_folder(saved, url, "pipe")
    assert [s["file"] for s in manifest["shards"]] == [
        "model_index.json", "tokenizer/vocab.json", "unet/config.json",
        "unet/diffusion_pytorch_model.safetensors"]
    local = RemoteStore(url, tmp_path / "cache", pins=_pins(clean_redis)).fetch("pipe")
    for shard in manifest["shards"]:
        assert (local / shard["file"]).read_bytes() == (saved / shard["file"]).read_bytes()
    assert not (local / ".cache").exists()
    (tmp_path / "store" / "pipe" / "unet" / "config.json").write_bytes(b'{"a": 2}')
    with pytest.raises(ShardError, match="unet/config.json: sha256"):
        RemoteStore(url, tmp_path / "other").fetch("pipe")
    assert not (tmp_path / "other" / "pipe" / "unet" / "config.json").exists()
    assert _no_partials(tmp_path / "other")


@pytest.mark.parametrize("files", [["unet", "unet/config.json"], ["a.bin", "a.bin"]])
def test_a_manifest_naming_a_file_twice_or_as_a_folder_is_refused(files):
    from gpu_worker.shards import parse_manifest

    manifest = {"format_version": 1, "shards": [{"file": f, "sha256": "0" * 64} for f in files]}
    with pytest.raises(ShardError, match="named twice|both a shard file and a folder"):
        parse_manifest(json.dumps(manifest), "here", "fix it")


def test_a_published_checkpoint_keeps_its_own_manifest_and_loads(tmp_path):
    from gpu_worker.store import publish_folder

    demo_model.build_checkpoint("demo-0", tmp_path / "demo-0")
    manifest = publish_folder(tmp_path / "demo-0", f"file://{tmp_path / 'store'}", "demo-0")
    assert manifest == read_manifest(tmp_path / "demo-0")  # tensors named, as loads check
    local = RemoteStore(f"file://{tmp_path / 'store'}", tmp_path / "cache").fetch("demo-0")
    assert torch.equal(load_checkpoint(local, "cpu")["embed"],
                       demo_model.make_weights("demo-0")["embed"])
    with pytest.raises(ShardError, match="checkpoint name"):
        publish_folder(tmp_path / "demo-0", f"file://{tmp_path / 'store'}", "../escaped")


def test_a_class_model_without_a_folder_loads_as_before_with_a_store_set(tmp_path,
                                                                         monkeypatch):
    """echo has no saved folder: a store set for the other models changes nothing."""
    from gpu_worker.models import load_model

    vary(monkeypatch, model_store=f"file://{tmp_path / 'empty-store'}")
    echo = load_model("echo", {"echo": "tasks.models.echo:Echo"}, "cpu", tmp_path)
    assert echo.predict(echo.Input(text="hi"), lambda *_: None) == {"text": "hi"}
