"""`laned bench`: the recipe sweep of seed 001, measured the way seeds 001 and 004 measure.

- decode tok/s at 1, 2, 4 and 8 concurrent streams (aggregate): each stream's prompt is
  warmed first, then every stream asks for a 16-token and then a 400-token reply
  (`ignore_eos`); decode = the extra tokens over the extra wall time (seed 004's method:
  prefill and per-request overheads cancel out);
- prefill tok/s at 8k, 16k and 32k prompt tokens (capped by the window): a cold prompt (a
  fresh nonce first, so the prefix cache cannot help) and a 1-token reply;
- decode at long context: the same 16/400 difference on the longest prompt, now warm.

The JSON's fields mirror the recipe kit's submissions: prefill by context length, decode by
concurrency, and decode at long context.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from laned.adapters.engine_api import EngineClient, Timed

SHORT, LONG = 16, 400
CONCURRENCY = (1, 2, 4, 8)
CONTEXTS = (8192, 16384, 32768)
METHOD = (
    "decode: (400 - 16 tokens) / (t400 - t16) per stream, warm prefix, aggregate over streams; "
    "prefill: prompt tokens / time of a 1-token reply, cold prefix"
)


def decode_rate(
    short: Sequence[Timed], long: Sequence[Timed], short_wall: float, long_wall: float
) -> float:
    """Aggregate decode tok/s from the short and the long round (wall times of each round)."""
    extra = sum(t.completion_tokens for t in long) - sum(t.completion_tokens for t in short)
    elapsed = long_wall - short_wall
    return extra / elapsed if extra > 0 and elapsed > 0 else 0.0


def cold_prompt(filler: list[str]) -> str:
    """A prompt of filler sentences behind a prefix of its own: nothing of it is cached."""
    return f"[{uuid.uuid4().hex}] " + "".join(filler)


def context_sizes(window: int, wanted: Sequence[int], reply: int = LONG) -> list[int]:
    """The prompt sizes to measure: the wanted ones, capped so that prompt + reply fit the window."""
    cap = window - reply - 64
    return sorted({min(size, cap) for size in wanted if cap > 0})


async def _round(
    client: EngineClient, prompts: Sequence[str], tokens: int
) -> tuple[list[Timed], float]:
    started = time.monotonic()
    done = await asyncio.gather(*(client.complete(p, tokens) for p in prompts))
    return list(done), time.monotonic() - started


async def decode_at(client: EngineClient, prompts: Sequence[str]) -> float:
    """Aggregate decode tok/s with one stream per prompt (warmed first)."""
    await _round(client, prompts, 1)
    short, short_wall = await _round(client, prompts, SHORT)
    long, long_wall = await _round(client, prompts, LONG)
    return decode_rate(short, long, short_wall, long_wall)


async def run_bench(
    client: EngineClient,
    window: int,
    concurrency: Sequence[int] = CONCURRENCY,
    contexts: Sequence[int] = CONTEXTS,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """The sweep; `progress` hears a line before each step and after each figure."""
    out: dict[str, Any] = {
        "model": client.model,
        "max_model_len": window,
        "method": METHOD,
        "decode_tok_s": {},
        "prefill_tok_s": {},
        "decode_long_context_tok_s": {},
    }
    for streams in concurrency:
        progress(f"decode at {streams} stream(s)...")
        prompts = [
            f"Stream {i}: write a long story about a lighthouse keeper. " * 4
            for i in range(streams)
        ]
        rate = await decode_at(client, prompts)
        out["decode_tok_s"][str(streams)] = round(rate, 2)
        progress(f"decode at {streams} stream(s): {rate:.1f} tok/s")
    longest: str | None = None
    for size in context_sizes(window, contexts):
        progress(f"prefill at {size} tokens...")
        prompt, _ = await client.fitted(cold_prompt, client.count_prompt, size)
        timed = await client.complete(prompt, 1)
        rate = timed.prompt_tokens / timed.seconds if timed.seconds > 0 else 0.0
        out["prefill_tok_s"][str(size)] = round(rate, 2)
        progress(f"prefill at {size} tokens ({timed.prompt_tokens} counted): {rate:.0f} tok/s")
        longest = prompt
    if longest is not None:
        size = max(int(k) for k in out["prefill_tok_s"])
        progress(f"decode at {size} tokens of context...")
        rate = await decode_at(client, [longest])
        out["decode_long_context_tok_s"][str(size)] = round(rate, 2)
        progress(f"decode at {size} tokens of context: {rate:.1f} tok/s")
    return out


def table(result: dict[str, Any]) -> str:
    """The sweep as a small table."""
    lines = [
        f"{result.get('lane', result['model'])}: {result['model']}, window {result['max_model_len']}"
    ]
    lines.append(
        "  decode, aggregate tok/s: "
        + ", ".join(f"C{k} {v:,.1f}" for k, v in result["decode_tok_s"].items())
    )
    lines.append(
        "  prefill tok/s:           "
        + ", ".join(f"{int(k) // 1024}k {v:,.0f}" for k, v in result["prefill_tok_s"].items())
    )
    lines.append(
        "  decode at long context:  "
        + ", ".join(
            f"C1 at {int(k) // 1024}k {v:,.1f}"
            for k, v in result["decode_long_context_tok_s"].items()
        )
    )
    return "\n".join(lines)
