"""gpulanes' transport overrides and wraps members of kombu's Redis transport; setup.cfg
pins kombu to the minor the suite runs on. Should a newer kombu drop or rename one of
them, this says which, before anything misbehaves quietly."""
from __future__ import annotations

import inspect

import kombu
import pytest

from tasks.broker import guard, transport

HOOKS = [(owner, name) for module in (transport, guard)
         for owner, names in module.KOMBU_HOOKS.items() for name in names]


def _has(owner: type, name: str) -> bool:
    if hasattr(owner, name):
        return True
    # instance attributes set in an __init__ of its classes (handlers, channel, _expires...)
    return any(f"self.{name} =" in inspect.getsource(cls.__init__)
               for cls in owner.__mro__ if inspect.isfunction(vars(cls).get("__init__")))


@pytest.mark.parametrize("owner,name", HOOKS, ids=[f"{o.__name__}.{n}" for o, n in HOOKS])
def test_every_kombu_member_the_transport_relies_on_exists(owner, name):
    assert _has(owner, name), (
        f"kombu {kombu.__version__} has no {owner.__module__}.{owner.__name__}.{name}, which "
        "gpulanes' transport (tasks/broker/transport.py, tasks/broker/guard.py) overrides or "
        "wraps: install the kombu minor pinned in setup.cfg, or port the transport first")


def test_the_check_itself_can_fail():
    assert not _has(transport.kombu_redis.Channel, "_no_such_hook")


def test_overridden_methods_keep_kombus_signatures():
    """Our overrides are called by kombu with kombu's arguments."""
    ours = {transport.LedgerQoS: transport.kombu_redis.QoS,
            transport.LedgerChannel: transport.kombu_redis.Channel}
    for subclass, base in ours.items():
        for name, member in vars(subclass).items():
            if callable(member) and not name.startswith("__") and hasattr(base, name):
                theirs = inspect.signature(getattr(base, name)).parameters
                mine = inspect.signature(member).parameters
                assert list(theirs)[:len(mine)] == list(mine)[:len(theirs)] or \
                    any(p.kind is p.VAR_KEYWORD for p in mine.values()), \
                    f"{subclass.__name__}.{name} no longer matches kombu's {list(theirs)}"
