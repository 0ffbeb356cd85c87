"""Probes of an engine's HTTP API: /health, /v1/models (with the lane's key), /metrics.

Each probe answers a plain value or None; transport errors are an answer ("no"), never an
exception, because an engine that does not answer is exactly what probes are for.
"""

from __future__ import annotations

import asyncio
import socket

import httpx
from prometheus_client.parser import text_string_to_metric_families

from laned.core.liveness import EngineSample

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

    async def sample(self, port: int) -> EngineSample | None:
        """The numbers stall detection and the engine summary need, from /metrics."""
        try:
            response = await self.client.get(self.url(port, "/metrics"))
            if response.status_code != 200:
                return None
            return parse_engine_metrics(response.text)
        except (httpx.HTTPError, ValueError):
            return None


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
