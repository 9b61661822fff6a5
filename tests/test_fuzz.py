"""Property tests of ``submit()``: any value of any parameter is either refused with
InvalidJob naming a field that really is bad, with nothing enqueued, or accepted as
a message that is valid JSON and passes the schema again. Nothing else escapes.

An independent oracle (``GOOD_VALUE``) says which values are acceptable, so the
test fails both when bad input gets through and when good input is refused.
"""
from __future__ import annotations

import base64
import json
import math
import re
import unicodedata

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from routing.names import TIERS
from tasks import submit
from tasks.errors import InvalidJob
from tasks.jobs import catalog
from tasks.jobs.image import MAX_PROMPT_CHARS, MAX_SIDE, MAX_STEPS, MIN_SIDE
from tasks.jobs.schema import JOB_FIELDS, MAX_ACCOUNT_CHARS, MAX_SEED, check_job, model_names
from tasks.settings import settings as gl
from tasks.worker.rejects import check_call, check_content
from tests.typed_model import TypedInput, TypedPart

#: Deterministic and database-free: CI sees the same examples on every run.
FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
FIELDS = ("prompt", "tier", "account", "model", "seed", "steps", "width", "height",
          "downgradable")
#: The models these fields fit (a class model, such as echo, takes other inputs).
IMAGE_MODELS = [name for name in model_names() if catalog.spec(name).cls is None]
ACCOUNT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:+-]*")


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no worker or log could carry it
        return False
    return True


def _shows_something(text: str) -> bool:
    """A letter, number, punctuation or symbol (a spacing mark, a private or unassigned
    character too) that is not one of the blank fillers: something a reader sees."""
    return any((unicodedata.category(ch)[0] in "LNPS"
                or unicodedata.category(ch) in ("Mc", "Co", "Cn"))
               and ch not in "\u115f\u1160\u3164\uffa0\u2800" for ch in text)


def _text_ok(value, max_chars: int) -> bool:
    return (isinstance(value, str) and bool(value.strip()) and len(value) <= max_chars
            and "\x00" not in value and _utf8(value) and _shows_something(value))


def _int_ok(value, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


GOOD_VALUE = {
    "prompt": lambda v: _text_ok(v, MAX_PROMPT_CHARS),
    "tier": lambda v: isinstance(v, str) and v in TIERS,
    "account": lambda v: _text_ok(v, MAX_ACCOUNT_CHARS) and bool(ACCOUNT_RE.fullmatch(v)),
    "model": lambda v: isinstance(v, str) and v in IMAGE_MODELS,
    "seed": lambda v: v is None or _int_ok(v, 0, MAX_SEED),
    "steps": lambda v: _int_ok(v, 1, MAX_STEPS),
    "width": lambda v: _int_ok(v, MIN_SIDE, MAX_SIDE) and v % 8 == 0,
    "height": lambda v: _int_ok(v, MIN_SIDE, MAX_SIDE) and v % 8 == 0,
    "downgradable": lambda v: v is None or isinstance(v, bool),
}

#: Integers too long for str() (over 4,300 digits), built by a map so that the
#: strategy's repr, which Hypothesis may print, does not hold them.
HUGE_INTS = st.sampled_from([1, -1]).map(lambda sign: sign * 10**5000)
# Values of every type a caller could get wrong, including the extremes.
GARBAGE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63 - 8),
    st.integers(max_value=-(2**63) + 8), HUGE_INTS,
    st.floats(allow_nan=True, allow_infinity=True), st.text(), st.binary(max_size=64),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(),
                                                         max_size=2),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, "", " ", "\x00", "\ud800",
                     "fast\x00", "x" * (MAX_PROMPT_CHARS + 1), b"fast", object()]),
)
#: Any code point, plus the ones that break encoders, terminals and C strings.
#: (A list joined, not st.text: text() drops the surrogates from its alphabet.)
NASTY_TEXT = st.lists(st.one_of(st.characters(), st.sampled_from(
    ["\ud800", "\udfff", "\x00", "\x1b", "\r", "\u202e", "\ufeff", "\U0010ffff"])),
    min_size=1, max_size=40).map("".join)
SIDE = st.integers(MIN_SIDE // 8, MAX_SIDE // 8).map(lambda n: n * 8)


def near(good: st.SearchStrategy, *edges) -> st.SearchStrategy:
    """Mostly ``good``, sometimes one of the values just outside it."""
    return st.tuples(st.integers(0, 9), good, st.sampled_from(edges)).map(
        lambda pick: pick[2] if pick[0] == 5 else pick[1])


LIKELY_GOOD = {
    "prompt": st.one_of(st.text(min_size=1, max_size=60), NASTY_TEXT,
                        st.just("y" * MAX_PROMPT_CHARS)),
    "tier": near(st.sampled_from(TIERS), "Fast", "fast ", "turbo"),
    "account": st.from_regex(ACCOUNT_RE, fullmatch=True).filter(lambda a: len(a) <= 70),
    "model": near(st.sampled_from(IMAGE_MODELS), "sdxl", "Demo", "demo ", "echo"),
    "seed": near(st.one_of(st.none(), st.integers(0, MAX_SEED)), -1, MAX_SEED + 1),
    "steps": near(st.integers(1, MAX_STEPS), 0, -1, MAX_STEPS + 1),
    "width": near(SIDE, 0, MIN_SIDE - 8, MIN_SIDE + 1, MAX_SIDE + 8),
    "height": near(SIDE, 0, MIN_SIDE - 8, MAX_SIDE - 1, MAX_SIDE + 8),
    "downgradable": st.one_of(st.none(), st.booleans()),
}


@st.composite
def submissions(draw) -> dict:
    """Garbage in a few fields, near-valid values elsewhere: both outcomes get explored."""
    garbled = draw(st.sets(st.sampled_from(FIELDS), max_size=1))
    return {field: draw(GARBAGE if field in garbled else LIKELY_GOOD[field])
            for field in FIELDS}


def _keys(client) -> list[bytes]:
    """Every key but kombu's queue bindings (which the test session keeps)."""
    return [k for k in client.scan_iter(count=1000) if not k.startswith(b"_kombu.binding")]


def _flush(client) -> None:
    if keys := _keys(client):
        client.delete(*keys)


def _queued(client) -> list[bytes]:
    """Every message in Redis: the lanes at every priority, and any worker's own queue."""
    return [raw for key in client.scan_iter(count=1000, _type="list")
            for raw in client.lrange(key, 0, -1)]


def _standard_json(text: bytes | str) -> object:
    """``text`` parsed as standard JSON: a NaN or Infinity token fails the test."""
    def refuse(token: str) -> None:
        raise AssertionError(f"a message holds the non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def _call_of(raw: bytes) -> tuple[list, dict]:
    """The arguments inside one message, read from standard JSON as a worker reads them."""
    envelope = _standard_json(raw)
    assert envelope["content-type"] == "application/json"
    body = base64.b64decode(envelope["body"]) \
        if envelope["properties"].get("body_encoding") == "base64" else envelope["body"]
    args, kwargs, _ = _standard_json(body)
    return args, kwargs


def _check_accepted(client, call: dict) -> None:
    bad = [field for field in FIELDS if not GOOD_VALUE[field](call[field])]
    assert not bad, f"accepted bad {bad}: {call!r}"
    messages = _queued(client)
    assert len(messages) == 1
    args, kwargs = _call_of(messages[0])
    check_call(args, kwargs)  # the checks a worker makes before it runs a job
    check_content(kwargs)
    job = kwargs["job"]
    # its cost (set unless 1.0) is worked out again by the worker, to the same value
    sent = {field: job[field] for field in (*JOB_FIELDS, "cost") if field in job}
    assert check_job(job).encode() == sent and set(sent) >= set(JOB_FIELDS)
    assert job["prompt"] == call["prompt"] and job["account"] == call["account"]


GOOD_CALL = dict(prompt="a fine prompt", tier="fast", account="alice", model="demo", seed=1,
                 steps=4, width=64, height=64, downgradable=None)
#: Hazards found here once, kept whatever the generator draws.
FOUND = [{"prompt": "\ud800"}, {"prompt": "\ud800", "seed": None}, {"steps": 10**5000},
         {"tier": "t" * 10**6}, {"account": "x" * 10**6}]


def _with_examples(test):
    for change in FOUND:
        test = example(call={**GOOD_CALL, **change})(test)
    return test


@FUZZ
@given(call=submissions())
@_with_examples
def test_submit_refuses_naming_a_bad_field_or_enqueues_a_valid_message(call, redis_server):
    client = redis_server.client()
    _flush(client)
    prompt, options = call["prompt"], {k: v for k, v in call.items() if k != "prompt"}
    try:
        submit(prompt, **options)
    except InvalidJob as exc:
        event(f"refused: {exc.field}")
        assert exc.field in FIELDS and str(exc).startswith(f"{exc.field}: ")
        assert not GOOD_VALUE[exc.field](call[exc.field]), f"refused a good {exc.field}: {exc}"
        assert len(str(exc)) < 500, "the message quotes the whole value"
        assert _keys(client) == []  # refused before anything was written
    else:
        event("accepted")
        _check_accepted(client, call)


@FUZZ
@given(field=st.sampled_from(FIELDS), value=GARBAGE)
def test_one_bad_keyword_among_good_ones_is_named(field, value, redis_server):
    client = redis_server.client()
    _flush(client)
    if GOOD_VALUE[field](value):
        return  # garbage that happens to be valid here (None seed, a bool downgradable)
    call = {**GOOD_CALL, field: value}
    with pytest.raises(InvalidJob) as caught:
        submit(call.pop("prompt"), **call)
    assert caught.value.field == field
    assert _keys(client) == []


def _nested(levels: int, leaf: object = 0, key: str | None = None) -> object:
    for _ in range(levels):
        leaf = [leaf] if key is None else {key: leaf}
    return leaf


#: Text, lone surrogates among it.
SHORT_TEXT = st.one_of(st.text(max_size=6), st.sampled_from(["\ud800", "a\udfffb", "\x00"]))
FLOAT = st.floats(allow_nan=True, allow_infinity=True)
#: Leaves of a class model's inputs: JSON's, and what JSON cannot carry as given.
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), FLOAT, SHORT_TEXT, st.binary(max_size=6),
    st.sampled_from([2**4096 - 1, -(2**4096), 2**14000, object(), memoryview(b"x"),
                     (1, 2), frozenset({1.5}), b"\xff", "nan", "-1e999"]))
KEYS = st.one_of(st.text(max_size=4), st.sampled_from([1, None, 1.5, (1, 2), "\ud800", True]))
VALUES = st.recursive(LEAVES, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=3),
    st.tuples(inner)), max_leaves=6)
#: Nesting around the bound of 64, and far past it.
DEEP = st.one_of(st.integers(62, 66).map(_nested),
                 st.integers(62, 66).map(lambda n: _nested(n, key="k")),
                 st.just(5000).map(_nested))
FLOATS = st.one_of(FLOAT, st.integers(), st.sampled_from(["nan", "-inf", "1e999", "2.5"]),
                   VALUES)
PART = st.one_of(
    st.fixed_dictionaries({}, optional={"ratio": FLOATS, "tags": st.lists(SHORT_TEXT, max_size=2),
                                        "extra": st.one_of(VALUES, DEEP)}),
    st.builds(TypedPart, ratio=FLOAT), VALUES)
#: For each input of the ``typed`` model: values of its type, hazards mixed in.
TYPED_FIELDS = {
    "number": FLOATS, "maybe": FLOATS,
    "count": st.one_of(st.integers(), st.sampled_from([2**4096, -(2**5000)]), VALUES),
    "text": st.one_of(SHORT_TEXT, st.binary(max_size=6), VALUES),
    "blob": st.one_of(st.binary(max_size=6), SHORT_TEXT, VALUES),
    "items": st.one_of(st.lists(VALUES, max_size=3), DEEP, VALUES),
    "mapping": st.one_of(st.dictionaries(KEYS, VALUES, max_size=3),
                         DEEP.map(lambda deep: {"a": deep}), VALUES),
    "anything": st.one_of(VALUES, DEEP), "part": PART, "parts": st.lists(PART, max_size=2),
}
#: A few inputs a call: each value gets its turn at the checks.
TYPED_CALLS = st.sets(st.sampled_from(sorted(TYPED_FIELDS)), max_size=3).flatmap(
    lambda names: st.fixed_dictionaries({name: TYPED_FIELDS[name] for name in names}))
MAX_LEVELS = 64  # the bound, stated here independently of tasks.jobs.schema


def _unfit(value: object, level: int) -> bool:
    """Whether ``value`` holds what standard JSON cannot carry as given: nesting past
    the bound, NaN or infinity, a key that is not a string, bytes that are not UTF-8,
    a lone surrogate, an integer of more than 4096 bits. ``level``: of the container
    ``value`` would be (an input's own value is at level 1)."""
    if isinstance(value, TypedPart):
        value = dict(value)
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, int):
        return value.bit_length() > 4096
    if isinstance(value, (bytes, bytearray)):
        return not _utf8_bytes(value)
    if isinstance(value, str):
        return not _utf8(value)
    if isinstance(value, (dict, list, tuple, set, frozenset)) and level > MAX_LEVELS:
        return True
    if isinstance(value, dict):
        return any(not isinstance(key, str) or not _utf8(key) or _unfit(item, level + 1)
                   for key, item in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_unfit(item, level + 1) for item in value)
    return False


def _utf8_bytes(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _acceptable(call: dict) -> bool:
    """The oracle: pydantic takes ``call`` and can write it, within the size limit, and
    nothing in it is unfit for JSON."""
    try:
        typed = TypedInput.model_validate(call)
        size = len(json.dumps(typed.model_dump(mode="json"), ensure_ascii=False).encode())
    except (ValueError, TypeError):  # pydantic refuses it, or cannot write it
        return False
    return size <= gl.max_input_bytes and not any(_unfit(item, 1) for item in dict(typed).values())


@FUZZ
@given(call=TYPED_CALLS)
def test_class_model_inputs_are_refused_naming_a_field_or_sent_as_standard_json(call,
                                                                                 redis_server):
    client = redis_server.client()
    _flush(client)
    try:
        submit(model="typed", **call)
    except InvalidJob as exc:
        event(f"refused: {exc.field.split('.')[0]}")
        assert exc.field.split(".")[0] in call or exc.field == "inputs", exc
        assert str(exc).startswith(f"{exc.field}: ") and len(str(exc)) < 500
        assert not _acceptable(call), f"refused acceptable inputs: {exc}"
        assert _keys(client) == []
    else:
        event("accepted")
        assert _acceptable(call), f"accepted inputs JSON cannot carry: {call!r}"
        (message,) = _queued(client)
        job = _call_of(message)[1]["job"]
        assert check_job(job).model == "typed"  # the worker's checks pass on it again
