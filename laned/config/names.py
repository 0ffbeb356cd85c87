"""The one place that derives names and paths of a lane's unit, wrapper, container and files."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from laned.config.model import Config, LaneConfig

DAEMON_UNIT = "laned.service"
# The lane's persistent cache directory inside its container: each engine points the
# variables of what it compiles at a cold start there (laned.engines, `caches`).
CACHE_MOUNT = "/laned/cache"


def unit_name(lane: str, spec: LaneConfig) -> str:
    """The lane's systemd unit: `unit` from the config, else `laned-<lane>.service`."""
    return spec.unit or f"laned-{lane}.service"


def weights_unit_name(lane: str, spec: LaneConfig) -> str:
    """The unit of the lane's weight-cache daemon: the lane's unit's stem plus `-weights`."""
    return unit_name(lane, spec).removesuffix(".service") + "-weights.service"


def weights_container_name(lane: str, spec: LaneConfig) -> str:
    """The weight-cache daemon's container: the lane's container name plus `-weights`."""
    return container_name(lane, spec) + "-weights"


def weights_wrapper_path(config: Config, lane: str) -> str:
    """Where the weight-cache daemon's wrapper is written (the serve wrapper's plus -weights)."""
    return wrapper_path(config, lane) + "-weights"


def weights_exit_record_path(config: Config, lane: str) -> str:
    """Where the daemon's wrapper records the daemon's own exit status."""
    return f"{lane_state_dir(config, lane)}/weights-exit"


WEIGHTS_SOCKETS_MOUNT = "/run/laned/weights"  # where both containers see the socket directory

# The longest AF_UNIX path a program can bind or connect to: sun_path is 108 bytes with its
# closing NUL (unix(7)); Python refuses 108 ("AF_UNIX path too long").
AF_UNIX_MAX = 107


def weights_sockets_dir(lane: str) -> str:
    """The lane's weight-cache socket directory under the user's runtime directory: `lw/`
    and 8 hex digits of the lane name's sha256, short and stable whatever the name (an
    AF_UNIX path is AF_UNIX_MAX bytes at most; `laned import` writes names of 30 and more)."""
    return "lw/" + hashlib.sha256(lane.encode()).hexdigest()[:8]


def container_name(lane: str, spec: LaneConfig) -> str:
    """The podman container name: `container.name`, else `laned-<lane>`."""
    if spec.container and spec.container.name:
        return spec.container.name
    return f"laned-{lane}"


def wrapper_name(lane: str, spec: LaneConfig) -> str:
    """The serve wrapper's file name: the unit's stem plus `-serve` (dsv41.service -> dsv41-serve)."""
    return unit_name(lane, spec).removesuffix(".service") + "-serve"


def unit_path(config: Config, lane: str) -> str:
    """Where the lane's unit file is written."""
    return f"{config.daemon.unit_dir}/{unit_name(lane, config.lanes[lane])}"


def wrapper_path(config: Config, lane: str) -> str:
    """Where the lane's serve wrapper is written."""
    return f"{config.daemon.bin_dir}/{wrapper_name(lane, config.lanes[lane])}"


def lane_state_dir(config: Config, lane: str) -> str:
    """laned's own directory for one lane under state_dir."""
    return f"{config.daemon.state_dir}/lanes/{lane}"


def cache_dir(config: Config, lane: str) -> str:
    """The lane's persistent compile-cache directory on the host (mounted at CACHE_MOUNT)."""
    return f"{config.daemon.cache_dir}/lanes/{lane}"


def podman_socket(config: Config, env: Mapping[str, str], uid: int) -> str:
    """The podman API socket: daemon.podman_socket, else the socket-activated one of the user
    `uid` (in the runtime directory `env` names, or systemd's default for that user)."""
    if config.daemon.podman_socket:
        return config.daemon.podman_socket
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    return f"{runtime}/podman/podman.sock"


def exit_record_path(config: Config, lane: str) -> str:
    """Where the wrapper records the engine's own exit status (before any mapping)."""
    return f"{lane_state_dir(config, lane)}/last-exit"
