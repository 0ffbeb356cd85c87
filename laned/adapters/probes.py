"""Probes of an engine's HTTP API: /health, /v1/models (with the lane's key), /metrics; and
vLLM's sleep mode (/sleep, /wake_up, /is_sleeping, reload_weights, /reset_prefix_cache).

Each probe answers a plain value or None; transport errors are an answer ("no"), never an
exception, because an engine that does not answer is exactly what probes are for. The
sleep-mode calls raise EngineUnreachable or EngineRefused instead: each one is a step laned
takes, and its caller says what failed. vLLM guards only /v1 (and a few other prefixes) with
its API key (vllm/entrypoints/serve/middleware/authenticate.py): the dev routes take none.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from laned.core import canary
from laned.core.liveness import EngineSample
from laned.errors import EngineRefused, EngineUnreachable

ENGINE_KEEP_ALIVE = 5.0  # vLLM's API server closes a connection idle this long (uvicorn)
# A pooled connection reused just as the engine closes it fails with ReadError although the
# engine is fine: a false probe failure, a failed gate. laned's clients of engines give
# pooled connections up well before the engine does (httpx keeps them 5 s by default).
ENGINE_POOL = httpx.Limits(keepalive_expiry=ENGINE_KEEP_ALIVE / 2)


class Probe:
    """HTTP probes against engines on this host."""

    def __init__(self, timeout: float = 5.0, host: str = "127.0.0.1") -> None:
        self.client = httpx.AsyncClient(timeout=timeout, limits=ENGINE_POOL)
        self.host = host

    async def close(self) -> None:
        """Close the connection pool."""
        await self.client.aclose()

    def url(self, port: int, path: str) -> str:
        """The engine URL for a path."""
        return f"http://{self.host}:{port}{path}"

    async def accepts(self, port: int) -> bool:
        """Whether the port takes a TCP connection: a refused connect costs about 45 µs of
        CPU (an HTTP probe a millisecond), so a close watch on a port about to open asks
        this first."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setblocking(False)
            try:
                await asyncio.get_running_loop().sock_connect(sock, (self.host, port))
            except OSError:
                return False
        return True

    async def health(self, port: int, path: str = "/health") -> bool:
        """Whether the health path answers 200."""
        try:
            return (await self.client.get(self.url(port, path))).status_code == 200
        except httpx.HTTPError:
            return False

    async def models(self, port: int, api_key: str | None) -> list[str] | None:
        """The model ids /v1/models lists (None when it does not answer with a list)."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            response = await self.client.get(self.url(port, "/v1/models"), headers=headers)
            if response.status_code != 200:
                return None
            return [str(m.get("id")) for m in response.json().get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    async def canary(
        self, port: int, model: str, api_key: str | None, timeout: float
    ) -> canary.Answer:
        """The canary's greedy completion (laned.core.canary): its token ids and text."""
        body = {
            "model": model,
            "prompt": canary.PROMPT,
            "max_tokens": canary.MAX_TOKENS,
            "temperature": 0,
            "return_token_ids": True,
        }
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        url = self.url(port, "/v1/completions")
        try:
            answer = await self.client.post(url, json=body, headers=headers, timeout=timeout)
            choice = answer.json()["choices"][0] if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise EngineUnreachable(f"POST {url}: {type(exc).__name__} {exc}".rstrip()) from exc
        if not isinstance(choice, dict):
            raise EngineRefused(f"POST {url} answered {answer.status_code}: {answer.text[:200]}")
        ids = choice.get("token_ids")
        token_ids = tuple(int(i) for i in ids) if isinstance(ids, list) else None
        return canary.Answer(token_ids, str(choice.get("text") or ""))

    # --- sleep mode (vLLM's dev routes: vllm/entrypoints/serve/dev/) ----------------------------

    async def sleep(self, port: int, level: int, timeout: float) -> None:
        """POST /sleep?level=N&mode=wait: `wait` lets a request still in flight end (laned
        drained them first; vLLM's default, `abort`, would cut it)."""
        await self._dev("POST", port, "/sleep", timeout, params={"level": level, "mode": "wait"})

    async def wake_up(self, port: int, timeout: float) -> bool:
        """POST /wake_up (every tag); whether the engine says it is fully awake."""
        answer = await self._dev("POST", port, "/wake_up", timeout)
        return _field(answer, "status") == "awake"

    async def is_sleeping(self, port: int, timeout: float = 10.0) -> bool:
        """GET /is_sleeping."""
        return _field(await self._dev("GET", port, "/is_sleeping", timeout), "is_sleeping") is True

    async def sleep_level(self, port: int) -> int | None:
        """The level the engine sleeps at, from its /metrics (`vllm:engine_sleep_state`:
        `weights_offloaded` 1 is level 1, `discard_all` 1 level 2); None when it cannot say."""
        try:
            response = await self.client.get(self.url(port, "/metrics"))
            lines = response.text.splitlines() if response.status_code == 200 else []
        except httpx.HTTPError:
            return None
        for line in lines:
            if line.startswith("vllm:engine_sleep_state{") and line.rstrip().endswith(" 1.0"):
                for state, level in (('"weights_offloaded"', 1), ('"discard_all"', 2)):
                    if f"sleep_state={state}" in line:
                        return level
        return None

    async def reload_weights(self, port: int, timeout: float) -> None:
        """After a level-2 wake: the weights read again (vLLM #29341: without it the engine
        answers, wrongly)."""
        await self._dev("POST", port, "/collective_rpc", timeout, json={"method": "reload_weights"})

    async def reset_prefix_cache(self, port: int, timeout: float = 30.0) -> None:
        """POST /reset_prefix_cache: no block computed with the old weights is reused."""
        await self._dev("POST", port, "/reset_prefix_cache", timeout)

    async def _dev(
        self,
        method: str,
        port: int,
        path: str,
        timeout: float,
        params: dict[str, Any] | None = None,
        json: dict[str, Any] | None = None,
    ) -> httpx.Response:
        url = self.url(port, path)
        try:
            answer = await self.client.request(
                method, url, params=params, json=json, timeout=timeout
            )
        except httpx.HTTPError as exc:
            raise EngineUnreachable(
                f"{method} {url}: {type(exc).__name__} {exc}".rstrip(),
                "see the lane's log (laned logs LANE)",
            ) from exc
        if answer.status_code != 200:
            hint = "see the lane's log (laned logs LANE)"
            if answer.status_code == 404:
                hint = (
                    "the engine serves no sleep routes: is VLLM_SERVER_DEV_MODE=1 in its wrapper?"
                )
            raise EngineRefused(
                f"{method} {url} answered {answer.status_code}: {answer.text[:200]}", hint
            )
        return answer

    async def sample(self, port: int) -> EngineSample | None:
        """The numbers stall detection and the engine summary need, from /metrics."""
        try:
            response = await self.client.get(self.url(port, "/metrics"))
            if response.status_code != 200:
                return None
            return parse_engine_metrics(response.text)
        except (httpx.HTTPError, ValueError):
            return None


def _field(answer: httpx.Response, key: str) -> object:
    try:
        body = answer.json()
    except ValueError:
        return None
    return body.get(key) if isinstance(body, dict) else None


# The engine's samples laned reads (vllm/v1/metrics/loggers.py names them).
SUMMED = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:iteration_tokens_total_count": "steps",
}
KV_USAGE = {"vllm:kv_cache_usage_perc": "kv", "vllm:gpu_cache_usage_perc": "gpu"}
WANTED = tuple(f"{name}{end}" for name in (*SUMMED, *KV_USAGE) for end in ("{", " "))


def parse_engine_metrics(text: str) -> EngineSample:
    """One sample of vLLM's /metrics: gauges and counters summed across engines (and models),
    the KV-cache usage as the fullest engine's — `vllm:kv_cache_usage_perc`, else the older
    `vllm:gpu_cache_usage_perc` (vLLM 0.9 and 0.10 export both, with the same value: they are
    never added) — and the engine steps taken (`vllm:iteration_tokens_total`'s count)."""
    values: dict[str, float] = {}
    # Only the few samples laned reads go to the parser: a data-parallel vLLM's page is
    # ~200 KB of histograms, and parsing it all cost ~30 ms of CPU a scrape (bench/cost.py).
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(WANTED))
    for family in text_string_to_metric_families(wanted):
        for sample in family.samples:
            if (key := SUMMED.get(sample.name)) is not None:
                values[key] = values.get(key, 0.0) + float(sample.value)
            elif (key := KV_USAGE.get(sample.name)) is not None:
                values[key] = max(values.get(key, 0.0), float(sample.value))
    return EngineSample(
        running=values.get("running", 0.0),
        waiting=values.get("waiting", 0.0),
        generation_tokens=values.get("generation_tokens", 0.0),
        prompt_tokens=values.get("prompt_tokens", 0.0),
        kv_cache_usage=values.get("kv", values.get("gpu", 0.0)),
        steps=values.get("steps", 0.0),
    )
