"""Flower refuses to start open, and asks for the credentials it was given."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import free_port, http_status, wait_until

from tasks.flower_login import login_problem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _flower(env: dict, port: int, log=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "tasks", "flower",
                             f"--port={port}", "--address=127.0.0.1"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, text=True)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, as an operator's stop would send; SIGKILL if Flower lingers on its
    own shutdown (its executor threads are joined at exit), as Docker would."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)


def _status(port: int, auth: str | None = None) -> int | None:
    return http_status(f"http://127.0.0.1:{port}/workers", auth)


def test_flower_will_not_start_without_auth(redis_server):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWER_")}
    proc = _flower(env, free_port())
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "without authentication" in out


def test_flower_requires_its_credentials(redis_server, tmp_path):
    port = free_port()
    with open(tmp_path / "flower.log", "w") as log:  # a file: a pipe nobody reads can fill
        proc = _flower({**os.environ, "FLOWER_BASIC_AUTH": "ops:s3cret"}, port, log)
    try:
        assert wait_until(lambda: _status(port), timeout_s=60, what="Flower to answer") == 401
        assert _status(port, "ops:wrong") == 401
        assert _status(port, "ops:s3cret") == 200
    finally:
        _stop(proc)


# --- what counts as a login ---------------------------------------------------------

FLOWER = ["celery", "-A", "tasks", "flower", "--port=5555"]
OAUTH_ENV = {"FLOWER_AUTH": r".*@example\.com", "FLOWER_OAUTH2_KEY": "k",
             "FLOWER_OAUTH2_SECRET": "s", "FLOWER_OAUTH2_REDIRECT_URI": "https://f/login"}


@pytest.mark.parametrize("args, env", [
    ([], {}),
    (["--auth="], {}),
    (["--auth_provider=flower.views.auth.GithubLoginHandler"], {}),
    (["--auth-provider", "flower.views.auth.GithubLoginHandler"], {}),
    (["--basic-auth=:"], {}),
    (["--basic-auth=u:"], {}),
    (["--basic_auth=:p"], {}),
    (["--basic-auth", "u:"], {}),
    (["--basic-auth=ops:s3cret,guest:"], {}),  # one login without a password
    (["--basic-auth="], {"FLOWER_BASIC_AUTH": "ops:s3cret"}),  # argv wins, empty
    ([], {"FLOWER_BASIC_AUTH": "ops:"}),
    ([], {"FLOWER_AUTH": r".*@example\.com"}),  # OAuth without its provider's keys
    (["--auth=.*"], {**OAUTH_ENV, "FLOWER_OAUTH2_SECRET": ""}),
    (["--oauth2_key="], OAUTH_ENV),
])
def test_an_empty_or_partial_login_is_refused(args, env):
    assert login_problem([*FLOWER, *args], env)


@pytest.mark.parametrize("args, env", [
    (["--basic-auth=ops:s3cret"], {}),
    (["--basic_auth", "ops:s3cret"], {}),
    (["---basic-auth=ops:s3cret,dev:pw"], {}),
    ([], {"FLOWER_BASIC_AUTH": "ops:s3cret"}),
    ([], OAUTH_ENV),
    (["--auth=.*", "--oauth2_key=k", "--oauth2-secret=s",
      "--oauth2_redirect_uri=https://f/login"], {}),
])
def test_a_real_login_is_accepted(args, env):
    assert login_problem([*FLOWER, *args], env) is None


def _refused(*args: str, cwd=ROOT) -> None:
    """A real Flower started with ``args``, no login in its environment, refuses to run."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLOWER_")},
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "tasks", "flower",
                             f"--port={free_port()}", "--address=127.0.0.1", *args],
                            cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        _stop(proc)
    assert proc.returncode != 0 and "without authentication" in out, out


def test_flower_with_an_auth_provider_alone_will_not_start(redis_server):
    """``--auth_provider`` used to pass for ``--auth``: Flower started open."""
    _refused("--auth_provider=flower.views.auth.GithubLoginHandler")


def test_flower_started_elsewhere_or_with_another_conf_will_not_start(redis_server,
                                                                     tmp_path):
    """The check runs as the command loads the app: a Flower started from another
    folder, or told to read another configuration, still needs a login."""
    _refused("--conf=/dev/null", cwd=tmp_path)
