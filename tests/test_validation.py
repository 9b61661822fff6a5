"""Every bad field is refused with InvalidJob naming it, and nothing reaches a lane."""
from __future__ import annotations

import pytest

from routing.names import LANES
from tasks import submit
from tasks.broker.keys import lane_keys
from tasks.errors import InvalidJob
from tasks.settings import settings

GOOD = dict(tier="standard", account="alice", model="demo", seed=1, steps=10,
            width=128, height=128)

BAD = [
    ("prompt", {"prompt": ""}), ("prompt", {"prompt": "   "}),
    ("prompt", {"prompt": 42}), ("prompt", {"prompt": None}),
    ("prompt", {"prompt": "x" * (settings.max_prompt_chars + 1)}),
    ("prompt", {"prompt": "nul\x00byte"}),
    ("prompt", {"prompt": "\u200b\u200c\u200d"}), ("prompt", {"prompt": "\u202e\u2066\u2069"}),
    ("prompt", {"prompt": "\ufeff \u2060\u180e"}), ("prompt", {"prompt": "\u3164\u2800"}),
    ("prompt", {"prompt": " \u0301\u20dd "}),
    ("tier", {"tier": "turbo"}), ("tier", {"tier": ["fast"]}), ("tier", {"tier": None}),
    ("tier", {"tier": "FAST"}),
    ("account", {"account": ""}), ("account", {"account": "a" * (settings.max_account_chars + 1)}),
    ("account", {"account": "has space"}), ("account", {"account": 7}),
    ("model", {"model": "sdxl-nope"}), ("model", {"model": ""}), ("model", {"model": 3}),
    ("seed", {"seed": 1.5}), ("seed", {"seed": "7"}), ("seed", {"seed": -1}),
    ("seed", {"seed": 2**64}), ("seed", {"seed": True}),
    ("steps", {"steps": "20"}), ("steps", {"steps": 20.0}), ("steps", {"steps": 0}),
    ("steps", {"steps": settings.max_steps + 1}), ("steps", {"steps": None}),
    ("steps", {"steps": True}),
    ("width", {"width": "256"}), ("width", {"width": 256.0}), ("width", {"width": 100}),
    ("width", {"width": settings.min_side - 8}), ("width", {"width": settings.max_side + 8}),
    ("height", {"height": [256]}), ("height", {"height": 0}),
    ("height", {"height": settings.max_side * 2}),
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
