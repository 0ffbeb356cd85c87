"""Rules over one lane's engine: its argv (flags laned owns, injection), its environment
and its container (image, mounts, devices, podman flags). Pure: LaneConfig in, Problems out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from laned import engines
from laned.config.model import LaneConfig
from laned.config.names import container_name
from laned.config.podman_options import read_options
from laned.config.ranks import PLACEHOLDER
from laned.config.secrecy import engine_flag
from laned.errors import Finding, Severity

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTAINER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
# Control characters would end a unit line early or smuggle a directive into it.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def check_env(base: str, lane: LaneConfig) -> Iterator[Finding]:
    """Each variable's name and value as a unit and an argv can carry them (whether one is
    a secret: laned.validation.secret_rules)."""
    tables = [(f"{base}.env", lane.env)]
    tables += [(f"{base}.rank.{rank}.env", r.env) for rank, r in lane.rank.items()]
    for table, env in tables:
        for key, var in env.items():
            where = f"{table}.{key}"
            if not ENV_NAME.match(key):
                yield Finding(
                    where, f"{key!r} is not a valid environment variable name", "use A-Z, 0-9 and _"
                )
            if "\x00" in var.value:
                yield Finding(where, "the value contains a NUL byte", "remove it")


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
    return engine_flag(text)  # `--served_model_name=x` is vLLM's --served-model-name


def check_placeholders(base: str, lane: LaneConfig) -> Iterator[Finding]:
    """A recipe's `${NODE_IP}` left in a value reaches the engine as written: no shell runs
    the wrapper's words (they are quoted), and laned fills no placeholder itself."""
    values = [(f"{base}.env.{k}", v.value) for k, v in lane.env.items()]
    values += [(where, text) for where, text in _argv_sources(base, lane)]
    for where, text in values:
        if match := PLACEHOLDER.search(text):
            yield Finding(
                where,
                f"{match.group()} reaches the engine as written: laned fills no placeholder",
                "write this host's value here (laned import --set NAME=VALUE does it)",
                Severity.WARNING,
            )


def check_argv(base: str, lane: LaneConfig) -> Iterator[Finding]:
    yield from check_placeholders(base, lane)
    for where, text in _argv_sources(base, lane):
        if "\x00" in text:
            yield Finding(where, "contains a NUL byte, which no argv can carry", "remove it")
    engine_parts: list[tuple[str, str]] = [
        (f"{base}.args[{i}]", a.flag) for i, a in enumerate(lane.args)
    ]
    flags = [a.flag for a in lane.args]
    engine_parts += [
        (f"{base}.rank.{r}.args[{i}]", a.flag)
        for r, table in lane.rank.items()
        # This host's rank (laned.config.ranks.resolve) has its args at the end of the lane's
        # already: not a second time.
        if not (table.args and flags[-len(table.args) :] == [a.flag for a in table.args])
        for i, a in enumerate(table.args)
    ]
    if lane.exec is not None:
        engine_parts += [(f"{base}.exec.command[{i}]", p) for i, p in enumerate(lane.exec.command)]
    if lane.container is not None:
        engine_parts += [
            (f"{base}.container.command[{i}]", p) for i, p in enumerate(lane.container.command)
        ]
    seen: dict[str, str] = {}
    profile = engines.for_lane(lane)
    owned = profile.owned
    # The engine's flags laned writes `sampling` as (vLLM's --override-generation-config,
    # SGLang's --preferred-sampling-params, llama-server's --temp ...).
    sampling_flags = {
        word
        for why, words in profile.serve_lines(lane, base)
        if (why or "").startswith(f"{base}.sampling")
        for word in words
        if word.startswith("-")
    }
    for where, text in engine_parts:
        flag = _flag_of(text)
        if flag in owned:
            key = owned[flag]
            yield Finding(
                where,
                f"{flag} is set by laned from {base}.{key}",
                f"remove it here; {base}.{key} is the single source of truth",
            )
        if flag in sampling_flags:
            yield Finding(
                where,
                f"{flag} conflicts with `sampling`",
                f"laned passes {base}.sampling as {flag}; keep one of the two",
            )
        if flag.startswith("--") and flag in seen:
            yield Finding(
                where,
                f"{flag} is given twice (also at {seen[flag]})",
                "the engine keeps only the last one; remove the other",
                Severity.WARNING,
            )
        seen.setdefault(flag, where)


def check_container(base: str, name: str, lane: LaneConfig) -> Iterator[Finding]:
    """A container lane: its name, image, bind mounts, cache paths and podman flags."""
    spec = lane.container
    assert spec is not None
    where = f"{base}.container"
    cname = container_name(name, lane)
    if not CONTAINER_NAME.match(cname):
        yield Finding(
            f"{where}.name",
            f"{cname!r} is not a valid container name",
            "use letters, digits and _.-",
        )
    if not spec.image.strip() or CONTROL.search(spec.image):
        yield Finding(
            f"{where}.image", f"{spec.image!r} is not an image name", "name a locally built image"
        )
    for i, volume in enumerate(spec.volumes):
        src = volume.split(":", 1)[0]
        if ":" not in volume:
            yield Finding(
                f"{where}.volumes[{i}]",
                f"{volume!r} is not SRC:DST[:OPTIONS]",
                "e.g. /models:/models:ro",
            )
        elif not src.startswith("/"):
            yield Finding(
                f"{where}.volumes[{i}]",
                f"host path {src!r} is not absolute",
                "named volumes belong in podman_args; a bind mount starts with /, ~ or $XDG_*",
            )
    yield from _check_cache_env(where, spec.cache_env)
    yield from _check_podman_args(where, lane)
    yield from _check_gpu_devices(base, where, lane)


def _check_gpu_devices(base: str, where: str, lane: LaneConfig) -> Iterator[Finding]:
    """A container is given no GPU unless podman is asked for one (a CDI device, or any
    --device): vLLM and SGLang then fail at start, and llama-server runs on the CPU without
    a word. A lane that needs no GPU says `gpus = []`."""
    spec = lane.container
    assert spec is not None
    names = {option.name for option in read_options(spec.podman_args)[0]}
    if lane.gpus == () or spec.devices or names & {"--device", "--gpus"}:
        return
    narrowed = f"; laned narrows it to {base}.gpus with CUDA_VISIBLE_DEVICES" if lane.gpus else ""
    yield Finding(
        f"{where}.devices",
        "the container is given no GPU: podman passes none unless asked",
        f'add devices = ["nvidia.com/gpu=all"] (rootless podman: CDI{narrowed}), or set '
        f"{base}.gpus = [] for a lane that needs none",
        Severity.WARNING,
    )


def _check_cache_env(where: str, cache_env: Mapping[str, str]) -> Iterator[Finding]:
    """Where each engine keeps what it compiles, inside the container."""
    for key, path in cache_env.items():
        if not ENV_NAME.match(key):
            yield Finding(
                f"{where}.cache_env.{key}",
                f"{key!r} is not a valid environment variable name",
                "use A-Z, 0-9 and _",
            )
        elif not path.startswith("/") or CONTROL.search(path):
            yield Finding(
                f"{where}.cache_env.{key}",
                f"{path!r} is not an absolute path inside the container",
                "e.g. /laned/cache/b12x (the lane's cache directory is mounted at /laned/cache)",
            )


def _check_podman_args(where: str, lane: LaneConfig) -> Iterator[Finding]:
    """Extra podman flags: the known-bad combinations, and flags laned owns."""
    spec = lane.container
    assert spec is not None
    flags = [(option.name, option.value) for option in read_options(spec.podman_args)[0]]
    names = {name for name, _ in flags}
    pargs = f"{where}.podman_args"
    if "--shm-size" in names and spec.ipc == "host":
        yield Finding(
            pargs,
            '--shm-size together with ipc = "host"',
            "with the host's IPC namespace the container uses the host's /dev/shm; rootless podman "
            "rejects the pair. Drop --shm-size",
        )
    cap_add = [v for f, v in flags if f == "--cap-add" and v and v.upper().endswith("IPC_LOCK")]
    if cap_add:
        # The engine's own word on whether it pins host memory at all (vLLM's engram-disk mode).
        unpinned = engines.for_lane(lane).pins_nothing(lane)
        memlock = any(f == "--ulimit" and v and v.startswith("memlock") for f, v in flags)
        if unpinned is not None:
            what, why = unpinned
            yield Finding(
                pargs, f"--cap-add IPC_LOCK with {what}", f"{why}; drop --cap-add IPC_LOCK"
            )
        elif not memlock:
            yield Finding(
                pargs,
                "--cap-add IPC_LOCK without --ulimit memlock",
                "pinning needs a raised memlock limit (--ulimit memlock=-1:-1); without it drop IPC_LOCK",
                Severity.WARNING,
            )
    if "--gpus" in names:
        yield Finding(
            pargs,
            "--gpus is Docker's GPU flag",
            'rootless podman uses CDI: devices = ["nvidia.com/gpu=all"]',
            Severity.WARNING,
        )
    for flag, _ in flags:
        if flag in ("--name", "--rm"):
            yield Finding(
                pargs,
                f"{flag} is set by laned",
                f"use {where}.name instead"
                if flag == "--name"
                else "remove it: laned removes the container itself, after reading how it ended",
            )
    if spec.network == "host" and "--publish" in names:
        yield Finding(
            pargs,
            'publishing ports with network = "host" has no effect',
            "the engine already listens on the host's port; drop -p/--publish",
            Severity.WARNING,
        )
