"""The load ``benchmarks/api.py`` puts on, each side in processes of its own: callers of
``submit()`` in a loop, and HTTP clients (``benchmarks.api_wire``) POSTing the same job
to the API. Every process is told to get ready, then to go for a number of seconds,
and answers what it did. Also the accounts and their keys, and the Redis state a round
leaves, emptied between rounds so that no lane fills and no account reaches its plan's
limits."""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from benchmarks.api_wire import BODY, MODELS_PATH, End, posted, sender
from benchmarks.common import PROMPT, stop_processes

#: The job both sides submit (``BODY``): a class model that needs no weights, standard.
MODEL, TIER = BODY["model"], BODY["tier"]
#: The biggest built-in plan: every key is made on it, and ``submit()`` is given it.
PLAN = "mega"


def share(items: list[Any], slot: int, slots: int) -> list[Any]:
    """The items slot ``slot`` of ``slots`` uses: every ``slots``-th, so that each
    account is used by one slot only and all of them about as often."""
    return items[slot::slots]


def submitter(accounts: list[str], conn: Any) -> None:
    """A process calling ``submit()``: ``("go", slot, slots, seconds)`` runs a loop over
    its share of ``accounts`` and answers its counts; ``("ready", ...)`` answers at once;
    None ends it. An error is answered as its text."""
    try:
        from tasks.api import submit
        from tasks.jobs.plans import PLANS

        plan = PLANS[PLAN]

        def one(account: str) -> None:
            submit(model=MODEL, text=PROMPT, tier=TIER, account=account, plan=plan)

        one(accounts[0])  # imports and connections, off the clock
        while (order := conn.recv()) is not None:
            kind, slot, slots, seconds = order
            conn.send("ready" if kind == "ready"
                      else looped(one, share(accounts, slot, slots), seconds))
    except BaseException as exc:  # noqa: BLE001  told to the parent, which stops
        conn.send(f"submitter: {type(exc).__name__}: {exc}")


def looped(one: Any, accounts: list[str], seconds: float) -> dict[str, Any]:
    """``one(account)`` in a loop for ``seconds``, accounts in turn; the result of each
    is dropped at once, as the API drops it. Its count, errors, wall and CPU seconds."""
    from tasks.errors import GpulanesError

    done, errors = 0, Counter()
    began, cpu = time.perf_counter(), time.process_time()
    deadline = began + seconds
    while time.perf_counter() < deadline:
        try:
            one(accounts[done % len(accounts)])
        except GpulanesError as exc:
            errors[type(exc).__name__] += 1
        done += 1
    return {"submits": done - sum(errors.values()), "errors": dict(errors),
            "wall_s": time.perf_counter() - began, "cpu_s": time.process_time() - cpu}


def poster(keys: list[str], concurrency: int, how: str, conn: Any) -> None:
    """An HTTP client process of ``concurrency`` slots, sending ``how`` (raw or httpx):
    ``("ready", urls, first, slots)`` opens its connections, ``("go", urls, first, slots,
    seconds)`` POSTs predictions for ``seconds``; None ends it. Its slots are ``first``
    onwards of ``slots``, slot ``i`` sending to ``urls[i % len(urls)]`` with its share
    of ``keys``."""
    try:
        asyncio.run(_poster(keys, concurrency, how, conn))
    except BaseException as exc:  # noqa: BLE001  told to the parent, which stops
        conn.send(f"client: {type(exc).__name__}: {exc}")


async def _poster(keys: list[str], concurrency: int, how: str, conn: Any) -> None:
    loop, sending = asyncio.get_running_loop(), sender(how, concurrency)
    try:
        while (order := await loop.run_in_executor(None, conn.recv)) is not None:
            kind, urls, first, slots, seconds = order
            ends: list[End] = [(urls[slot % len(urls)], share(keys, slot, slots))
                               for slot in range(first, first + concurrency)]
            if kind == "ready":
                await sending.ready(ends)
                conn.send("ready")
                continue
            began, cpu = time.perf_counter(), time.process_time()
            statuses = await posted(sending, concurrency, seconds)
            conn.send({"submits": statuses.pop("201", 0), "errors": statuses,
                       "wall_s": time.perf_counter() - began,
                       "cpu_s": time.process_time() - cpu})
    finally:
        await sending.close()


class Processes:
    """Processes of one kind (``multiprocessing``'s spawn: a fresh interpreter each),
    each running ``target(*args, conn)``, told the same order at once."""

    def __init__(self, target: Any, args_of: list[tuple[Any, ...]], name: str) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.conns, self.processes = [], []
        for i, args in enumerate(args_of):
            mine, theirs = context.Pipe()
            process = context.Process(target=target, args=(*args, theirs),
                                      name=f"{name}-{i}", daemon=True)
            process.start()
            self.conns.append(mine)
            self.processes.append(process)

    def ask(self, orders: list[tuple[Any, ...]]) -> list[Any]:
        """Send ``orders[i]`` to process ``i`` (all first), then read every answer."""
        for conn, order in zip(self.conns, orders):
            conn.send(order)
        answers = [conn.recv() for conn in self.conns[:len(orders)]]
        if failed := [answer for answer in answers if isinstance(answer, str)
                      and answer != "ready"]:
            raise SystemExit(f"benchmarks/api.py: {failed[0]}")
        return answers

    def stop(self) -> None:
        stop_processes(self.conns, self.processes)


def merged(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """Several processes' answers as one: submits, errors and CPU summed, the longest
    wall time (they ran at once), and submits per second."""
    errors: Counter = Counter()
    for answer in answers:
        errors.update(answer["errors"])
    wall_s = max(answer["wall_s"] for answer in answers)
    submits = sum(answer["submits"] for answer in answers)
    return {"submits": submits, "errors": dict(errors), "wall_s": wall_s,
            "submits_s": submits / wall_s if wall_s else 0.0,
            "cpu_s": sum(answer["cpu_s"] for answer in answers)}


# --- Redis between rounds --------------------------------------------------------------
def make_keys(client: Any, accounts: int) -> tuple[list[str], list[str]]:
    """``accounts`` accounts and a key of each on the benchmark's plan."""
    from tasks.jobs import apikeys

    names = [f"bench-{i:04d}" for i in range(accounts)]
    return names, [apikeys.create(client, name, PLAN)[0] for name in names]


def bind_lanes(client: Any, workers: list[str]) -> None:
    """Bind each lane's queue, and each of ``workers``' own queue of it, to its exchange,
    as a worker that takes from them does: a process keeps a lane's bindings for
    seconds, but reads them at every publish while none are bound."""
    from routing.names import LANES
    from tasks.broker.bindings import Bindings

    bindings = Bindings(client)
    for queue in [*LANES, *(f"{lane}.{worker}" for lane in LANES for worker in workers)]:
        bindings.bind(queue, queue, "", queue)


def kept(name: bytes) -> bool:
    """Whether a reset leaves ``name``: the API keys, the snapshot, the lanes' bindings,
    the accounts' fast time."""
    from tasks.broker import keys

    return name.startswith(keys.BINDINGS_PREFIX.encode()) or name.decode() in (
        keys.API_KEYS_KEY, keys.SNAPSHOT_KEY, keys.FAST_BALANCE_KEY, keys.FAST_PERIOD_KEY,
        keys.FAST_EXHAUSTED_KEY)


def reset(client: Any) -> None:
    """Drop everything the submits left: lanes, due indexes, admissions, records."""
    doomed = [name for name in client.scan_iter(count=1000) if not kept(name)]
    for i in range(0, len(doomed), 1000):
        client.unlink(*doomed[i:i + 1000])


def parked(client: Any, accounts: list[str]) -> int:
    """Jobs waiting in their accounts' own lines: a plan limit was reached."""
    from tasks.broker.keys import parked_key

    with client.pipeline(transaction=False) as pipe:
        for account in accounts:
            pipe.llen(parked_key(account))
        return sum(pipe.execute())


def warm_keys(urls: list[str], keys: list[str]) -> None:
    """Every key called once at each server: each keeps it, as a server up for a while
    keeps its callers' keys (a key's first call also reads it from Redis)."""
    import httpx

    for url in urls:
        with httpx.Client(base_url=url, timeout=60) as http:
            for key in keys:
                http.get(MODELS_PATH, headers={"Authorization": f"Bearer {key}"})
