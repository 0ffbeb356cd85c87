"""The simulator's pure parts: answers, tokens, metrics exposition."""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from laned.sim import answers
from laned.sim.metrics import Metrics

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}


def test_arithmetic_is_right() -> None:
    working, result = answers.arithmetic("What is 17 × 23?") or ("", "")
    assert result == "391" and "340" in working
    assert answers.arithmetic("12 * 12")[1] == "144"  # type: ignore[index]
    assert answers.arithmetic("7 / 0")[1] == "undefined"  # type: ignore[index]
    assert answers.arithmetic("no numbers here") is None


def test_needle_is_found_anywhere() -> None:
    hay = "filler. " * 500 + "The secret code is QX-4471-ZEBRA. " + "more filler. " * 500
    assert answers.find_code(hay) == "QX-4471-ZEBRA"
    assert answers.find_code("nothing to see") is None


def test_tool_call_has_valid_json_arguments_then_uses_the_result() -> None:
    messages = [{"role": "user", "content": "What's the weather in Paris in celsius?"}]
    first = answers.compose_chat(messages, [WEATHER], "auto", False, "m", "call-1")
    assert len(first.tool_calls) == 1
    call = first.tool_calls[0]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    messages += [
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call-1", "content": "18 degrees and sunny"},
    ]
    second = answers.compose_chat(messages, [WEATHER], "auto", False, "m", "call-2")
    assert not second.tool_calls and "18 degrees and sunny" in second.content


def test_no_tool_when_not_needed_or_refused() -> None:
    plain = [{"role": "user", "content": "Say hello."}]
    assert not answers.compose_chat(plain, [WEATHER], "auto", False, "m", "c").tool_calls
    weather = [{"role": "user", "content": "weather in Oslo?"}]
    assert not answers.compose_chat(weather, [WEATHER], "none", False, "m", "c").tool_calls
    assert answers.compose_chat(plain, [WEATHER], "required", False, "m", "c").tool_calls


def test_output_tokens_join_back_to_the_text() -> None:
    text = 'Hello,  world! {"a": 1}\n next'
    assert "".join(answers.split_output(text)) == text
    assert answers.count_prompt_tokens("Hello, world!") == 4


def test_metrics_exposition_parses_with_vllm_names() -> None:
    metrics = Metrics("deepseek", spec_decode=True, num_spec_tokens=5)
    metrics.add("generation_tokens", 12)
    metrics.observe("time_to_first_token_seconds", 0.3)
    families = {f.name: f for f in text_string_to_metric_families(metrics.render())}
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:spec_decode_num_drafts",
    ):
        assert name in families, name
    gen = next(s for s in families["vllm:generation_tokens"].samples if s.name.endswith("_total"))
    assert gen.value == 12 and gen.labels == {"model_name": "deepseek", "engine": "0"}
    ttft = {s.name: s.value for s in families["vllm:time_to_first_token_seconds"].samples}
    assert ttft["vllm:time_to_first_token_seconds_count"] == 1
