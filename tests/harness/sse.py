"""Server-Sent Events as a client reads them (the fields it keeps: event, data, id)."""
from __future__ import annotations

import json
from typing import Any, Iterable, Iterator

import httpx


def parsed(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Each event of an event stream's ``lines``: ``{"event", "data" (parsed JSON), "id"
    (absent: none)}``; comments (pings) are skipped."""
    event: dict[str, Any] = {}
    for line in lines:
        if not line:
            if "data" in event:
                event["data"] = json.loads(event["data"])
                yield event
            event = {}
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            event["data"] = f"{event['data']}\n{value}" if "data" in event else value
        elif field in ("event", "id"):
            event[field] = value


def read(http: httpx.Client, url: str, headers: dict[str, str], last_id: str | None = None,
         stop: int | None = None, timeout_s: float = 60.0,
         into: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The events of the stream at ``url`` until it ends (or after ``stop`` of them),
    from after ``last_id``; each appended to ``into`` as it comes, when given."""
    asked = {**headers, **({"Last-Event-ID": last_id} if last_id else {})}
    got: list[dict[str, Any]] = [] if into is None else into
    with http.stream("GET", url, headers=asked, timeout=timeout_s) as response:
        response.raise_for_status()
        assert response.headers["content-type"].startswith("text/event-stream")
        for event in parsed(response.iter_lines()):
            got.append(event)
            if stop is not None and len(got) >= stop:
                break
    return got
