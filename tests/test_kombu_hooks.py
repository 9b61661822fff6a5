"""gpulanes' transport (``tasks/broker/lanes.py``) is a kombu virtual transport built on the
interface kombu documents for transport authors: it overrides only the methods kombu asks
of a virtual channel (``_get``, ``_put``...) and public ones, and calls nothing private of
kombu or Celery. Should a newer kombu drop or rename one of them, this says which."""
from __future__ import annotations

import inspect

import kombu
import pytest
from kombu.transport import virtual

from tasks.broker import app as app_module
from tasks.broker import lanes

#: The methods kombu asks a virtual transport's channel to implement, by name.
INTERFACE = frozenset({"_get", "_put", "_size", "_purge", "_delete", "_new_queue",
                       "_has_queue", "_put_fanout", "_queue_bind", "_restore",
                       "_restore_at_beginning"})
OURS = {lanes.Channel: virtual.Channel, lanes.QoS: virtual.QoS,
        lanes.Transport: virtual.Transport}
#: kombu members the transport calls, reads or sets (besides the overrides below).
USES = [(virtual.Transport, "on_message_ready"), (virtual.Transport, "channels"),
        (virtual.Transport, "implements"), (virtual.Transport, "connection_errors"),
        (virtual.Channel, "typeof"), (virtual.Channel, "Message"), (virtual.Channel, "qos"),
        (virtual.Channel, "from_transport_options"), (virtual.Channel, "supports_fanout"),
        (virtual.QoS, "can_consume"), (virtual.QoS, "append"), (virtual.QoS, "channel"),
        (virtual.Message, "serializable"), (virtual.Message, "delivery_tag")]
OVERRIDES = [(base, name) for cls, base in OURS.items() for name, member in vars(cls).items()
             if not name.startswith("__") and hasattr(base, name)]


def _has(owner: type, name: str) -> bool:
    if hasattr(owner, name):
        return True
    # instance attributes set in an __init__ of its classes (channel, connection...)
    return any(f"self.{name} =" in inspect.getsource(cls.__init__)
               for cls in owner.__mro__ if inspect.isfunction(vars(cls).get("__init__")))


def test_the_transport_overrides_only_kombus_interface_for_transport_authors():
    private = sorted(f"{base.__name__}.{name}" for base, name in OVERRIDES
                     if name.startswith("_") and name not in INTERFACE)
    assert private == []
    assert not any("kombu.transport.redis" in cls.__module__
                   for ours in OURS for cls in ours.__mro__)


@pytest.mark.parametrize("owner,name", USES + OVERRIDES,
                         ids=[f"{o.__name__}.{n}" for o, n in USES + OVERRIDES])
def test_every_kombu_member_the_transport_relies_on_exists(owner, name):
    assert _has(owner, name), (
        f"kombu {kombu.__version__} has no {owner.__module__}.{owner.__name__}.{name}, which "
        "gpulanes' transport (tasks/broker/lanes.py) relies on: install the kombu minor "
        "pinned in setup.cfg, or port it first")


def test_the_check_itself_can_fail():
    assert not _has(virtual.Channel, "_no_such_hook")


def test_overridden_methods_keep_kombus_signatures():
    """Our overrides are called by kombu with kombu's arguments."""
    for base, name in OVERRIDES:
        ours = next(cls for cls, b in OURS.items() if b is base)
        member = vars(ours)[name]
        if not callable(member) or isinstance(member, type):
            continue
        theirs = inspect.signature(getattr(base, name)).parameters
        mine = inspect.signature(member).parameters
        assert list(theirs)[:len(mine)] == list(mine)[:len(theirs)] or \
            any(p.kind is p.VAR_KEYWORD for p in mine.values()), \
            f"{ours.__name__}.{name} no longer matches kombu's {list(theirs)}"


@pytest.mark.parametrize("owner,name", [(o, n) for o, names in app_module.CELERY_HOOKS.items()
                                        for n in names])
def test_every_celery_member_the_result_backend_relies_on_exists(owner, name):
    assert _has(owner, name), f"Celery has no {owner.__name__}.{name} (tasks/broker/app.py)"


def test_importing_tasks_leaves_every_other_celery_app_as_it_was(app, redis_server):
    """gpulanes' app names its own transport in its URL and builds its own result
    backend; a default Celery app of the same process, on the same Redis, keeps kombu's
    and Celery's own."""
    from celery import Celery
    from celery.app.backends import BACKEND_ALIASES
    from celery.backends.redis import RedisBackend
    from kombu.transport import TRANSPORT_ALIASES
    from kombu.transport import redis as kombu_redis

    from tasks.broker.backend import ResultBackend
    from tasks.broker.store import bare

    url = bare(app.conf.broker_url)
    other = Celery("plain", broker=url, backend=url, set_as_current=False)
    with other.connection_for_write() as theirs, app.connection_for_write() as mine:
        assert type(theirs.default_channel) is kombu_redis.Channel
        assert type(mine.default_channel) is lanes.Channel
        assert type(mine.clone().default_channel) is lanes.Channel
    with other.producer_or_acquire() as theirs, app.producer_or_acquire() as mine:
        assert type(theirs.connection.default_channel) is kombu_redis.Channel
        assert type(mine.connection.default_channel) is lanes.Channel
    assert type(other.backend) is RedisBackend and type(app.backend) is ResultBackend
    assert TRANSPORT_ALIASES["redis"] == "kombu.transport.redis:Transport"
    assert BACKEND_ALIASES["redis"] == "celery.backends.redis:RedisBackend"


def _smembers(client) -> int:
    return client.info("commandstats").get("cmdstat_smembers", {}).get("calls", 0)


def test_a_lane_exchanges_bindings_are_read_once_and_a_bind_is_seen_at_once(app, clean_redis):
    """kombu reads an exchange's bindings on every publish; gpulanes' channel keeps a
    lane's for a few seconds, and forgets them when it binds a queue itself; a lane queue
    nobody bound is served by its shared lane."""
    from kombu import Exchange, Queue

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        own = "fast.gpu7@bindings"
        Queue("fast", Exchange("fast", "direct"), routing_key="fast")(channel).declare()
        before = _smembers(clean_redis)
        assert [q for _, _, q in channel.get_table("fast")] == ["fast"]
        assert [q for _, _, q in channel.get_table("fast")] == ["fast"]
        assert _smembers(clean_redis) - before == 1  # read once, then kept
        assert [q for _, _, q in channel.get_table(own)] == ["fast"]  # nobody bound it
        Queue(own, Exchange(own, "direct"), routing_key=own)(channel).declare()
        assert [q for _, _, q in channel.get_table(own)] == [own]  # its own bind: seen at once
        before = _smembers(clean_redis)
        for _ in range(2):  # not a lane: read every time
            channel.get_table("reply.celery.pidbox")
        assert _smembers(clean_redis) - before == 2


def test_the_result_backend_is_named_by_its_url():
    """gpulanes' result backends are Celery ``celery.result_backends`` entry points, named
    by the result backend URL: no override of how Celery picks a backend."""
    from celery.app.backends import by_url

    from tasks.broker.backend import ResultBackend, SentinelResultBackend
    from tasks.broker.store import result_url

    sentinels = "sentinel://h:26379;sentinel://g:26379/0"
    for url, cls, rest in (("redis://h:6379/0", ResultBackend, "redis://h:6379/0"),
                           ("redis+socket:///tmp/r.sock", ResultBackend, "socket:///tmp/r.sock"),
                           (sentinels, SentinelResultBackend, sentinels)):
        assert by_url(result_url(url), app_module.app.loader) == (cls, rest)
    assert result_url("db+sqlite:///results.db") == "db+sqlite:///results.db"  # not ours
