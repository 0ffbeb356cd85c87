"""The gates' judging, the bench's arithmetic and the config hash: pure, no engine."""

from __future__ import annotations

import re
from typing import Any

import pytest

from laned.adapters.engine_api import Timed
from laned.engines import VLLM
from laned.gates.acceptance import (
    buried_prompt,
    judge_chat,
    judge_context,
    judge_reasoning,
    judge_speed,
    judge_tool_call,
    judge_tool_use,
)
from laned.gates.bench import context_sizes, decode_rate
from laned.render import plan as render
from laned.validation.load import parse_config


def chat(message: dict[str, Any], finish: str = "stop", completion: int = 10) -> Timed:
    body = {"choices": [{"message": message, "finish_reason": finish}]}
    return Timed(0.5, 20, completion, body)


def test_chat_must_answer_and_stop_on_its_own() -> None:
    assert judge_chat(chat({"content": "Paris."}))[0]
    passed, _, reason = judge_chat(chat({"content": "Paris is" * 100}, finish="length"))
    assert not passed and "did not stop on its own" in reason
    assert judge_chat(chat({"content": "  "}))[2] == "the answer is empty"


def test_reasoning_must_be_separate_and_right() -> None:
    good = chat({"content": "391", "reasoning_content": "17 × 20 = 340, 17 × 3 = 51"})
    assert judge_reasoning(good)[0]
    inline = chat({"content": "<think>17*23</think> 391", "reasoning_content": None})
    hint = VLLM.gate_hints["reasoning"]
    assert judge_reasoning(inline, hint)[2].endswith("is empty: check --reasoning-parser)")
    assert judge_reasoning(inline)[2].endswith("is empty)")  # an engine with no hint
    wrong = chat({"content": "381", "reasoning_content": "hmm"})
    assert "391" in judge_reasoning(wrong)[2]


def test_tools_must_call_with_the_right_arguments_and_use_the_result() -> None:
    call = {"id": "c1", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    (passed, measured, _), got = judge_tool_call(chat({"tool_calls": [call]}, "tool_calls"))
    assert passed and got == call and measured["arguments"] == {"city": "Paris"}
    bad_json = {"function": {"name": "get_weather", "arguments": "{city: Paris"}}
    assert "not JSON" in judge_tool_call(chat({"tool_calls": [bad_json]}))[0][2]
    lisbon = {"function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'}}
    assert "not Paris" in judge_tool_call(chat({"tool_calls": [lisbon]}))[0][2]
    hint = VLLM.gate_hints["tools"]
    assert "--tool-call-parser" in judge_tool_call(chat({"content": "sunny"}), hint)[0][2]
    assert judge_tool_use(chat({"content": "It is 17 °C with light rain."}))[0]
    assert not judge_tool_use(chat({"content": "It is sunny."}))[0]


def test_context_recall_and_the_buried_prompt() -> None:
    filler = ["one. ", "two. ", "three. ", "four. "]
    prompt = buried_prompt(filler, "Q7-4821", 0.5)
    assert prompt.index("Q7-4821") > prompt.index("two.") and prompt.index(
        "Q7-4821"
    ) < prompt.index("three.")
    assert prompt.rstrip().endswith("Answer with the code only.")
    timed = Timed(3.0, 850, 5, {"choices": [{"message": {"content": "Q7-4821"}}]})
    passed, measured, _ = judge_context(timed, "Q7-4821", 1000)
    assert passed and measured["fill"] == 0.85
    assert not judge_context(timed, "Z1-0000", 1000)[0]


def test_speed_is_the_difference_of_two_replies() -> None:
    short, long = Timed(0.4, 30, 16, {}), Timed(8.08, 30, 400, {})
    passed, measured, _ = judge_speed(short, long, 15)
    assert passed and measured["decode_tok_s"] == 50.0
    passed, measured, reason = judge_speed(short, long, 100)
    assert not passed and "below 100" in reason
    assert "ignore_eos" in judge_speed(short, Timed(0.5, 30, 16, {}), 15)[2]


def test_bench_arithmetic() -> None:
    short = [Timed(0.2, 10, 16, {})] * 4
    long = [Timed(2.1, 10, 400, {})] * 4
    assert decode_rate(short, long, 0.2, 2.12) == pytest.approx(800.0)
    assert decode_rate(short, short, 0.2, 0.2) == 0.0
    assert context_sizes(524288, (8192, 16384, 32768)) == [8192, 16384, 32768]
    assert context_sizes(20000, (8192, 16384, 32768)) == [8192, 16384, 19536]
    assert context_sizes(100, (8192,)) == []


def test_the_config_hash_follows_the_lane_and_nothing_else() -> None:
    text = """
[lanes.a]
port = 8001
served_model_name = "a"
[lanes.a.exec]
command = ["/opt/vllm", "serve", "/m/a"]
[lanes.b]
port = 8002
group = "other"
served_model_name = "b"
[lanes.b.exec]
command = ["/opt/vllm", "serve", "/m/b"]
"""
    env = {"HOME": "/home/op"}
    base = parse_config(text, "t.toml", env)
    other = parse_config(text.replace('"/m/b"', '"/m/b2"'), "t.toml", env)
    mine = parse_config(text.replace('"/m/a"', '"/m/a2"'), "t.toml", env)
    assert render.lane_digest(base, "a") == render.lane_digest(other, "a")
    assert render.lane_digest(base, "a") != render.lane_digest(mine, "a")
    assert re.fullmatch(r"[0-9a-f]{16}", render.lane_digest(base, "a"))
