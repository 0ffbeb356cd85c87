"""How requests at laned's OpenAI endpoint wait and share a group's GPUs: `[daemon.proxy]`
(or `[lanes.X.proxy]`), and `[groups.X]` (docs/proxy.md; the decisions themselves are
laned.core.schedule); how a swap prepares the next lane while it waits: `[daemon.prefetch]`."""

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


class PrefetchConfig(StrictModel):
    """`[daemon.prefetch]`: the next lane's weights read into the page cache while its swap
    waits for the running lane to drain and stop (docs/prefetch.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    enabled: bool = True
    max_gibps: float = Field(default=4.0, ge=0)  # read no faster (0: the disk's own pace)
    margin_gib: float = Field(default=8.0, ge=0)  # MemAvailable this much is never filled
