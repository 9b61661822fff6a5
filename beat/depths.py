"""The depths of the lists that hold jobs, as beat last read them, and each worker's
queued counts, kept up to date a list at a time.

Each round reads the depth counters the queue protocol keeps (``LIST_DEPTHS_KEY``) as
one string (``lua/list_depths.lua``: one bulk reply, split at once) and takes in only
the lists whose depth changed since the round before: the lists of each lane
(``lengths``) and each worker's ``queued``, ``queued_fast`` and ``queued_first`` counts
follow them. The read still carries every list that holds jobs; the rest of a round's
work costs what changed.
"""
from __future__ import annotations

from typing import Iterable, MutableMapping

import redis

from routing.names import FAST, LANES, first_level
from tasks.broker import scripts
from tasks.broker.keys import LIST_DEPTHS_KEY, PRIORITY_SEP, lane_of_key

#: (queued, queued_fast, queued_first) of a worker with nothing queued.
NONE_QUEUED = (0, 0, 0)


class Depths:
    """The lists' depths beat read last (``lengths``: per lane, each list's), and per
    owner (a worker's name, "" for the shared lanes) its queued counts."""

    def __init__(self) -> None:
        self.raw = b""
        self.read_lists: dict[bytes, bytes] = {}
        self.lengths: dict[str, dict[str, int]] = {lane: {} for lane in LANES}
        self.owners: dict[str, list[int]] = {}

    def read(self, client: redis.Redis) -> set[str]:
        """Take in the lists' depths now; the owners whose counts changed."""
        raw = scripts.run(client, "list_depths", [LIST_DEPTHS_KEY], [])
        raw = raw.encode() if isinstance(raw, str) else raw
        if raw == self.raw:
            return set()
        parts = raw.split(b"\n")
        found = dict(zip(parts[0:-1:2], parts[1::2]))
        touched: set[str] = set()
        for key in self.read_lists.keys() - found.keys():
            self._set(key.decode(), 0, touched)
        for key, count in found.items() - self.read_lists.items():
            self._set(key.decode(), int(count), touched)
        self.raw, self.read_lists = raw, found
        return touched

    def _set(self, key: str, count: int, touched: set[str]) -> None:
        lane = lane_of_key(key)
        if lane not in self.lengths:
            return
        count = max(count, 0)
        delta = count - self.lengths[lane].pop(key, 0)
        if count:
            self.lengths[lane][key] = count
        queue, _, step = key.partition(PRIORITY_SEP)
        node = queue.partition(".")[2]
        counts = self.owners.setdefault(node, [0, 0, 0])
        counts[0] += delta
        if lane == FAST:
            counts[1] += delta
        elif node and first_level(lane, int(step or 0)):
            counts[2] += delta
        if not any(counts):
            del self.owners[node]
        touched.add(node)

    def totals(self) -> dict[str, int]:
        """Queued jobs per lane."""
        return {lane: sum(per_list.values()) for lane, per_list in self.lengths.items()}

    def counted(self, workers: MutableMapping[str, dict], hosts: Iterable[str]) -> set[str]:
        """Give the records of ``hosts`` their queued counts; those whose counts changed."""
        changed = set()
        for host in hosts:
            if (worker := workers.get(host)) is None:
                continue
            counts = tuple(self.owners.get(host, NONE_QUEUED))
            if counts != (worker.get("queued"), worker.get("queued_fast"),
                          worker.get("queued_first")):
                worker["queued"], worker["queued_fast"], worker["queued_first"] = counts
                changed.add(host)
        return changed

    def unknown(self, workers: MutableMapping[str, dict]) -> set[str]:
        """Owners of queued jobs not in the record ``workers``."""
        return self.owners.keys() - workers.keys() - {""}
