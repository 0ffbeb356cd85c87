"""What laned must know of an engine, as one record (laned.engines.vllm is one)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from laned.core.phases import Seen


@dataclass(frozen=True)
class MetricNames:
    """The engine's /metrics samples laned reads, by laned's own names: each of `summed`
    adds up across the engine's processes and models (running, waiting, generation_tokens,
    prompt_tokens, steps); each of `fullest` is a usage of which the fullest counts (kv,
    then an older name of the same figure)."""

    summed: Mapping[str, str]
    fullest: Mapping[str, str]

    @property
    def prefixes(self) -> tuple[str, ...]:
        """The start of every line of a /metrics page that carries a sample laned reads."""
        return tuple(f"{name}{end}" for name in (*self.summed, *self.fullest) for end in ("{", " "))


@dataclass(frozen=True)
class EngineProfile:
    """One engine: its name, the environment variable its API key is read from (never
    argv), its /metrics names, and what its log lines say of a start."""

    name: str
    api_key_env: str
    metrics: MetricNames
    read_line: Callable[[str], Seen | None]
