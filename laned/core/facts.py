"""What preflight and fit look at, as plain data: findings, and the facts of a host and a lane."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from laned.errors import Finding, Severity

GIB = 1024**3


@dataclass(frozen=True)
class GpuReading:
    """One GPU's memory: the device's own count, and its compute processes where NVML lists them.

    `unified`: a GPU with no memory of its own (DGX Spark's GB10: NVML will not read its
    memory, laned.core.unified): `total_bytes` is the pool it shares with the host and
    `used_bytes` all that is taken of it (by processes on the CPU too), so that
    total - used is what is free for an engine, as on a discrete GPU."""

    index: int
    name: str
    total_bytes: int
    used_bytes: int
    processes: tuple[tuple[int, int], ...] | None  # (pid, bytes); None: NVML cannot list them
    unified: bool = False

    @property
    def compute_bytes(self) -> int:
        """Memory held by compute processes; the device's used memory where NVML lists none
        (it cannot see them from some containers and sandboxes, and then says nothing). On
        unified memory the device's count is the whole host's: only the processes count."""
        if not self.processes:
            return 0 if self.unified else self.used_bytes
        return sum(used for _, used in self.processes)

    def to_json(self) -> dict[str, Any]:
        """As served by /fit and preflight."""
        return {
            "index": self.index,
            "name": self.name,
            "total_gib": round(self.total_bytes / GIB, 2),
            "used_gib": round(self.used_bytes / GIB, 2),
            "compute_gib": round(self.compute_bytes / GIB, 2),
            "processes": None if self.processes is None else [p for p, _ in self.processes],
            "unified": self.unified,
        }


@dataclass(frozen=True)
class HostFacts:
    """What the host has: GPUs (None where NVML is absent, with the reason in `gpu_note`; the
    GPUs NVML could not read are left out, and `gpu_note` says which and why) and memory."""

    gpus: tuple[GpuReading, ...] | None
    gpu_note: str = ""
    mem_total_gib: float | None = None
    mem_available_gib: float | None = None

    def to_json(self) -> dict[str, Any]:
        """As served by /fit."""
        return {
            "gpus": None if self.gpus is None else [g.to_json() for g in self.gpus],
            "gpu_note": self.gpu_note,
            "mem_total_gib": self.mem_total_gib,
            "mem_available_gib": self.mem_available_gib,
        }


@dataclass(frozen=True)
class KeyFile:
    """The lane's secrets file as found: does it exist, its mode, the names it defines (never
    a value), and why it cannot be read as NAME=VALUE lines; where it leads when it is a
    symbolic link (then nothing else is read of it), and its owner when that is not the user
    laned runs as."""

    exists: bool
    mode: int = 0
    names: tuple[str, ...] = ()
    unreadable: str | None = None
    link: str | None = None  # the real path a symbolic link leads to
    foreign_owner: str | None = None  # the owner's name (or uid), when not laned's user


@dataclass(frozen=True)
class Sleepers:
    """laned's own sleepers as the next lane's preflight counts them: the processes of the
    lanes asleep now, and the peers its activation would put to sleep, with what each kept
    on its GPUs (index -> bytes) at its last sleep ({}: not measured yet)."""

    pids: frozenset[int] = frozenset()
    coming: Mapping[str, Mapping[int, int]] = field(default_factory=dict)


NO_SLEEPERS = Sleepers()


@dataclass(frozen=True)
class LaneFacts:
    """Everything the checks of one lane look at, gathered beforehand (see laned.adapters.host)."""

    host: HostFacts
    paths: dict[str, bool] = field(default_factory=dict)  # host path -> exists
    disk_total_gib: float | None = None  # the filesystem of the model directory
    key_file: KeyFile | None = None
    port_busy: bool = False
    port_peer: str | None = None  # a lane of the same group that runs on the port
    # False: asked without laned (the CLI while it does not answer): which of its lanes runs
    # on the port is not known, so a held port is not called a stranger's.
    lanes_known: bool = True
    command_found: bool | None = None  # exec lanes: the program is on PATH
    image_id: str | None = None  # container lanes: the local image's id (None: not present)
    image_error: str | None = None  # the podman API could not be asked
    last_image_id: str | None = None  # at the lane's last good start
    model_generation_config: dict[str, Any] | None = None  # the model's generation_config.json
    flag_generation_config: dict[str, Any] | None = None  # that of a --generation-config DIR
    model_quantization: str | None = None  # config.json's quantization_config.quant_method
    weights_gib: float | None = None  # a lane that sleeps: its model's weight files, on disk
    weights_resident: tuple[int, int] | None = (
        None  # its weight files: (bytes in the page cache, bytes)
    )
    sleepers: Sleepers = NO_SLEEPERS
    runtime_dir: str | None = None  # a weight-cache lane: the user's, where its sockets go


def size(n: float) -> str:
    """Bytes as people read them: GiB with one decimal, MiB under one GiB."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.0f} MiB"


def findings_json(findings: Sequence[Finding]) -> list[dict[str, str]]:
    """Findings as served and kept."""
    return [f.to_json() for f in findings]


def blocking(findings: Sequence[Finding]) -> list[Finding]:
    """The findings that block an activation (errors)."""
    return [f for f in findings if f.severity is Severity.ERROR]
