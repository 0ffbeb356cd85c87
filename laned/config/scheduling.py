"""How requests at laned's OpenAI endpoint wait and share a group's GPUs: `[daemon.proxy]`
(or `[lanes.X.proxy]`), and `[groups.X]` (docs/proxy.md). The decisions themselves are
laned.core.schedule."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from laned.config.base import Duration, StrictModel


class ProxyConfig(StrictModel):
    """`[daemon.proxy]` (or `[lanes.X.proxy]`): requests for a lane that is starting wait."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    queue_limit: int = Field(default=64, ge=0)  # requests waiting for one lane, at most
    queue_timeout: Duration = 1800.0  # how long one waits for its lane to be ready


class GroupConfig(StrictModel):
    """`[groups.X]`: a group of lanes that share GPUs, where requests alone would leave it."""

    default_lane: str | None = None  # the lane the group returns to after idle_return
    idle_return: Duration | None = None  # no request this long: back to default_lane
