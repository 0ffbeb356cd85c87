"""The six acceptance gates of seed 002, run against a lane's OpenAI-compatible API.

    load       loads and serves within an hour (the lane's last cold start)
    chat       answers a plain question and stops on its own
    reasoning  thinks separately and gets 17 x 23 right
    tools      calls a tool with the right arguments and uses the result
    context    recalls a code buried at a random depth in a prompt filling 85% of the window
    speed      decodes at 15 tok/s or more (a 400-token minus a 16-token reply, warm prefix)

Each gate runs under its deadline, so a stalled engine fails it with a reason instead of
hanging. The judging of each answer is a pure function (`judge_*`), tested without I/O.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from laned.adapters.engine_api import EngineClient, Timed
from laned.config.model import GATES, ChecksConfig
from laned.errors import LaneError, LaneNotRunning

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "the city's name"}},
            "required": ["city"],
        },
    },
}
TOOL_RESULT = {"city": "Paris", "temperature_c": 17, "conditions": "light rain"}
SPEED_SHORT, SPEED_LONG = 16, 400  # seed 004: the difference of a 400- and a 16-token reply


@dataclass(frozen=True)
class GateResult:
    """One gate: passed or not, what was measured, why it failed, how long it took."""

    gate: str
    passed: bool
    measured: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """As stored and served."""
        return {
            "gate": self.gate,
            "passed": self.passed,
            "measured": self.measured,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
        }


Verdict = tuple[bool, dict[str, Any], str]  # (passed, measured, reason)


def _message(timed: Timed) -> dict[str, Any]:
    return dict(timed.choice.get("message") or {})


def judge_chat(timed: Timed) -> Verdict:
    """A plain answer that says something and ends on its own (finish_reason "stop")."""
    content = (_message(timed).get("content") or "").strip()
    finish = timed.choice.get("finish_reason")
    measured = {"finish_reason": finish, "completion_tokens": timed.completion_tokens}
    if not content:
        return False, measured, "the answer is empty"
    if finish != "stop":
        return False, measured, f"it did not stop on its own (finish_reason {finish!r})"
    return True, measured, ""


def judge_reasoning(timed: Timed, hint: str = "") -> Verdict:
    """Reasoning kept apart from the answer, and the answer is 391; `hint`: what to check
    where it is not kept apart (the engine's flags for it: EngineProfile.gate_hints)."""
    message = _message(timed)
    reasoning = (message.get("reasoning_content") or message.get("reasoning") or "").strip()
    content = (message.get("content") or "").strip()
    measured = {"reasoning_chars": len(reasoning), "answer": content[:200]}
    if not reasoning:
        return (
            False,
            measured,
            "no separate reasoning (reasoning_content is empty" + (f": {hint})" if hint else ")"),
        )
    if "391" not in content.replace(",", ""):
        return False, measured, f"17 x 23 is 391, the answer says {content[:80]!r}"
    return True, measured, ""


def judge_tool_call(timed: Timed, hint: str = "") -> tuple[Verdict, dict[str, Any] | None]:
    """A get_weather call whose JSON arguments name Paris; the call, for the follow-up.
    `hint`: what to check where there is none (EngineProfile.gate_hints)."""
    calls = _message(timed).get("tool_calls") or []
    measured: dict[str, Any] = {"finish_reason": timed.choice.get("finish_reason")}
    if not calls:
        return (False, measured, f"no tool call ({hint})" if hint else "no tool call"), None
    call = calls[0]
    function = call.get("function") or {}
    measured["tool"] = function.get("name")
    try:
        args = json.loads(function.get("arguments") or "")
    except ValueError:
        return (False, measured, f"the arguments are not JSON: {function.get('arguments')!r}"), None
    measured["arguments"] = args
    if function.get("name") != "get_weather":
        return (False, measured, f"called {function.get('name')!r}, not get_weather"), None
    if not isinstance(args, dict) or "paris" not in str(args.get("city", "")).lower():
        return (False, measured, f"the city argument is {args!r}, not Paris"), None
    return (True, measured, ""), call


def judge_tool_use(timed: Timed) -> Verdict:
    """The final answer uses the tool's result (its temperature)."""
    content = (_message(timed).get("content") or "").strip()
    measured = {"answer": content[:200]}
    if str(TOOL_RESULT["temperature_c"]) not in content:
        return False, measured, "the answer does not use the tool's result (17 °C)"
    return True, measured, ""


def judge_context(timed: Timed, code: str, window: int) -> Verdict:
    """The buried code comes back; and the prompt really filled the window as asked."""
    content = (_message(timed).get("content") or "").strip()
    measured = {
        "prompt_tokens": timed.prompt_tokens,
        "max_model_len": window,
        "fill": round(timed.prompt_tokens / window, 3) if window else None,
        "answer": content[:120],
    }
    if code not in content:
        return False, measured, f"the code {code} was not recalled"
    return True, measured, ""


def judge_speed(short: Timed, long: Timed, minimum: float) -> Verdict:
    """Decode tok/s = the extra tokens of the long reply over the extra time it took."""
    extra_tokens = long.completion_tokens - short.completion_tokens
    extra_time = long.seconds - short.seconds
    measured: dict[str, Any] = {
        "short": [short.completion_tokens, round(short.seconds, 3)],
        "long": [long.completion_tokens, round(long.seconds, 3)],
    }
    if extra_tokens <= 0 or extra_time <= 0:
        return False, measured, "the long reply was not longer (does the engine honour ignore_eos?)"
    tps = extra_tokens / extra_time
    measured["decode_tok_s"] = round(tps, 2)
    measured["minimum"] = minimum
    if tps < minimum:
        return False, measured, f"decodes at {tps:.1f} tok/s, below {minimum:g}"
    return True, measured, ""


def buried_prompt(filler: Sequence[str], code: str, depth: float) -> str:
    """Filler with `The secret code is CODE.` at `depth` (0..1), and the question at the end."""
    at = int(len(filler) * depth)
    parts = [*filler[:at], f"Remember this: the secret code is {code}. ", *filler[at:]]
    return (
        "".join(parts)
        + "\n\nWhat is the secret code mentioned in the text above? Answer with the code only."
    )


@dataclass
class Gates:
    """The gates of one lane, over one client."""

    client: EngineClient
    settings: ChecksConfig
    last_cold_start: float | None = None
    rng: random.Random = field(default_factory=random.Random)

    async def load(self) -> Verdict:
        served = await self.client.served()
        within = self.settings.load_within
        measured = {"cold_start_s": self.last_cold_start, "within_s": within}
        if served is None:
            return False, measured, f"/v1/models does not list {self.client.model}"
        if self.last_cold_start is not None and self.last_cold_start > within:
            return (
                False,
                measured,
                f"the last cold start took {self.last_cold_start:.0f}s, over {within:g}s",
            )
        return True, measured, ""

    async def chat(self) -> Verdict:
        asked = [
            {"role": "user", "content": "What is the capital of France? Answer in one sentence."}
        ]
        return judge_chat(
            await self.client.chat(asked, max_tokens=await self.client.room(asked, 512))
        )

    async def reasoning(self) -> Verdict:
        asked = [
            {"role": "user", "content": "What is 17 × 23? Think it through, then give the number."}
        ]
        kwargs = {"thinking": True, "enable_thinking": True}
        room = await self.client.room(asked, 4096)  # vLLM refuses more than its window
        return judge_reasoning(
            await self.client.chat(asked, max_tokens=room, chat_template_kwargs=kwargs),
            self.client.profile.gate_hints.get("reasoning", ""),
        )

    async def tools(self) -> Verdict:
        asked: list[dict[str, Any]] = [
            {"role": "user", "content": "What is the weather in Paris right now? Use the tool."}
        ]
        first = await self.client.chat(
            asked, tools=[WEATHER_TOOL], tool_choice="auto", max_tokens=1024
        )
        hint = self.client.profile.gate_hints.get("tools", "")
        (passed, measured, reason), call = judge_tool_call(first, hint)
        if not passed or call is None:
            return passed, measured, reason
        follow = [
            *asked,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {
                "role": "tool",
                "tool_call_id": call.get("id", "call-0"),
                "content": json.dumps(TOOL_RESULT),
            },
        ]
        second = await self.client.chat(follow, tools=[WEATHER_TOOL], max_tokens=1024)
        passed, more, reason = judge_tool_use(second)
        return passed, {**measured, **more}, reason

    async def context(self) -> Verdict:
        served = await self.client.served() or {}
        window = int(served.get("max_model_len") or 0)
        if window <= 0:
            return False, {}, "/v1/models does not say max_model_len, so the window is unknown"
        code = (
            f"{self.rng.choice('QXZKV')}{self.rng.randint(10, 99)}-{self.rng.randint(1000, 9999)}"
        )
        depth = round(self.rng.uniform(0.1, 0.9), 3)

        def asked(filler: list[str]) -> list[dict[str, Any]]:
            return [{"role": "user", "content": buried_prompt(filler, code, depth)}]

        async def counted(messages: list[dict[str, Any]]) -> int | None:
            return await self.client.count(messages=messages)

        # As the engine's own tokenizer counts it, chat template included (vLLM's /tokenize).
        target = min(int(window * self.settings.context_fraction), window - 48 - 1)
        messages, _ = await self.client.fitted(asked, counted, target)
        timed = await self.client.chat(messages, max_tokens=48, temperature=0)
        passed, measured, reason = judge_context(timed, code, window)
        return (
            passed,
            {**measured, "depth": depth, "fraction": self.settings.context_fraction},
            reason,
        )

    async def speed(self) -> Verdict:
        prompt = "Write a long story about a lighthouse keeper. " * 4
        await self.client.complete(prompt, SPEED_SHORT)  # warms the prefix cache
        short = await self.client.complete(prompt, SPEED_SHORT)
        long = await self.client.complete(prompt, SPEED_LONG)
        return judge_speed(short, long, self.settings.speed_min_tps)

    def deadline(self, gate: str) -> float:
        """How long a gate may take."""
        return self.settings.context_deadline if gate == "context" else self.settings.deadline


async def run_gates(
    client: EngineClient,
    settings: ChecksConfig,
    gates: Sequence[str] = GATES,
    last_cold_start: float | None = None,
    on_result: Callable[[GateResult], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[GateResult]:
    """Run the named gates in seed order; LaneNotRunning at once when the engine does not answer."""
    unknown = [g for g in gates if g not in GATES]
    if unknown:
        raise LaneError(f"unknown gate {unknown[0]!r}", "gates: " + ", ".join(GATES))
    if not await client.healthy():
        raise LaneNotRunning(
            f"{client.base_url} does not answer /health: the lane is not running",
            "activate it first (laned activate LANE --wait)",
        )
    runner = Gates(client, settings, last_cold_start)
    results = []
    for gate in [g for g in GATES if g in gates]:
        check: Callable[[], Awaitable[Verdict]] = getattr(runner, gate)
        started = clock()
        limit = runner.deadline(gate)
        try:
            passed, measured, reason = await asyncio.wait_for(check(), limit)
        except asyncio.TimeoutError:
            passed, measured = False, {}
            reason = f"no answer within its {limit:g}s deadline (is the engine stalled?)"
        except LaneError as exc:  # unreachable or refused: the engine's own words
            passed, measured, reason = False, {}, exc.message
        result = GateResult(gate, passed, measured, reason, clock() - started)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def merge_run(
    lane: str,
    last: dict[str, Any] | None,
    config_hash: str,
    results: Sequence[GateResult],
    at: float,
) -> dict[str, Any]:
    """The lane's acceptance record after a run: this run's gates over the earlier results of
    the same configuration (those of another configuration do not carry over)."""
    previous = (
        (last or {}).get("gates", {}) if (last or {}).get("config_hash") == config_hash else {}
    )
    gates = {**previous, **{r.gate: r.to_json() for r in results}}
    return {
        "lane": lane,
        "at": at,
        "config_hash": config_hash,
        "passed": all(g["passed"] for g in gates.values()),
        "gates": gates,
        "ran": [r.gate for r in results],
    }
