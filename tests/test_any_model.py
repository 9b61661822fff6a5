"""Any model in the lanes: a class with a typed Input, run by real workers; its output
in the result, images and bytes as artifacts; bad inputs named before enqueue."""
from __future__ import annotations

import hashlib

import pytest
from conftest import SMALL

from tasks import submit
from tasks.broker.keys import DUE_PREFIX, HELD_PREFIX, LANE_DEPTHS_KEY
from tasks.errors import InvalidJob, JobFailed, ModelError
from tasks.jobs.artifacts import open_artifact

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def worker(cluster_factory):
    return cluster_factory(workers=1)


def test_echo_runs_in_its_lane_and_returns_its_output(worker):
    result = submit(model="echo", text="hi", repeat=2, tier="fast", account="a").get(timeout=60)
    assert result["output"] == {"text": "hihi"}
    assert result["lane"] == "fast" and result["model"] == "echo" and "image" not in result
    assert result["attempts"] == 1 and result["cached"] is False and result["run_ms"] >= 0


def test_a_deterministic_models_result_is_served_from_the_cache(worker):
    first = submit(model="echo", text="again", tier="standard").get(timeout=60)
    second = submit(model="echo", text="again", tier="standard").get(timeout=60)
    third = submit(model="echo", text="again", tier="standard").get(timeout=60)
    assert first["output"] == second["output"] == third["output"] == {"text": "again"}
    # admitted on its second sighting (LRU-K), served from the third on
    assert not second["cached"] and third["cached"] is True
    assert third["source_job_id"] == second["job_id"] and third["attempts"] == 0


def test_images_and_bytes_become_artifact_references(worker):
    output = submit(model="odd", kind="artifacts").get(timeout=60)["output"]
    red, black = output["images"]
    assert red["media_type"] == black["media_type"] == "image/png"
    assert output["blob"]["media_type"] == "application/octet-stream"
    assert output["note"] == "two images and some bytes"
    for ref in (red, black, output["blob"]):
        with open_artifact(ref) as file:
            data = file.read()
        assert len(data) == ref["bytes"] and hashlib.sha256(data).hexdigest() == ref["sha256"]
    with open_artifact(output["blob"]) as file:
        assert file.read() == b"\x00\x01binary"


def test_an_input_may_name_a_file_only_in_the_artifact_store(worker):
    red = submit(model="odd", kind="artifacts").get(timeout=60)["output"]["images"][0]
    assert submit(model="odd", kind="read", source=red["url"]).get(timeout=60)["output"] == \
        {"bytes_read": red["bytes"]}
    root = red["url"].rsplit("/", 1)[0]
    for outside in ("/etc/passwd", f"{root}/../etc/passwd", f"{root}/sub/x.png",
                    "file:///etc/passwd", red["url"] + "\x00"):
        with pytest.raises(InvalidJob) as caught:
            submit(model="odd", kind="read", source=outside)
        assert caught.value.field == "source"


@pytest.mark.parametrize("kind", ["not_json", "not_a_dict"])
def test_an_output_that_is_not_json_fails_the_job_and_the_worker_serves_on(worker, kind):
    with pytest.raises(JobFailed, match="predict returned"):
        submit(model="odd", kind=kind).get(timeout=60)
    assert submit(model="echo", text="still here").get(timeout=60)["output"] == \
        {"text": "still here"}


def test_the_image_models_keep_their_shape(worker):
    result = submit("a fox", tier="fast", seed=3, **SMALL).get(timeout=60)
    assert result["image"].endswith(".png") and result["seed"] == 3 and "output" not in result


@pytest.mark.parametrize("call,field", [
    (dict(model="echo", text="hi", repeat=9), "repeat"),
    (dict(model="echo", text=""), "text"),
    (dict(model="echo", text="hi", colour="red"), "colour"),
    (dict(model="echo"), "text"),
    (dict(model="nope", text="hi"), "model"),
    (dict(model="odd", kind="sideways"), "kind"),
])
def test_a_bad_input_is_named_before_anything_is_enqueued(call, field, clean_redis):
    with pytest.raises(InvalidJob) as caught:
        submit(**call)
    assert caught.value.field == field
    # nothing of a job: no message in any list, none counted, indexed or held, no result
    # (the running workers push their stats, counters and the usage of earlier jobs on
    # their own, whenever they like)
    assert not [k for k in clean_redis.scan_iter() if clean_redis.type(k) == b"list"]
    assert not clean_redis.exists(LANE_DEPTHS_KEY)
    assert not list(clean_redis.scan_iter(f"{DUE_PREFIX}*"))
    assert not any(clean_redis.hlen(k) for k in clean_redis.scan_iter(f"{HELD_PREFIX}*"))
    assert not list(clean_redis.scan_iter("celery-task-meta-*"))


def test_inputs_over_the_size_limit_are_refused(clean_redis, monkeypatch):
    from conftest import vary

    vary(monkeypatch, max_input_bytes=64)
    with pytest.raises(InvalidJob, match="GPULANES_MAX_INPUT_BYTES") as caught:
        submit(model="echo", text="x" * 100)
    assert caught.value.field == "inputs"


def test_a_model_whose_class_cannot_be_imported_says_so_at_submit(monkeypatch):
    from conftest import vary

    from tasks.settings import settings

    vary(monkeypatch, models={**settings.models, "ghost": "no.such.module:Ghost"})
    with pytest.raises(ModelError, match="ghost.*no.such.module"):
        submit(model="ghost", text="boo")


def test_a_diffusers_pipeline_runs_in_the_lanes_and_repeats_its_images(worker):
    """A tiny Stable Diffusion pipeline saved with save_pretrained, loaded by the worker
    with from_pretrained: the same seed gives the same images, through two runs."""
    pytest.importorskip("diffusers")
    from conftest import STATE_DIR

    from tests.tiny_models import build_tiny_diffusion

    build_tiny_diffusion(STATE_DIR / "models" / "tiny-sd")
    call = dict(model="tiny-sd", prompt="a red fox", steps=2, width=64, height=64, seed=7,
                num_images=2)
    runs = [submit(**call).get(timeout=120) for _ in range(2)]
    assert [r["cached"] for r in runs] == [False, False]  # admitted on the second sighting
    digests = [[image["sha256"] for image in r["output"]["images"]] for r in runs]
    assert digests[0] == digests[1] and len(set(digests[0])) == 2
    other = submit(**{**call, "seed": 8}).get(timeout=120)
    assert [image["sha256"] for image in other["output"]["images"]] != digests[0]


def test_a_transformers_model_returns_json_through_a_worker(worker):
    """A tiny BERT saved with save_pretrained: mean-pooled embeddings as JSON rows, the
    same texts giving the same numbers (a cache hit the third time)."""
    pytest.importorskip("transformers")
    from conftest import STATE_DIR

    from tests.tiny_models import build_tiny_bert

    build_tiny_bert(STATE_DIR / "models" / "tiny-bert")
    call = dict(model="tiny-bert", texts=["a red fox", "blue ocean waves"], tier="fast")
    runs = [submit(**call).get(timeout=120) for _ in range(3)]
    output = runs[0]["output"]
    assert output["dim"] == 32 and len(output["embeddings"]) == 2
    assert all(len(row) == 32 for row in output["embeddings"])
    assert runs[1]["output"] == output and runs[2]["cached"] and runs[2]["output"] == output
    with pytest.raises(InvalidJob) as caught:
        submit(model="tiny-bert", texts=[])
    assert caught.value.field == "texts"


def test_a_worker_whose_model_class_cannot_be_imported_exits_naming_it(monkeypatch, caplog):
    from conftest import vary

    from gpu_worker.hooks import EXIT_NOT_WARM, WarmModels
    from tasks.settings import settings

    vary(monkeypatch, models={**settings.models, "ghost": "no.such.module:Ghost"})
    with pytest.raises(SystemExit) as stopped:
        WarmModels().on_worker_init(sender=None)
    assert stopped.value.code == EXIT_NOT_WARM
    assert "cannot be imported" in caplog.text and "no.such.module" in caplog.text
