"""The HTTP benchmark's arithmetic: what HTTP adds, the rates and their paired ratios,
the goals judged, the accounts shared out, the page's headline."""
from __future__ import annotations

import pytest

from benchmarks.api_figures import (
    latency_figures, mode_summary, throughput_figures, verdict_lines, verdicts)
from benchmarks.api_load import merged, share
from benchmarks.api_page import api as api_page
from benchmarks.api_wire import answer_status, request


def test_added_is_the_posts_percentile_less_submits_and_the_paired_median_too():
    ms = {"submit": [1.0, 1.0, 2.0, 2.0, 9.0], "http_submit": [3.0, 4.0, 3.0, 5.0, 20.0],
          "http_floor": [1.5, 1.5, 1.5, 1.5, 1.5], "http_models": [2.0] * 5}
    found = latency_figures(ms, {kind: [0.5, 0.25, 0.75, 0.5, 0.5] for kind in ms})
    assert found["ms"]["submit"]["p50"] == 2.0 and found["ms"]["http_submit"]["p99"] == 20.0
    assert found["ms"]["http_floor"]["caller_cpu_p50"] == 0.5
    assert found["added_ms"] == {"p50": 2.0, "p99": 11.0, "paired_p50": 3.0}
    assert found["over_floor_ms"] == {"p50": 2.5, "p99": 18.5}


def _round(side: str, n: int, r: int, submits: int, wall_s: float = 2.0, **extra) -> dict:
    return {"round": r, "side": side, "processes": n, "submits": submits, "wall_s": wall_s,
            "submits_s": submits / wall_s, "errors": {}, "parked": 0,
            "submitting_cpu_s": submits * 0.001, "client_cpu_s": 0.0,
            "redis_commands": {"evalsha": submits, "hgetall": submits if side == "api" else 0},
            "redis_cpu_s": submits * 0.0002, **extra}


def test_a_modes_rate_counts_every_round_and_its_costs_are_per_submit():
    rounds = [_round("api", 1, 0, 600, errors={"429": 3}),
              _round("api", 1, 1, 1000, wall_s=4.0, client_cpu_s=0.8, parked=2)]
    found = mode_summary(rounds)
    assert found["submits_s"] == pytest.approx(1600 / 6.0)
    assert found["median_round_submits_s"] == pytest.approx(275.0)
    assert found["cpu_us_per_submit"] == pytest.approx(1000.0)
    assert found["client_cpu_us_per_submit"] == pytest.approx(500.0)
    assert found["redis_commands_per_submit"] == pytest.approx(2.0)
    assert found["redis_cpu_us_per_submit"] == pytest.approx(200.0)
    assert (found["errors"], found["parked"]) == (3, 2)


def test_the_ratio_pairs_each_round_of_the_api_with_submits_of_the_same_round():
    rounds = [_round("submit", 1, 0, 2000), _round("api", 1, 0, 1000),
              _round("submit", 1, 1, 1000), _round("api", 1, 1, 900),  # a slow stretch
              _round("submit", 1, 2, 2000), _round("api", 1, 2, 1100),
              _round("submit", 2, 0, 3000), _round("api", 2, 0, 600)]
    found = throughput_figures(rounds)
    assert found["ratios"]["1"]["paired"] == pytest.approx(0.55)
    assert found["ratios"]["1"]["all_rounds"] == pytest.approx(3000 / 5000)
    assert found["ratios"]["2"]["paired"] == pytest.approx(0.2)
    assert found["ratios"]["1"]["cpu_per_submit"] == pytest.approx(1.0)
    assert found["redis_by_command"]["api x1"] == {"evalsha": 1.0, "hgetall": 1.0}
    assert found["redis_by_command"]["submit x1"] == {"evalsha": 1.0}


def test_each_goal_is_judged_on_its_own_figure():
    latency = {"added_ms": {"p50": 2.4}}
    throughput = {"ratios": {"1": {"paired": 0.6}, "2": {"paired": 0.45}}}
    judged = verdicts(latency, throughput)
    assert {name: goal["met"] for name, goal in judged.items()} == {
        "added_p50_ms": False, "rate_ratio_x1": True, "rate_ratio_x2": False}
    lines = verdict_lines(judged)
    assert "2.400 ms" in lines[0] and "NOT met" in lines[0]
    assert lines[1].startswith("The API in 1 process submits at 0.60x the rate of submit() "
                               "in 1 process") and lines[1].endswith(": met.")
    assert "in 2 processes" in lines[2]
    assert verdicts({"added_ms": {"p50": 2.0}}, {"ratios": {}})["added_p50_ms"]["met"]


def test_every_account_goes_to_exactly_one_slot_and_the_slots_share_them_evenly():
    accounts = [f"a{i}" for i in range(100)]
    shares = [share(accounts, slot, 16) for slot in range(16)]
    assert sorted(a for found in shares for a in found) == sorted(accounts)
    assert {len(found) for found in shares} == {6, 7}


def test_processes_that_ran_at_once_are_merged_over_the_longest_wall_time():
    found = merged([{"submits": 300, "errors": {"429": 1}, "wall_s": 2.0, "cpu_s": 1.0},
                    {"submits": 100, "errors": {"429": 2, "ReadTimeout": 1}, "wall_s": 2.5,
                     "cpu_s": 0.5}])
    assert found["submits_s"] == pytest.approx(160.0)
    assert found["errors"] == {"429": 3, "ReadTimeout": 1} and found["cpu_s"] == 1.5


def test_the_page_heads_with_what_http_adds_and_the_paired_ratios():
    rounds = [_round("submit", 1, 0, 2000), _round("api", 1, 0, 1000),
              _round("submit", 2, 0, 3000), _round("api", 2, 0, 1500)]
    throughput = throughput_figures(rounds)
    ms = {"submit": [1.0] * 4, "http_submit": [2.5] * 4, "http_floor": [1.2] * 4,
          "http_models": [1.6] * 4}
    latency = latency_figures(ms, ms)
    page = api_page({"config": {"rounds": 1, "clients": 2, "concurrency": 8,
                                "client": "raw", "accounts": 100},
                     "latency": latency, "throughput": throughput,
                     "goals": verdicts(latency, throughput)})
    assert page.headline.startswith("HTTP adds 1.50 ms at p50")
    assert page.versus == ("1 process: 0.50x of `submit()`'s submits/s, 2 processes: 0.50x "
                           "of `submit()`'s submits/s")
    text = "\n".join(page.sections)
    assert "| `HGETALL` | 0.00 | 1.00 | +1.00 |" in text and "`EVALSHA`" not in text
    assert "| all commands | 1.00 | 2.00 | +1.00 |" in text
    assert "HTTP adds 1.500 ms to a submit at the median; goal <= 2 ms: met." in text


def test_a_raw_request_carries_its_key_and_length_and_an_answer_is_read_by_its_head():
    raw = request("POST", "http://127.0.0.1:8123", "/v1/predictions", "gl_k", b'{"a": 1}')
    assert raw == (b"POST /v1/predictions HTTP/1.1\r\nHost: 127.0.0.1:8123\r\n"
                   b"Authorization: Bearer gl_k\r\nContent-Type: application/json\r\n"
                   b"Content-Length: 8\r\n\r\n{\"a\": 1}")
    assert b"Content-Length" not in request("GET", "http://h:1", "/v1/models", "gl_k")
    head = (b"HTTP/1.1 201 Created\r\ndate: x\r\nserver: uvicorn\r\n"
            b"content-length: 412\r\ncontent-type: application/json\r\n\r\n")
    assert answer_status(head) == (201, 412, False)
    closing = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n"
    assert answer_status(closing) == (503, 0, True)
