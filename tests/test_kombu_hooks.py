"""gpulanes' transport overrides and wraps members of kombu's Redis transport; setup.cfg
pins kombu to the minor the suite runs on. Should a newer kombu drop or rename one of
them, this says which, before anything misbehaves quietly."""
from __future__ import annotations

import inspect

import kombu
import pytest

from tasks.broker import app as app_module
from tasks.broker import guard, transport

HOOKS = [(owner, name) for hooks in (transport.KOMBU_HOOKS, guard.KOMBU_HOOKS,
                                     app_module.CELERY_HOOKS)
         for owner, names in hooks.items() for name in names]


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
        "gpulanes' transport or app (tasks/broker/transport.py, guard.py, app.py) overrides or "
        "wraps: install the kombu and Celery minors pinned in setup.cfg, or port them first")


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


def test_importing_tasks_leaves_every_other_celery_app_as_it_was(app, redis_server):
    """gpulanes' app builds its own transport and result backend; a default Celery app of
    the same process, on the same Redis, keeps kombu's and Celery's own."""
    from celery import Celery
    from celery.app.backends import BACKEND_ALIASES
    from celery.backends.redis import RedisBackend
    from kombu.transport import TRANSPORT_ALIASES

    from tasks.broker.backend import ResultBackend

    url = app.conf.broker_url
    other = Celery("plain", broker=url, backend=url, set_as_current=False)
    with other.connection_for_write() as theirs, app.connection_for_write() as mine:
        assert type(theirs.default_channel) is transport.kombu_redis.Channel
        assert type(mine.default_channel) is transport.LedgerChannel
        assert type(mine.clone().default_channel) is transport.LedgerChannel
        assert theirs.as_uri() == mine.as_uri()  # what Flower reads: the URL as given
    # what a publish takes: a connection of kombu's pools
    with other.producer_or_acquire() as theirs, app.producer_or_acquire() as mine:
        assert type(theirs.connection.default_channel) is transport.kombu_redis.Channel
        assert type(mine.connection.default_channel) is transport.LedgerChannel
    assert type(other.backend) is RedisBackend and type(app.backend) is ResultBackend
    assert TRANSPORT_ALIASES["redis"] == "kombu.transport.redis:Transport"
    assert BACKEND_ALIASES["redis"] == "celery.backends.redis:RedisBackend"


def _smembers(client) -> int:
    return client.info("commandstats").get("cmdstat_smembers", {}).get("calls", 0)


def test_a_lane_exchanges_bindings_are_read_once_and_a_bind_is_seen_at_once(app, clean_redis):
    """kombu reads an exchange's bindings on every publish; gpulanes' channel keeps a
    lane's for a few seconds, and forgets them when it binds a queue itself."""
    from kombu import Exchange, Queue

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        own = "fast.gpu7@bindings"
        Queue("fast", Exchange("fast", "direct"), routing_key="fast")(channel).declare()
        before = _smembers(clean_redis)
        assert list(channel._lookup("fast", "fast")) == ["fast"]
        assert list(channel._lookup("fast", "fast")) == ["fast"]
        assert _smembers(clean_redis) - before == 1  # read once, then kept
        Queue(own, Exchange(own, "direct"), routing_key=own)(channel).declare()
        assert list(channel._lookup(own, own)) == [own]  # its own bind: seen at once
        before = _smembers(clean_redis)
        for _ in range(2):  # not a lane: kombu's way, read every time
            channel.get_table("reply.celery.pidbox")
        assert _smembers(clean_redis) - before == 2
