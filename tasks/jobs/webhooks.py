"""A prediction's webhook as its caller asks for it: checked before anything is enqueued.

The URL must be ``http`` or ``https`` with a host whose every address is a public one:
a webhook that points into the cluster's own network (loopback, link-local, private,
reserved or multicast addresses) is refused unless ``GPULANES_WEBHOOK_ALLOW_PRIVATE``
lets it. The sender checks the addresses again before each delivery
(``tasks.front.hooks``): a name may come to resolve elsewhere later.

The filter names the events sent (``tasks.jobs.events.WEBHOOK_EVENTS``): all of them
when it is not given. Each account signs its webhooks with a secret of its own
(:func:`secret`), which its API key reads at ``GET /v1/webhooks/default/secret``.
"""
from __future__ import annotations

import base64
import ipaddress
import os
import socket
from typing import Any
from urllib.parse import urlsplit

import redis

from tasks.broker.keys import WEBHOOK_SECRETS_KEY
from tasks.errors import InvalidJob
from tasks.jobs.events import WEBHOOK_EVENTS
from tasks.settings import settings

#: The longest webhook URL taken.
MAX_URL_CHARS = 2048


def checked(url: Any, events: Any) -> tuple[str, tuple[str, ...]]:
    """``(url, events)`` as given, each checked; else :class:`InvalidJob` naming the
    field (``webhook`` or ``webhook_events_filter``)."""
    if not isinstance(url, str) or not 0 < len(url) <= MAX_URL_CHARS:
        raise InvalidJob("webhook", f"must be a URL of 1 to {MAX_URL_CHARS} characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidJob("webhook", f"must be an http or https URL with a host, got "
                                    f"{url[:100]!r}")
    why = refused(url)
    if why:
        raise InvalidJob("webhook", why)
    return url, _events(events)


def refused(url: str) -> str | None:
    """Why a delivery to ``url`` must not be made, or None: its port is bad, its host
    does not resolve, or one of its addresses is in the cluster's own network (unless
    the settings allow it)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        return f"has a bad port: {exc}"
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, port,
                                                          proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError) as exc:
        return f"its host {host!r} does not resolve ({exc})"
    if settings.webhook_allow_private:
        return None
    inner = sorted(address for address in found if not public(address))
    if inner:
        return (f"its host {host!r} resolves to {', '.join(inner)}, in the cluster's own "
                "network (loopback, link-local or private addresses are refused unless "
                "GPULANES_WEBHOOK_ALLOW_PRIVATE is set)")
    return None


def public(address: str) -> bool:
    """Whether ``address`` (an IP, v4 or v6) is one on the public internet."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_reserved)


def _events(events: Any) -> tuple[str, ...]:
    if events is None:
        return tuple(WEBHOOK_EVENTS)
    names = ", ".join(WEBHOOK_EVENTS)
    if not isinstance(events, (list, tuple)) or not events or \
            any(not isinstance(e, str) or e not in WEBHOOK_EVENTS for e in events):
        raise InvalidJob("webhook_events_filter",
                         f"must be a non-empty list of {names}, got {events!r}"[:300])
    return tuple(name for name in WEBHOOK_EVENTS if name in events)


def secret(client: redis.Redis, account: str) -> str:
    """The secret ``account``'s webhooks are signed with (Standard Webhooks' form:
    ``whsec_`` and 32 random bytes in base64), made on its first use."""
    made = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    with client.pipeline(transaction=False) as pipe:
        pipe.hsetnx(WEBHOOK_SECRETS_KEY, account, made)
        pipe.hget(WEBHOOK_SECRETS_KEY, account)
        found = pipe.execute()[1]
    return found.decode() if isinstance(found, bytes) else found
