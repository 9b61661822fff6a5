"""The webhook sender: ``celery -A tasks lanes webhooks`` (or ``python -m
tasks.front.hooks``) POSTs each prediction's events to its webhook.

A prediction's events that its webhook's filter takes are put in the outbox in the
same step as they are logged (``lua/events.lua``): a sorted set of deliveries by when
each is due. A sender takes the due ones with a lease (``lua/webhook_take.lua``: each is
due again when the lease ends, so a sender killed mid-delivery loses none: another
sender, or itself restarted, sends it then; a sender held up until its lease has too little
left for a whole attempt leaves it to that next take rather than send it twice), and
settles each (``lua/webhook_settle.lua``) as delivered, or due again after a backoff.

Each delivery is the prediction as ``GET /v1/predictions/{id}`` shows it at the time of
sending, signed the Standard Webhooks way with its account's secret
(``tasks.jobs.webhooks.secret``): ``webhook-id`` (the same for every attempt of one
event), ``webhook-timestamp`` and ``webhook-signature``. Any answer but a 2xx, or none
within :data:`TIMEOUT_S`, is tried again after an exponential backoff with full
jitter (:data:`BACKOFF_BASE_S` doubling, at most :data:`BACKOFF_CAP_S`) until
:data:`RETRY_FOR_S` after the event. Deliveries run side by side, at most
:data:`PER_HOST` at once to one receiver (host and port): a receiver that is slow, or
never answers, holds only its own. Redirects are not followed, and a host that resolves
into the cluster's own network is refused at each delivery, as at submit.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

import httpx
import redis
from kombu.utils.encoding import bytes_to_str
from standardwebhooks.webhooks import Webhook

from tasks.broker import cells, scripts
from tasks.broker.app import app as celery_app
from tasks.broker.app import redis_client
from tasks.broker.keys import PREDICTION_PREFIX, WEBHOOK_ATTEMPTS_KEY, WEBHOOKS_DUE_KEY
from tasks.broker.outage import OUTAGE
from tasks.front.views import prediction_json, seen
from tasks.jobs import predictions, webhooks

log = logging.getLogger(__name__)
#: Deliveries in flight in one sender, and to one receiver (a host and port).
MAX_IN_FLIGHT, PER_HOST = 256, 8
#: Longest one delivery may take; a slower receiver's is tried again.
TIMEOUT_S = 10.0
#: How long after its event a delivery is retried before it is dropped.
RETRY_FOR_S = 3600.0
#: A retry's backoff: uniform in [0, min(BACKOFF_CAP_S, BACKOFF_BASE_S x 2^attempts)].
BACKOFF_BASE_S, BACKOFF_CAP_S = 1.0, 60.0
#: The backoff's own draws: the random module's shared state is left to the caller.
_JITTER = random.Random()
#: The API's address in a body's URLs when its prediction did not say how its caller
#: reached the API (one made by ``submit_placed`` in Python).
DEFAULT_API_URL = "http://127.0.0.1:8000"
#: Seconds a taken delivery's lease outlasts its longest attempt.
LEASE_MARGIN_S = 5.0
#: Seconds between two looks at the outbox when nothing was due.
POLL_S = 0.05
#: Seconds before a delivery whose receiver is at PER_HOST is looked at again.
HOST_BUSY_S = 0.2


@dataclass(frozen=True)
class Delivery:
    """One event of one prediction to send: the outbox's member, as taken."""

    member: str
    lease: float
    attempts: int

    @property
    def job_id(self) -> str:
        return self.member.split(" ", 1)[0][len(PREDICTION_PREFIX):]

    @property
    def event_id(self) -> str:
        return self.member.split(" ")[1]

    @property
    def webhook_id(self) -> str:
        """The same for every attempt at this event (Standard Webhooks' ``webhook-id``)."""
        return f"msg_{self.job_id}_{self.event_id}"

    @property
    def event_at(self) -> float:
        return int(self.event_id.split("-", 1)[0]) / 1000


def take(client: redis.Redis, most: int, now: float | None = None) -> list[Delivery]:
    """Up to ``most`` deliveries due now, each leased until its longest attempt ends."""
    now = time.time() if now is None else now
    lease = now + TIMEOUT_S + LEASE_MARGIN_S
    flat = scripts.run(client, "webhook_take", [WEBHOOKS_DUE_KEY, WEBHOOK_ATTEMPTS_KEY],
                       [repr(now), repr(lease), most])
    return [Delivery(bytes_to_str(member), lease, int(made))
            for member, made in zip(flat[::2], flat[1::2])]


def settle(client: redis.Redis, delivery: Delivery, outcome: str, due: float = 0.0) -> bool:
    """``delivery`` is ``done``, due ``again`` at ``due`` (an attempt failed) or
    ``later`` (not tried); False: another sender took it meanwhile."""
    return bool(scripts.run(client, "webhook_settle", [WEBHOOKS_DUE_KEY, WEBHOOK_ATTEMPTS_KEY],
                            [delivery.member, repr(delivery.lease), outcome, repr(due)]))


def backoff_s(attempts: int) -> float:
    """The wait before the next attempt after ``attempts`` failed ones (full jitter)."""
    return _JITTER.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** max(0, attempts - 1)))


@dataclass(frozen=True)
class Prepared:
    """What one attempt sends: where, the body, and its account's secret."""

    url: str
    body: str
    secret: str


def prepare(client: redis.Redis, delivery: Delivery, celery_app: Any = celery_app,
            accounts: redis.Redis | None = None) -> Prepared | None:
    """The request for ``delivery``: its prediction as it stands now (on ``client``, with
    ``celery_app``'s results: its cell's), signed with its account's secret (on
    ``accounts``, the API's own Redis; default ``client``); None when the prediction is
    gone (expired) or has no webhook (blocks on Redis)."""
    found = predictions.read(client, delivery.job_id)
    if found is None or not found.webhook:
        return None
    body = prediction_json(found, seen(celery_app, client, found, placed=True),
                           found.api_url or DEFAULT_API_URL)
    return Prepared(found.webhook, json.dumps(body),
                    webhooks.secret(accounts or client, found.account))


@dataclass
class Limits:
    """What the senders of one process share (one per cell): the deliveries in flight,
    in all and to each receiver, and the turn to take more, so that the limits hold
    for the process."""

    in_flight: set[asyncio.Task] = field(default_factory=set)
    per_host: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    taking: asyncio.Lock = field(default_factory=asyncio.Lock)


class Sender:
    """Sends due deliveries until :meth:`stop`, each in a task of its own: those of the
    outbox on ``client`` (with cells, one cell's; ``celery_app``: that cell's), signed
    with the secrets on ``accounts`` (the API's own Redis), within ``limits``."""

    def __init__(self, client: redis.Redis | None = None, celery_app: Any = celery_app,
                 accounts: redis.Redis | None = None, limits: Limits | None = None) -> None:
        self.client = client or redis_client()
        self.celery_app, self.accounts = celery_app, accounts or self.client
        self.stopping = asyncio.Event()
        limits = limits or Limits()
        self.in_flight, self.per_host, self.taking = (limits.in_flight, limits.per_host,
                                                      limits.taking)
        self.http = httpx.AsyncClient(timeout=TIMEOUT_S,
                                      follow_redirects=False, trust_env=False,
                                      limits=httpx.Limits(max_connections=MAX_IN_FLIGHT))

    def stop(self) -> None:
        self.stopping.set()

    async def run(self) -> None:
        """Take and send deliveries until stopped, then let those in flight end."""
        try:
            while not self.stopping.is_set():
                async with self.taking:  # the room left, taken by one sender at a time
                    room = MAX_IN_FLIGHT - len(self.in_flight)
                    taken: list[Delivery] = []
                    if room > 0:
                        try:
                            taken = await asyncio.to_thread(take, self.client, room)
                        except OUTAGE as exc:
                            log.warning("webhooks: Redis away (%s)", exc)
                    for delivery in taken:
                        task = asyncio.create_task(self.deliver(delivery))
                        self.in_flight.add(task)
                        task.add_done_callback(self.in_flight.discard)
                if not taken:
                    try:
                        await asyncio.wait_for(self.stopping.wait(), POLL_S)
                    except asyncio.TimeoutError:
                        pass
            if self.in_flight:
                await asyncio.wait(self.in_flight, timeout=TIMEOUT_S)
        finally:
            await self.http.aclose()

    async def deliver(self, delivery: Delivery) -> None:
        """One attempt at ``delivery``, settled as its answer says."""
        try:
            prepared = await asyncio.to_thread(prepare, self.client, delivery,
                                               self.celery_app, self.accounts)
            if prepared is None:
                await asyncio.to_thread(settle, self.client, delivery, "done")
                return
            host = urlsplit(prepared.url).netloc  # a receiver: its host and port
            if self.per_host[host] >= PER_HOST:
                await asyncio.to_thread(settle, self.client, delivery, "later",
                                        time.time() + HOST_BUSY_S)
                return
            self.per_host[host] += 1
            try:
                sent = await self.attempt(delivery, prepared)
            finally:
                self.per_host[host] -= 1
            if sent is not None:
                await asyncio.to_thread(self.settle_attempt, delivery, sent)
        except OUTAGE as exc:  # its lease lapses and it is due again
            log.warning("webhook %s: Redis away (%s)", delivery.webhook_id, exc)

    async def attempt(self, delivery: Delivery, prepared: Prepared) -> str | None:
        """Send it once: '' when the receiver took it, else why not; None: not sent, as
        its lease would lapse before the attempt could end (this sender was held up since
        it took it: it is due again, and another take sends it, once)."""
        refusal = await asyncio.to_thread(webhooks.refused, prepared.url)
        if refusal:
            return f"refused: {refusal}"
        if time.time() + TIMEOUT_S > delivery.lease:
            log.info("webhook %s: its lease lapses before an attempt could end; left to "
                     "the next take", delivery.webhook_id)
            return None
        now = datetime.now(timezone.utc)
        signature = Webhook(prepared.secret).sign(delivery.webhook_id, now, prepared.body)
        headers = {"content-type": "application/json", "webhook-id": delivery.webhook_id,
                   "webhook-timestamp": str(int(now.timestamp())),
                   "webhook-signature": signature, "user-agent": "gpulanes-webhooks/1"}
        try:
            answer = await self.http.post(prepared.url, content=prepared.body, headers=headers)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        return "" if 200 <= answer.status_code < 300 else f"HTTP {answer.status_code}"

    def settle_attempt(self, delivery: Delivery, why: str) -> None:
        """Settle one attempt: delivered, dropped (past its retry time, or refused), or
        due again after its backoff."""
        if not why:
            settle(self.client, delivery, "done")
            return
        due = time.time() + backoff_s(delivery.attempts + 1)
        if why.startswith("refused") or due > delivery.event_at + RETRY_FOR_S:
            log.warning("webhook %s to its receiver dropped after %d attempts: %s",
                        delivery.webhook_id, delivery.attempts + 1, why)
            settle(self.client, delivery, "done")
            return
        log.info("webhook %s: attempt %d failed (%s); again in %.1f s", delivery.webhook_id,
                 delivery.attempts + 1, why, due - time.time())
        settle(self.client, delivery, "again", due)


def serve() -> None:
    """Send webhooks until SIGINT or SIGTERM (deliveries in flight end first)."""
    async def main() -> None:
        accounts, limits = redis_client(), Limits()  # the API's own Redis: its secrets
        senders = [Sender(client, celery_app, accounts, limits)  # one per cell
                   for _, celery_app, client in cells.each()]
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, lambda: [sender.stop() for sender in senders])
        log.info("sending webhooks (at most %d at once, %d to one receiver)", MAX_IN_FLIGHT,
                 PER_HOST)
        await asyncio.gather(*(sender.run() for sender in senders))

    asyncio.run(main())


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(prog="python -m tasks.front.hooks",
                            description="Send gpulanes' webhooks.").parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve()


if __name__ == "__main__":
    main()

