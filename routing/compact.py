"""The routing snapshot in two parts: a small one read twice a second, and the membership.

Beat's full snapshot embeds every worker's record (about 0.7 kB each: 727 kB at 1,000
workers), and every submitting process read it twice a second. :func:`split` cuts it in
two (pure: beat writes both, a router reads the second only when its version changes):

``members`` (what changes when workers join, leave, sicken or load models; never on a
mere heartbeat)::

    {"version": "<16 hex: blake2b-64 of the canonical JSON of the rest>",
     "hosts": [serving hosts, sorted],           # routing.placement.serving(record)
     "budget_mb": [per host: MB its models may take],   # its record's memory_mb
     "warm":  [per host: the sorted set of its warm and loading models],
     "model_mb": {model: MB, the most any serving host reported}}

The warm sets are sorted so that a worker running another of its models (which moves
it to the end of its LRU order) does not make a new version; the order is in the
compact part.

``compact`` (per heartbeat; 6 kB at 1,000 workers, 14 kB at 10,000, with 200 models,
4 kB of it ``cold_s``): the snapshot's keys but ``workers`` (``at``, ``measured_at``, ``lanes``,
``policy``, ``exhausted``, ``levels`` and any other), plus::

    "members": "<version>",
    "work":  b64(zlib(uint8 per host)),    # load << 4 | fast << 2 | (first - fast):
                                           # load: in_flight + queued; fast: what a fast
                                           # job would wait for there (``fast_work``);
                                           # first: what a first-level standard job would
                                           # (``first_work``); 0xF0: past 14, 3, 3, see:
    "work_over": b64(zlib(uint16 LE: load, fast, first per such host, in host order)),
    "slice": [start, stop],                # the hosts whose slow figures follow: all of
                                           # them up to SLICE_HOSTS, else one slice in turn
                                           # (``int(at)`` picks it), kept by routers
    "drain": b64(zlib(uint8 per host of the slice)),  # seconds per queued job (service /
                                           # concurrency): 0 not measured, else
                                           # 10 ** ((code - 121) / 40), 1 ms .. 2,239 s,
                                           # steps of 5.9 % (0.1 s, 1 s, 10 s exact)
    "order": b64(zlib(uint8 per host of the slice)),  # the Lehmer rank of the host's warm
                                           # models, then loading ones, in its own (LRU)
                                           # order, over the sorted set in members;
                                           # 255: see "order_over" {"<host index>": rank}
    "cold_s": {model: mean measured load seconds, 3 decimals; by model}

Per-host figures follow ``members["hosts"]``; a router checks their lengths.
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
import sys
import zlib
from array import array
from operator import add
from typing import Any, Mapping, Sequence

from routing.names import FAST
from routing.placement import serving

U16_MAX, U8_MAX = 65535, 255
#: Hosts whose slow figures (drain, order) one snapshot carries at most.
SLICE_HOSTS = 2048
#: Drain codes: 40 per decade, 121 is 1 s (so 0.1 s, 1 s and 10 s decode exactly).
DRAIN_PER_DECADE, DRAIN_ONE_S = 40, 121


def drain_s_of(worker: Mapping[str, Any]) -> float | None:
    """Seconds per queued job on ``worker``: its mean service time over its concurrency."""
    samples = [ms for ms in worker.get("service_ms", {}).values() if ms]
    return sum(samples) / len(samples) / 1000 / worker.get("concurrency", 1) if samples else None


def cold_s_of(workers: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Mean measured load seconds per model over the workers that loaded it, by model
    (the exact sum, rounded once: the same whatever the order of the workers)."""
    samples: dict[str, list[float]] = {}
    for worker in workers:
        for model, load_s in load_s_of(worker):
            samples.setdefault(model, []).append(load_s)
    return {model: round(math.fsum(s) / len(s), 3) for model, s in sorted(samples.items())}


def load_s_of(worker: Mapping[str, Any]) -> tuple[tuple[str, float], ...]:
    """(model, seconds) of each load ``worker`` measured (finite ones)."""
    return tuple((model, load_ms / 1000) for model, load_ms in worker.get("load_ms", {}).items()
                 if math.isfinite(load_ms))


def fast_work(worker: Mapping[str, Any]) -> int:
    """Jobs a fast job sent to ``worker`` would wait for: the fast jobs it runs, or a
    model it is loading (a load is not preempted), and the fast jobs in its own queue."""
    return _waited_for(worker, worker.get("in_flight", {}).get(FAST, 0),
                       worker.get("queued_fast", 0))


def first_work(worker: Mapping[str, Any]) -> int:
    """Jobs a first-level standard job sent to ``worker`` would wait for
    (``routing.names.FIRST_STEPS``): its fast work (``fast_work``) and the first-level
    standard jobs it runs or holds in its own queue; a heavier run steps aside for it."""
    return _waited_for(
        worker, worker.get("in_flight", {}).get(FAST, 0) + worker.get("in_flight_first", 0),
        worker.get("queued_fast", 0) + worker.get("queued_first", 0))


def _waited_for(worker: Mapping[str, Any], running: int, queued: int) -> int:
    """``running`` jobs of ``worker`` a new job would wait for (at least one while it
    loads a model: a load is not preempted), then ``queued`` ones of its own queue."""
    return max(running, 1 if worker.get("loading_models") else 0) + queued


def warm_of(worker: Mapping[str, Any]) -> tuple[str, ...]:
    """A worker's warm models then the ones it is loading, in its order, once each."""
    return tuple(dict.fromkeys([*worker.get("warm_models", ()),
                                *worker.get("loading_models", ())]))


def version_of(hosts: Sequence[str], budget_mb: Sequence[int],
               warm: Sequence[Sequence[str]], model_mb: Mapping[str, int] | None = None) -> str:
    """The members version: 16 hex digits of blake2b over the canonical JSON."""
    canonical = json.dumps({"hosts": list(hosts), "budget_mb": list(budget_mb),
                            "warm": [list(models) for models in warm],
                            "model_mb": dict(model_mb or {})},
                           sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(canonical.encode(), digest_size=8).hexdigest()


def sizes_of(workers: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Each model's size in MB, the most any of ``workers`` reported (whole MB)."""
    sizes: dict[str, int] = {}
    for worker in workers:
        for model, size in worker.get("model_mb", {}).items():
            sizes[model] = max(sizes.get(model, 0), math.ceil(size))
    return sizes


def work_of(worker: Mapping[str, Any]) -> tuple[int, int, int]:
    """(load, fast, first) of ``worker``: its jobs in flight and queued for it, its
    ``fast_work`` and its ``first_work``."""
    return (sum(worker.get("in_flight", {}).values()) + worker.get("queued", 0),
            fast_work(worker), first_work(worker))


def split(snapshot: dict) -> tuple[dict, dict]:
    """(compact, members) of beat's full snapshot (see the module's docstring;
    ``routing.splitter`` keeps it up to date from round to round)."""
    workers = snapshot.get("workers", {})
    hosts = sorted(host for host, worker in workers.items() if serving(worker))
    records = [workers[host] for host in hosts]
    ordered = [warm_of(worker) for worker in records]
    warm = [sorted(models) for models in ordered]
    members = members_of(hosts, [int(worker.get("memory_mb", 0)) for worker in records], warm,
                         sizes_of(records))
    work = [work_of(worker) for worker in records]
    start, stop = slice_of(len(hosts), snapshot.get("at", 0))
    compact = compact_of(snapshot, members["version"],
                         pack_work([w[0] for w in work], [w[1] for w in work],
                                   [w[2] for w in work]),
                         start, [drain_code(drain_s_of(worker)) for worker in records[start:stop]],
                         [rank_of(warm[i], ordered[i]) for i in range(start, stop)],
                         cold_s_of(records))
    return compact, members


def members_of(hosts: list[str], budget_mb: list[int], warm: list[list[str]],
               model_mb: dict[str, int]) -> dict[str, Any]:
    """The members part of these figures (see the module's docstring)."""
    return {"version": version_of(hosts, budget_mb, warm, model_mb), "hosts": hosts,
            "budget_mb": budget_mb, "warm": warm, "model_mb": model_mb}


def compact_of(snapshot: Mapping[str, Any], version: str, work: Mapping[str, str], start: int,
               drains: Sequence[int], ranks: Sequence[int], cold_s: dict[str, float]) -> dict:
    """The compact part of ``snapshot`` for the members ``version``: ``work`` packed
    (``pack_work``), the drain codes and order ranks of the slice from ``start``."""
    compact = {key: value for key, value in snapshot.items() if key != "workers"}
    compact["members"] = version
    compact.update(work)
    compact.update({"slice": [start, start + len(ranks)], "drain": pack_u8(drains),
                    "order": pack_u8(min(rank, U8_MAX) for rank in ranks), "cold_s": cold_s})
    over = {str(start + i): rank for i, rank in enumerate(ranks) if rank >= U8_MAX}
    if over:
        compact["order_over"] = over
    return compact


def slice_of(hosts: int, at: float) -> tuple[int, int]:
    """The hosts whose slow figures (drain, order) a snapshot taken ``at`` carries: all
    up to ``SLICE_HOSTS``, else the slice of its second, in turn."""
    turns = -(-hosts // SLICE_HOSTS) or 1
    size = -(-hosts // turns)
    start = int(at) % turns * size
    return start, min(hosts, start + size)


# --- the packed figures ----------------------------------------------------------------
def pack_work(loads: list[int], fast: list[int], first: list[int]) -> dict[str, str]:
    """The ``work`` byte of each host (and ``work_over`` for the ones that do not fit)."""
    codes, over = bytearray(), []
    for figures in zip(loads, fast, first):
        codes.append(work_code(*figures))
        if codes[-1] == WORK_OVER:
            over += figures
    return packed_work(codes, over)


def work_code(load: int, ahead: int, more: int) -> int:
    """A host's ``work`` byte: ``WORK_OVER`` when its figures do not fit."""
    if load < 15 and 0 <= ahead < 4 and 0 <= more - ahead < 4:
        return load << 4 | ahead << 2 | more - ahead
    return WORK_OVER


def packed_work(codes: bytes, over: list[int]) -> dict[str, str]:
    """``work`` of the hosts' codes, and ``work_over`` of the figures of those over."""
    packed = {"work": _packed(codes)}
    if over:
        packed["work_over"] = pack_u16(over)
    return packed


def unpack_work(compact: Mapping[str, Any],
                count: int) -> tuple[list[int], list[int], list[int]]:
    """(loads, fast, first) of :func:`pack_work` (ValueError unless ``count`` hosts)."""
    codes = _unpacked(compact["work"])
    _counted(codes, count)
    fast = list(codes.translate(_FAST))
    loads, first = list(codes.translate(_LOAD)), list(map(add, fast, codes.translate(_MORE)))
    if WORK_OVER in codes:
        over, at = unpack_u16(compact["work_over"], 3 * codes.count(WORK_OVER)), -1
        for k in range(0, len(over), 3):
            at = codes.index(WORK_OVER, at + 1)
            loads[at], fast[at], first[at] = over[k:k + 3]
    return loads, fast, first


#: A host's work byte when its figures are in ``work_over``; the tables that read the rest.
WORK_OVER = 0xF0
_LOAD = bytes(code >> 4 for code in range(256))
_FAST = bytes(code >> 2 & 3 for code in range(256))
_MORE = bytes(code & 3 for code in range(256))


def _packed(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 9)).decode()


def _unpacked(text: str) -> bytes:  # base64, not b85: decoded in C, 30x faster
    return zlib.decompress(base64.b64decode(text, validate=True))


def pack_u16(values: Any) -> str:
    """base64 of the zlib of uint16 little-endian values (each capped at 65535)."""
    packed = array("H", (min(max(int(v), 0), U16_MAX) for v in values))
    if sys.byteorder == "big":
        packed.byteswap()
    return _packed(packed.tobytes())


def unpack_u16(text: str, count: int | None) -> list[int]:
    """The values of :func:`pack_u16` (ValueError unless there are ``count``)."""
    values = array("H")
    values.frombytes(_unpacked(text))
    if sys.byteorder == "big":
        values.byteswap()
    return _counted(values.tolist(), count)


def pack_u8(values: Any) -> str:
    """base64 of the zlib of bytes."""
    return _packed(bytes(values))


def unpack_u8(text: str, count: int | None) -> bytes:
    """The values of :func:`pack_u8` (ValueError unless there are ``count``)."""
    return _counted(_unpacked(text), count)


def _counted(values: Any, count: int | None) -> Any:
    if count is not None and len(values) != count:
        raise ValueError(f"{len(values)} values for {count} hosts: snapshot and members "
                         "do not match")
    return values


def drain_code(drain_s: float | None) -> int:
    """The byte of a drain time: 0 for none, else its log-scale step (clamped)."""
    if drain_s is None or drain_s <= 0:
        return 0
    code = round(DRAIN_ONE_S + DRAIN_PER_DECADE * math.log10(drain_s))
    return min(255, max(1, code))


#: Each code's seconds (None for 0), decoded once.
DRAIN_S: tuple[float | None, ...] = (None, *(
    10 ** ((code - DRAIN_ONE_S) / DRAIN_PER_DECADE) for code in range(1, 256)))


# --- the order of a host's warm models -----------------------------------------------
def rank_of(sorted_models: Sequence[str], models: Sequence[str]) -> int:
    """The Lehmer rank of ``models`` (a permutation of ``sorted_models``): 0 when sorted."""
    left, rank = list(sorted_models), 0
    for model in models:
        at = left.index(model)
        rank = rank * len(left) + at
        left.pop(at)
    return rank


def in_order(sorted_models: Sequence[str], rank: int) -> tuple[str, ...]:
    """The permutation of ``sorted_models`` of Lehmer ``rank`` (inverse of :func:`rank_of`)."""
    left, digits = list(sorted_models), []
    for size in range(1, len(left) + 1):
        rank, digit = divmod(rank, size)
        digits.append(digit)
    return tuple(left.pop(digit) for digit in reversed(digits))


def slice_ranks(compact: Mapping[str, Any]) -> list[int]:
    """The order rank of each host of the snapshot's slice, the ones over 8 bits filled in."""
    start, stop = compact["slice"]
    found = list(unpack_u8(compact["order"], stop - start))
    for index, rank in compact.get("order_over", {}).items():
        found[int(index) - start] = rank
    return found
