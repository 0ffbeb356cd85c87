"""The shapes of the simulated engine's answers: a job, its errors, and the OpenAI bodies
(whole, or streamed as Server-Sent Events) built from the pieces the engine emits."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from laned.errors import EngineDead
from laned.sim.http import Response

Run = AsyncGenerator[tuple[str, str], None]  # (kind, text) pieces: reasoning, content, tool


@dataclass
class Job:
    """One request's work: what to emit and how it ends."""

    prompt_text: str
    prompt_tokens: int
    pieces: list[tuple[str, str]]
    tool_calls: list[dict[str, Any]]
    truncated: bool  # cut short by max_tokens: finish_reason "length"
    token_ids: bool = False  # return_token_ids: the ids beside the text (completions)

    @property
    def finish_reason(self) -> str:
        """The OpenAI finish_reason."""
        if self.tool_calls:
            return "tool_calls"
        return "length" if self.truncated else "stop"


def token_id(piece: str) -> int:
    """A generated piece's token id: the same piece, the same id (a 151,936-token vocabulary,
    Qwen's and DeepSeek's size)."""
    return int.from_bytes(hashlib.sha256(piece.encode()).digest()[:4], "big") % 151936


def error(message: str, status: int, kind: str = "BadRequestError") -> Response:
    """vLLM's error body: `{"error": {"message", "type", "param", "code"}}`."""
    return Response.json(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}, status
    )


async def collect(run: Run, job: Job, chat: bool, model: str) -> Response:
    """The whole answer at once (stream: false), as vLLM's OpenAI server shapes it."""
    parts: dict[str, list[str]] = {"reasoning": [], "content": [], "tool": []}
    try:
        async for kind, text in run:
            parts[kind].append(text)
    except EngineDead:
        return error(
            "EngineCore encountered an issue. See stack trace for the root cause.",
            500,
            "EngineDeadError",
        )
    finally:
        await run.aclose()
    prompt_tokens, tool_calls, finish = job.prompt_tokens, job.tool_calls, job.finish_reason
    completion = sum(len(v) for v in parts.values())
    created, rid = int(time.time()), uuid.uuid4().hex
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": None,
    }
    if not chat:
        choice = {
            "index": 0,
            "text": "".join(parts["content"]),
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        if job.token_ids:  # vllm/entrypoints/openai/completion/serving.py: beside the text
            choice["token_ids"] = [token_id(piece) for piece in parts["content"]]
        return Response.json(
            {
                "id": f"cmpl-{rid}",
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [choice],
                "usage": usage,
            }
        )
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(parts["content"]) or None,
        "reasoning_content": "".join(parts["reasoning"]) or None,
        "tool_calls": tool_calls,
    }
    choice = {
        "index": 0,
        "message": message,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
    }
    return Response.json(
        {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage,
        }
    )


async def stream(
    run: Run, job: Job, chat: bool, include_usage: bool, model: str
) -> AsyncGenerator[bytes, None]:
    """The answer as Server-Sent Events (stream: true), ending with `data: [DONE]`."""
    created, rid = int(time.time()), uuid.uuid4().hex
    tool_calls, prompt_tokens = job.tool_calls, job.prompt_tokens
    obj = "chat.completion.chunk" if chat else "text_completion"
    ident = f"chatcmpl-{rid}" if chat else f"cmpl-{rid}"

    def event(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        data: dict[str, Any] = {
            "id": ident,
            "object": obj,
            "created": created,
            "model": model,
            "choices": choices,
        }
        if usage is not None:
            data["usage"] = usage
        return b"data: " + json.dumps(data).encode() + b"\n\n"

    def choice(delta: dict[str, Any] | str, finish: str | None = None) -> dict[str, Any]:
        if chat:
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}

    completion = 0
    try:
        if chat:
            yield event([choice({"role": "assistant", "content": ""})])
        started_tool = False
        # Cut at max_tokens, the last token's event carries finish_reason "length", as vLLM
        # sends it (one event per output: vllm/entrypoints/openai/completion/serving.py and
        # chat_completion/serving.py); a natural stop ends with its own (the EOS step's).
        last = len(job.pieces) if job.truncated and not tool_calls else -1
        async for kind, text in run:
            completion += 1
            ends = "length" if completion == last else None
            if not chat:
                yield event([choice(text, ends)])
            elif kind == "tool":
                call = tool_calls[0]
                delta: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
                if not started_tool:
                    delta = {
                        "index": 0,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": text},
                    }
                    started_tool = True
                yield event([choice({"tool_calls": [delta]})])
            else:
                yield event(
                    [
                        choice(
                            {"reasoning_content" if kind == "reasoning" else "content": text}, ends
                        )
                    ]
                )
        if completion != last:
            yield event([choice({} if chat else "", job.finish_reason)])
        if include_usage:
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
            }
            yield event([], usage)
    except EngineDead:
        error = {
            "error": {
                "message": "EngineCore encountered an issue.",
                "type": "EngineDeadError",
                "code": 500,
            }
        }
        yield b"data: " + json.dumps(error).encode() + b"\n\n"
    finally:
        await run.aclose()
    yield b"data: [DONE]\n\n"
