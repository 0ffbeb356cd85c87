"""Lanes over several hosts (seed 002: a head and a headless worker): each host runs its own
rank of the lane, with the `${NAME}` placeholders of the lane filled for that rank.

Pure. The same config file serves every host; `daemon.host` says which one this is. On
each host the lane's spec is resolved to its own rank (`for_host`): placeholders filled
from the lane's `values`, then the rank's `values` (NODE_RANK and NNODES are laned's own),
the rank's `args` appended and its `env` merged. Everything downstream (units, wrappers,
preflight, the supervisor) then sees one concrete lane, as on a single host. A lane whose
`nodes` do not name this host is not this host's: it is left out of the config here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from urllib.parse import urlsplit

from laned.config.model import Arg, Config, ContainerSpec, EnvVar, ExecSpec, LaneConfig
from laned.config.sleep import loopback
from laned.errors import Finding, Severity

PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def rank_here(config: Config, lane: str) -> int | None:
    """This host's rank in the lane (None: a one-host lane, or not on this host)."""
    hosts = [node.host for node in config.lanes[lane].nodes]
    return hosts.index(config.daemon.host) if config.daemon.host in hosts else None


def values_for(spec: LaneConfig, rank: int) -> dict[str, str]:
    """What each placeholder of the lane means on `rank`."""
    own = {"NODE_RANK": str(rank), "NNODES": str(len(spec.nodes))}
    per_rank = spec.rank.get(str(rank))
    return {**spec.values, **(per_rank.values if per_rank else {}), **own}


def _fill(text: str, values: Mapping[str, str]) -> str:
    return PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def resolve(spec: LaneConfig, rank: int) -> LaneConfig:
    """The lane as rank `rank` runs it: placeholders filled, the rank's args and env added."""
    values = values_for(spec, rank)
    per_rank = spec.rank.get(str(rank))
    args = [*spec.args, *(per_rank.args if per_rank else ())]
    env = {**spec.env, **(per_rank.env if per_rank else {})}
    update: dict[str, object] = {
        "args": tuple(
            Arg(
                flag=_fill(a.flag, values),
                value=None if a.value is None else _fill(a.value, values),
                why=a.why,
            )
            for a in args
        ),
        "env": {
            k: EnvVar(value=_fill(v.value, values), why=v.why, secret=v.secret)
            for k, v in env.items()
        },
    }
    if spec.container is not None:
        c = spec.container
        update["container"] = ContainerSpec.model_construct(
            **{
                **dict(c),
                "command": tuple(_fill(w, values) for w in c.command),
                "volumes": tuple(_fill(w, values) for w in c.volumes),
                "devices": tuple(_fill(w, values) for w in c.devices),
                "podman_args": tuple(_fill(w, values) for w in c.podman_args),
            }
        )
    if spec.exec is not None:
        update["exec"] = ExecSpec(command=tuple(_fill(w, values) for w in spec.exec.command))
    return spec.model_copy(update=update)


def for_host(config: Config) -> Config:
    """The config as this host runs it: each lane over several hosts resolved to this host's
    rank; one whose nodes do not name this host left out (`elsewhere` keeps its name)."""
    lanes: dict[str, LaneConfig] = {}
    elsewhere: list[str] = []
    for name, spec in config.lanes.items():
        if not spec.nodes:
            lanes[name] = spec
            continue
        rank = rank_here(config, name)
        if rank is None:
            elsewhere.append(name)
        else:
            lanes[name] = resolve(spec, rank)
    daemon = config.daemon
    if daemon.default_lane in elsewhere:  # another host's: nothing to start here at boot
        daemon = daemon.model_copy(update={"default_lane": None})
    return config.model_copy(
        update={"lanes": lanes, "elsewhere": tuple(elsewhere), "daemon": daemon}
    )


def check_nodes(config: Config) -> Iterator[Finding]:
    """The nodes of each lane over several hosts, and a value for every placeholder on
    every rank."""
    for name, spec in config.lanes.items():
        base = f"lanes.{name}"
        if not spec.nodes:
            if spec.rank or spec.values:
                yield Finding(
                    f"{base}.rank" if spec.rank else f"{base}.values",
                    "is set on a lane without `nodes`",
                    "list the lane's hosts: nodes = [{ host = ..., laned = ... }, ...] (rank 0 is the head)",
                )
            continue
        hosts = [node.host for node in spec.nodes]
        if len(spec.nodes) < 2:
            yield Finding(
                f"{base}.nodes",
                "a lane over several hosts needs two or more",
                "list every host; rank 0 first",
            )
        for host in {h for h in hosts if hosts.count(h) > 1}:
            yield Finding(f"{base}.nodes", f"host {host!r} is listed twice", "one entry per host")
        for i, node in enumerate(spec.nodes):
            where = urlsplit(node.laned)
            if where.scheme == "http" and not loopback(where.hostname or ""):
                yield Finding(
                    f"{base}.nodes[{i}].laned",
                    f"{node.laned} is plain http off this host: the peer token, which opens each "
                    "rank's activate, deactivate and restart, crosses the network in clear",
                    "carry the peers' link over a private fabric only the hosts share, or put TLS "
                    "in front of laned (docs/multinode.md)",
                    Severity.WARNING,
                )
        for key in spec.rank:
            if not key.isdigit() or int(key) >= len(spec.nodes):
                yield Finding(
                    f"{base}.rank.{key}",
                    f"there is no rank {key} (ranks are 0 to {len(spec.nodes) - 1}, by position in nodes)",
                    "name the table by the rank's number",
                )
        for rank in range(len(spec.nodes)):
            values = values_for(spec, rank)
            missing = sorted(
                {m for text in _texts(resolve(spec, rank)) for m in PLACEHOLDER.findall(text)}
                - set(values)
            )
            empty = sorted(k for k, v in values.items() if v == "" and k not in missing)
            if empty:
                yield Finding(
                    f"{base}.rank.{rank}",
                    f"{', '.join(f'${{{m}}}' for m in empty)} is empty on rank {rank} ({spec.nodes[rank].host})",
                    "fill it in: the engine gets an empty value",
                    Severity.WARNING,
                )
            if missing:
                names = ", ".join(f"${{{m}}}" for m in missing)
                yield Finding(
                    f"{base}.rank.{rank}",
                    f"{names} has no value on rank {rank} ({spec.nodes[rank].host})",
                    f"set it in [{base}.values] (every rank) or [{base}.rank.{rank}.values]",
                )
    if (
        config.lanes
        and any(s.nodes for s in config.lanes.values())
        and not config.daemon.peer_token_file
    ):
        yield Finding(
            "daemon.peer_token_file",
            "is unset, and lanes over several hosts need their laned to call each other",
            "write a random token (openssl rand -hex 32) to a 0600 file on every host, name it here",
            Severity.WARNING,
        )


def _texts(spec: LaneConfig) -> Iterator[str]:
    for arg in spec.args:
        yield arg.flag
        if arg.value is not None:
            yield arg.value
    yield from (var.value for var in spec.env.values())
    if spec.container is not None:
        c = spec.container
        yield from (*c.command, *c.volumes, *c.devices, *c.podman_args)
    if spec.exec is not None:
        yield from spec.exec.command
