"""Settings: one typed helper that names the bad variable; safe Celery defaults."""
from __future__ import annotations

import subprocess
import sys

import pytest

import celeryconfig as cfg
from tasks.errors import ConfigError


def test_setting_parses_and_defaults(monkeypatch):
    monkeypatch.setenv("GPULANES_SOMETHING_S", "2.5")
    assert cfg.setting("SOMETHING_S", float, 1.0) == 2.5
    monkeypatch.delenv("GPULANES_SOMETHING_S")
    assert cfg.setting("SOMETHING_S", float, 1.0) == 1.0


@pytest.mark.parametrize("parse,raw", [(int, "ten"), (cfg.positive(float), "-1"),
                                       (cfg.choice("auto", "cpu"), "tpu"),
                                       (cfg.mapping, "demo-without-factory")])
def test_bad_value_names_the_variable(monkeypatch, parse, raw):
    monkeypatch.setenv("GPULANES_THING", raw)
    with pytest.raises(ConfigError) as caught:
        cfg.setting("THING", parse, None)
    assert caught.value.variable == "GPULANES_THING"
    assert "GPULANES_THING" in str(caught.value) and raw in str(caught.value)


def test_bad_setting_stops_import_with_its_name():
    env = {"GPULANES_MAX_STEPS": "lots", "PATH": ""}
    proc = subprocess.run([sys.executable, "-c", "import celeryconfig"], env=env,
                          capture_output=True, text=True, cwd=cfg.PROJECT_DIR)
    assert proc.returncode != 0
    assert "GPULANES_MAX_STEPS" in proc.stderr


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
    assert options["queue_order_strategy"] == "priority"
    # A job may run MAX_JOB_S and back off RETRY_CAP_S before Redis redelivers it.
    assert options["visibility_timeout"] > cfg.MAX_JOB_S + cfg.RETRY_CAP_S


def test_more_warm_models_than_slots_is_refused():
    env = {"GPULANES_WARM_MODELS": "demo,demo-0,demo-1", "GPULANES_MODEL_SLOTS": "2",
           "PATH": ""}
    proc = subprocess.run([sys.executable, "-c", "import celeryconfig"], env=env,
                          capture_output=True, text=True, cwd=cfg.PROJECT_DIR)
    assert proc.returncode != 0 and "GPULANES_WARM_MODELS" in proc.stderr


def test_the_demo_family_is_built_in():
    assert {"demo", "demo-0", "demo-15"} <= set(cfg.DEMO_MODELS)
    assert len(cfg.DEMO_MODELS) == 17


def test_every_setting_is_documented_in_the_readme():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    names = set(re.findall(r'setting\("([A-Z0-9_]+)"', (root / "celeryconfig.py").read_text()))
    readme = (root / "README.md").read_text()
    assert names and not {n for n in names if f"GPULANES_{n}" not in readme}
