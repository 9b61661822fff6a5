"""The events part of ``benchmarks/api.py``: what open event streams cost submits, how
soon a progress report reaches a stream's client, and webhooks through a receiver
outage.

1. **Submits with open streams.** ``--streams`` Server-Sent Event streams are opened to
   the first API process (predictions queued in the fast lane by other accounts, a
   client in this process holding them; the submits measured go to standard, so the
   streams' places stay as they are, as those of jobs ahead of new ones do), and the
   API's submit rate in one process is measured in rounds of ``--stream-seconds``
   without and with them, interleaved, each on a Redis emptied before the streams'
   predictions are made. The ratio is with over without, paired by round.
2. **Progress to event.** With the streams open, the worker's own progress report
   (``tasks.broker.backend.store_progress``, as a running job calls it every
   ``PROGRESS_S``) is made for a prediction whose stream an httpx client reads; the
   latency is from the report's call to the event parsed at the client. Goal: p95 at
   most one progress interval.
3. **Webhooks through an outage.** ``--hooks`` predictions name a receiver (in this
   process) that answers 503 for ``--outage`` seconds; each prediction's end is stored
   as a worker's is (``mark_as_done``: Celery's store, which logs ``completed`` and puts
   its delivery in the outbox), and a sender (``celery -A tasks lanes webhooks``) sends
   them. Figures: the share delivered once the receiver is back, each once, and the
   time from its return to the last delivery.
"""
from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

#: Each stream's account has this many predictions (under the plan's jobs at once).
PER_ACCOUNT = 10
#: Reports of the progress latency, one every progress interval.
PROGRESS_SAMPLES = 80


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def queued_predictions(client: Any, count: int, prefix: str) -> list[tuple[str, str]]:
    """``count`` predictions queued in the fast lane by accounts of their own: (its id,
    its key)."""
    from benchmarks.api_load import PLAN
    from tasks.api import submit_placed
    from tasks.jobs import apikeys
    from tasks.jobs.plans import plan

    made = []
    for i in range(0, count, PER_ACCOUNT):
        account = f"{prefix}-{i // PER_ACCOUNT:04d}"
        key = apikeys.create(client, account, PLAN)[0]
        for n in range(min(PER_ACCOUNT, count - i)):
            where, _ = submit_placed(model="echo", account=account, plan=plan(PLAN),
                                     tier="fast", text=f"held {n}")
            made.append((where.job_id, key))
    return made


class Streams:
    """Event streams held open on one API process by an asyncio loop in a thread: each a
    raw HTTP/1.1 GET whose answer's headers are read, then its bytes as they come."""

    def __init__(self, url: str, made: list[tuple[str, str]]) -> None:
        self.host, self.port = url.removeprefix("http://").split(":")
        self.made, self.open, self.begun = made, 0, 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.tasks = asyncio.run_coroutine_threadsafe(self._open_all(), self.loop)

    async def _open_all(self) -> None:
        self.closing, self.drains = asyncio.Event(), []
        writers = await asyncio.gather(*(self._one(job, key) for job, key in self.made))
        self.ready.set()
        await self.closing.wait()  # held until closed
        for writer in writers:
            writer.close()
        await asyncio.gather(*self.drains, return_exceptions=True)

    async def _one(self, job_id: str, key: str) -> Any:
        reader, writer = await asyncio.open_connection(self.host, int(self.port))
        writer.write(f"GET /v1/predictions/{job_id}/events HTTP/1.1\r\nHost: {self.host}\r\n"
                     f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n"
                     .encode())
        status = await reader.readline()
        if b" 200 " in status:
            self.open += 1
        while (await reader.readline()).strip():  # the headers
            pass
        await reader.readuntil(b"\r\n\r\n")  # its first event: the stream has begun
        self.begun += 1
        self.drains.append(asyncio.ensure_future(self._drain(reader)))
        return writer

    @staticmethod
    async def _drain(reader: asyncio.StreamReader) -> None:
        while await reader.read(65536):
            pass

    def wait(self, timeout_s: float = 120.0) -> int:
        """Once every stream has sent its first event, and the server's looks at them
        are under way: how many answered 200."""
        from tasks.front.hub import LOOK_S

        self.ready.wait(timeout_s)
        time.sleep(LOOK_S + 0.5)  # the hub's first look at them, which comes once
        return self.open

    def close(self) -> None:
        if self.ready.is_set():
            self.loop.call_soon_threadsafe(self.closing.set)
            self.tasks.result(30)
        else:
            self.tasks.cancel()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def progress_latency(url: str, job_id: str, key: str, samples: int) -> list[float]:
    """Milliseconds from each progress report of ``job_id`` to its event at a client
    reading the prediction's stream."""
    import httpx

    from tasks.broker.app import app
    from tasks.broker.backend import store_progress
    from tasks.worker.progress import PROGRESS_S
    from tests.harness import sse

    seen: dict[int, float] = {}
    opened = threading.Event()

    def read() -> None:
        with httpx.Client(base_url=url, timeout=120) as http, http.stream(
                "GET", f"/v1/predictions/{job_id}/events",
                headers={"Authorization": f"Bearer {key}"}) as answer:
            opened.set()
            for event in sse.parsed(answer.iter_lines()):
                if event["event"] == "progress":
                    seen[event["data"]["progress"]["step"]] = time.perf_counter()
                    if len(seen) >= samples:
                        return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    opened.wait(30)
    time.sleep(0.5)  # the stream subscribed, its first look done
    sent = {}
    for step in range(1, samples + 1):
        sent[step] = time.perf_counter()
        store_progress(app, job_id, {"step": step, "steps": samples + 1, "lane": "standard",
                                     "eta_s": None})
        time.sleep(PROGRESS_S)
    reader.join(30)
    return [(seen[s] - sent[s]) * 1000 for s in sent if s in seen]


def webhook_outage(client: Any, logs: Path, count: int, outage_s: float) -> dict[str, Any]:
    """``count`` completed events to a receiver down for ``outage_s``: delivered once it
    is back, each once, and how soon."""
    from benchmarks.api_load import PLAN
    from tasks.api import submit_placed
    from tasks.broker.app import app
    from tasks.jobs import apikeys
    from tasks.jobs.plans import plan
    from tests.harness.hooks import Receiver, Sender

    with Receiver() as receiver, Sender(logs, name="webhooks"):
        receiver.down = True
        made = []
        for i in range(count):
            account = f"hooked-{i // PER_ACCOUNT:04d}"
            if i % PER_ACCOUNT == 0:
                apikeys.create(client, account, PLAN)
            where, _ = submit_placed(model="echo", account=account, plan=plan(PLAN),
                                     text=f"hook {i}", webhook=receiver.url,
                                     webhook_events_filter=["completed"])
            made.append(where.job_id)
        began = time.monotonic()
        for job_id in made:  # each ends as a worker's store of its result ends it
            app.backend.mark_as_done(job_id, {"output": {"text": "done"}, "run_ms": 1.0,
                                              "queued_ms": 1.0})
        time.sleep(max(0.0, outage_s - (time.monotonic() - began)))
        tried_down = receiver.tried
        receiver.down = False
        back = time.monotonic()
        deadline = back + 120
        while time.monotonic() < deadline and len({d.body["id"] for d in receiver.got}) < count:
            time.sleep(0.05)
        last_s = time.monotonic() - back
        ids = [d.headers["webhook-id"] for d in receiver.got]
        return {"count": count, "outage_s": outage_s, "attempts_while_down": tried_down,
                "delivered": len({d.body["id"] for d in receiver.got}),
                "deliveries": len(ids), "repeats": len(ids) - len(set(ids)),
                "last_delivered_after_back_s": round(last_s, 2)}


def measure(client: Any, servers: list[Any], state: Path, args: Any,
            one_round: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """The three measurements (``one_round(fresh)``: benchmarks/api.py's round of submits
    to one API process, on a Redis it empties first if ``fresh``)."""
    url = servers[0].url
    print(f"  submits with {args.streams} open streams...", file=sys.stderr, flush=True)
    from benchmarks.api_load import reset

    rounds = []
    for r in range(args.rounds):
        for streamed in ((False, True) if r % 2 == 0 else (True, False)):
            reset(client)  # before the streams' predictions are made: the round keeps them
            with _held(client, url, args.streams if streamed else 0, f"s{r}") as opened:
                rounds.append({"round": r, "streams": opened, **one_round(False)})
    latency = {}
    for streamed in (0, args.streams):
        with _held(client, url, streamed, f"l{streamed}"):
            probe = queued_predictions(client, 1, f"probe{streamed}")[0]
            latency[streamed] = progress_latency(url, *probe, PROGRESS_SAMPLES)
    print(f"  webhooks through a {args.outage:g} s outage...", file=sys.stderr, flush=True)
    hooks = webhook_outage(client, state / "logs", args.hooks, args.outage)
    return figures(rounds, latency, hooks)


@contextmanager
def _held(client: Any, url: str, count: int, prefix: str) -> Iterator[int]:
    """``count`` streams held open on ``url`` meanwhile (how many opened), of
    predictions made for them."""
    if not count:
        yield 0
        return
    streams = Streams(url, queued_predictions(client, count, f"streamed-{prefix}"))
    try:
        yield streams.wait()
    finally:
        streams.close()
        time.sleep(1.0)  # the server drops its side of them


def figures(rounds: list[dict[str, Any]], latency: dict[int, list[float]],
            hooks: dict[str, Any]) -> dict[str, Any]:
    """What the page shows, and the goals."""
    from tasks.worker.progress import PROGRESS_S

    without = [r for r in rounds if not r["streams"]]
    held = [r for r in rounds if r["streams"]]
    paired = [b["submits_s"] / a["submits_s"] for a, b in zip(
        sorted(without, key=lambda r: r["round"]), sorted(held, key=lambda r: r["round"]))]
    ratio = statistics.median(paired) if paired else None
    shown = {str(n): _spread(ms) for n, ms in latency.items()}
    p95 = max((found["p95"] for found in shown.values() if found["p95"] is not None),
              default=None)
    interval_ms = PROGRESS_S * 1000
    return {
        "streams_open": max((r["streams"] for r in rounds), default=0),
        "submits_s": {"without": statistics.median(r["submits_s"] for r in without),
                      "with": statistics.median(r["submits_s"] for r in held)},
        "rate_ratio_paired": ratio,
        "progress_to_event_ms": shown, "progress_interval_ms": interval_ms,
        "webhooks": hooks,
        "goals": {
            "streams_slow_submits_at_most_10pct": {
                "goal": ">= 0.90", "value": ratio, "met": ratio is not None and ratio >= 0.9},
            "progress_p95_within_interval": {
                "goal": f"<= {interval_ms:g} ms", "value": p95,
                "met": p95 is not None and p95 <= interval_ms},
            "webhooks_all_delivered": {
                "goal": "100 %", "value": 100 * hooks["delivered"] / hooks["count"],
                "met": hooks["delivered"] == hooks["count"]}},
        "rounds": rounds}


def _spread(ms: list[float]) -> dict[str, Any]:
    if not ms:
        return {"p50": None, "p95": None, "max": None, "samples": 0}
    return {"p50": round(percentile(ms, 0.5), 2), "p95": round(percentile(ms, 0.95), 2),
            "max": round(max(ms), 2), "samples": len(ms)}


def report_lines(found: dict[str, Any]) -> list[str]:
    """The events part's figures and goals, one sentence each."""
    rate, hooks = found["submits_s"], found["webhooks"]
    lines = [f"Submits/s of one API process: {rate['without']:.0f} with no stream open, "
             f"{rate['with']:.0f} with {found['streams_open']} open (paired ratio "
             f"{found['rate_ratio_paired']:.3f})."]
    for n, ms in found["progress_to_event_ms"].items():
        lines.append(f"Progress report to event at the client, {n} other streams open: p50 "
                     f"{ms['p50']} ms, p95 {ms['p95']} ms, max {ms['max']} ms "
                     f"({ms['samples']} reports).")
    lines.append(f"Webhooks: {hooks['delivered']} of {hooks['count']} delivered after a "
                 f"{hooks['outage_s']:g} s outage ({hooks['attempts_while_down']} attempts "
                 f"refused meanwhile), the last {hooks['last_delivered_after_back_s']} s "
                 f"after the receiver was back; {hooks['repeats']} repeats.")
    for name, goal in found["goals"].items():
        lines.append(f"{name}: {goal['value']} (goal {goal['goal']}): "
                     f"{'met' if goal['met'] else 'NOT met'}.")
    return lines
