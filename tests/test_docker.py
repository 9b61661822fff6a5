"""docker/: compose services, Prometheus and Grafana configs against the real entry points.

No Docker engine runs here, so the files are parsed and every command is
checked against the code it starts: each ``celery -A tasks ...`` sub-command
answers ``--help`` with the service's own options (and their values convert
to the options' types), ``python -m gpu_worker`` arguments pass its parser,
every ``GPULANES_*`` variable is a setting celeryconfig reads, every metric the
dashboard and the alert rules query is one the exporter or Flower serves.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is in the test extra: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
EXPORTER_PORT = 9808

#: The exporter's metric contract (tasks/ops/metrics.py, the README's table) and Flower's own.
HISTOGRAMS = {"gpulanes_queue_wait_seconds", "gpulanes_run_seconds", "flower_task_runtime_seconds"}
METRICS = {
    "gpulanes_lane_depth", "gpulanes_lane_expected_wait_seconds", "gpulanes_lane_overloaded",
    "gpulanes_downgrades_total", "gpulanes_retries_total", "gpulanes_dead_letters",
    "gpulanes_jobs_total", "gpulanes_worker_up", "gpulanes_worker_in_flight",
    "gpulanes_worker_warm_models", "gpulanes_model_cold_start_seconds",
    "gpulanes_failures_total", "gpulanes_cache_hits_total", "gpulanes_cache_joins_total",
    "gpulanes_cache_misses_total", "gpulanes_preemptions_total",
    "gpulanes_fast_seconds_balance",
    "flower_events_total", "flower_worker_online",
    "flower_worker_number_of_currently_executing_tasks",
    # Prometheus' own per-target series
    "up",
} | {f"{name}{suffix}" for name in HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}


@lru_cache(maxsize=None)
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def services() -> dict[str, dict]:
    return compose()["services"]


def command(service: dict) -> list[str]:
    cmd = service.get("command") or []
    return cmd.split() if isinstance(cmd, str) else [str(arg) for arg in cmd]


def celery_services() -> dict[str, list[str]]:
    """Services that run ``celery -A tasks ...``: the arguments after ``tasks``."""
    found = {}
    for name, service in services().items():
        cmd = command(service)
        if cmd[:1] == ["celery"]:
            assert cmd[1:3] == ["-A", "tasks"], f"{name}: {cmd} must load the app with -A tasks"
            found[name] = cmd[3:]
    return found


def worker_services() -> dict[str, dict]:
    return {name: service for name, service in services().items()
            if command(service)[:3] == ["python", "-m", "gpu_worker"]}


def service_running(*sub_command: str) -> tuple[str, dict]:
    for name, args in celery_services().items():
        if tuple(args[:len(sub_command)]) == sub_command:
            return name, services()[name]
    raise AssertionError(f"no service runs celery -A tasks {' '.join(sub_command)}")


def option_value(args: list[str], option: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == option and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(option + "="):
            return arg.split("=", 1)[1]
    return None


def is_reference(value: object) -> bool:
    """A value taken from docker/.env (``${NAME...}``) rather than written here."""
    return isinstance(value, str) and re.fullmatch(r"\$\{[A-Z0-9_]+(:?[-?][^}]*)?\}", value) is not None


# --- the services and their processes ---------------------------------------

def test_compose_runs_every_process_of_a_gpu_host():
    assert {"redis", "beat", "flower", "exporter"} <= set(services())
    assert worker_services(), "no service runs python -m gpu_worker"
    service_running("beat")
    beats = [name for name, args in celery_services().items() if args[:1] == ["beat"]]
    assert len(beats) >= 2, f"one beat only ({beats}): nothing stands by if it dies"
    service_running("flower")
    service_running("lanes", "exporter")


def _subcommand_path(args: list[str]) -> list[str]:
    """The sub-command words before the first option: ['lanes', 'exporter'], ['beat']."""
    path = []
    for arg in args:
        if arg.startswith("-"):
            break
        path.append(arg)
    return path


@pytest.mark.parametrize("name", sorted(celery_services()))
def test_celery_commands_exist_with_these_options(name):
    """The real CLI answers ``--help`` with the service's arguments: the
    sub-command exists and knows every option (click rejects an unknown one first)."""
    args = celery_services()[name]
    if _subcommand_path(args)[:1] == ["flower"]:
        args = _subcommand_path(args)  # Flower's own options are tornado's, checked below
    proc = subprocess.run([sys.executable, "-m", "celery", "-A", "tasks", *args, "--help"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FLOWER_BASIC_AUTH": "check:only"})
    assert proc.returncode == 0, f"{name}: celery -A tasks {' '.join(args)}: {proc.stderr[-2000:]}"
    assert "Usage:" in proc.stdout


@pytest.mark.parametrize("name", sorted(celery_services()))
def test_celery_option_values_fit_their_types(name):
    """``--help`` does not convert values: convert each one with its click type."""
    from celery.bin.celery import celery as cli

    args = celery_services()[name]
    path = _subcommand_path(args)
    if path[:1] == ["flower"]:
        return
    cmd = cli
    for word in path:
        cmd = cmd.commands[word]
    params = {opt: param for param in cmd.params for opt in param.opts}
    rest = iter(args[len(path):])
    for arg in rest:
        option, has_value, value = arg.partition("=")
        param = params.get(option)
        if param is None or getattr(param, "is_flag", False):
            continue
        param.type.convert(value if has_value else next(rest), param, None)


def test_flower_options_are_flower_options():
    from flower.options import options

    name, service = service_running("flower")
    for arg in celery_services()[name][1:]:
        option = arg.lstrip("-").split("=", 1)[0]
        assert option in options, f"{name}: Flower has no option --{option}"
    port = option_value(celery_services()[name], "--port")
    assert port and any(str(p).endswith(f":{port}") for p in service.get("ports", [])), \
        f"{name}: Flower's --port {port} is not the published container port"
    # Flower takes every FLOWER_* variable as an option and stops on an unknown one.
    for variable in service.get("environment", {}):
        if variable.startswith("FLOWER_"):
            assert variable[len("FLOWER_"):].lower() in options, f"{name}: {variable}"


def test_flower_login_comes_from_the_environment():
    _, service = service_running("flower")
    auth = service["environment"].get("FLOWER_BASIC_AUTH")
    assert is_reference(auth) and ":?" in auth, \
        f"FLOWER_BASIC_AUTH must be required from docker/.env, not written here: {auth!r}"


def test_gpu_worker_arguments_pass_its_parser():
    from gpu_worker.__main__ import parse_args

    for name, service in worker_services().items():
        args = parse_args(command(service)[3:])  # argparse exits on a bad argument
        assert args.workers == 1, f"{name}: one worker per GPU service, not {args.workers}"
        assert args.device == "cuda", f"{name}: a GPU worker runs with --device cuda"
        assert service["environment"].get("GPULANES_DEVICE") in (None, "cuda"), name


def test_each_worker_reserves_exactly_one_distinct_gpu():
    seen: dict[str, str] = {}
    for name, service in worker_services().items():
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1, f"{name}: {devices}"
        device = devices[0]
        assert device.get("driver") == "nvidia" and "gpu" in device.get("capabilities", [])
        assert "count" not in device, f"{name}: pin a device_id, not a count"
        assert len(device.get("device_ids", [])) == 1, f"{name}: exactly one device id"
        gpu = str(device["device_ids"][0])
        assert gpu not in seen, f"{name} and {seen.get(gpu)} both reserve GPU {gpu}"
        seen[gpu] = name
    hostnames = [service.get("hostname") for service in worker_services().values()]
    assert None not in hostnames and len(set(hostnames)) == len(hostnames), \
        "worker hostnames name the Celery nodes: each must be set and distinct"


# --- environment ------------------------------------------------------------

@lru_cache(maxsize=None)
def settings_read() -> list[re.Pattern]:
    """The variables of the settings object (``tasks.settings.Settings``' fields)."""
    from tasks.settings import Settings

    names = [name.upper() for name in Settings.model_fields]
    assert len(names) > 20, "tasks.settings.Settings no longer lists the settings"
    return [re.compile(f"GPULANES_{name}") for name in names]


def test_every_gpulanes_variable_is_a_setting():
    for name, service in services().items():
        for variable in service.get("environment") or {}:
            if variable.startswith("GPULANES_"):
                assert any(p.fullmatch(variable) for p in settings_read()), \
                    f"{name}: {variable} is not a setting (tasks/settings.py)"


def test_no_literal_secret_in_any_environment():
    secretish = re.compile(r"PASSWORD|SECRET|TOKEN|BASIC_AUTH|_KEY$")
    for name, service in services().items():
        for variable, value in (service.get("environment") or {}).items():
            if secretish.search(variable) and not variable.endswith("__FILE"):
                assert is_reference(value), f"{name}: {variable} holds a literal value"
            if variable.endswith("__FILE"):
                assert str(value).startswith("/run/secrets/"), f"{name}: {variable}"


def test_required_variables_are_in_the_example_env():
    example = (DOCKER / ".env.example").read_text()
    defined = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", example, re.M))
    required = set(re.findall(r"\$\{([A-Z0-9_]+):\?", (DOCKER / "compose.yaml").read_text()))
    required |= {secret["environment"] for secret in compose().get("secrets", {}).values()
                 if "environment" in secret}
    assert required <= defined, f"not in docker/.env.example: {sorted(required - defined)}"


def test_redis_requires_a_password_and_keeps_an_append_only_file():
    redis = services()["redis"]
    args = command(redis)
    assert args[0] == "redis-server"
    assert is_reference(option_value(args, "--requirepass")), "--requirepass from docker/.env"
    assert option_value(args, "--appendonly") == "yes"
    assert any(str(v).endswith(":/data") for v in redis.get("volumes", [])), "no volume at /data"
    for name, service in services().items():
        for variable in ("GPULANES_BROKER_URL", "GPULANES_RESULT_BACKEND"):
            url = (service.get("environment") or {}).get(variable)
            if url is not None:
                assert re.match(r"redis://:\$\{REDIS_PASSWORD", url), f"{name}: {variable}"


# --- Prometheus -------------------------------------------------------------

def mounted(service: dict, target: str) -> Path | None:
    """The repository file a service mounts at ``target``, if any."""
    for volume in service.get("volumes", []):
        source, _, rest = str(volume).partition(":")
        if rest.split(":")[0] == target and source.startswith("."):
            return DOCKER / source
    return None


def prometheus() -> tuple[dict, dict]:
    service = services()["prometheus"]
    config_path = option_value(command(service), "--config.file")
    source = mounted(service, config_path)
    assert source and source.exists(), f"Prometheus config {config_path} is not mounted from docker/"
    return service, yaml.safe_load(source.read_text())


def scrape_job_for(config: dict, target: str) -> dict:
    for job in config["scrape_configs"]:
        if any(target in static.get("targets", []) for static in job.get("static_configs", [])):
            return job
    raise AssertionError(f"no scrape job targets {target}")


def test_prometheus_scrapes_the_exporter_and_flower():
    service, config = prometheus()
    assert "monitoring" in service.get("profiles", [])
    exporter, _ = service_running("lanes", "exporter")
    args = celery_services()[exporter]
    assert option_value(args, "--port") == str(EXPORTER_PORT)
    assert option_value(args, "--address") == "0.0.0.0", "the exporter must listen beyond loopback"
    job = scrape_job_for(config, f"{exporter}:{EXPORTER_PORT}")
    assert job.get("metrics_path", "/metrics") == "/metrics"
    login = services()[exporter]["environment"]["GPULANES_EXPORTER_AUTH"]
    assert login.startswith(f"{job['basic_auth']['username']}:") and ":?" in login, \
        "beyond loopback the exporter needs GPULANES_EXPORTER_AUTH, Prometheus its login"
    assert job["basic_auth"]["password_file"].removeprefix("/run/secrets/") in [
        s if isinstance(s, str) else s.get("target", s["source"])
        for s in service.get("secrets", [])]

    flower, _ = service_running("flower")
    job = scrape_job_for(config, f"{flower}:{option_value(celery_services()[flower], '--port')}")
    auth = job["basic_auth"]
    assert "password" not in auth, "Flower's password belongs in a file, not in prometheus.yml"
    secret = auth["password_file"].removeprefix("/run/secrets/")
    mounted_secrets = [s if isinstance(s, str) else s.get("target", s["source"])
                       for s in service.get("secrets", [])]
    assert secret in mounted_secrets, f"{auth['password_file']} is not a secret of prometheus"


def test_prometheus_rules_query_known_metrics():
    service, config = prometheus()
    rules = []
    for pattern in config.get("rule_files", []):
        folder = pattern.rsplit("/", 1)[0]
        files = [mounted(service, f"{folder}/{Path(str(v).split(':')[1]).name}")
                 for v in service.get("volumes", []) if f":{folder}/" in str(v)]
        assert files and all(f and f.exists() for f in files), f"rule files {pattern} not mounted"
        for path in files:
            for group in yaml.safe_load(path.read_text())["groups"]:
                rules += group["rules"]
    exprs = [rule["expr"] for rule in rules]
    for expr in exprs:
        assert metric_names(expr) <= METRICS, f"unknown metrics in {expr!r}"
    assert any("histogram_quantile(0.95" in e and "gpulanes_queue_wait_seconds_bucket" in e
               and re.search(r">\s*120\b", e) for e in exprs), "no alert on p95 queue wait > 120 s"


# --- Grafana ----------------------------------------------------------------

PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "rate", "irate", "increase", "delta", "idelta",
    "histogram_quantile", "label_values", "clamp_min", "clamp_max", "abs", "time", "vector",
    "scalar", "sort", "sort_desc", "avg_over_time", "max_over_time", "min_over_time",
    "sum_over_time", "absent", "changes", "resets", "deriv", "predict_linear", "round",
    "humanizeDuration", "inf",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (labels, functions, ranges left out)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)           # strings
    expr = re.sub(r"label_values\(([^,)]*),[^)]*\)", r"\1", expr)  # Grafana's, label dropped
    expr = re.sub(r"\{[^}]*\}", "", expr)                    # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)                   # ranges
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\$\w+", "", expr)                        # dashboard variables
    words = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr)
    return {w for w in words if w not in PROMQL_WORDS and not re.fullmatch(r"e\d*", w)}


def dashboard() -> dict:
    return json.loads((DOCKER / "grafana" / "gpulanes.json").read_text())


def dashboard_exprs(dash: dict) -> list[str]:
    exprs = [target["expr"] for panel in dash["panels"] for target in panel.get("targets", [])]
    for variable in dash.get("templating", {}).get("list", []):
        query = variable.get("query")
        exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def test_grafana_dashboard_queries_only_exported_metrics():
    exprs = dashboard_exprs(dashboard())
    assert exprs
    for expr in exprs:
        assert metric_names(expr) <= METRICS, f"unknown metrics in {expr!r}"


def test_grafana_dashboard_covers_the_operators_questions():
    dash = dashboard()
    joined = "\n".join(dashboard_exprs(dash))
    for needed in ("histogram_quantile(0.5, sum by (lane, le) (rate(gpulanes_queue_wait_seconds",
                   "histogram_quantile(0.95, sum by (lane, le) (rate(gpulanes_queue_wait_seconds",
                   "gpulanes_lane_depth", "gpulanes_lane_expected_wait_seconds",
                   "sum by (reason) (rate(gpulanes_downgrades_total", "gpulanes_worker_up",
                   "gpulanes_model_cold_start_seconds", "gpulanes_cache_hits_total",
                   "gpulanes_cache_misses_total", "gpulanes_fast_seconds_balance"):
        assert needed in joined, f"no panel queries {needed}"
    steps = [step.get("value") for panel in dash["panels"]
             for step in panel.get("fieldConfig", {}).get("defaults", {})
             .get("thresholds", {}).get("steps", [])
             if any("gpulanes_queue_wait_seconds" in t["expr"] for t in panel.get("targets", []))]
    assert 120 in steps, "no 120 s threshold on a queue wait panel"


def test_grafana_is_provisioned_with_the_dashboard_and_its_datasource():
    service = services()["grafana"]
    assert "monitoring" in service.get("profiles", [])
    provisioning = mounted(service, "/etc/grafana/provisioning")
    assert provisioning and provisioning.is_dir()
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    source = sources["datasources"][0]
    assert source["type"] == "prometheus" and source["url"].startswith("http://prometheus:")
    providers = yaml.safe_load((provisioning / "dashboards" / "gpulanes.yml").read_text())
    folder = providers["providers"][0]["options"]["path"]
    assert mounted(service, f"{folder}/gpulanes.json") == DOCKER / "grafana" / "gpulanes.json"
    uids = {target["datasource"]["uid"] for panel in dashboard()["panels"]
            for target in panel.get("targets", [])}
    assert uids == {source["uid"]}, f"panels query datasources {uids}, provisioned {source['uid']}"
