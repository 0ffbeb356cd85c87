"""Each engine's knowledge in one module (an engine profile): how laned reads its log lines,
its /metrics, its API key's name. `profile.EngineProfile` is the shape; `vllm` the first
(and, for now, the only) engine. Pure: data and pure functions.

`for_lane(spec)` is the profile of a lane's engine.
"""

from __future__ import annotations

from laned.config.model import LaneConfig
from laned.engines.profile import EngineProfile
from laned.engines.vllm import VLLM


def for_lane(spec: LaneConfig) -> EngineProfile:
    """The profile of the lane's engine (every lane runs vLLM today)."""
    return VLLM


__all__ = ["VLLM", "EngineProfile", "for_lane"]
