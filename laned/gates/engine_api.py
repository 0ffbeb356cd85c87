"""A small client of an engine's OpenAI-compatible API, for the acceptance checks and the bench.

Timed, non-streaming requests with the usage the engine reports, and prompts sized to a
number of *the engine's own* tokens: a probe request estimates how many tokens a filler
sentence costs on this tokenizer, and vLLM's /tokenize counts the prompt as built (chat
template included), so a prompt fills 85% of any model's window, never more, without knowing
its tokenizer (a byte-level BPE does not cost the same per sentence at every length).
Transport problems become EngineUnreachable; an error answer becomes EngineRefused with the
engine's own message.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from laned.adapters.probes import ENGINE_POOL
from laned.errors import EngineRefused, EngineUnreachable

T = TypeVar("T")

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
    # A pool of connections to share: the owner passes its probe's, one pool per laned for
    # the engines it watches. None: a pool of its own, closed by `close()`.
    pool: httpx.AsyncClient | None = None
    _per_sentence: tuple[int, float] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self.http = self.pool or httpx.AsyncClient(limits=ENGINE_POOL)

    async def close(self) -> None:
        """Close its own connection pool (a shared one stays its owner's)."""
        if self.pool is None:
            await self.http.aclose()

    def _url(self, path: str) -> str:
        return self.base_url.rstrip("/") + path

    async def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout: float = 0
    ) -> httpx.Response:
        return await self.http.request(
            method,
            self._url(path),
            json=None if body is None else {"model": self.model, **body},
            headers=self._headers,
            timeout=timeout or self.timeout,
        )

    async def _post(self, path: str, body: dict[str, Any]) -> Timed:
        started = time.monotonic()
        try:
            response = await self._request("POST", path, body)
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
            return (await self._request("GET", "/health", timeout=timeout)).status_code == 200
        except httpx.HTTPError:
            return False

    async def served(self, timeout: float = 10.0) -> dict[str, Any] | None:
        """The model's entry in /v1/models (with max_model_len where vLLM lists it), or None."""
        try:
            response = await self._request("GET", "/v1/models", timeout=timeout)
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
            # The engine's /tokenize counts without generating; else a one-token completion
            # each. 16 sentences: 64 overflowed a 2048-token window on a small tokenizer.
            n = 16
            base, probe = (
                await self.count(prompt="Hi."),
                await self.count(prompt="Hi. " + FILLER * n),
            )
            if base is None or probe is None:
                base = (await self.complete("Hi.", 1)).prompt_tokens
                probe = (await self.complete("Hi. " + FILLER * n, 1)).prompt_tokens
            self._per_sentence = (base, max((probe - base) / n, 1.0))
        return self._per_sentence

    async def filler(self, tokens: int) -> list[str]:
        """Filler sentences that come to about `tokens` of the engine's tokens."""
        base, per = await self.sentence_cost()
        return [FILLER] * max(int((tokens - base) / per), 0)

    async def count(
        self, *, messages: list[dict[str, Any]] | None = None, prompt: str | None = None
    ) -> int | None:
        """The prompt's tokens as the engine's own tokenizer counts them, chat template
        included for `messages` (vLLM's POST /tokenize); None where the engine has none."""
        body: dict[str, Any] = (
            {"messages": messages} if messages is not None else {"prompt": prompt}
        )
        try:
            response = await self._request("POST", "/tokenize", body)
            return int(response.json()["count"]) if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    async def count_prompt(self, prompt: str) -> int | None:
        """A completion prompt's tokens as the engine counts them (None: it cannot say)."""
        return await self.count(prompt=prompt)

    async def room(self, messages: list[dict[str, Any]], wanted: int) -> int:
        """`wanted` tokens of answer, or what the window leaves after the prompt (counted
        by the engine's /tokenize where it has one): never a max_tokens the engine refuses."""
        window = int((await self.served() or {}).get("max_model_len") or 0)
        if window <= 0:
            return wanted
        used = await self.count(messages=messages)
        return max(min(wanted, window - (used or 0) - 1), 1)

    async def fitted(
        self,
        make: Callable[[list[str]], T],
        counted: Callable[[T], Awaitable[int | None]],
        tokens: int,
    ) -> tuple[T, int | None]:
        """What `make` builds from filler sentences, as close to `tokens` of the engine's own
        tokens as whole sentences allow, never over where the engine can count (/tokenize):
        the estimate first, then trimmed by what the engine counts. With its count."""
        filler = await self.filler(tokens)
        _, per = await self.sentence_cost()
        for _ in range(8):
            built = make(filler)
            n = await counted(built)
            if n is None or n <= tokens or not filler:
                return built, n
            filler = filler[: max(len(filler) - math.ceil((n - tokens) / per) - 1, 0)]
        built = make(filler)
        return built, await counted(built)
