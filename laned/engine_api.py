"""A small client of an engine's OpenAI-compatible API, for the acceptance checks and the bench.

Timed, non-streaming requests with the usage the engine reports, and prompts sized to a
number of *the engine's own* tokens: a probe request measures how many tokens a filler
sentence costs on this tokenizer, so a prompt can fill 85% of any model's window without
knowing its tokenizer. Transport problems become EngineUnreachable; an error answer
becomes EngineRefused with the engine's own message.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from laned.errors import EngineRefused, EngineUnreachable
from laned.probes import ENGINE_POOL

FILLER = (
    "The river bends slowly around the old mill, where the water turns a wooden wheel "
    "that once ground flour for the whole valley. "
)


@dataclass(frozen=True)
class Timed:
    """One completed request: how long it took and what the engine counted."""

    seconds: float
    prompt_tokens: int
    completion_tokens: int
    body: dict[str, Any]

    @property
    def choice(self) -> dict[str, Any]:
        """The first choice."""
        choices = self.body.get("choices") or [{}]
        return dict(choices[0])


@dataclass
class EngineClient:
    """The engine at `base_url` (http://host:port), serving `model`, with an optional key."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout: float = 3600.0
    _per_sentence: tuple[int, float] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.http = httpx.AsyncClient(
            base_url=self.base_url.rstrip("/"),
            headers=headers,
            timeout=self.timeout,
            limits=ENGINE_POOL,
        )

    async def close(self) -> None:
        """Close the connection pool."""
        await self.http.aclose()

    async def _post(self, path: str, body: dict[str, Any]) -> Timed:
        started = time.monotonic()
        try:
            response = await self.http.post(path, json={"model": self.model, **body})
        except httpx.HTTPError as exc:
            raise EngineUnreachable(
                f"{self.base_url}{path}: {type(exc).__name__} {exc}".rstrip(),
                "is the lane running? (laned status)",
            ) from exc
        seconds = time.monotonic() - started
        try:
            data = response.json()
        except ValueError:
            data = {}
        if response.status_code != 200:
            error = data.get("error") if isinstance(data, dict) else None
            text = error.get("message") if isinstance(error, dict) else str(error or data)
            raise EngineRefused(
                f"{self.base_url}{path} answered {response.status_code}: {text}",
                "see the lane's log (laned logs LANE)",
            )
        usage = data.get("usage") or {}
        return Timed(
            seconds,
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            data,
        )

    async def healthy(self, timeout: float = 5.0) -> bool:
        """Whether /health answers 200 within `timeout`."""
        try:
            return (await self.http.get("/health", timeout=timeout)).status_code == 200
        except httpx.HTTPError:
            return False

    async def served(self, timeout: float = 10.0) -> dict[str, Any] | None:
        """The model's entry in /v1/models (with max_model_len where vLLM lists it), or None."""
        try:
            response = await self.http.get("/v1/models", timeout=timeout)
            entries = response.json().get("data", []) if response.status_code == 200 else []
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return next((dict(m) for m in entries if m.get("id") == self.model), None)

    async def chat(self, messages: list[dict[str, Any]], **options: Any) -> Timed:
        """POST /v1/chat/completions."""
        return await self._post("/v1/chat/completions", {"messages": messages, **options})

    async def complete(self, prompt: str, max_tokens: int, ignore_eos: bool = True) -> Timed:
        """POST /v1/completions for exactly `max_tokens` tokens (vLLM's ignore_eos)."""
        return await self._post(
            "/v1/completions",
            {
                "prompt": prompt,
                "max_tokens": max_tokens,
                "ignore_eos": ignore_eos,
                "temperature": 0,
            },
        )

    async def sentence_cost(self) -> tuple[int, float]:
        """(tokens of an empty prompt's template, tokens per filler sentence), measured once."""
        if self._per_sentence is None:
            base = await self.complete("Hi.", 1)
            probe = await self.complete("Hi. " + FILLER * 64, 1)
            per = max((probe.prompt_tokens - base.prompt_tokens) / 64, 1.0)
            self._per_sentence = (base.prompt_tokens, per)
        return self._per_sentence

    async def filler(self, tokens: int) -> list[str]:
        """Filler sentences that come to about `tokens` of the engine's tokens."""
        base, per = await self.sentence_cost()
        return [FILLER] * max(int((tokens - base) / per), 0)
