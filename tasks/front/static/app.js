// The gpulanes web page: a person pastes their API key, makes images and watches them
// queue, run and end. The key lives in this tab's sessionStorage only, and every call
// to the API sends it as `Authorization: Bearer <key>`. A prediction's events are read
// with fetch() (EventSource cannot send that header) and parsed here. A module: strict,
// deferred, and nothing of it on `window`.

const KEY_ITEM = "gpulanes.key";
const FINAL = new Set(["succeeded", "failed", "canceled"]);
const RECENT_LIMIT = 15;
const LONGEST_RETRY_MS = 15000;
const $ = (id) => document.getElementById(id);

const state = {
  view: null,      // the prediction shown, as last heard of
  watch: null,     // the AbortController of its event stream
  imageFor: null,  // the prediction whose image is shown (or being fetched)
  imageUrl: null,  // that image's blob: URL
};

// --- the key ------------------------------------------------------------------------

const key = () => sessionStorage.getItem(KEY_ITEM);
const auth = (more) => ({ ...more, Authorization: `Bearer ${key()}` });

function useKey(event) {
  event.preventDefault();
  const typed = $("key").value.trim();
  if (!typed) return;
  sessionStorage.setItem(KEY_ITEM, typed);
  $("key").value = "";
  start();
}

function forgetKey(why) {
  sessionStorage.removeItem(KEY_ITEM);
  stopWatching();
  showImage(null, null);
  state.view = null;
  $("main").hidden = true;
  $("key-forget").hidden = true;
  $("key").placeholder = "gl_...";
  notice(typeof why === "string" ? why : "");
}

function notice(text) {
  $("notice").textContent = text;
  $("notice").hidden = !text;
}

async function api(path, options = {}) {
  const res = await fetch(path, { ...options, headers: auth(options.headers), cache: "no-store" });
  const json = (res.headers.get("content-type") || "").includes("application/json");
  const body = json ? parseJson(await res.text()) : null;
  if (res.status === 401) {
    forgetKey("The API key was refused (unknown or revoked): paste a valid one.");
  }
  if (!res.ok) {
    const detail = (body && body.detail) || `${res.status} ${res.statusText}`;
    throw Object.assign(new Error(detail), { status: res.status, body: body || {} });
  }
  return body;
}

async function start() {
  $("key-forget").hidden = false;
  $("key").placeholder = "key kept for this tab";
  try {
    await refreshAccount();  // the key is good
  } catch (err) {
    if (err.status !== 401) notice(`The API did not answer: ${err.message}`);
    return;
  }
  notice("");
  $("main").hidden = false;
  loadModels().catch((err) => notice(`The models could not be listed: ${err.message}`));
  refreshRecent().catch((err) => notice(`Your predictions could not be listed: ${err.message}`));
}

// --- account, models, recent predictions ---------------------------------------------

function duration(seconds) {
  const s = Math.max(0, seconds);
  if (s >= 3600) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  if (s >= 60) return `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s`;
  return `${s.toFixed(1)} s`;
}

async function refreshAccount() {
  const account = await api("v1/account");
  $("account-name").textContent = account.account;
  $("account-plan").textContent = account.plan;
  $("fast-left").textContent = duration(account.fast_seconds_left);
  $("fast-left").dataset.seconds = account.fast_seconds_left;
  $("fast-renews").textContent = new Date(account.fast_renews_at).toLocaleString(
    undefined, { dateStyle: "medium", timeStyle: "short" });
}

async function loadModels() {
  const models = (await api("v1/models")).results.filter(
    (m) => m.kind === "image" && m.available);
  const select = $("model");
  const chosen = select.value;
  select.replaceChildren(...models.map((m) => new Option(m.name, m.name)));
  if (models.some((m) => m.name === chosen)) select.value = chosen;
  const steps = models.length && models[0].input_schema.properties.steps;
  if (steps) Object.assign($("steps"), { min: steps.minimum, max: steps.maximum });
}

async function refreshRecent() {
  const page = await api(`v1/predictions?limit=${RECENT_LIMIT}`);
  $("recent").replaceChildren(...page.results.map(recentItem));
  markCurrent();
}

function recentItem(p) {
  const button = document.createElement("button");
  button.type = "button";
  button.dataset.id = p.id;
  button.append(badge(p.status), text("span", "what", (p.input && p.input.prompt) || p.model),
                text("span", "meta", `${p.model} · ${p.tier} · ${clock(p.created_at)}`));
  button.addEventListener("click", () => openPrediction(p.id));
  const item = document.createElement("li");
  item.append(button);
  return item;
}

function markCurrent() {
  for (const button of $("recent").querySelectorAll("button")) {
    button.toggleAttribute("aria-current", state.view && button.dataset.id === state.view.id);
  }
}

// --- making and cancelling -------------------------------------------------------------

async function compose(event) {
  event.preventDefault();
  const form = new FormData($("compose"));
  const side = Number(form.get("size"));
  const input = { prompt: form.get("prompt"), steps: Number(form.get("steps")),
                  width: side, height: side };
  const seed = form.get("seed").trim();
  if (seed !== "") {  // sent as its digits: a number would round a seed past 2**53
    input.seed = JSON.rawJSON && /^\d+$/.test(seed) ? JSON.rawJSON(seed) : Number(seed);
  }
  const body = { model: form.get("model"), tier: form.get("tier"), input };
  $("submit").disabled = true;
  $("compose-error").hidden = true;
  try {
    show(await api("v1/predictions", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body) }));
    refreshRecent().catch(() => {});
  } catch (err) {
    $("compose-error").textContent = refusal(err);
    $("compose-error").hidden = false;
  } finally {
    $("submit").disabled = false;
  }
}

function refusal(err) {
  if (err.status === 402) {
    return `Your fast time is spent until ${new Date(err.body.renews_at).toLocaleString()}:` +
           " choose the standard or relaxed lane.";
  }
  if (err.status === 429) return `${err.message} Try again in a moment.`;
  return err.message;
}

async function cancel() {
  const id = state.view.id;
  $("cancel").disabled = true;
  $("cancel").textContent = "Cancelling";
  try {
    const answered = await api(`v1/predictions/${encodeURIComponent(id)}/cancel`,
                               { method: "POST" });
    if (state.view && state.view.id === id) {
      if (FINAL.has(answered.status)) stopWatching();
      render(answered);  // running: it stops at its next step, and the stream says so
    }
    refreshRecent().catch(() => {});
  } catch (err) {
    notice(`Could not cancel: ${err.message}`);
  }
}

async function openPrediction(id) {
  try {
    show(await api(`v1/predictions/${encodeURIComponent(id)}`));
  } catch (err) {
    notice(`Could not open that prediction: ${err.message}`);
  }
}

// --- one prediction --------------------------------------------------------------------

function show(prediction) {
  stopWatching();
  render(prediction);
  if (!FINAL.has(prediction.status)) watch(prediction.id);
}

function render(p) {
  const changed = !state.view || state.view.id !== p.id;
  state.view = p;
  $("empty").hidden = true;
  $("current").hidden = false;
  $("status").replaceWith(badge(p.status, "status"));
  $("where").textContent = where(p);
  $("prompt-shown").textContent = (p.input && p.input.prompt) || "";
  renderQueue(p.status === "starting" ? p.queue : null);
  renderProgress(p.status === "processing" ? p.progress : null);
  const final = FINAL.has(p.status);
  $("cancel").hidden = final;
  if (changed || final) Object.assign($("cancel"), { disabled: false, textContent: "Cancel" });
  $("error").textContent = p.error || "";
  $("error").hidden = !p.error;
  renderDetails(p);
  const image = p.status === "succeeded" && p.output && p.output.image;
  if (image && image.url) showImage(p.id, image.url);
  else if (state.imageFor !== p.id) showImage(null, null);
  markCurrent();
}

function where(p) {
  const run = p.run || {};
  let text = `${p.model} · asked ${p.tier}`;
  if (run.lane) text += ` · ran in ${run.lane}`;
  if (run.downgraded_from) text += ` (${run.downgrade_reason || "moved down"})`;
  return text;
}

function renderQueue(queue) {
  const box = $("queue");
  box.hidden = !queue;
  if (!queue) return;
  box.dataset.position = queue.position === null ? "" : queue.position;
  if (queue.parked) box.textContent = "Waiting for one of your running jobs to end.";
  else if (queue.position === null) box.textContent = `Waiting in the ${queue.lane} lane.`;
  else if (queue.position === 0) box.textContent = `Next in the ${queue.lane} lane.`;
  else box.textContent = `${queue.position} ahead of you in the ${queue.lane} lane.`;
}

function renderProgress(progress) {
  const box = $("progress");
  box.hidden = !progress;
  if (!progress) return;
  const { step, steps, eta_s: eta } = progress;
  Object.assign($("bar"), { max: steps || 1, value: step || 0 });
  Object.assign(box.dataset, { step: step || 0, steps: steps || 0 });
  let said = `Step ${step || 0} of ${steps}`;
  if (progress.paused) said += " · paused while a faster job runs";
  else if (typeof eta === "number") said += ` · about ${eta.toFixed(1)} s left`;
  $("progress-text").textContent = said;
}

function renderDetails(p) {
  const input = p.input || {};
  const timing = p.timing || {};
  const rows = [["Seed", input.seed], ["Steps", input.steps],
                ["Size", input.width && `${input.width} x ${input.height}`],
                ["Made", clock(p.created_at)],
                ["Waited", timing.queued_ms != null && `${Math.round(timing.queued_ms)} ms`],
                ["Ran", timing.run_ms != null && `${Math.round(timing.run_ms)} ms`]];
  $("details").replaceChildren(...rows.filter(([, v]) => v != null && v !== false)
    .flatMap(([name, value]) => [text("dt", "", name), text("dd", "", String(value))]),
    text("dt", "wide", "Id"), text("dd", "wide", p.id));
}

async function showImage(id, url) {
  if (id && state.imageFor === id) return;  // shown already, or on its way
  state.imageFor = id;
  const img = $("image");
  if (state.imageUrl) URL.revokeObjectURL(state.imageUrl);
  state.imageUrl = null;
  img.hidden = true;
  img.removeAttribute("src");
  $("image-note").textContent = "";
  if (!id) return;
  try {
    const res = await fetch(url, { headers: auth(), cache: "no-store" });
    if (!res.ok) throw new Error(`${res.status} ${res.statusText}`);
    const blob = await res.blob();
    if (state.imageFor !== id) return;  // another prediction was opened meanwhile
    state.imageUrl = URL.createObjectURL(blob);
    img.src = state.imageUrl;
    img.alt = (state.view && state.view.input && state.view.input.prompt) || "the image";
    img.hidden = false;
  } catch (err) {
    if (state.imageFor === id) $("image-note").textContent = `The image: ${err.message}`;
  }
}

// --- the event stream ------------------------------------------------------------------

function stopWatching() {
  if (state.watch) state.watch.abort();
  state.watch = null;
}

// Follow a prediction's events until `completed`; a dropped connection is opened again
// with Last-Event-ID, after a pause that grows with each failure in a row.
async function watch(id) {
  const control = new AbortController();
  state.watch = control;
  let lastId = null;
  let retryMs = 500;
  let failures = 0;
  while (!control.signal.aborted) {
    try {
      const headers = { Accept: "text/event-stream" };
      if (lastId !== null) headers["Last-Event-ID"] = lastId;
      const res = await fetch(`v1/predictions/${encodeURIComponent(id)}/events`,
                              { headers: auth(headers), cache: "no-store",
                                signal: control.signal });
      if (res.status === 401) return forgetKey("The API key was refused: paste a valid one.");
      if (res.status === 404) return notice("That prediction is gone (kept for a day).");
      if (!res.ok || !res.body) throw new Error(`events: ${res.status}`);
      for await (const event of serverEvents(res.body)) {
        if (event.id !== undefined) lastId = event.id;
        if (event.retry) retryMs = event.retry;
        failures = 0;
        if (heard(id, event) === "completed") return;
      }
    } catch (err) {
      if (control.signal.aborted) return;
    }
    failures += 1;
    await pause(Math.min(retryMs * 2 ** (failures - 1), LONGEST_RETRY_MS), control.signal);
  }
}

// The events of a text/event-stream body, as the HTML standard parses them.
async function* serverEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { type: "message", data: [] };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      const cut = buffer.endsWith("\r") ? buffer.length - 1 : buffer.length;  // \r\n split?
      const lines = buffer.slice(0, cut).split(/\r\n|\r|\n/);
      buffer = lines.pop() + buffer.slice(cut);
      for (const line of lines) {
        if (line === "") {
          if (event.data.length || event.id !== undefined) {
            yield { ...event, data: event.data.join("\n") };
          }
          event = { type: "message", data: [] };
          continue;
        }
        if (line.startsWith(":")) continue;  // a comment: a keep-alive
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") event.type = value;
        else if (field === "data") event.data.push(value);
        else if (field === "id" && !value.includes("\0")) event.id = value;
        else if (field === "retry" && /^\d+$/.test(value)) event.retry = Number(value);
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// One event of prediction `id`: what it changes of the view; its type.
function heard(id, event) {
  if (!event.data || !state.view || state.view.id !== id) return event.type;
  const data = parseJson(event.data);
  const view = { ...state.view };
  if (event.type === "completed") {
    render(data);
    refreshAccount().catch(() => {});
    refreshRecent().catch(() => {});
    return event.type;
  }
  if (data.status) view.status = data.status;
  if (event.type === "queued") view.queue = data.queue;
  if (event.type === "started") view.started_at = data.started_at;
  if (event.type === "progress") view.progress = data.progress;
  if (event.type === "output") view.output = data.output;
  render(view);
  return event.type;
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

// --- small helpers ---------------------------------------------------------------------

// JSON whose integers past 2**53 (an image's seed) are kept as their digits: a number
// would round them, and a seed shown or sent again must be exact.
function parseJson(text) {
  return JSON.parse(text, (name, value, context) =>
    typeof value === "number" && !Number.isSafeInteger(value) && context &&
    /^\d+$/.test(context.source) ? context.source : value);
}

function text(tag, className, content) {
  const element = document.createElement(tag);
  if (className) element.className = className;
  element.textContent = content;
  return element;
}

function badge(status, id) {
  const element = text("span", `badge ${status}`, status);
  if (id) element.id = id;
  return element;
}

function clock(iso) {
  return iso ? new Date(iso).toLocaleTimeString() : "";
}

document.addEventListener("DOMContentLoaded", () => {
  $("key-form").addEventListener("submit", useKey);
  $("key-forget").addEventListener("click", () => forgetKey(""));
  $("compose").addEventListener("submit", compose);
  $("cancel").addEventListener("click", cancel);
  $("recent-refresh").addEventListener("click", () => refreshRecent().catch(() => {}));
  if (key()) start();
});
