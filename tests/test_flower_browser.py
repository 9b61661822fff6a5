"""Flower in a real browser, over a real cluster: two GPU workers and beat.

Debian's headless Chromium, driven by Selenium through chromedriver, opens
Flower with its basic-auth credentials and without them. The workers page and
the broker page are rendered by Flower's JavaScript, so the test waits on their
elements. `make browser` installs the browser (as root); without it this module
skips and says why, unless GPULANES_REQUIRE_BROWSER is set (CI sets it).

Screenshots of each page go to the test's ``tmp_path`` and, when
GPULANES_TEST_ARTIFACTS names a folder (or GPULANES_TEST_KEEP keeps the test
state), are copied there too; the path is printed.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator

import pytest
from conftest import STATE_DIR, free_port, wait_until
from test_flower import _flower, _status, _stop

pytestmark = [pytest.mark.cluster, pytest.mark.browser]

CHROMIUM = os.environ.get("GPULANES_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("GPULANES_CHROMEDRIVER", "/usr/bin/chromedriver")
CREDENTIALS = "ops:browser-s3cret"
LANE_NAMES = ("fast", "standard", "relaxed")
#: Without the background-networking flags Chromium dials Google's hosts at
#: start, and a closed network refuses those connections.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,900")
PAGE_WAIT_S = 30


def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if missing:
        return (f"no {' or '.join(missing)}: `make browser` (as root) installs Debian's "
                "chromium and chromium-driver")
    return None


@contextmanager
def chromium(logs: dict[str, str], page_wait_s: float = PAGE_WAIT_S) -> Iterator[Any]:
    """Headless Chromium driven by chromedriver, keeping the browser logs ``logs`` names;
    the test skips (fails, under GPULANES_REQUIRE_BROWSER) without them."""
    reason = _browser_missing()
    if reason and os.environ.get("GPULANES_REQUIRE_BROWSER"):
        pytest.fail(f"GPULANES_REQUIRE_BROWSER is set but {reason}")
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="gl-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", logs)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(page_wait_s)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # The performance log carries each response's status, which WebDriver hides.
    with chromium({"performance": "ALL"}) as driver:
        yield driver


@pytest.fixture(scope="module")
def flower(browser, cluster_factory, tmp_path_factory):
    """Flower, then a cluster of two workers and beat under it; yields (url, cluster).

    Flower starts first, as under ``docker compose up`` where it is ready long
    before the workers have loaded their models: it must find them by their events.
    """
    port = free_port()
    log_path = tmp_path_factory.mktemp("flower") / "flower.log"
    with open(log_path, "w") as log:  # a file: a pipe nobody reads can fill
        proc = _flower({**os.environ, "FLOWER_BASIC_AUTH": CREDENTIALS}, port, log)
    try:
        wait_until(lambda: _status(port), timeout_s=60, what=f"Flower to answer ({log_path})")
        yield f"http://127.0.0.1:{port}", cluster_factory(workers=2, beat=True)
    finally:
        _stop(proc)


def _authorize(driver, credentials: str | None) -> None:
    """Send (or stop sending) basic auth on every request, the page's XHR included."""
    headers = {}
    if credentials:
        headers["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": headers})


def _document_status(driver, url: str) -> int | None:
    """The HTTP status of the last page load of ``url``, from the performance log."""
    status = None
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if (message["method"] == "Network.responseReceived"
                and params.get("type") == "Document" and params["response"]["url"] == url):
            status = params["response"]["status"]
    return status


def _open(driver, url: str) -> int | None:
    driver.get_log("performance")  # drop what earlier loads logged
    driver.get(url)
    return _document_status(driver, url)


def _screenshot(driver, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot of {name}"
    keep = os.environ.get("GPULANES_TEST_ARTIFACTS") or (
        os.environ.get("GPULANES_TEST_KEEP") and str(STATE_DIR / "screenshots"))
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        path = Path(shutil.copy(path, Path(keep) / path.name))
    print(f"screenshot of Flower's {name} page: {path}")
    return path


def _cell_texts(driver, selector: str) -> list[str]:
    from selenium.common.exceptions import StaleElementReferenceException

    try:  # DataTables redraws rows while we read them
        return [cell.text.strip() for cell in driver.find_elements("css selector", selector)]
    except StaleElementReferenceException:
        return []


def test_without_credentials_flower_refuses(browser, flower):
    url, _ = flower
    _authorize(browser, None)
    for page in ("/workers", "/broker"):
        assert _open(browser, url + page) == 401
        assert not browser.find_elements("css selector", "#workers-table, #queue-table")
    _authorize(browser, "ops:wrong-password")
    assert _open(browser, url + "/workers") == 401


def test_workers_page_lists_every_gpu_worker(browser, flower, tmp_path):
    url, cluster = flower
    _authorize(browser, CREDENTIALS)
    assert _open(browser, url + "/workers") == 200

    def listed() -> bool:
        names = _cell_texts(browser, "#workers-table tbody tr td:first-child")
        return all(host in names for host in cluster.hostnames)

    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(browser, PAGE_WAIT_S, poll_frequency=0.2).until(
        lambda _: listed(), f"workers {cluster.hostnames} on Flower's workers page")
    online = browser.find_element("id", "workers-online").text
    assert online.isdigit() and int(online) >= len(cluster.hostnames), online
    assert _screenshot(browser, tmp_path, "workers").stat().st_size > 0


def test_broker_page_shows_the_three_lanes(browser, flower, tmp_path):
    url, _ = flower
    _authorize(browser, CREDENTIALS)
    assert _open(browser, url + "/broker") == 200

    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def lane_rows(driver) -> dict | None:
        """Every lane's row, once all three are drawn (a redraw mid-read: try again)."""
        rows = {row.get_attribute("id"): row.text.split()
                for row in driver.find_elements("css selector", "#queue-table tbody tr")
                if row.get_attribute("id")}
        return rows if set(LANE_NAMES) <= set(rows) else None

    rows = WebDriverWait(browser, PAGE_WAIT_S, poll_frequency=0.2,
                         ignored_exceptions=(StaleElementReferenceException,)).until(
        lane_rows, "the three lanes on Flower's broker page")
    for lane in LANE_NAMES:
        assert lane in rows, f"lane {lane} missing from the broker page: {sorted(rows)}"
        name, messages, *_ = rows[lane]
        assert name == lane and messages.isdigit(), rows[lane]  # its Redis list's length
    assert _screenshot(browser, tmp_path, "broker").stat().st_size > 0


def test_a_running_jobs_task_page_shows_its_progress(browser, flower, tmp_path):
    """The task-progress events of a running job: Flower's task page says PROGRESS and,
    in its result field, the step the job is at."""
    from selenium.webdriver.support.ui import WebDriverWait

    from tasks import submit

    url, _ = flower
    job = submit("a long one for Flower", tier="relaxed", seed=5, steps=150, width=1024,
                 height=1024)
    wait_until(lambda: job.state == "PROGRESS", timeout_s=60, what="the job to report a step")
    _authorize(browser, CREDENTIALS)
    WebDriverWait(browser, PAGE_WAIT_S, poll_frequency=0.5).until(
        lambda driver: _open(driver, f"{url}/task/{job.id}") == 200
        and "PROGRESS" in driver.page_source and "step " in driver.page_source,
        "PROGRESS and the job's step on its Flower task page")
    assert f"/{150}" in browser.page_source  # "step 12/150, eta ..."
    assert _screenshot(browser, tmp_path, "task-progress").stat().st_size > 0
    job.revoke()
    wait_until(lambda: job.state == "REVOKED", timeout_s=60, what="the job to stop")
