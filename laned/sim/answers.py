"""What the simulated engine says: tokens and deterministic answers (pure, no I/O).

Good enough for the acceptance checks of seed 002: a plain answer that stops on its
own, reasoning kept apart from the answer, 17 × 23 done right, a tool call with valid
JSON arguments and then use of its result, and recall of a code buried in a long prompt.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_PROMPT_TOKEN = re.compile(r"\w+|[^\w\s]")
_OUTPUT_TOKEN = re.compile(r"\s*\S+")
_ARITH = re.compile(r"(-?\d+(?:\.\d+)?)\s*([x×*+\-/÷])\s*(-?\d+(?:\.\d+)?)")
_CODE = re.compile(
    r"(?:code|passcode|password|secret|needle|key|token)\s*(?:is|was|:|=)\s*[\"'`]?"
    r"([A-Za-z0-9][A-Za-z0-9_-]{2,})",
    re.IGNORECASE,
)
_LONG = re.compile(r"\b(write|story|essay|explain in detail|describe at length|count)\b", re.I)

FILLER = (
    "The simulated engine keeps talking at its configured pace so that a client can "
    "measure decode speed, and every token it sends is counted in its metrics. "
)


def count_prompt_tokens(text: str) -> int:
    """Tokens in a prompt: words and punctuation marks (a stable stand-in for a tokenizer)."""
    return len(_PROMPT_TOKEN.findall(text))


def prompt_token_list(text: str) -> list[str]:
    """The prompt's tokens, for prefix-cache block hashing."""
    return _PROMPT_TOKEN.findall(text)


def split_output(text: str) -> list[str]:
    """Split output text into the tokens that are streamed one by one (joined, they are the text)."""
    return _OUTPUT_TOKEN.findall(text)


def message_text(message: dict[str, Any]) -> str:
    """The text of a chat message whose content is a string or a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def chat_prompt_tokens(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """Prompt tokens of a chat request: contents plus a few template tokens per message."""
    total = sum(count_prompt_tokens(message_text(m)) + 4 for m in messages)
    if tools:
        total += count_prompt_tokens(json.dumps(tools))
    return total + 2


@dataclass
class Answer:
    """What the engine will emit for one request."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    long: bool = False  # keep generating filler until max_tokens


def _format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def arithmetic(text: str) -> tuple[str, str] | None:
    """Solve the first `a op b` in text: (working, result); None when there is none."""
    match = _ARITH.search(text)
    if not match:
        return None
    a, op, b = float(match.group(1)), match.group(2), float(match.group(3))
    if op in "x×*":
        result, sign = a * b, "×"
    elif op == "+":
        result, sign = a + b, "+"
    elif op == "-":
        result, sign = a - b, "-"
    else:
        if b == 0:
            return (f"{_format_number(a)} ÷ 0 is undefined.", "undefined")
        result, sign = a / b, "÷"
    sa, sb, sr = _format_number(a), _format_number(b), _format_number(result)
    working = f"The question asks for {sa} {sign} {sb}."
    if sign == "×" and b >= 10 and b.is_integer() and a.is_integer():
        tens, ones = int(b) // 10 * 10, int(b) % 10
        working += (
            f" {sa} × {tens} = {_format_number(a * tens)}, {sa} × {ones} = {_format_number(a * ones)},"
            f" and {_format_number(a * tens)} + {_format_number(a * ones)} = {sr}."
        )
    else:
        working += f" That is {sr}."
    return working, sr


def find_code(text: str) -> str | None:
    """The code buried in a prompt (`the code is X7-...`): the last one that has a digit."""
    found = [m.group(1) for m in _CODE.finditer(text) if any(ch.isdigit() for ch in m.group(1))]
    return found[-1] if found else None


def _tool_keywords(tool: dict[str, Any]) -> set[str]:
    function = tool.get("function", {})
    words = re.split(r"[_\W]+", f"{function.get('name', '')} {function.get('description', '')}")
    stop = {"the", "and", "for", "with", "from", "that", "this", "into", "returns", "return", "get"}
    return {w.lower() for w in words if len(w) >= 4 and w.lower() not in stop}


def _argument_for(name: str, schema: dict[str, Any], text: str) -> Any:
    kind = schema.get("type", "string")
    if schema.get("enum"):
        for option in schema["enum"]:
            if str(option).lower() in text.lower():
                return option
        return schema["enum"][0]
    if kind in ("number", "integer"):
        match = re.search(r"-?\d+(?:\.\d+)?", text)
        number = float(match.group(0)) if match else 0.0
        return int(number) if kind == "integer" else number
    if kind == "boolean":
        return not re.search(r"\b(no|not|false|without)\b", text, re.I)
    quoted = re.search(r"[\"“']([^\"”']{1,80})[\"”']", text)
    if quoted:
        return quoted.group(1)
    place = re.search(r"\b(?:in|for|of|at|about|to)\s+((?:[A-Z][\w.-]*)(?:\s+[A-Z][\w.-]*)*)", text)
    if place:
        return place.group(1)
    capitals = re.findall(r"\b[A-Z][a-z][\w-]*", text)
    if capitals:
        return capitals[-1]
    words = re.findall(r"\w+", text)
    return words[-1] if words else name


def tool_call_for(tool: dict[str, Any], text: str, call_id: str) -> dict[str, Any]:
    """A call of `tool` whose arguments are read out of the user's text, as valid JSON."""
    function = tool.get("function", {})
    params = function.get("parameters") or {}
    properties = params.get("properties") or {}
    required = params.get("required") or list(properties)
    args = {name: _argument_for(name, properties.get(name, {}), text) for name in required}
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": function.get("name", "tool"), "arguments": json.dumps(args)},
    }


def _choose_tool(tools: list[dict[str, Any]], tool_choice: Any, text: str) -> dict[str, Any] | None:
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        wanted = tool_choice.get("function", {}).get("name")
        return next((t for t in tools if t.get("function", {}).get("name") == wanted), None)
    if tool_choice == "required":
        return tools[0]
    words = {w.lower() for w in re.findall(r"\w+", text)}
    for tool in tools:
        if _tool_keywords(tool) & words:
            return tool
    return None


def compose_chat(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    thinking: bool,
    model: str,
    call_id: str,
) -> Answer:
    """Decide the reply to a chat request, deterministically."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    question = message_text(messages[last_user]) if last_user >= 0 else ""
    tool_results = [m for m in messages[last_user + 1 :] if m.get("role") == "tool"]
    everything = "\n".join(message_text(m) for m in messages)
    if tool_results:
        result = message_text(tool_results[-1])
        return Answer(
            content=f"According to the tool, the result is: {result}",
            reasoning="The tool answered; I will report its result to the user.",
        )
    tool = _choose_tool(tools or [], tool_choice, question)
    if tool is not None:
        call = tool_call_for(tool, question, call_id)
        name = call["function"]["name"]
        return Answer(
            reasoning=f"The user needs {name}; I will call it with arguments taken from the request.",
            tool_calls=[call],
        )
    return compose_text(question, everything, thinking, model)


def compose_text(question: str, context: str, thinking: bool, model: str) -> Answer:
    """Decide the reply to a plain prompt (chat without tools, or a completion)."""
    # A question about a buried code first: the code itself may look like arithmetic (Q7-4821).
    if re.search(r"\b(code|passcode|password|secret|needle)\b", question, re.I):
        code = find_code(context)
        if code:
            return Answer(
                content=f"The code is {code}.", reasoning="I searched the text for the code."
            )
    math = arithmetic(question)
    if math is not None:
        working, result = math
        return Answer(
            content=f"{result}" if thinking else f"{working} The answer is {result}.",
            reasoning=working,
        )
    if _LONG.search(question):
        return Answer(content=FILLER, reasoning="The user wants a long text.", long=True)
    return Answer(
        content=f"This is {model}, served by laned's simulated engine. Your question was received.",
        reasoning="A short, direct answer is enough here.",
    )


def pieces(
    answer: Answer,
    thinking: bool,
    reasoning_parser: str | None,
    limit: int,
    ignore_eos: bool,
    runs_on: bool = False,
) -> list[tuple[str, str]]:
    """The tokens to emit, tagged `reasoning`, `content` or `tool`; one past `limit` when cut."""
    out: list[tuple[str, str]] = []
    if thinking and answer.reasoning:
        if reasoning_parser:
            out += [("reasoning", t) for t in split_output(answer.reasoning)]
        else:  # no parser: the thinking stays inline, as vLLM leaves it
            out += [("content", t) for t in split_output(f"<think>{answer.reasoning}</think> ")]
    for call in answer.tool_calls:
        out += [("tool", t) for t in split_output(call["function"]["arguments"])]
    out += [("content", t) for t in split_output(answer.content)]
    if runs_on and not answer.long:
        # The id the model ends its turn with is no stop id here (a --generation-config
        # DIR without the model's eos_token_id list): the turn marker comes out as text
        # and the model writes the next turn itself, until max_tokens (vLLM #45591).
        out.append(("content", "<|user|>"))
    if answer.long or ignore_eos or runs_on:
        filler = split_output(FILLER)
        while len(out) <= limit:
            out += [("content", t) for t in filler[: limit + 1 - len(out)]]
    return out


def tokenize(body: dict[str, Any], max_model_len: int) -> dict[str, Any]:
    """vLLM's /tokenize answer: a prompt's tokens, or a chat's with its template, counted as
    a request of the same prompt counts them (KeyError/TypeError on a body without either)."""
    if isinstance(body.get("messages"), list):
        tools = body.get("tools") if isinstance(body.get("tools"), list) else None
        count = chat_prompt_tokens(body["messages"], tools)
    else:
        count = count_prompt_tokens(str(body["prompt"])) + 1
    return {
        "count": count,
        "max_model_len": max_model_len,
        "tokens": list(range(count)),
        "token_strs": None,
    }
