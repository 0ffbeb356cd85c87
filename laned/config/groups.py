"""The explicit groups of lanes (lanes of one group never run together; which others may
is derived from their GPU memory: laned.core.placement), each group's default lane and idle
return (docs/proxy.md, "Several models"), and the rules of `[groups.X]`, `pinned`,
`priority` and `min_residency`. Pure."""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from laned.config.model import Config
from laned.errors import Finding, Severity


def groups(config: Config) -> list[str]:
    """The groups the lanes name, sorted."""
    return sorted({spec.group for spec in config.lanes.values() if spec.group is not None})


def port_sharers(config: Config, lane: str) -> list[str]:
    """The other lanes on the lane's port: only one of them can listen at a time."""
    port = config.lanes[lane].port
    return sorted(n for n, s in config.lanes.items() if n != lane and s.port == port)


def default_lanes(config: Config) -> list[tuple[str, float | None]]:
    """Every lane that is someone's default (`[groups.X] default_lane`, `daemon.default_lane`),
    with its idle return (None: never)."""
    out = {}
    for group in groups(config):
        lane = default_lane(config, group)
        if lane is not None and lane in config.lanes:
            out[lane] = idle_return(config, group)
    lane = config.daemon.default_lane
    if lane is not None and lane in config.lanes and lane not in out:
        out[lane] = config.daemon.idle_return
    return sorted(out.items())


def default_lane(config: Config, group: str) -> str | None:
    """The lane the group returns to: `[groups.X] default_lane`, else daemon.default_lane
    where that lane is of the group."""
    table = config.groups.get(group)
    if table is not None and table.default_lane is not None:
        return table.default_lane
    lane = config.daemon.default_lane
    spec = config.lanes.get(lane) if lane is not None else None
    return lane if spec is not None and spec.group == group else None


def idle_return(config: Config, group: str) -> float | None:
    """After how long with no request the group returns to its default lane (None: never)."""
    table = config.groups.get(group)
    if table is not None and table.idle_return is not None:
        return table.idle_return
    return config.daemon.idle_return


def check_groups(config: Config) -> Iterator[Finding]:
    """Every problem of `[groups.X]` and of the lanes' scheduling keys."""
    named = groups(config)
    for group, table in sorted(config.groups.items()):
        where = f"groups.{group}"
        if group not in named:
            close = difflib.get_close_matches(group, named, n=1)
            hint = (
                f"did you mean {close[0]!r}?"
                if close
                else f"lanes' groups: {', '.join(named) or 'none'}"
            )
            yield Finding(where, f"no lane is of group {group!r}", hint)
        lane = table.default_lane
        if lane is not None:
            if lane not in config.lanes:
                close = difflib.get_close_matches(lane, list(config.lanes), n=1)
                hint = (
                    f"did you mean {close[0]!r}?" if close else "name one of the [lanes.*] tables"
                )
                yield Finding(f"{where}.default_lane", f"no lane named {lane!r}", hint)
            elif config.lanes[lane].group != group:
                of = config.lanes[lane].group
                yield Finding(
                    f"{where}.default_lane",
                    f"lane {lane!r} is of {f'group {of!r}' if of else 'no group'}, not {group!r}",
                    f"name a lane of group {group!r}, or set its group",
                )
        if table.idle_return is not None and default_lane(config, group) is None:
            yield Finding(
                f"{where}.idle_return",
                "is set but the group has no default lane to return to",
                f"set groups.{group}.default_lane",
                Severity.WARNING,
            )
    returns = [(config.daemon.idle_return, "daemon.idle_return")]
    returns += [
        (t.idle_return, f"groups.{g}.idle_return") for g, t in sorted(config.groups.items())
    ]
    for value, where in returns:
        if value is not None and value <= 0:
            yield Finding(where, f"is {value:g} s", 'give a duration, e.g. "30m"')
    for name, spec in sorted(config.lanes.items()):
        if spec.min_residency is not None and spec.min_residency < 0:
            yield Finding(f"lanes.{name}.min_residency", "is negative", 'e.g. "5m", or 0')
