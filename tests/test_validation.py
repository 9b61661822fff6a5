"""Every bad field is refused with InvalidJob naming it, and nothing reaches a lane."""
from __future__ import annotations

import base64
import json

import pytest

from routing.names import LANES
from tasks import submit
from tasks.broker.keys import lane_keys
from tasks.broker.message import BOOKKEEPING, ROUTING
from tasks.errors import InvalidJob
from tasks.jobs.image import MAX_PROMPT_CHARS, MAX_SIDE, MAX_STEPS, MIN_SIDE
from tasks.jobs.schema import MAX_ACCOUNT_CHARS, check_job
from tests.typed_model import TypedPart

GOOD = dict(tier="standard", account="alice", model="demo", seed=1, steps=10,
            width=128, height=128)

BAD = [
    ("prompt", {"prompt": ""}), ("prompt", {"prompt": "   "}),
    ("prompt", {"prompt": 42}), ("prompt", {"prompt": None}),
    ("prompt", {"prompt": "x" * (MAX_PROMPT_CHARS + 1)}),
    ("prompt", {"prompt": "nul\x00byte"}),
    ("prompt", {"prompt": "\u200b\u200c\u200d"}), ("prompt", {"prompt": "\u202e\u2066\u2069"}),
    ("prompt", {"prompt": "\ufeff \u2060\u180e"}), ("prompt", {"prompt": "\u3164\u2800"}),
    ("prompt", {"prompt": " \u0301\u20dd "}),
    ("tier", {"tier": "turbo"}), ("tier", {"tier": ["fast"]}), ("tier", {"tier": None}),
    ("tier", {"tier": "FAST"}),
    ("account", {"account": ""}), ("account", {"account": "a" * (MAX_ACCOUNT_CHARS + 1)}),
    ("account", {"account": "has space"}), ("account", {"account": 7}),
    ("model", {"model": "sdxl-nope"}), ("model", {"model": ""}), ("model", {"model": 3}),
    ("seed", {"seed": 1.5}), ("seed", {"seed": "7"}), ("seed", {"seed": -1}),
    ("seed", {"seed": 2**64}), ("seed", {"seed": True}),
    ("steps", {"steps": "20"}), ("steps", {"steps": 20.0}), ("steps", {"steps": 0}),
    ("steps", {"steps": MAX_STEPS + 1}), ("steps", {"steps": None}),
    ("steps", {"steps": True}),
    ("width", {"width": "256"}), ("width", {"width": 256.0}), ("width", {"width": 100}),
    ("width", {"width": MIN_SIDE - 8}), ("width", {"width": MAX_SIDE + 8}),
    ("height", {"height": [256]}), ("height", {"height": 0}),
    ("height", {"height": MAX_SIDE * 2}),
]


def _lane_lengths(client) -> list[int]:
    return [sum(client.llen(key) for key in lane_keys(lane)) for lane in LANES]


@pytest.mark.parametrize("field,change", BAD, ids=[f"{f}={c[f]!r}"[:40] for f, c in BAD])
def test_bad_field_is_named_and_nothing_is_enqueued(field, change, clean_redis):
    kwargs = {**GOOD, **change}
    prompt = kwargs.pop("prompt", "a valid prompt")
    with pytest.raises(InvalidJob) as caught:
        submit(prompt, **kwargs)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert isinstance(caught.value, ValueError)
    assert _lane_lengths(clean_redis) == [0, 0, 0]


def test_an_unknown_input_is_named():
    with pytest.raises(InvalidJob) as caught:
        submit("a prompt", priority=9)
    assert caught.value.field == "priority" and "not an input" in str(caught.value)


@pytest.mark.parametrize("tier", LANES)
def test_good_job_is_enqueued_in_its_tier_lane(tier, clean_redis):
    result = submit("a valid prompt", **{**GOOD, "tier": tier})
    expected = [1 if lane == tier else 0 for lane in LANES]
    assert _lane_lengths(clean_redis) == expected
    assert result.id


def test_seed_is_drawn_when_missing():
    from tasks.jobs.schema import validate

    jobs = [validate("p", **{**GOOD, "seed": None}) for _ in range(3)]
    seeds = [job.inputs["seed"] for job in jobs]
    assert all(isinstance(seed, int) and seed >= 0 for seed in seeds) and len(set(seeds)) == 3


def nested(levels: int, leaf: object = 0, key: str | None = None) -> object:
    """``leaf`` inside ``levels`` lists (dicts under ``key``, when given)."""
    for _ in range(levels):
        leaf = [leaf] if key is None else {key: leaf}
    return leaf


NAN, INF = float("nan"), float("inf")
#: Inputs of the ``typed`` model (tests/typed_model.py) that JSON text cannot carry as
#: given, and the field each refusal names: (field, inputs).
UNFIT = [
    ("anything.0.0.0.….0.0.0", {"anything": nested(65)}),
    ("anything.0.0.0.….0.0.0", {"anything": nested(5000)}),
    ("items.0.0.0.….0.0.0", {"items": nested(65)}),
    ("anything.k.k.k.….k.k.k", {"anything": nested(65, key="k")}),
    ("mapping.a.0.0.….0.0.0", {"mapping": {"a": nested(64)}}),
    ("blob", {"blob": b"\xff"}), ("anything", {"anything": b"\xff\xfe"}),
    ("anything.k.0", {"anything": {"k": [b"\x80"]}}), ("items.1", {"items": [b"ok", b"\xc3"]}),
    ("number", {"number": NAN}), ("number", {"number": INF}), ("number", {"number": -INF}),
    ("number", {"number": "nan"}), ("number", {"number": "1e999"}), ("maybe", {"maybe": NAN}),
    ("anything", {"anything": NAN}), ("anything", {"anything": -INF}),
    ("anything.1", {"anything": [1.0, INF]}), ("mapping.x.y", {"mapping": {"x": {"y": -INF}}}),
    ("items.0.0", {"items": [(NAN,)]}), ("part.ratio", {"part": {"ratio": NAN}}),
    ("parts.1.ratio", {"parts": [{}, {"ratio": INF}]}),
    ("part.extra.z.0", {"part": {"extra": {"z": [NAN]}}}),
    ("anything", {"anything": {1: "a", "1": "b"}}), ("anything", {"anything": {None: 1}}),
    ("anything.ok", {"anything": {"ok": {(1, 2): 0}}}), ("items.0", {"items": [{1.5: 0}]}),
    ("anything", {"anything": "\ud800"}), ("anything", {"anything": {"\udfff": 1}}),
    ("anything", {"anything": 10**5000}), ("count", {"count": 2**5000}),
    ("anything", {"anything": object()}), ("anything", {"anything": [memoryview(b"x")]}),
]


@pytest.mark.parametrize("field,inputs", UNFIT,
                         ids=[f"{n}-{f.split('.')[0]}" for n, (f, _) in enumerate(UNFIT)])
def test_inputs_json_cannot_carry_are_refused_naming_the_field(field, inputs, clean_redis):
    with pytest.raises(InvalidJob) as caught:
        submit(model="typed", **inputs)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ") and len(str(caught.value)) < 500
    assert _lane_lengths(clean_redis) == [0, 0, 0]


def test_a_nested_model_given_as_an_object_is_checked_too():
    with pytest.raises(InvalidJob) as caught:
        submit(model="typed", part=TypedPart(ratio=NAN))
    assert caught.value.field == "part.ratio"


@pytest.mark.parametrize("inputs", [{"anything": nested(64)}, {"items": nested(64)},
                                    {"mapping": {"a": nested(63)}},
                                    {"anything": nested(64, key="k")},
                                    {"blob": "é".encode(), "anything": 2**4096 - 1,
                                     "number": 1e308, "maybe": -0.0}])
def test_inputs_at_the_bounds_are_enqueued_as_standard_json(inputs, clean_redis):
    submit(model="typed", **inputs)
    (raw,) = [raw for lane in LANES for key in lane_keys(lane)
              for raw in clean_redis.lrange(key, 0, -1)]
    job = _strict_json(base64.b64decode(_strict_json(raw)["body"]))[1]["job"]
    assert check_job(job).inputs == {k: v for k, v in job.items()
                                     if k not in ROUTING and k not in BOOKKEEPING}


def _strict_json(text: bytes | str) -> object:
    """``text`` parsed as standard JSON: NaN and Infinity tokens refused."""
    def refuse(token: str) -> None:
        raise AssertionError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_a_model_output_holding_nan_fails_as_output_error():
    from tasks.errors import OutputError
    from tasks.worker.outputs import encoded_output

    for output in ({"x": NAN}, {"y": [1.0, INF]}, {"z": {"w": -INF}}):
        with pytest.raises(OutputError, match="JSON cannot hold"):
            encoded_output(output)
