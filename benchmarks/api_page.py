"""The page of ``benchmarks/api.py``: what the HTTP front door adds to a submit."""
from __future__ import annotations

from typing import Any, Mapping

from benchmarks.api_figures import (
    LATENCY_HEADERS, THROUGHPUT_HEADERS, latency_rows, throughput_rows, verdict_lines)
from benchmarks.pages_kit import Page, num, ratio, table


#: How the throughput rounds' clients sent, as the page says it.
CLIENTS = {"raw": "HTTP/1.1 written by hand on keep-alive connections",
           "httpx": "httpx's `AsyncClient`"}


def api(data: dict[str, Any]) -> Page:
    """``benchmarks/api.py``: ``POST /v1/predictions`` against ``submit()`` in-process."""
    config, lat, rate = data["config"], data["latency"], data["throughput"]
    added, alone = lat["added_ms"], lat["ms"]["submit"]
    ratios = rate["ratios"]
    page = Page(
        "api", "The HTTP front door against `submit()`",
        "The same job (`echo`, tier standard, the `mega` plan: admission and the "
        "prediction's record included) submitted by `submit()` in-process and by "
        "`POST /v1/predictions` to `celery -A tasks lanes api`, on one embedded Redis "
        "with nothing consuming; a thread stands in for beat. Latency: one call at a "
        "time, the kinds interleaved, over a keep-alive httpx client. Throughput: "
        f"{config['rounds']} interleaved rounds of `submit()` looping in 1 and 2 "
        f"processes, and of {config['clients']} asyncio client processes "
        f"({config['concurrency']} requests in flight each, {CLIENTS[config['client']]}) "
        "against 1 and 2 API processes. Each round starts on an emptied Redis, the "
        f"submits spread over {config['accounts']} accounts so that none reaches its "
        "plan's limits.",
        f"HTTP adds {num(added['p50'], 2)} ms at p50, {num(added['p99'], 2)} ms at p99 "
        f"(`submit()` alone {num(alone['p50'], 2)} ms at p50)",
        ", ".join(f"{n} process{'es' if n != '1' else ''}: {ratio(r['paired'])} of "
                  "`submit()`'s submits/s" for n, r in ratios.items()))
    page.add("## Latency, one call at a time",
             table(LATENCY_HEADERS, latency_rows(lat)),
             "*Added by HTTP* is the POST's percentile less `submit()`'s (the median of the "
             f"per-sample differences: {num(added['paired_p50'], 2)} ms). `submit()` is "
             "timed until it returns, the POST until its 201 is read: it holds the "
             "request's parsing and validation, the key, the submit itself (its publish "
             "also counts the job's place in its lane, for the answer), and the client's "
             "own work (*caller CPU*: the calling thread's CPU in a call, the client's "
             "share of it). The floor is the "
             "cheapest authenticated call: the key from the server's memory, one Redis "
             "read, a 404 of a few bytes; `GET /v1/models` reads no Redis but answers "
             f"{num(config.get('models_bytes'), 0)} bytes.")
    page.add("## Submits per second",
             table(THROUGHPUT_HEADERS, throughput_rows(rate)),
             "*CPU µs per submit*: of the processes that submit (the loops calling "
             "`submit()`, or the API servers); *client CPU µs*: the HTTP clients', which "
             "share the machine's cores with the servers. Redis' commands count those "
             "its scripts run. *Errors* counts submits refused or parked (none expected). "
             "The paired ratio is the median of the rounds' ratios.")
    page.add("## What the API asks Redis more than `submit()` does",
             "Per submit, one process each, the commands its scripts run included:",
             redis_table(rate["redis_by_command"]))
    if data.get("events"):
        events_section(page, data["events"], config)
    return page.add("## Goals", "\n".join(f"- {line}" for line in
                                          verdict_lines(data["goals"])))


def events_section(page: Page, found: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """Open event streams against submits, progress to event, webhooks through an
    outage."""
    rate, hooks = found["submits_s"], found["webhooks"]
    latency = found["progress_to_event_ms"]
    page.add("## Event streams and webhooks",
             f"Submits per second of one API process (the rounds above's client load), "
             f"in {config['rounds']} interleaved pairs of rounds without and with "
             f"{found['streams_open']} Server-Sent Event streams open on it (predictions "
             "of other accounts queued in the fast lane, held by a client in the "
             "benchmark's process; the submits go to standard):",
             table(["open streams", "submits/s (median)", "paired ratio"], [
                 ["0", num(rate["without"], 0), ""],
                 [str(found["streams_open"]), num(rate["with"], 0),
                  ratio(found["rate_ratio_paired"])]]),
             "From a worker's progress report (`store_progress`, as a running job calls it "
             f"every {num(found['progress_interval_ms'], 0)} ms) to the event parsed by "
             "a client reading the prediction's stream:",
             table(["other streams open", "p50 ms", "p95 ms", "max ms", "reports"], [
                 [n, num(ms["p50"], 1), num(ms["p95"], 1), num(ms["max"], 1),
                  str(ms["samples"])] for n, ms in latency.items()]),
             f"Webhooks: {hooks['count']} predictions' `completed` events to a receiver "
             f"that answered 503 for {num(hooks['outage_s'], 0)} s "
             f"({hooks['attempts_while_down']} attempts refused meanwhile): "
             f"{hooks['delivered']} delivered once it was back "
             f"({num(100 * hooks['delivered'] / hooks['count'], 0)} %), each once "
             f"({hooks['repeats']} repeats), the last "
             f"{num(hooks['last_delivered_after_back_s'], 1)} s after its return (the "
             "retries' backoff, at most 60 s apart, with full jitter).",
             "\n".join(f"- {name.replace('_', ' ')}: {goal['value']} (goal {goal['goal']})"
                       f": {'met' if goal['met'] else 'NOT met'}"
                       for name, goal in found["goals"].items()))


def redis_table(found: Mapping[str, Mapping[str, float]]) -> str:
    """The commands one API process runs per submit that ``submit()`` alone does not (or
    runs more of), and every command's total."""
    alone, api = found.get("submit x1", {}), found.get("api x1", {})
    more = {name: api.get(name, 0) - alone.get(name, 0) for name in set(alone) | set(api)}
    rows = [[f"`{name.upper()}`", num(alone.get(name, 0), 2), num(api.get(name, 0), 2),
             f"{more[name]:+.2f}"] for name in sorted(more) if abs(more[name]) >= 0.05]
    rows.append(["all commands", num(sum(alone.values()), 2), num(sum(api.values()), 2),
                 f"{sum(more.values()):+.2f}"])
    return table(["command", "`submit()`", "API", "API more"], rows)


RENDERERS = {"api": api}
