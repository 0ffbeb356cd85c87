"""The config model: validated, immutable pydantic models of laned's TOML file.

Parsing (TOML, every problem at once with its key path) is `laned.validation.load`; semantic rules
that span keys are `laned.validation.rules`. This module knows neither, so both can build on it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from laned.config import paths
from laned.config.applied import LIVE, NEXT_START, RESTART
from laned.config.base import ArgText, Duration, scalar_to_str
from laned.config.base import StrictModel as _Model
from laned.config.command import command_flags
from laned.config.listener import LimitsConfig
from laned.config.scheduling import GroupConfig, PrefetchConfig, ProxyConfig
from laned.errors import Finding, UnknownLane


def _context(info: ValidationInfo) -> dict[str, Any]:
    """What laned.validation.load hands the model: the environment (`env`) and this host's name
    (`hostname`). The model reads neither itself."""
    context = info.context or {}
    if "env" not in context or "hostname" not in context:
        raise ValueError(
            "the config is read by laned.validation.load, which passes env and hostname"
        )
    return context


def _expand_path(value: str | None, info: ValidationInfo) -> str | None:
    return None if value is None else paths.expand(value, _context(info)["env"])


class DaemonConfig(_Model):
    """`[daemon]`: where laned listens and where it writes what it renders."""

    listen: Annotated[str, RESTART] = "127.0.0.1:9000"
    unit_dir: Annotated[str, RESTART] = ""
    bin_dir: Annotated[str, RESTART] = ""
    state_dir: Annotated[str, RESTART] = ""
    cache_dir: Annotated[str, RESTART] = ""
    podman: Annotated[str, RESTART] = "podman"
    podman_socket: Annotated[str | None, LIVE] = None
    token_file: Annotated[str | None, LIVE] = None
    token_for_reads: Annotated[bool, LIVE] = False
    host: Annotated[str, RESTART] = ""  # this host's name in lanes' `nodes` (default: the hostname)
    peer_token_file: Annotated[str | None, LIVE] = None  # the token laned's peers present (0600)
    default_lane: Annotated[str | None, LIVE] = None
    idle_return: Annotated[Duration | None, LIVE] = (
        None  # every group with a default lane (docs/proxy.md)
    )
    schedule: Annotated[Literal["laned", "fifo"], LIVE] = (
        "laned"  # how requests share a group's GPUs
    )
    proxy: Annotated[ProxyConfig, LIVE] = Field(default_factory=ProxyConfig)
    prefetch: Annotated[PrefetchConfig, LIVE] = Field(default_factory=PrefetchConfig)
    limits: Annotated[LimitsConfig, RESTART] = Field(default_factory=LimitsConfig)  # the listener's

    @field_validator(
        "unit_dir",
        "bin_dir",
        "state_dir",
        "cache_dir",
        "token_file",
        "podman_socket",
        "peer_token_file",
    )
    @classmethod
    def _expand(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _expand_path(value, info)

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any, info: ValidationInfo) -> Any:
        # Defaults follow the XDG variables the way systemd itself does.
        if not isinstance(data, dict):
            return data
        context = _context(info)
        env = context["env"]
        data = dict(data)
        data.setdefault("unit_dir", paths.default_unit_dir(env))
        data.setdefault("bin_dir", paths.default_bin_dir(env))
        data.setdefault("state_dir", paths.default_state_dir(env))
        data.setdefault("cache_dir", paths.default_cache_dir(env))
        data.setdefault("host", context["hostname"])
        return data


class Arg(_Model):
    """One engine argument: `flag` alone, or `flag` and `value`, with the reason it is there."""

    flag: ArgText
    value: ArgText | None = None
    why: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        # A plain string in `args` is one argv element, exactly as written.
        return {"flag": data} if isinstance(data, str) else data

    def argv(self) -> list[str]:
        """The argv elements this argument becomes."""
        return [self.flag] if self.value is None else [self.flag, self.value]


class EnvVar(_Model):
    """One environment variable for the engine, with the reason it is set. `secret = false`:
    a name that only looks secret (laned.config.secrecy) may carry its value in the config."""

    value: ArgText
    why: str | None = None
    secret: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_scalar(cls, data: Any) -> Any:
        if isinstance(data, (str, int, float)) and not isinstance(data, bool):
            return {"value": scalar_to_str(data)}
        return data


class Sampling(_Model):
    """Server-side sampling defaults for requests that send none (generation_config.json keys)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    max_new_tokens: int | None = Field(default=None, gt=0)

    def as_json_dict(self) -> dict[str, float | int]:
        """The keys that are set, in a stable order, for generation_config.json."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class ContainerSpec(_Model):
    """`[lanes.X.container]`: the engine runs as `podman run --rm` of a local image."""

    image: str
    name: str | None = None
    entrypoint: str | None = None
    command: tuple[ArgText, ...] = ()
    devices: tuple[str, ...] = ()
    network: str | None = None
    ipc: str | None = None
    security_opt: tuple[str, ...] = ()
    volumes: tuple[str, ...] = ()
    podman_args: tuple[ArgText, ...] = ()
    compile_cache: bool = True
    cache_env: dict[str, str] = Field(default_factory=dict)

    @field_validator("volumes")
    @classmethod
    def _expand_sources(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        # Only the host side of SRC:DST[:OPTS] is a path on this machine.
        env = _context(info)["env"]
        out = []
        for volume in value:
            src, sep, rest = volume.partition(":")
            out.append(paths.expand(src, env) + sep + rest)
        return tuple(out)


class ExecSpec(_Model):
    """`[lanes.X.exec]`: the engine runs as a host process (a venv's vllm, the simulator)."""

    command: tuple[ArgText, ...] = Field(min_length=1)


class ProbeConfig(_Model):
    """`[lanes.X.probe]`: how laned watches a lane (see docs/configuration.md)."""

    interval: Duration = 5.0
    failures: int = Field(default=3, ge=1)
    stall_after: Duration = 120.0
    start_interval_min: Duration = 0.1
    start_interval_max: Duration = 5.0
    memory_floor_gib: float = Field(default=0.0, ge=0)
    memory_floor_for: Duration = 30.0


class Needs(_Model):
    """`[lanes.X.needs]`: what the lane needs of the host (seed 001's NEEDS line)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    gpus: int = Field(default=0, ge=0)
    gpu_memory_gib: float = Field(default=0.0, ge=0)  # in all, across the lane's GPUs
    host_memory_gib: float = Field(default=0.0, ge=0)
    disk_gib: float = Field(default=0.0, ge=0)


class GpuGate(_Model):
    """`[lanes.X.gpu_gate]`: before a start, wait until the lane's GPUs are free enough."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    enabled: bool = True
    max_used_gib: float = Field(default=1.0, ge=0)  # per GPU, by compute processes
    timeout: Duration = 120.0
    interval: Duration = 0.25


class PrepareStep(_Model):
    """One command of `prepare`: argv (never a shell), with the reason and a time limit."""

    command: tuple[ArgText, ...] = Field(min_length=1)
    why: str | None = None
    timeout: Duration = 1800.0

    @model_validator(mode="before")
    @classmethod
    def _from_argv(cls, data: Any) -> Any:
        # `prepare = [["kernels/build.sh", "--jobs", "8"], "/path/to/script"]`
        if isinstance(data, str):
            return {"command": (data,)}
        if isinstance(data, (list, tuple)):
            return {"command": tuple(data)}
        return data


GATES = ("load", "chat", "reasoning", "tools", "context", "speed")


class ChecksConfig(_Model):
    """`[lanes.X.checks]`: the acceptance gates (seed 002) and what they demand."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    after_activate: tuple[str, ...] = ()  # gates run by themselves after each activation
    load_within: Duration = 3600.0  # the `load` gate: a cold start no longer than this
    context_fraction: float = Field(default=0.85, gt=0, lt=1)
    speed_min_tps: float = Field(default=15.0, gt=0)
    deadline: Duration = 300.0  # each of chat, reasoning, tools and speed
    context_deadline: Duration = 1800.0  # a prompt of 85% of a long window takes a while

    @model_validator(mode="before")
    @classmethod
    def _tuple(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("after_activate"), list):
            return {**data, "after_activate": tuple(data["after_activate"])}
        return data


class Node(_Model):
    """One host of a lane over several hosts: its name and its laned's control API."""

    host: str = Field(min_length=1)
    laned: str  # http(s)://HOST:PORT

    @field_validator("laned")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s]+(/\S*)?$", value):
            raise ValueError(f"{value!r} is not http(s)://HOST:PORT (the host's laned)")
        return value.rstrip("/")


class WeightCacheConfig(_Model):
    """`[lanes.X.weight_cache]`, or `weight_cache = true`: vLLM's weight-cache daemon (`vllm
    preload`) holds the lane's weights on its GPUs across engine restarts (docs/weight-cache.md).
    Its ports: `health_port` (its /health; default the lane's port + 10000, or - 10000 above
    55533) and
    `master_port` (its own rendezvous, apart from the engine's; default health_port + 1,
    and the next one for a speculative draft's group)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    health_port: int | None = Field(default=None, ge=1, le=65535)
    master_port: int | None = Field(default=None, ge=1, le=65535)


class RankConfig(_Model):
    """`[lanes.X.rank.N]`: what differs on rank N (values for `${NAME}`, more args and env)."""

    values: dict[str, ArgText] = Field(default_factory=dict)
    args: tuple[Arg, ...] = ()
    env: dict[str, EnvVar] = Field(default_factory=dict)


class LaneConfig(_Model):
    """`[lanes.X]`: one engine with its exact flags, environment, mounts and API key."""

    description: Annotated[str, NEXT_START] = ""  # rendered into the unit
    unit: Annotated[str | None, NEXT_START] = None
    # "vllm", "sglang" or "llamacpp" (laned.engines); unset: read from the command or image
    # where it names one, else vLLM.
    engine: Annotated[str | None, NEXT_START] = None
    # Lanes of one group never run together, whatever their memory says (docs/placement.md);
    # unset: which lanes run together follows from what each takes of its GPUs.
    group: Annotated[str | None, LIVE] = None
    port: Annotated[int, NEXT_START] = Field(ge=1, le=65535)
    health_path: Annotated[str, NEXT_START] = "/health"
    served_model_name: Annotated[str, NEXT_START]
    aliases: Annotated[
        tuple[str, ...], LIVE
    ] = ()  # more model names laned's OpenAI endpoint routes here
    proxy: Annotated[ProxyConfig | None, LIVE] = None  # this lane's queue, instead of daemon.proxy
    on_demand: Annotated[bool, LIVE] = (
        False  # a request for its model at laned's OpenAI endpoint activates it
    )
    pinned: Annotated[bool, LIVE] = False  # requests never swap it out: only an operator does
    priority: Annotated[int, LIVE] = (
        0  # among the lanes requests wait for: one point weighs a minute of waiting
    )
    min_residency: Annotated[Duration | None, LIVE] = (
        None  # kept this long while others wait (default: measured)
    )
    loading_state: Annotated[bool, LIVE] = (
        False  # a streaming chat request that waits hears the progress
    )
    drain_timeout: Annotated[Duration, LIVE] = (
        120.0  # a stop waits this long for the endpoint's requests to end
    )
    # NAME=VALUE lines, mode 0600: each reaches the engine by name only (laned.config.secrecy).
    secrets_file: Annotated[str | None, NEXT_START] = None
    secrets: Annotated[
        tuple[str, ...], NEXT_START
    ] = ()  # the names the secrets file must define (never values)
    api_key_file: Annotated[str | None, NEXT_START] = (
        None  # the older name of secrets_file, for vLLM lanes: it must define VLLM_API_KEY
    )
    start_timeout: Annotated[Duration, NEXT_START] = 3600.0
    # TimeoutStopSec=: systemd applies a new value to the running unit at the daemon-reload a
    # reload ends with (252, measured: 30 s -> 2 s, the next stop killed at 2 s, same MainPID),
    # and laned's own waits for a container to go read the config of the moment.
    stop_timeout: Annotated[Duration, LIVE] = 120.0
    restart_sec: Annotated[Duration, NEXT_START] = 15.0
    restart_max_delay: Annotated[Duration, NEXT_START] = 300.0
    start_limit_burst: Annotated[int, NEXT_START] = Field(default=5, ge=1)
    start_limit_interval: Annotated[Duration, NEXT_START] = 1800.0
    sampling: Annotated[Sampling | None, NEXT_START] = None
    env: Annotated[dict[str, EnvVar], NEXT_START] = Field(default_factory=dict)
    args: Annotated[tuple[Arg, ...], NEXT_START] = ()
    probe: Annotated[ProbeConfig, NEXT_START] = Field(default_factory=ProbeConfig)
    model_dir: Annotated[str | None, NEXT_START] = None
    gpus: Annotated[tuple[int, ...] | None, NEXT_START] = None
    needs: Annotated[Needs, LIVE] = Field(default_factory=Needs)
    gpu_gate: Annotated[GpuGate, NEXT_START] = Field(default_factory=GpuGate)
    prepare: Annotated[tuple[PrepareStep, ...], NEXT_START] = ()
    checks: Annotated[ChecksConfig, LIVE] = Field(default_factory=ChecksConfig)
    container: Annotated[ContainerSpec | None, NEXT_START] = None
    exec: Annotated[ExecSpec | None, NEXT_START] = None
    # A lane over several hosts (rank = position, rank 0 the head that serves the API); the
    # values fill `${NAME}` placeholders on every rank, `rank` tables per rank.
    nodes: Annotated[tuple[Node, ...], RESTART] = ()
    values: Annotated[dict[str, ArgText], NEXT_START] = Field(default_factory=dict)
    rank: Annotated[dict[str, RankConfig], NEXT_START] = Field(default_factory=dict)
    # How a swap takes the lane off its GPUs: 0 stops it; 1 and 2 are vLLM's sleep levels
    # (docs/sleep.md; laned.config.sleep holds the rules).
    sleep_level: Annotated[Literal[0, 1, 2], NEXT_START] = 0
    prefetch: Annotated[bool, LIVE] = (
        True  # its weights read in while a swap to it waits ([daemon.prefetch])
    )
    dev_mode_exposed: Annotated[str, NEXT_START] = (
        ""  # why vLLM's dev routes may be reached from other hosts
    )
    # vLLM's weight cache: its daemon keeps the weights on the GPUs across engine restarts.
    weight_cache: Annotated[WeightCacheConfig | None, NEXT_START] = None

    @field_validator("weight_cache", mode="before")
    @classmethod
    def _weight_cache_switch(cls, value: Any) -> Any:
        # `weight_cache = true` is the table with its defaults; `false` is none.
        if value is True:
            return {}
        return None if value is False else value

    @field_validator("secrets_file", "api_key_file", "model_dir")
    @classmethod
    def _expand(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _expand_path(value, info)

    @property
    def secrets_path(self) -> str | None:
        """The lane's secrets file (`secrets_file`, or `api_key_file`, its older name)."""
        return self.secrets_file or self.api_key_file

    @property
    def secrets_key(self) -> str:
        """The config key that names the secrets file (for messages)."""
        return "api_key_file" if self.api_key_file and not self.secrets_file else "secrets_file"

    def weight_cache_ports(self) -> tuple[int, int, int]:
        """The weight-cache daemon's ports: (its /health, its rendezvous, its draft group's)."""
        wc = self.weight_cache or WeightCacheConfig()
        # The lane's port + 10000, or - 10000 where the three would pass 65535.
        health = wc.health_port or self.port + (10000 if self.port <= 55533 else -10000)
        master = wc.master_port or health + 1
        return health, master, master + 1

    def command_words(self) -> list[str]:
        """The words of its command: the exec command, or the container's after its image."""
        if self.exec is not None:
            return list(self.exec.command)
        return list(self.container.command) if self.container is not None else []

    def arg_words(self) -> list[str]:
        """Its `args` as argv elements."""
        return [part for arg in self.args for part in arg.argv()]

    def engine_args(self) -> list[str]:
        """The user's engine flags as argv elements, without laned's own additions: those
        its command carries after the program and the model (laned.config.command), then
        `args`. The engine reads both; so does every rule that asks for a flag."""
        return [*command_flags(self.command_words()), *self.arg_words()]

    def flag_key(self, flag: str) -> str:
        """The key the lane writes `flag` under, for messages: `args`, or its command's."""
        given = any(w == flag or w.startswith(flag + "=") for w in self.arg_words())
        if given or (self.exec is None and self.container is None):
            return "args"
        return "exec.command" if self.exec is not None else "container.command"

    def engine_arg(self, flag: str) -> str | None:
        """The value of `flag` in the engine arguments (`--flag VALUE` or `--flag=VALUE`),
        the last one given where it is given twice (argparse keeps the last: a flag in
        `args` wins over the command's); None when it is not there."""
        args, found = self.engine_args(), None
        for i, part in enumerate(args):
            if part.startswith(flag + "="):
                found = part.removeprefix(flag + "=")
            elif part == flag and i + 1 < len(args):
                found = args[i + 1]
        return found


class Config(_Model):
    """The whole file: `[daemon]`, `[lanes.*]` and `[groups.*]`."""

    daemon: DaemonConfig = Field(default_factory=DaemonConfig)
    lanes: dict[str, LaneConfig] = Field(default_factory=dict)
    groups: dict[str, GroupConfig] = Field(default_factory=dict)
    source: str = Field(default="", exclude=True)
    warnings: tuple[Finding, ...] = Field(default=(), exclude=True)
    elsewhere: tuple[str, ...] = Field(default=(), exclude=True)  # lanes of other hosts

    def lane(self, name: str) -> LaneConfig:
        """The lane called `name`; UnknownLane, naming the configured lanes, otherwise."""
        if name not in self.lanes:
            known = ", ".join(sorted(self.lanes)) or "none"
            raise UnknownLane(f"no lane named {name!r}", f"configured lanes: {known}")
        return self.lanes[name]

    @model_validator(mode="before")
    @classmethod
    def _daemon_table(cls, data: Any) -> Any:
        # Validate a missing [daemon] too, so that its defaults see the caller's environment.
        if isinstance(data, dict) and "daemon" not in data:
            return {**data, "daemon": {}}
        return data


def gpu_indices(spec: LaneConfig) -> tuple[int, ...] | None:
    """The NVML indices of the lane's GPUs: `gpus`, else what its CDI devices
    (`nvidia.com/gpu=0`) or CUDA_VISIBLE_DEVICES ("0,1") name; None means all of them."""
    if spec.gpus is not None:
        return spec.gpus
    named: list[int] = []
    for device in spec.container.devices if spec.container else ():
        kind, _, which = device.partition("=")
        if kind == "nvidia.com/gpu":
            if not which.isdigit():
                return None  # `all`, a UUID or a MIG name: all of them, as far as laned knows
            named.append(int(which))
    if named:
        return tuple(sorted(set(named)))
    visible = spec.env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        parts = [p.strip() for p in visible.value.split(",") if p.strip()]
        if parts and all(p.isdigit() for p in parts):
            return tuple(sorted({int(p) for p in parts}))
    return None
