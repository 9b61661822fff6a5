"""The web page in a real browser, over the real API server and a one-worker cluster.

Debian's headless Chromium, driven by Selenium through chromedriver (as in
tests/test_flower_browser.py, and skipped as it is without them unless
GPULANES_REQUIRE_BROWSER is set), opens ``/``: a person pastes a key and sees their
fast time; a prediction queued behind a held job shows its place, then its steps as it
runs, and is cancelled; an image is made and shown; the recent list opens each again;
an event stream cut mid-way resumes after its last event. A screenshot goes to the
test's ``tmp_path``, and to docs/images/web-page.png when GPULANES_SCREENSHOTS=1.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from conftest import SMALL, STATE_DIR, new_gate, wait_at_gate
from test_flower_browser import chromium

from tasks import submit
from tasks.jobs import apikeys
from tasks.jobs.plans import plan
from tests.flaky_model import open_gate
from tests.harness.http import ROOT, ApiServer

pytestmark = [pytest.mark.cluster, pytest.mark.browser]

#: Seconds any one thing the page shows may take to appear.
WAIT_S = 30
#: The job whose steps the test watches: long enough to be seen running, and cancelled.
PACED_STEPS, PACE_MS = 60, 100
#: A seed past 2**53, which a JavaScript number would round.
SEED = 2**63 - 25
SCREENSHOT = ROOT / "docs" / "images" / "web-page.png"
#: The shown image's natural size, once it is a decoded image from a blob: URL.
IMAGE_LOADED = """const img = document.getElementById('image');
return !img.hidden && img.complete && img.src.startsWith('blob:') && img.naturalWidth > 0
    && [img.naturalWidth, img.naturalHeight];"""
#: Whether the prediction shown has the status ``arguments[0]``.
STATUS = "return document.getElementById('status').textContent === arguments[0];"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium({"browser": "ALL"}, WAIT_S) as driver:  # its console, for errors
        yield driver


@pytest.fixture(scope="module")
def api(redis_server):
    with ApiServer(STATE_DIR / "logs" / "test_page_browser") as server:
        yield server


@pytest.fixture(scope="module")
def worker(cluster_factory):
    return cluster_factory(workers=1)


def test_the_page_loads_without_a_key_under_a_strict_policy(api):
    page = httpx.get(f"{api.url}/", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "unsafe-inline" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    scripts = re.findall(r"<script\b([^>]*)>\s*</script>", page.text)
    assert scripts and all("src=" in tag for tag in scripts)  # no inline script
    assert page.text.count("<script") == len(scripts)
    script = httpx.get(f"{api.url}/static/app.js", timeout=10)
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert script.headers["content-security-policy"] == policy
    assert "localStorage" not in script.text and "document.cookie" not in script.text
    assert httpx.get(f"{api.url}/static/app.css", timeout=10).headers[
        "content-type"].startswith("text/css")
    assert httpx.get(f"{api.url}/static/..%2Fpage.py", timeout=10).status_code == 404


def _until(driver, script: str, what: str, *args: Any) -> Any:
    """Wait until ``script`` (a JS function body) returns something truthy; that."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.05).until(
        lambda d: d.execute_script(script, *args), f"the page to show {what}")


def _shown(driver, element_id: str) -> str:
    return driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e.hidden ? '' : e.textContent",
        element_id)


def _compose(driver, prompt: str, model: str = "demo", steps: int = 20,
             seed: int | None = None) -> None:
    from selenium.webdriver.support.ui import Select

    _until(driver, "return document.querySelector(`#model option[value='${arguments[0]}']`)",
           f"model {model} among the choices", model)
    Select(driver.find_element("id", "model")).select_by_value(model)
    fields = (("prompt", prompt), ("steps", str(steps)),
              ("seed", "" if seed is None else str(seed)))
    for element_id, value in fields:
        field = driver.find_element("id", element_id)
        field.clear()
        field.send_keys(value)
    driver.find_element("id", "submit").click()


def _save(driver, tmp_path: Path) -> Path:
    path = tmp_path / "web-page.png"
    assert driver.save_screenshot(str(path)), "no screenshot of the page"
    if os.environ.get("GPULANES_SCREENSHOTS") == "1":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, SCREENSHOT)
    print(f"screenshot of the web page: {path}")
    return path


def test_a_person_watches_a_prediction_cancels_it_and_makes_an_image(
        browser, api, worker, clean_redis, tmp_path):
    made, _ = apikeys.create(clean_redis, "web-studio")
    gate = new_gate()  # holds the one worker: the page's first prediction waits its turn
    holder = submit(f"gate:{gate} hold", model="flaky", account="someone-else", **SMALL)
    wait_at_gate(holder, gate)
    try:
        _sign_in(browser, api.url, made)
        _watch_and_cancel(browser, gate)
    finally:
        open_gate(gate)  # a failed test leaves no job holding the worker
    assert holder.get(timeout=WAIT_S)["lane"] == "standard"
    _make_an_image(browser, api.url, made)
    _open_each_recent_one(browser)
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, errors  # no script error, no call refused by the policy
    assert _save(browser, tmp_path).stat().st_size > 0


def _sign_in(browser, url: str, made: str) -> None:
    """A wrong key is refused; the right one shows the account and its fast time."""
    browser.get(f"{url}/")
    key = browser.find_element("id", "key")
    key.send_keys("gl_not-a-key")
    browser.find_element("id", "key-use").click()
    assert "refused" in _until(browser, "return !document.getElementById('notice').hidden "
                               "&& document.getElementById('notice').textContent", "a refusal")
    browser.get_log("browser")  # drop the console's lines of those 401s
    key.send_keys(made)
    browser.find_element("id", "key-use").click()
    fast = _until(browser, "return !document.getElementById('main').hidden && "
                  "document.getElementById('fast-left').dataset.seconds", "the fast time left")
    assert float(fast) == plan("standard").fast_seconds
    assert _shown(browser, "fast-left") == "15 h 0 min"
    assert _shown(browser, "account-name") == "web-studio"
    assert browser.execute_script("return [sessionStorage.getItem('gpulanes.key'), "
                                  "localStorage.length, document.cookie]") == [made, 0, ""]


def _watch_and_cancel(browser, gate: str) -> None:
    """A prediction queued behind the held job shows its place, then (the worker let go)
    its steps as it runs; cancelled, it stops and says so."""
    _compose(browser, f"pace:{PACE_MS} a storm over the harbour", "flaky", PACED_STEPS)
    _until(browser, "const q = document.getElementById('queue'); "
           "return !q.hidden && q.dataset.position === '0'", "its place in the lane")
    assert _shown(browser, "queue") == "Next in the standard lane."
    assert _shown(browser, "status") == "starting"
    open_gate(gate)
    step, steps = _until(browser, """const p = document.getElementById('progress');
        return !p.hidden && Number(p.dataset.step) > 0 && [Number(p.dataset.step),
               Number(p.dataset.steps)];""", "a step of the running prediction")
    assert 0 < step < steps == PACED_STEPS  # seen while it runs, not once it ended
    assert _shown(browser, "status") == "processing" and _shown(browser, "queue") == ""
    browser.find_element("id", "cancel").click()
    _until(browser, STATUS, "the prediction canceled", "canceled")
    assert _shown(browser, "cancel") == "" and _shown(browser, "progress") == ""


def _make_an_image(browser, url: str, made: str) -> None:
    """An image made with a seed past 2**53 shows, and the seed is kept exactly."""
    _compose(browser, "a lighthouse on a cliff at dusk", seed=SEED)
    assert _until(browser, IMAGE_LOADED, "the image") == [256, 256]
    assert _shown(browser, "status") == "succeeded"
    shown = browser.execute_script("return [...document.querySelectorAll('#details dt')]"
                                   ".map(dt => [dt.textContent, dt.nextSibling.textContent])")
    details = dict(shown)
    assert details["Seed"] == str(SEED) and details["Size"] == "256 x 256"
    made_there = httpx.get(f"{url}/v1/predictions/{details['Id']}", timeout=10,
                           headers={"Authorization": f"Bearer {made}"}).json()
    assert made_there["input"]["seed"] == SEED and made_there["status"] == "succeeded"


def _open_each_recent_one(browser) -> None:
    """The recent list, newest first; a click shows that prediction (its image again)."""
    listed = _until(browser, """const items = [...document.querySelectorAll('#recent button')];
        return items.length === 2 && items.map(b => b.querySelector('.badge').textContent);""",
                    "both predictions in the recent list")
    assert listed == ["succeeded", "canceled"]
    browser.find_elements("css selector", "#recent button")[1].click()
    _until(browser, STATUS, "the cancelled prediction again", "canceled")
    assert _shown(browser, "prompt-shown").endswith("a storm over the harbour")
    assert browser.execute_script("return document.getElementById('image').hidden")
    browser.find_elements("css selector", "#recent button")[0].click()
    _until(browser, STATUS, "the image's prediction again", "succeeded")
    assert _until(browser, IMAGE_LOADED, "its image again") == [256, 256]
    assert _shown(browser, "prompt-shown") == "a lighthouse on a cliff at dusk"


#: Wraps the page's fetch: every event stream it opens is noted (with the Last-Event-ID
#: it resumes from), and the first is cut, as a dropped connection would, right after its
#: first event that has an id.
CUT_THE_FIRST_STREAM = r"""
window.streams = [];
const fetched = window.fetch;
window.fetch = async (url, options = {}) => {
  const answer = await fetched(url, options);
  if (!String(url).endsWith('/events')) return answer;
  const stream = {resumed: new Headers(options.headers).get('Last-Event-ID'), cutAfter: null};
  window.streams.push(stream);
  if (window.streams.length > 1) return answer;
  const reader = answer.body.getReader();
  const decoder = new TextDecoder();
  let text = '';
  const cut = new ReadableStream({async pull(controller) {
    const {value, done} = await reader.read();
    if (done) return controller.close();
    text += decoder.decode(value, {stream: true});
    const event = /(?:^|\n)id: ?([^\r\n]+)[\s\S]*?(\r?\n\r?\n)/.exec(text);
    if (!event) return;
    stream.cutAfter = event[1];
    controller.enqueue(new TextEncoder().encode(text.slice(0, event.index + event[0].length)));
    reader.cancel();
    controller.error(new TypeError('network error'));
  }});
  return new Response(cut, {status: answer.status, headers: answer.headers});
};
"""


def test_a_dropped_event_stream_resumes_after_its_last_event(browser, api, worker,
                                                            clean_redis):
    made, _ = apikeys.create(clean_redis, "web-resumer")
    browser.get(f"{api.url}/")
    browser.execute_script("sessionStorage.setItem('gpulanes.key', arguments[0]);", made)
    browser.get(f"{api.url}/")  # the key stays with the tab: no need to paste it again
    _until(browser, "return !document.getElementById('main').hidden", "the signed-in page")
    assert _shown(browser, "account-name") == "web-resumer"
    browser.execute_script(CUT_THE_FIRST_STREAM)
    _compose(browser, "a harbour at night", steps=8)
    assert _until(browser, IMAGE_LOADED, "the image") == [256, 256]
    assert _shown(browser, "status") == "succeeded"
    first, second = browser.execute_script("return window.streams")
    assert first["resumed"] is None and first["cutAfter"]
    assert second["resumed"] == first["cutAfter"]  # and it was told the rest: it ended
