"""Rules that span keys: names, ports, single sources of truth, injection, known-bad combinations.

Pure: takes a parsed Config, returns Problems (errors and warnings). The known-bad
combinations come from the seed lane's operational notes; each says why.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator

from laned.config import GATES, Config, LaneConfig
from laned.errors import Problem, Severity
from laned.names import DAEMON_UNIT, container_name, unit_name, wrapper_name
from laned.preflight import gpu_indices

LANE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
GROUP_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\-]+\.service$")
CONTAINER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Control characters would end a unit line early or smuggle a directive into it.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")

# Flags laned owns: each has one source of truth in the lane config.
OWNED_FLAGS = {
    "--port": "port",
    "--served-model-name": "served_model_name",
    "--api-key": "api_key_file",
}


def check_config(config: Config) -> list[Problem]:
    """Every cross-key problem in the config, errors and warnings."""
    problems: list[Problem] = []
    problems += _check_daemon(config)
    if not config.lanes:
        problems.append(
            Problem(
                "lanes",
                "no lanes are configured",
                "add a [lanes.NAME] table; see config/laned.example.toml",
                Severity.WARNING,
            )
        )
    for name, lane in config.lanes.items():
        problems += _check_lane(name, lane)
    problems += _check_uniqueness(config)
    problems += _check_gpu_sharing(config)
    return problems


def _check_gpu_sharing(config: Config) -> Iterator[Problem]:
    # Lanes of different groups run at the same time: each must say which GPUs are its own,
    # or the GPU-memory gate of one waits on the memory the other holds.
    if len({lane.group for lane in config.lanes.values()}) < 2:
        return
    for name, lane in sorted(config.lanes.items()):
        if lane.gpu_gate.enabled and gpu_indices(lane) is None:
            yield Problem(
                f"lanes.{name}.gpus",
                "is unset while lanes of other groups may run at the same time: the GPU-memory "
                "gate would wait on every GPU, theirs too",
                "list this lane's GPUs (gpus = [0, 1]), or name them in its devices "
                '("nvidia.com/gpu=0") or CUDA_VISIBLE_DEVICES',
                Severity.WARNING,
            )


def _check_daemon(config: Config) -> Iterator[Problem]:
    daemon = config.daemon
    if parse_listen(daemon.listen) is None:
        yield Problem(
            "daemon.listen",
            f"{daemon.listen!r} is not HOST:PORT",
            'write it like "127.0.0.1:9000" or "[::1]:9000"',
        )
    for key in ("unit_dir", "bin_dir", "state_dir", "cache_dir", "token_file", "podman_socket"):
        value = getattr(daemon, key)
        if value is not None:
            yield from _check_path(f"daemon.{key}", value)
    if CONTROL.search(daemon.podman) or not daemon.podman:
        yield Problem("daemon.podman", f"{daemon.podman!r} is not a command name", 'e.g. "podman"')
    elif "/" in daemon.podman and not daemon.podman.startswith("/"):
        yield Problem(
            "daemon.podman",
            f"{daemon.podman!r} is a relative path",
            "give a bare name looked up on PATH or an absolute path",
        )
    if daemon.default_lane is not None and daemon.default_lane not in config.lanes:
        close = difflib.get_close_matches(daemon.default_lane, list(config.lanes), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "name one of the [lanes.*] tables"
        yield Problem("daemon.default_lane", f"no lane named {daemon.default_lane!r}", hint)


def parse_listen(listen: str) -> tuple[str, int] | None:
    """Split "host:port" / "[v6]:port" into (host, port); None when malformed."""
    match = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d{1,5})|([A-Za-z0-9.-]+):(\d{1,5})", listen)
    if not match:
        return None
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    return (host, port) if 0 < port < 65536 else None


def _check_path(key: str, value: str) -> Iterator[Problem]:
    if CONTROL.search(value):
        yield Problem(key, f"{value!r} contains a control character", "remove it")
    elif not value.startswith("/"):
        yield Problem(key, f"{value!r} is not an absolute path", "start it with /, ~ or $XDG_*")


def _check_lane(name: str, lane: LaneConfig) -> Iterator[Problem]:
    base = f"lanes.{name}"
    if not LANE_NAME.match(name):
        yield Problem(
            base,
            f"{name!r} is not a valid lane name",
            "use 1-32 characters: lowercase letters, digits, - and _, starting with a letter or digit",
        )
    if (lane.container is None) == (lane.exec is None):
        which = "both" if lane.container else "neither"
        yield Problem(
            base,
            f"has {which} of `container` and `exec`",
            f"give exactly one: [{base}.container] (podman) or [{base}.exec] (a host process)",
        )
    unit = unit_name(name, lane)
    if not UNIT_NAME.match(unit) or CONTROL.search(unit):
        yield Problem(
            f"{base}.unit",
            f"{unit!r} is not a service unit name",
            'use letters, digits and ":_.-", ending in ".service" (templates with @ are not supported)',
        )
    elif unit == DAEMON_UNIT:
        yield Problem(f"{base}.unit", f"{unit!r} is laned's own unit", "pick another name")
    if not GROUP_NAME.match(lane.group):
        yield Problem(
            f"{base}.group",
            f"{lane.group!r} is not a valid group name",
            "use lowercase letters, digits, - and _",
        )
    for key in ("description", "served_model_name", "health_path"):
        value = getattr(lane, key)
        if CONTROL.search(value):
            yield Problem(
                f"{base}.{key}", f"{value!r} contains a control character", "keep it on one line"
            )
    if lane.description.endswith("\\"):
        yield Problem(
            f"{base}.description",
            "ends with a backslash, which would continue the unit line",
            "remove the trailing backslash",
        )
    if not lane.served_model_name.strip():
        yield Problem(
            f"{base}.served_model_name", "is empty", "name the model clients will ask for"
        )
    if not lane.health_path.startswith("/") or " " in lane.health_path:
        yield Problem(
            f"{base}.health_path", f"{lane.health_path!r} is not a URL path", 'e.g. "/health"'
        )
    for key in ("api_key_file", "model_dir"):
        if getattr(lane, key) is not None:
            yield from _check_path(f"{base}.{key}", getattr(lane, key))
    if lane.gpus is not None:
        if any(index < 0 for index in lane.gpus) or len(set(lane.gpus)) != len(lane.gpus):
            yield Problem(
                f"{base}.gpus",
                f"{list(lane.gpus)} is not a list of distinct GPU indices",
                "list NVML indices as nvidia-smi shows them, e.g. [0, 1]",
            )
        elif lane.needs.gpus and len(lane.gpus) != lane.needs.gpus:
            yield Problem(
                f"{base}.needs.gpus",
                f"is {lane.needs.gpus} but {base}.gpus lists {len(lane.gpus)}",
                "make them agree (or drop needs.gpus: the list says it)",
            )
    if lane.gpu_gate.timeout <= 0 or lane.gpu_gate.interval <= 0:
        yield Problem(
            f"{base}.gpu_gate", "timeout and interval must be longer than zero", "e.g. 2m and 250ms"
        )
    for i, gate in enumerate(lane.checks.after_activate):
        if gate not in GATES:
            close = difflib.get_close_matches(gate, GATES, n=1)
            yield Problem(
                f"{base}.checks.after_activate[{i}]",
                f"{gate!r} is not a gate",
                (f"did you mean {close[0]!r}? " if close else "") + "gates: " + ", ".join(GATES),
            )
    for key in ("load_within", "deadline", "context_deadline"):
        if getattr(lane.checks, key) <= 0:
            yield Problem(f"{base}.checks.{key}", "must be longer than zero", "e.g. 5m")
    for i, step in enumerate(lane.prepare):
        if step.timeout <= 0:
            yield Problem(f"{base}.prepare[{i}].timeout", "must be longer than zero", "e.g. 30m")
    for key in ("start_timeout", "stop_timeout", "start_limit_interval"):
        if getattr(lane, key) <= 0:
            yield Problem(f"{base}.{key}", "must be longer than zero", "e.g. 90s, 15m or 1h")
    for key in ("interval", "stall_after", "start_interval_min", "start_interval_max"):
        if getattr(lane.probe, key) <= 0:
            yield Problem(f"{base}.probe.{key}", "must be longer than zero", "e.g. 500ms, 5s or 2m")
    if lane.probe.start_interval_min > lane.probe.start_interval_max:
        yield Problem(
            f"{base}.probe.start_interval_min",
            "is longer than probe.start_interval_max",
            "readiness probing starts at the min and backs off to the max",
        )
    if lane.restart_max_delay < lane.restart_sec:
        yield Problem(
            f"{base}.restart_max_delay",
            "is shorter than restart_sec",
            "the backoff cap must be >= restart_sec",
        )
    yield from _check_env(base, lane)
    yield from _check_argv(base, lane)
    if lane.container is not None:
        yield from _check_container(base, name, lane)


def _check_env(base: str, lane: LaneConfig) -> Iterator[Problem]:
    for key, var in lane.env.items():
        where = f"{base}.env.{key}"
        if not ENV_NAME.match(key):
            yield Problem(
                where, f"{key!r} is not a valid environment variable name", "use A-Z, 0-9 and _"
            )
        if "\x00" in var.value:
            yield Problem(where, "the value contains a NUL byte", "remove it")
        if key == "VLLM_API_KEY":
            yield Problem(
                where,
                "an API key must not be written into the config",
                f"put VLLM_API_KEY=... in a 0600 file and set {base}.api_key_file to it",
            )


def _argv_sources(base: str, lane: LaneConfig) -> Iterator[tuple[str, str]]:
    """Every string that reaches an argv, with its key path."""
    for i, arg in enumerate(lane.args):
        yield f"{base}.args[{i}]", arg.flag
        if arg.value is not None:
            yield f"{base}.args[{i}]", arg.value
    if lane.exec is not None:
        for i, part in enumerate(lane.exec.command):
            yield f"{base}.exec.command[{i}]", part
    for i, step in enumerate(lane.prepare):
        for j, part in enumerate(step.command):
            yield f"{base}.prepare[{i}].command[{j}]", part
    if lane.container is not None:
        spec = lane.container
        for key in ("command", "podman_args", "devices", "security_opt", "volumes"):
            for i, part in enumerate(getattr(spec, key)):
                yield f"{base}.container.{key}[{i}]", part
        for key in ("image", "entrypoint", "network", "ipc", "name"):
            value = getattr(spec, key)
            if value is not None:
                yield f"{base}.container.{key}", value


def _flag_of(text: str) -> str:
    return text.split("=", 1)[0] if text.startswith("--") else text


def _check_argv(base: str, lane: LaneConfig) -> Iterator[Problem]:
    for where, text in _argv_sources(base, lane):
        if "\x00" in text:
            yield Problem(where, "contains a NUL byte, which no argv can carry", "remove it")
    engine_parts: list[tuple[str, str]] = [
        (f"{base}.args[{i}]", a.flag) for i, a in enumerate(lane.args)
    ]
    if lane.exec is not None:
        engine_parts += [(f"{base}.exec.command[{i}]", p) for i, p in enumerate(lane.exec.command)]
    if lane.container is not None:
        engine_parts += [
            (f"{base}.container.command[{i}]", p) for i, p in enumerate(lane.container.command)
        ]
    seen: dict[str, str] = {}
    for where, text in engine_parts:
        flag = _flag_of(text)
        if flag in OWNED_FLAGS:
            key = OWNED_FLAGS[flag]
            yield Problem(
                where,
                f"{flag} is set by laned from {base}.{key}",
                f"remove it here; {base}.{key} is the single source of truth"
                + (" and keeps the key out of every argv" if flag == "--api-key" else ""),
            )
        if flag == "--generation-config" and lane.sampling is not None:
            yield Problem(
                where,
                "--generation-config conflicts with `sampling`",
                f"laned passes its own --generation-config for {base}.sampling; drop one of the two",
            )
        if flag.startswith("--") and flag in seen:
            yield Problem(
                where,
                f"{flag} is given twice (also at {seen[flag]})",
                "the engine keeps only the last one; remove the other",
                Severity.WARNING,
            )
        seen.setdefault(flag, where)
    engram_disk = [k for k, v in lane.env.items() if k.endswith("ENGRAM_DISK") and v.value == "1"]
    if engram_disk and "--enforce-eager" not in seen:
        yield Problem(
            f"{base}.args",
            f"{engram_disk[0]}=1 needs --enforce-eager",
            "CUDA graphs cannot capture the NVMe reads of engram-disk mode; add --enforce-eager",
        )


def _podman_flags(args: Iterable[str]) -> list[tuple[str, str | None]]:
    """Pair podman options with their values (`--cap-add X` and `--cap-add=X` alike)."""
    out: list[tuple[str, str | None]] = []
    items = list(args)
    i = 0
    while i < len(items):
        item = items[i]
        if item.startswith("--") and "=" in item:
            flag, value = item.split("=", 1)
            out.append((flag, value))
        elif item.startswith("-") and i + 1 < len(items) and not items[i + 1].startswith("-"):
            out.append((item, items[i + 1]))
            i += 1
        else:
            out.append((item, None))
        i += 1
    return out


def _check_container(base: str, name: str, lane: LaneConfig) -> Iterator[Problem]:
    spec = lane.container
    assert spec is not None
    where = f"{base}.container"
    cname = container_name(name, lane)
    if not CONTAINER_NAME.match(cname):
        yield Problem(
            f"{where}.name",
            f"{cname!r} is not a valid container name",
            "use letters, digits and _.-",
        )
    if not spec.image.strip() or CONTROL.search(spec.image):
        yield Problem(
            f"{where}.image", f"{spec.image!r} is not an image name", "name a locally built image"
        )
    for i, volume in enumerate(spec.volumes):
        src = volume.split(":", 1)[0]
        if ":" not in volume:
            yield Problem(
                f"{where}.volumes[{i}]",
                f"{volume!r} is not SRC:DST[:OPTIONS]",
                "e.g. /models:/models:ro",
            )
        elif not src.startswith("/"):
            yield Problem(
                f"{where}.volumes[{i}]",
                f"host path {src!r} is not absolute",
                "named volumes belong in podman_args; a bind mount starts with /, ~ or $XDG_*",
            )
    for key, path in spec.cache_env.items():
        if not ENV_NAME.match(key):
            yield Problem(
                f"{where}.cache_env.{key}",
                f"{key!r} is not a valid environment variable name",
                "use A-Z, 0-9 and _",
            )
        elif not path.startswith("/") or CONTROL.search(path):
            yield Problem(
                f"{where}.cache_env.{key}",
                f"{path!r} is not an absolute path inside the container",
                "e.g. /laned/cache/b12x (the lane's cache directory is mounted at /laned/cache)",
            )
    flags = _podman_flags(spec.podman_args)
    names = {flag for flag, _ in flags}
    pargs = f"{where}.podman_args"
    if "--shm-size" in names and spec.ipc == "host":
        yield Problem(
            pargs,
            '--shm-size together with ipc = "host"',
            "with the host's IPC namespace the container uses the host's /dev/shm; rootless podman "
            "rejects the pair. Drop --shm-size",
        )
    cap_add = [v for f, v in flags if f == "--cap-add" and v and v.upper().endswith("IPC_LOCK")]
    if cap_add:
        disk = [k for k, v in lane.env.items() if k.endswith("ENGRAM_DISK") and v.value == "1"]
        memlock = any(f == "--ulimit" and v and v.startswith("memlock") for f, v in flags)
        if disk:
            yield Problem(
                pargs,
                f"--cap-add IPC_LOCK with {disk[0]}=1",
                "engram-disk mode pins nothing (the pinned mode is unused); drop --cap-add IPC_LOCK",
            )
        elif not memlock:
            yield Problem(
                pargs,
                "--cap-add IPC_LOCK without --ulimit memlock",
                "pinning needs a raised memlock limit (--ulimit memlock=-1:-1); without it drop IPC_LOCK",
                Severity.WARNING,
            )
    if "--gpus" in names:
        yield Problem(
            pargs,
            "--gpus is Docker's GPU flag",
            'rootless podman uses CDI: devices = ["nvidia.com/gpu=all"]',
            Severity.WARNING,
        )
    for flag, value in flags:
        if flag in ("-e", "--env") and value and value.split("=", 1)[0] == "VLLM_API_KEY":
            yield Problem(
                pargs,
                "the API key must not be passed in podman_args",
                f"set {base}.api_key_file; laned passes the key by name only (-e VLLM_API_KEY)",
            )
        if flag in ("--name", "--rm"):
            yield Problem(
                pargs,
                f"{flag} is set by laned",
                f"use {where}.name instead"
                if flag == "--name"
                else "remove it: laned removes the container itself, after reading how it ended",
            )
    if spec.network == "host" and ("-p" in names or "--publish" in names):
        yield Problem(
            pargs,
            'publishing ports with network = "host" has no effect',
            "the engine already listens on the host's port; drop -p/--publish",
            Severity.WARNING,
        )


def _check_uniqueness(config: Config) -> Iterator[Problem]:
    units: dict[str, str] = {}
    containers: dict[str, str] = {}
    wrappers: dict[str, str] = {}
    ports: dict[int, list[tuple[str, str]]] = {}
    for name, lane in config.lanes.items():
        for table, value, key in (
            (units, unit_name(name, lane), "unit"),
            (wrappers, wrapper_name(name, lane), "unit"),
        ):
            if value in table and key == "unit":
                yield Problem(
                    f"lanes.{name}.unit",
                    f"{value!r} is also used by lane {table[value]!r}",
                    "give each lane its own unit name",
                )
                break
            table[value] = name
        if lane.container is not None:
            cname = container_name(name, lane)
            if cname in containers:
                yield Problem(
                    f"lanes.{name}.container.name",
                    f"container name {cname!r} is also used by lane {containers[cname]!r}",
                    "give each container lane its own name",
                )
            containers[cname] = name
        ports.setdefault(lane.port, []).append((name, lane.group))
    listen = parse_listen(config.daemon.listen)
    for port, users in sorted(ports.items()):
        groups = {group for _, group in users}
        if len(groups) > 1:
            names = ", ".join(f"{n} (group {g})" for n, g in users)
            yield Problem(
                f"lanes.{users[-1][0]}.port",
                f"port {port} is shared by lanes that may run at the same time: {names}",
                "lanes of different groups need different ports; lanes of one group may share one",
            )
        if listen is not None and listen[1] == port:
            yield Problem(
                f"lanes.{users[0][0]}.port",
                f"port {port} is laned's own listen port (daemon.listen)",
                "pick another port for the engine",
            )
