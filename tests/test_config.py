"""Settings: one typed object built from the environment, naming a bad variable;
varied in process; safe Celery defaults derived from it."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import celeryconfig
from gpu_worker.memory import check_warm, default_warm
from tasks.errors import ConfigError
from routing.names import RELAX_PRIORITIES
from tasks.settings import (BUILT_IN_MODELS, DEMO_MODELS, PROJECT_DIR, Settings, load, override,
                            settings)

#: The most settings a user may set: everything else is a named constant or derived.
MOST_SETTINGS = 35


def test_settings_read_the_environment_and_default(monkeypatch):
    monkeypatch.setenv("GPULANES_MAX_JOB_S", "2.5")
    assert load().max_job_s == 2.5
    monkeypatch.setenv("GPULANES_MAX_JOB_S", "")  # empty is unset
    assert load().max_job_s == 300.0
    monkeypatch.setenv("GPULANES_MAX_BATCH", "demo=4,*=2")
    monkeypatch.setenv("GPULANES_WARM_MODELS", "demo, demo-1")
    monkeypatch.setenv("GPULANES_MAX_DEPTH", "standard=5")  # a lane not named keeps its own
    loaded = load()
    assert loaded.max_batch == {"*": 2, "demo": 4} and loaded.warm_models == ("demo", "demo-1")
    assert loaded.max_depth == {"fast": 500, "standard": 5, "relaxed": 10000}


def test_the_warm_models_default_to_the_first_that_fit_the_budget(monkeypatch):
    monkeypatch.delenv("GPULANES_WARM_MODELS")
    loaded = load(models="a=x:A,b=x:B,c=x:C", model_memory_mb=300)
    assert loaded.warm_models == () and loaded.warm == ("a", "b", "c")  # candidates
    assert load(models="a=x:A,b=x:B", warm_models="b").warm == ("b",)
    assert load(models=dict(BUILT_IN_MODELS)).warm == ("demo",)  # the demo model alone
    # a worker keeps those whose declared sizes fit, in order; one that declares none
    # ends the set unless it is the first
    sizes = {"a": 90, "b": 250, "c": 90, "d": None}
    assert default_warm("abc", sizes.get, 300) == ("a",)
    assert default_warm("acb", sizes.get, 300) == ("a", "c")
    assert default_warm("dab", sizes.get, 300) == ("d",)
    assert default_warm("ad", sizes.get, 300) == ("a",)
    assert default_warm("b", sizes.get, 200) == ()
    check_warm({"a": 90, "c": 90, "d": None}, 300, "GPULANES_MODEL_MEMORY_MB=300")
    with pytest.raises(ConfigError) as caught:
        check_warm({"a": 90, "b": 250}, 300, "GPULANES_MODEL_MEMORY_MB=300")
    assert caught.value.variable == "GPULANES_WARM_MODELS"
    assert "340 MB" in str(caught.value) and "GPULANES_MODEL_MEMORY_MB=300" in str(caught.value)


def test_model_slots_is_retired_for_a_memory_budget(monkeypatch):
    monkeypatch.setenv("GPULANES_MODEL_SLOTS", "2")
    with pytest.raises(ConfigError, match="GPULANES_MODEL_MEMORY_MB") as caught:
        load()
    assert caught.value.variable == "GPULANES_MODEL_SLOTS"


@pytest.mark.parametrize("variable,says", [
    ("GPULANES_MAX_WAIT_FAST_S", "GPULANES_MAX_WAIT_S="), ("gpulanes_max_steps", "image"),
    ("GPULANES_RETRY_CAP_S", "fixed"), ("GPULANES_BEAT_LEASE_S", "derived"),
])
def test_a_retired_variable_is_refused_naming_what_took_its_place(monkeypatch, variable,
                                                                   says):
    monkeypatch.setenv(variable, "5")
    with pytest.raises(ConfigError) as caught:
        load()
    assert caught.value.variable == variable.upper() and says in str(caught.value)


@pytest.mark.parametrize("variable,raw", [
    ("MAX_DEPTH", "fast=ten"), ("MAX_JOB_S", "-1"), ("DEVICE", "tpu"),
    ("MODELS", "demo-without-factory"), ("PREEMPT", "maybe"), ("MAX_WAIT_S", "relaxed=5"),
    ("MAX_WAIT_S", "fast=nan"), ("MAX_WAIT_S", "standard=inf"),
    ("EXPORTER_AUTH", "no-password"), ("CACHE_MAX_ENTRIES", "0"), ("MAX_BATCH", "demo=0"),
])
def test_a_bad_value_names_its_variable(monkeypatch, variable, raw):
    monkeypatch.setenv(f"GPULANES_{variable}", raw)
    with pytest.raises(ConfigError) as caught:
        load()
    assert caught.value.variable == f"GPULANES_{variable}"
    assert str(caught.value).startswith(f"GPULANES_{variable}: ")


@pytest.mark.parametrize("values,variable", [
    ({"warm_models": "demo,demo-0,demo-1", "model_memory_mb": "4"}, "GPULANES_WARM_MODELS"),
    ({"warm_models": "demo,nope"}, "GPULANES_WARM_MODELS"),
    ({"min_replicas": "nope=1"}, "GPULANES_MIN_REPLICAS"),
    ({"max_batch": "nope=2"}, "GPULANES_MAX_BATCH"),
    ({"broker_url": "sentinel://h:26379"}, "GPULANES_SENTINEL_MASTER"),
])
def test_rules_across_settings_name_a_variable(values, variable):
    with pytest.raises(ConfigError) as caught:
        load(**values)
    assert caught.value.variable == variable


def test_a_setting_varies_in_process_and_what_follows_from_it_too():
    before = settings.runs_kept_s
    with override(max_job_s=5):
        assert settings.max_job_s == 5 and settings.run_hung_s == 10
        assert settings.runs_kept_s < before
        with override(heartbeat_s=0.5):  # nested: both changes hold
            assert settings.keepalive_s == 0.5 and settings.lease_ttl_s == 2
            assert settings.run_hung_s == 10
    assert settings.max_job_s == 300 and settings.runs_kept_s == before


def test_an_override_is_validated_like_the_environment():
    with pytest.raises(ConfigError, match="GPULANES_MAX_JOB_S"):
        with override(max_job_s=-1):
            pass
    assert settings.max_job_s == 300


def test_a_bad_setting_stops_a_process_naming_it():
    env = {"GPULANES_MAX_JOB_S": "lots", "PATH": ""}
    proc = subprocess.run([sys.executable, "-c", "import celeryconfig"], env=env,
                          capture_output=True, text=True, cwd=PROJECT_DIR)
    assert proc.returncode != 0 and "GPULANES_MAX_JOB_S" in proc.stderr


def test_json_only_and_lanes_declared(app):
    conf = app.conf
    assert conf.task_serializer == conf.result_serializer == "json"
    assert list(conf.accept_content) == ["json"] == list(conf.result_accept_content)
    assert list(app.amqp.queues) == ["fast", "standard", "relaxed"]
    assert conf.task_create_missing_queues is False


def test_delivery_guarantees(app):
    conf = app.conf
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    options = conf.broker_transport_options
    assert conf.broker_url == f"gpulanes+{settings.broker_url}"  # gpulanes' transport
    assert options["priority_steps"] == list(RELAX_PRIORITIES)
    assert celeryconfig.result_expires == settings.result_ttl_s


def test_the_demo_family_is_built_in():
    assert {"demo", "demo-0", "demo-15"} <= set(DEMO_MODELS)
    assert len(DEMO_MODELS) == 17 and Settings.model_fields["models"].default_factory() == \
        {**DEMO_MODELS, "echo": "tasks.models.echo:Echo", "faces": "tasks.models.faces:Faces"}


def test_few_settings_each_saying_what_it_does():
    """A user sets at most MOST_SETTINGS settings, each described (its attribute
    docstring: the configuration page prints it)."""
    fields = Settings.model_fields
    assert 0 < len(fields) <= MOST_SETTINGS, sorted(fields)
    assert not [name for name, field in fields.items() if len((field.description or "")
                                                              .split()) < 3]


def test_reading_a_setting_is_typed():
    """``settings`` is a ``Settings`` to a type checker: an unknown name is an error there,
    and at run time an ``AttributeError``."""
    from typing import get_type_hints

    import tasks.settings as module

    assert get_type_hints(module)["settings"] is Settings
    with pytest.raises(AttributeError):
        settings.no_such_setting  # noqa: B018


def test_no_setting_is_read_outside_the_settings_object():
    """Every GPULANES_ setting is a field: no module parses its own from os.environ."""
    root = Path(__file__).resolve().parent.parent
    own = {"GPULANES_WORKER_DEVICE", "GPULANES_WORKER_CONCURRENCY"}  # set by the supervisor
    for path in [*root.glob("tasks/**/*.py"), *root.glob("gpu_worker/*.py"),
                 *root.glob("beat/*.py"), *root.glob("routing/*.py")]:
        for name in re.findall(r"environ(?:\.get)?\(?\[?[\"'](GPULANES_[A-Z_]+)", path.read_text()):
            assert name in own, f"{path.name} reads {name} itself"
