"""laned's one client of an engine's HTTP API (the proxy's upstream.Pool aside: that is the hot
path's transport): what the watchers probe (/health, /v1/models, /metrics), the canary, the
engine's sleep routes, and what the acceptance checks and the bench ask (timed chat and
completions, the tokenizer). What differs between engines (metric names, sleep routes, the
tokenizer's request) is the engine's profile's (laned.engines): this client makes the calls. `laned.adapters.probes.Probe` holds the connection pool every client of a running
laned shares.

Probes answer a plain value or None; transport errors are an answer ("no"), never an
exception, because an engine that does not answer is exactly what probes are for. Requests
that are steps laned takes (the canary, a sleep, a wake, a gate's request) raise
EngineUnreachable or EngineRefused instead, and their caller says what failed. vLLM guards
only /v1 (and a few other prefixes) with its API key
(vllm/entrypoints/serve/middleware/authenticate.py): the dev routes take none.

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
from prometheus_client.parser import text_string_to_metric_families

from laned import engines
from laned.core import canary
from laned.core.liveness import UNANSWERED, EngineSample, Unanswered
from laned.engines.profile import Call, EngineProfile, MetricNames
from laned.errors import EngineRefused, EngineUnreachable

ENGINE_KEEP_ALIVE = 5.0  # vLLM's API server closes a connection idle this long (uvicorn)
# A pooled connection reused just as the engine closes it fails with ReadError although the
# engine is fine: a false probe failure, a failed gate. laned's clients of engines give
# pooled connections up well before the engine does (httpx keeps them 5 s by default).
ENGINE_POOL = httpx.Limits(keepalive_expiry=ENGINE_KEEP_ALIVE / 2)
DEV_HINT = "see the lane's log (laned logs LANE)"

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
    profile: EngineProfile = engines.DEFAULT
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

    async def _post(self, path: str, body: dict[str, Any], timeout: float = 0) -> Timed:
        started = time.monotonic()
        try:
            response = await self._request("POST", path, body, timeout)
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

    # --- probes: a plain answer, never an exception ----------------------------------------

    async def healthy(self, timeout: float = 5.0, path: str = "/health") -> bool:
        """Whether the health path answers 200 within `timeout`."""
        return await self.health(timeout, path) == 200

    async def health(self, timeout: float = 5.0, path: str = "/health") -> int | None:
        """The status the health path answers with within `timeout`; None without an answer."""
        try:
            return (await self._request("GET", path, timeout=timeout)).status_code
        except httpx.HTTPError:
            return None

    async def listed(self) -> list[str] | None:
        """The model ids /v1/models lists (None when it does not answer with a list)."""
        try:
            response = await self._request("GET", "/v1/models")
            if response.status_code != 200:
                return None
            return [str(m.get("id")) for m in response.json().get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    async def metrics(self) -> str | None:
        """The text of its /metrics; None when it does not answer 200."""
        try:
            response = await self._request("GET", "/metrics")
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None

    async def sample(self) -> EngineSample | Unanswered | None:
        """The numbers stall detection and the engine summary need, from /metrics;
        UNANSWERED when the engine gave no answer in time; None when it answered without
        them (no page, another status, a page laned cannot read)."""
        try:
            response = await self._request("GET", "/metrics")
        except httpx.HTTPError:
            return UNANSWERED
        if response.status_code != 200:
            return None
        try:
            return parse_engine_metrics(response.text, self.profile.metrics)
        except ValueError:
            return None

    async def sleep_level(self) -> int | None:
        """The level the engine sleeps at, from its /metrics where the engine says it there;
        None when it cannot say."""
        if self.profile.sleep is None:
            return None
        return self.profile.sleep.level_in_metrics(await self.metrics() or "")

    # --- the canary (laned.core.canary) ------------------------------------------------------

    async def canary(self, timeout: float) -> canary.Answer:
        """The canary's greedy completion: its token ids and text."""
        body = {
            "prompt": canary.PROMPT,
            "max_tokens": canary.MAX_TOKENS,
            "temperature": 0,
            "return_token_ids": True,
        }
        timed = await self._post("/v1/completions", body, timeout)
        choices = timed.body.get("choices") if isinstance(timed.body, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict):
            url = self._url("/v1/completions")
            raise EngineRefused(f"POST {url} answered with no choice: {str(timed.body)[:200]}")
        ids = choice.get("token_ids")
        token_ids = tuple(int(i) for i in ids) if isinstance(ids, list) else None
        return canary.Answer(token_ids, str(choice.get("text") or ""))

    # --- sleep mode (the engine's routes: laned.engines.profile.SleepApi) --------------------

    def _sleep_api(self) -> Any:
        if self.profile.sleep is None:
            raise EngineRefused(f"{self.profile.title} cannot sleep", "set sleep_level = 0")
        return self.profile.sleep

    async def sleep(self, level: int, timeout: float) -> None:
        """Put the engine to sleep at `level` (vLLM: POST /sleep?level=N&mode=wait, `wait`
        letting a request still in flight end; laned drained them first)."""
        await self._call(self._sleep_api().sleep(level), timeout)

    async def wake_up(self, level: int, timeout: float) -> bool:
        """Wake the engine asleep at `level` (every tag), then what a wake at that level
        needs (after a level-2 wake, vLLM's weights read again and its prefix cache reset,
        vLLM #29341); whether the engine says it is fully awake."""
        api = self._sleep_api()
        answer = await self._call(api.wake, timeout)
        for call in api.after_wake.get(level, ()):
            await self._call(call, timeout)
        return api.awake is None or bool(api.awake(_json(answer)))

    async def is_sleeping(self, timeout: float = 10.0) -> bool | None:
        """The engine's word on whether it sleeps; None where it has no such route."""
        api = self._sleep_api()
        if api.is_sleeping is None:
            return None
        return bool(api.asleep(_json(await self._call(api.is_sleeping, timeout))))

    async def _call(self, call: Call, timeout: float) -> httpx.Response:
        url = self._url(call.path)
        method = call.method
        try:
            answer = await self.http.request(
                method,
                url,
                params=None if call.params is None else dict(call.params),
                json=None if call.body is None else dict(call.body),
                headers=self._headers,
                timeout=timeout,
            )
        except httpx.HTTPError as exc:
            raise EngineUnreachable(
                f"{method} {url}: {type(exc).__name__} {exc}".rstrip(), DEV_HINT
            ) from exc
        if answer.status_code != 200:
            hint = DEV_HINT
            if answer.status_code == 404 and self.profile.sleep is not None:
                hint = self.profile.sleep.missing
            raise EngineRefused(
                f"{method} {url} answered {answer.status_code}: {answer.text[:200]}", hint
            )
        return answer

    # --- what the checks and the bench ask ---------------------------------------------------

    async def served(self, timeout: float = 10.0) -> dict[str, Any] | None:
        """The model's entry in /v1/models, or None; with `max_model_len`, the window a request
        may fill, where the engine says it (laned.engines.profile.EngineProfile.window)."""
        try:
            response = await self._request("GET", "/v1/models", timeout=timeout)
            entries = response.json().get("data", []) if response.status_code == 200 else []
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        entry = next((dict(m) for m in entries if m.get("id") == self.model), None)
        if entry is not None and (window := self.profile.window(entry)) is not None:
            entry["max_model_len"] = window  # the engine's window under vLLM's name
        return entry

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
        included for `messages` (vLLM's and SGLang's POST /tokenize, llama-server's for a
        prompt); None where the engine cannot count it."""
        tokenizer = self.profile.tokenizer
        if tokenizer is None:
            return None
        try:
            call = tokenizer.call(messages, prompt)
            if call is None and messages is not None and tokenizer.template is not None:
                rendered = await self._answer(tokenizer.template(messages))
                call = (
                    None
                    if rendered is None
                    else tokenizer.call(None, tokenizer.templated(rendered))
                )
            counted = None if call is None else await self._answer(call)
            return None if counted is None else tokenizer.count(counted)
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    async def _answer(self, call: Call) -> Any:
        """The JSON of a 200 answer to `call` (None for another status); HTTPError, ValueError
        as they come."""
        response = await self._request(call.method, call.path, dict(call.body or {}))
        return response.json() if response.status_code == 200 else None

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


def _json(answer: httpx.Response) -> Any:
    try:
        return answer.json()
    except ValueError:
        return None


def parse_engine_metrics(text: str, names: MetricNames = engines.DEFAULT.metrics) -> EngineSample:
    """One sample of an engine's /metrics by its `names` (laned.engines; vLLM's by default):
    gauges and counters summed across engines (and models), a usage as the fullest
    engine's (the first of its names that is there: vLLM's KV-cache usage has an older name
    too, exported beside it with the same value, never added)."""
    values: dict[str, float] = {}
    # Only the few samples laned reads go to the parser: a data-parallel vLLM's page is
    # ~200 KB of histograms, and parsing it all cost ~30 ms of CPU a scrape (bench/cost.py).
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(names.prefixes))
    for family in text_string_to_metric_families(wanted):
        for sample in family.samples:
            if (key := names.summed.get(sample.name)) is not None:
                values[key] = values.get(key, 0.0) + float(sample.value)
            elif (key := names.fullest.get(sample.name)) is not None:
                values[key] = max(values.get(key, 0.0), float(sample.value))
    return EngineSample(
        running=values.get("running", 0.0),
        waiting=values.get("waiting", 0.0),
        generation_tokens=values.get("generation_tokens", 0.0),
        prompt_tokens=values.get("prompt_tokens", 0.0),
        kv_cache_usage=values.get("kv", values.get("gpu", 0.0)),
        steps=values.get("steps", 0.0),
    )
