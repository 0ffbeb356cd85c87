"""Rules that span keys: names, ports, single sources of truth, injection, known-bad combinations.

Pure: takes a parsed Config, returns Problems (errors and warnings). The known-bad
combinations come from the seed lane's operational notes; each says why.
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections.abc import Iterator

from laned import engines
from laned.config.groups import check_groups
from laned.config.listener import BODY_COPIES, parse_listen
from laned.config.model import GATES, Config, LaneConfig
from laned.config.names import (
    AF_UNIX_MAX,
    DAEMON_UNIT,
    container_name,
    unit_name,
    weights_sockets_dir,
    wrapper_name,
)
from laned.config.sleep import check_sleep
from laned.core.placement import never
from laned.engines.footprints import footprints
from laned.errors import Finding, Severity
from laned.validation.engine_rules import CONTROL, check_argv, check_container, check_env
from laned.validation.secret_rules import check_secrets

LANE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
GROUP_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\-]+\.service$")


def check_config(config: Config) -> list[Finding]:
    """Every cross-key problem in the config, errors and warnings."""
    problems: list[Finding] = []
    problems += _check_daemon(config)
    if not config.lanes:
        problems.append(
            Finding(
                "lanes",
                "no lanes are configured",
                "add a [lanes.NAME] table; see config/laned.example.toml",
                Severity.WARNING,
            )
        )
    for name, lane in config.lanes.items():
        problems += _check_lane(name, lane)
    problems += _check_uniqueness(config)
    problems += check_sleep(config)
    problems += check_groups(config)
    problems += _check_groups_apart(config)
    problems += _check_socket_dirs(config)
    return problems


def check_socket_paths(config: Config, runtime_dir: str, podman_socket: str) -> list[Finding]:
    """Every AF_UNIX path laned renders or connects to, against the longest one a program can
    bind (laned.config.names.AF_UNIX_MAX), with the user's runtime directory `runtime_dir`
    (which laned.validation.load reads): each weight-cache lane's daemon sockets (its engine's
    profile knows their names), and the podman API's socket where a lane runs in a container."""
    problems: list[Finding] = []
    for name, lane in sorted(config.lanes.items()):
        api = engines.for_lane(lane).weight_cache
        if lane.weight_cache is not None and api is not None:
            problems += api.sockets(name, lane, runtime_dir)
    length = len(podman_socket.encode())
    containers = any(lane.container is not None for lane in config.lanes.values())
    if containers and length > AF_UNIX_MAX:
        problems.append(
            Finding(
                "daemon.podman_socket",
                f"{podman_socket} is {length} bytes, more than the {AF_UNIX_MAX} an AF_UNIX "
                "path may be: laned could not reach podman",
                "point daemon.podman_socket at a shorter path (a symbolic link to the socket)",
            )
        )
    return problems


def _check_socket_dirs(config: Config) -> Iterator[Finding]:
    """Two weight-cache lanes whose socket directories' short names are one (a hash of the
    lane's name: two daemons on one GPU would fight over one socket)."""
    seen: dict[str, str] = {}
    for name, lane in sorted(config.lanes.items()):
        if lane.weight_cache is None:
            continue
        directory = weights_sockets_dir(name)
        if directory in seen:
            yield Finding(
                f"lanes.{name}.weight_cache",
                f"its daemon's socket directory ($XDG_RUNTIME_DIR/{directory}) is lane "
                f"{seen[directory]}'s too (both lane names hash to it)",
                "rename one of the two lanes",
            )
        seen.setdefault(directory, name)


def _check_groups_apart(config: Config) -> Iterator[Finding]:
    """Lanes of different groups that their GPU memory keeps apart anyway: before placement,
    different groups ran side by side whatever their GPUs (docs/placement.md)."""
    fps = footprints(config.lanes)
    for a, b in itertools.combinations(sorted(fps), 2):
        ga, gb = fps[a].group, fps[b].group
        if ga is None or gb is None or ga == gb or fps[a].port == fps[b].port:
            continue
        why = never(fps[a], fps[b])
        if why:
            yield Finding(
                f"lanes.{b}.gpus",
                f"lanes {a} (group {ga}) and {b} (group {gb}) never run together: {why}",
                "different groups no longer mean side by side: declare each lane's gpus (or "
                "CUDA_VISIBLE_DEVICES) and its engine's share, or put them in one group",
                Severity.WARNING,
            )


def _check_daemon(config: Config) -> Iterator[Finding]:
    daemon = config.daemon
    if parse_listen(daemon.listen) is None:
        yield Finding(
            "daemon.listen",
            f"{daemon.listen!r} is not HOST:PORT",
            'write it like "127.0.0.1:9000" or "[::1]:9000"',
        )
    for key in ("unit_dir", "bin_dir", "state_dir", "cache_dir", "token_file", "podman_socket"):
        value = getattr(daemon, key)
        if value is not None:
            yield from _check_path(f"daemon.{key}", value)
    if CONTROL.search(daemon.podman) or not daemon.podman:
        yield Finding("daemon.podman", f"{daemon.podman!r} is not a command name", 'e.g. "podman"')
    elif "/" in daemon.podman and not daemon.podman.startswith("/"):
        yield Finding(
            "daemon.podman",
            f"{daemon.podman!r} is a relative path",
            "give a bare name looked up on PATH or an absolute path",
        )
    limits = daemon.limits
    budget = limits.request_memory_mib
    if budget is not None and budget < BODY_COPIES * limits.max_body_mib:
        yield Finding(
            "daemon.limits.request_memory_mib",
            f"{budget:g} MiB holds no body at max_body_mib ({limits.max_body_mib:g} MiB): each "
            f"body counts {BODY_COPIES} times (it and its copy on the way to the engine)",
            f"raise it to at least {BODY_COPIES * limits.max_body_mib:g}, or leave it unset "
            "(a 32nd of the host's memory)",
        )
    if daemon.default_lane is not None and daemon.default_lane not in config.lanes:
        close = difflib.get_close_matches(daemon.default_lane, list(config.lanes), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "name one of the [lanes.*] tables"
        yield Finding("daemon.default_lane", f"no lane named {daemon.default_lane!r}", hint)


def _check_path(key: str, value: str) -> Iterator[Finding]:
    """A path laned reads, and may write on a unit's line (EnvironmentFile=, ExecStart=)."""
    if CONTROL.search(value):
        yield Finding(key, f"{value!r} contains a control character", "remove it")
    elif not value.startswith("/"):
        yield Finding(key, f"{value!r} is not an absolute path", "start it with /, ~ or $XDG_*")
    elif value.endswith("\\"):
        yield Finding(
            key,
            f"{value!r} ends with a backslash, which would continue its unit line (the next "
            "line, ExecStart= say, would become part of it)",
            "remove the trailing backslash",
        )
    elif value != value.strip():
        yield Finding(
            key,
            f"{value!r} starts or ends with whitespace, which systemd drops from a unit line",
            "remove it (or rename the file)",
        )


def _check_lane(name: str, lane: LaneConfig) -> Iterator[Finding]:
    base = f"lanes.{name}"
    yield from _check_identity(base, name, lane)
    yield from _check_text(base, lane)
    yield from _check_gpus(base, lane)
    yield from _check_timing(base, lane)
    yield from check_env(base, lane)
    yield from check_secrets(base, lane)
    yield from check_argv(base, lane)
    if lane.container is not None:
        yield from check_container(base, name, lane)
    yield from _check_engine(base, lane)


def _check_engine(base: str, lane: LaneConfig) -> Iterator[Finding]:
    """The lane's engine: a name laned knows, and the engine's own rules for the lane."""
    if lane.engine is not None and lane.engine not in engines.ENGINES:
        close = difflib.get_close_matches(lane.engine, engines.ENGINES, n=1)
        yield Finding(
            f"{base}.engine",
            f"{lane.engine!r} is not an engine laned knows",
            (f"did you mean {close[0]!r}? " if close else "")
            + "one of: "
            + ", ".join(repr(name) for name in engines.ENGINES)
            + f" (unset, laned reads it from the command, {engines.DEFAULT.title} by default)",
        )
        return
    profile, default = engines.for_lane(lane), engines.DEFAULT
    if lane.api_key_file and not lane.secrets_file and profile is not default:
        yield Finding(
            f"{base}.api_key_file",
            f"is the older name of secrets_file, for {default.title} lanes "
            f"({default.api_key_env}); this lane runs {profile.title}",
            f"rename it secrets_file, with the line {profile.api_key_env}=... in that file",
        )
    if lane.sleep_level and (profile.sleep is None or lane.sleep_level not in profile.sleep.levels):
        levels = " or ".join(str(n) for n in profile.sleep.levels) if profile.sleep else ""
        yield Finding(
            f"{base}.sleep_level",
            f"= {lane.sleep_level}: {profile.title} "
            + (f"sleeps at level {levels} only" if levels else "cannot sleep as laned drives it")
            + f" ({profile.sleep_note})",
            (f"set sleep_level = {levels} or 0" if levels else "set sleep_level = 0")
            + ": a swap stops a lane that does not sleep",
        )
    if lane.sleep_level and lane.nodes and profile.sleep and not profile.sleep.across_nodes:
        yield Finding(
            f"{base}.sleep_level",
            f"= {lane.sleep_level}: {profile.title} does not sleep a lane over several "
            "hosts as one (its head's sleep would not reach the other ranks)",
            "set sleep_level = 0: a swap stops every rank",
        )
    yield from profile.findings(lane, base)
    if lane.weight_cache is not None:
        if profile.weight_cache is None:
            daemons = " or ".join(
                f"{p.title}'s weight-cache daemon (`{p.weight_cache.daemon}`)"
                for p in engines.LISTED
                if p.weight_cache is not None
            )
            yield Finding(
                f"{base}.weight_cache",
                f"keeps the weights in {daemons}; this lane runs {profile.title}, which has none",
                "remove weight_cache from this lane",
            )
        else:
            yield from profile.weight_cache.findings(lane, base)


def _check_identity(base: str, name: str, lane: LaneConfig) -> Iterator[Finding]:
    """The lane's name, its kind (container or exec), its unit and its group."""
    if not LANE_NAME.match(name):
        yield Finding(
            base,
            f"{name!r} is not a valid lane name",
            "use 1-32 characters: lowercase letters, digits, - and _, starting with a letter or digit",
        )
    if (lane.container is None) == (lane.exec is None):
        which = "both" if lane.container else "neither"
        yield Finding(
            base,
            f"has {which} of `container` and `exec`",
            f"give exactly one: [{base}.container] (podman) or [{base}.exec] (a host process)",
        )
    unit = unit_name(name, lane)
    if not UNIT_NAME.match(unit) or CONTROL.search(unit):
        yield Finding(
            f"{base}.unit",
            f"{unit!r} is not a service unit name",
            'use letters, digits and ":_.-", ending in ".service" (templates with @ are not supported)',
        )
    elif unit == DAEMON_UNIT:
        yield Finding(f"{base}.unit", f"{unit!r} is laned's own unit", "pick another name")
    if lane.group is not None and not GROUP_NAME.match(lane.group):
        yield Finding(
            f"{base}.group",
            f"{lane.group!r} is not a valid group name",
            "use lowercase letters, digits, - and _",
        )


def _check_text(base: str, lane: LaneConfig) -> Iterator[Finding]:
    """Values that end up on a unit line or in a URL, and the paths the lane reads."""
    for i, alias in enumerate(lane.aliases):
        if not alias.strip() or CONTROL.search(alias):
            yield Finding(f"{base}.aliases[{i}]", f"{alias!r} is not a model name", 'e.g. "glm"')
    for key in ("description", "served_model_name", "health_path"):
        value = getattr(lane, key)
        if CONTROL.search(value):
            yield Finding(
                f"{base}.{key}", f"{value!r} contains a control character", "keep it on one line"
            )
    if lane.description.endswith("\\"):
        yield Finding(
            f"{base}.description",
            "ends with a backslash, which would continue the unit line",
            "remove the trailing backslash",
        )
    if not lane.served_model_name.strip():
        yield Finding(
            f"{base}.served_model_name", "is empty", "name the model clients will ask for"
        )
    if not lane.health_path.startswith("/") or " " in lane.health_path:
        yield Finding(
            f"{base}.health_path", f"{lane.health_path!r} is not a URL path", 'e.g. "/health"'
        )
    for key in ("secrets_file", "api_key_file", "model_dir"):
        if getattr(lane, key) is not None:
            yield from _check_path(f"{base}.{key}", getattr(lane, key))
    for i, name in enumerate(lane.secrets):
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            yield Finding(
                f"{base}.secrets[{i}]",
                f"{name!r} is not an environment variable name",
                "use A-Z, 0-9 and _",
            )
    if lane.secrets and lane.secrets_path is None:
        yield Finding(
            f"{base}.secrets",
            "names secrets, but the lane has no secrets_file to hold them",
            f'set {base}.secrets_file = "~/.config/laned/{base.removeprefix("lanes.")}.env" (mode 0600, NAME=VALUE lines)',
        )
    if lane.secrets_file and lane.api_key_file:
        yield Finding(
            f"{base}.api_key_file",
            "is the older name of secrets_file: the lane has one secrets file",
            f"write {engines.for_lane(lane).api_key_env}=... in {lane.secrets_file} and remove "
            "api_key_file",
        )


def _check_gpus(base: str, lane: LaneConfig) -> Iterator[Finding]:
    """The lane's GPU list against its needs, and the GPU-memory gate's settings."""
    if lane.gpus is not None:
        if any(index < 0 for index in lane.gpus) or len(set(lane.gpus)) != len(lane.gpus):
            yield Finding(
                f"{base}.gpus",
                f"{list(lane.gpus)} is not a list of distinct GPU indices",
                "list NVML indices as nvidia-smi shows them, e.g. [0, 1]",
            )
        elif lane.needs.gpus and len(lane.gpus) != lane.needs.gpus:
            yield Finding(
                f"{base}.needs.gpus",
                f"is {lane.needs.gpus} but {base}.gpus lists {len(lane.gpus)}",
                "make them agree (or drop needs.gpus: the list says it)",
            )
    if lane.gpu_gate.timeout <= 0 or lane.gpu_gate.interval <= 0:
        yield Finding(
            f"{base}.gpu_gate", "timeout and interval must be longer than zero", "e.g. 2m and 250ms"
        )


def _check_timing(base: str, lane: LaneConfig) -> Iterator[Finding]:
    """Durations, probing, restarts, prepare steps and the acceptance checks' settings."""
    for i, gate in enumerate(lane.checks.after_activate):
        if gate not in GATES:
            close = difflib.get_close_matches(gate, GATES, n=1)
            yield Finding(
                f"{base}.checks.after_activate[{i}]",
                f"{gate!r} is not a gate",
                (f"did you mean {close[0]!r}? " if close else "") + "gates: " + ", ".join(GATES),
            )
    for key in ("load_within", "deadline", "context_deadline"):
        if getattr(lane.checks, key) <= 0:
            yield Finding(f"{base}.checks.{key}", "must be longer than zero", "e.g. 5m")
    for i, step in enumerate(lane.prepare):
        if step.timeout <= 0:
            yield Finding(f"{base}.prepare[{i}].timeout", "must be longer than zero", "e.g. 30m")
    for key in ("start_timeout", "stop_timeout", "start_limit_interval"):
        if getattr(lane, key) <= 0:
            yield Finding(f"{base}.{key}", "must be longer than zero", "e.g. 90s, 15m or 1h")
    for key in ("interval", "stall_after", "start_interval_min", "start_interval_max"):
        if getattr(lane.probe, key) <= 0:
            yield Finding(f"{base}.probe.{key}", "must be longer than zero", "e.g. 500ms, 5s or 2m")
    if lane.probe.start_interval_min > lane.probe.start_interval_max:
        yield Finding(
            f"{base}.probe.start_interval_min",
            "is longer than probe.start_interval_max",
            "readiness probing starts at the min and backs off to the max",
        )
    if lane.restart_max_delay < lane.restart_sec:
        yield Finding(
            f"{base}.restart_max_delay",
            "is shorter than restart_sec",
            "the backoff cap must be >= restart_sec",
        )


def _check_uniqueness(config: Config) -> Iterator[Finding]:
    units: dict[str, str] = {}
    containers: dict[str, str] = {}
    wrappers: dict[str, str] = {}
    ports: dict[int, list[str]] = {}
    for name, lane in config.lanes.items():
        for table, value, key in (
            (units, unit_name(name, lane), "unit"),
            (wrappers, wrapper_name(name, lane), "unit"),
        ):
            if value in table and key == "unit":
                yield Finding(
                    f"lanes.{name}.unit",
                    f"{value!r} is also used by lane {table[value]!r}",
                    "give each lane its own unit name",
                )
                break
            table[value] = name
        if lane.container is not None:
            cname = container_name(name, lane)
            if cname in containers:
                yield Finding(
                    f"lanes.{name}.container.name",
                    f"container name {cname!r} is also used by lane {containers[cname]!r}",
                    "give each container lane its own name",
                )
            containers[cname] = name
        ports.setdefault(lane.port, []).append(name)
    listen = parse_listen(config.daemon.listen)
    # A weight-cache daemon's ports run beside every lane's (it stays up while its lane is
    # swapped in; another group's lanes run at the same time).
    daemons: dict[int, str] = {}
    for name, lane in sorted(config.lanes.items()):
        if lane.weight_cache is None:
            continue
        for port in lane.weight_cache_ports():
            other = daemons.get(port) or next(
                (f"lane {n}'s port" for n, s in config.lanes.items() if s.port == port), None
            )
            if other is None and listen is not None and listen[1] == port:
                other = "laned's own listen port"
            if other is not None:
                yield Finding(
                    f"lanes.{name}.weight_cache",
                    f"its daemon's port {port} is also {other}",
                    "set weight_cache.health_port and master_port to free ports "
                    "(the daemon takes health_port, master_port and master_port + 1)",
                )
            daemons[port] = f"the weight-cache daemon's of lane {name}"
    for port, users in sorted(ports.items()):
        groups = {config.lanes[n].group for n in users}
        if len(users) > 1 and (None in groups or len(groups) > 1):  # one group: as meant
            yield Finding(
                f"lanes.{users[-1]}.port",
                f"port {port} is shared by lanes {', '.join(users)}: they never run together "
                "(one listens at a time)",
                "give each lane its own port where they should run side by side",
                Severity.NOTE,
            )
        if listen is not None and listen[1] == port:
            yield Finding(
                f"lanes.{users[0]}.port",
                f"port {port} is laned's own listen port (daemon.listen)",
                "pick another port for the engine",
            )
