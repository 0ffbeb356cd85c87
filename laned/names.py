"""The one place that derives names and paths of a lane's unit, wrapper, container and files."""

from __future__ import annotations

from laned.config import Config, LaneConfig

DAEMON_UNIT = "laned.service"
GENERATION_CONFIG_MOUNT = "/laned/generation-config"


def unit_name(lane: str, spec: LaneConfig) -> str:
    """The lane's systemd unit: `unit` from the config, else `laned-<lane>.service`."""
    return spec.unit or f"laned-{lane}.service"


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


def generation_config_dir(config: Config, lane: str) -> str:
    """The laned-owned directory holding the lane's generation_config.json."""
    return f"{lane_state_dir(config, lane)}/generation-config"


def exit_record_path(config: Config, lane: str) -> str:
    """Where the wrapper records the engine's own exit status (before any mapping)."""
    return f"{lane_state_dir(config, lane)}/last-exit"
