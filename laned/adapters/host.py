"""The host as laned sees it: memory, disks, ports, files, GPUs and podman, gathered into facts.

The adapter behind preflight, `laned status --fit`, the GPU-memory gate and the `prepare`
steps. Everything that blocks (NVML, podman-py, statvfs) runs off the event loop.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Collection
from typing import Any

from laned.adapters import commands, secret_files
from laned.adapters.gpus import GateResult, Nvml, wait_released
from laned.adapters.pagecache import residency, weight_files
from laned.adapters.podman import Podman
from laned.config.model import Config, LaneConfig, gpu_indices
from laned.config.names import container_name
from laned.config.sleep import LOOPBACK
from laned.errors import CommandFailed, Finding, LaneError, PodmanError
from laned.preflight.facts import (
    GIB,
    NO_SLEEPERS,
    GpuReading,
    HostFacts,
    LaneFacts,
    Sleepers,
)
from laned.preflight.rules import evaluate, generation_config_path, model_path, paths_to_check


def meminfo() -> dict[str, float]:
    """/proc/meminfo in GiB (MemTotal, MemAvailable, ...); {} where it cannot be read."""
    out: dict[str, float] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) / 1024**2
    except OSError:
        return {}
    return out


def disk_total_gib(path: str) -> float | None:
    """Size of the filesystem holding `path` (or its nearest existing parent), in GiB."""
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    try:
        st = os.statvfs(path or "/")
    except OSError:
        return None
    return st.f_blocks * st.f_frsize / GIB


def port_busy(port: int, host: str = "0.0.0.0") -> bool:
    """Whether something listens on the port: bind without SO_REUSEPORT fails then."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR so that connections in TIME_WAIT do not count; a listener still does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def read_generation_config(directory: str | None) -> dict[str, Any] | None:
    """DIR/generation_config.json as a dict; None when there is none (or it is unreadable)."""
    if directory is None:
        return None
    try:
        with open(os.path.join(directory, "generation_config.json"), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def resident_weights(model: str | None) -> tuple[int, int] | None:
    """(bytes of the model's weight files in the page cache, their bytes); None without any."""
    files = weight_files(model)
    if not files:
        return None
    found = residency(files)
    return found.resident_bytes, found.total_bytes


def weights_gib(model: str | None) -> float | None:
    """The model's weight files on disk, in GiB (what a level-1 sleep pins in host RAM);
    None where there is no local model directory or no weight file in it."""
    files = weight_files(model)
    if not files:
        return None
    total = 0
    for path in files:
        try:
            total += os.stat(path).st_size
        except OSError:
            continue
    return total / GIB


def cgroup_of(pid: int) -> str:
    """The cgroup (v2) a process is in, as a path under /sys/fs/cgroup ("" if unknown)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return ""


def cgroup2_root(mounts: str = "/proc/self/mounts") -> str:
    """Where the unified (v2) cgroup hierarchy is mounted: /sys/fs/cgroup on a pure-v2 host,
    /sys/fs/cgroup/unified on a hybrid one."""
    try:
        with open(mounts, encoding="utf-8") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) > 2 and fields[2] == "cgroup2":
                    return fields[1]
    except OSError:
        pass
    return "/sys/fs/cgroup"


def cgroup_pids(path: str, root: str | None = None) -> set[int]:
    """The processes in a cgroup and every cgroup below it (empty for "" or one that is gone)."""
    if not path:
        return set()
    root = cgroup2_root() if root is None else root
    pids: set[int] = set()
    for where, _dirs, files in os.walk(root + path):
        if "cgroup.procs" in files:
            try:
                with open(os.path.join(where, "cgroup.procs"), encoding="utf-8") as handle:
                    pids.update(int(line) for line in handle if line.strip())
            except (OSError, ValueError):
                continue
    return pids


def engine_host(spec: LaneConfig) -> str:
    """The address the engine binds: its `--host`; else loopback for a lane that sleeps
    (laned renders it, laned.config.sleep), else vLLM's default 0.0.0.0."""
    host = spec.engine_arg("--host")
    if host is None:
        return LOOPBACK if spec.sleep_level else "0.0.0.0"
    return host


class Host:
    """GPUs (NVML, opened when first needed) and the podman API, for one laned."""

    def __init__(self, podman: Podman, nvml: Nvml | None = None) -> None:
        self.podman = podman
        self._nvml = nvml  # opened when first needed; given, it stands in for NVML (tests)

    def close(self) -> None:
        """Release NVML and the podman session."""
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None
        self.podman.close()

    def nvml(self) -> tuple[Nvml | None, str]:
        """NVML, or None and why (tried again each time: a driver may be installed later)."""
        if self._nvml is None:
            self._nvml, why = Nvml.open()
            return self._nvml, why
        return self._nvml, ""

    async def facts(self) -> HostFacts:
        """GPUs and memory."""
        nvml, why = self.nvml()
        gpus = None if nvml is None else tuple(await asyncio.to_thread(nvml.read))
        memory = meminfo()
        return HostFacts(gpus, why, memory.get("MemTotal"), memory.get("MemAvailable"))

    async def image_id(self, spec: LaneConfig) -> str | None:
        """The id of a container lane's local image; None when absent (PodmanError if unknowable)."""
        if spec.container is None:
            return None
        image = await self.podman.image(spec.container.image)
        return None if image is None else image.id

    async def lane_facts(
        self,
        config: Config,
        lane: str,
        port_peer: str | None,
        last_image_id: str | None,
        sleepers: Sleepers = NO_SLEEPERS,
    ) -> LaneFacts:
        """Everything preflight looks at for one lane (`sleepers`: laned's sleeping lanes,
        whose GPU memory stays, and those the activation puts to sleep)."""
        spec = config.lanes[lane]
        host = await self.facts()
        paths = {path: os.path.exists(path) for _, path in paths_to_check(spec)}
        model = model_path(spec)
        image_id, image_error = None, None
        if spec.container is not None:
            try:
                image_id = await self.image_id(spec)
            except PodmanError as exc:
                image_error = exc.message
        command_found = None
        if spec.exec is not None:
            command_found = shutil.which(spec.exec.command[0]) is not None
        return LaneFacts(
            host=host,
            paths=paths,
            disk_total_gib=await asyncio.to_thread(
                disk_total_gib, model or config.daemon.state_dir
            ),
            key_file=secret_files.key_file(spec.secrets_path) if spec.secrets_path else None,
            port_busy=await asyncio.to_thread(port_busy, spec.port, engine_host(spec)),
            port_peer=port_peer,
            command_found=command_found,
            image_id=image_id,
            image_error=image_error,
            last_image_id=last_image_id,
            model_generation_config=read_generation_config(model),
            flag_generation_config=read_generation_config(generation_config_path(spec)),
            weights_gib=await asyncio.to_thread(weights_gib, model) if spec.sleep_level else None,
            weights_resident=await asyncio.to_thread(resident_weights, model),
            sleepers=sleepers,
        )

    async def preflight(
        self,
        config: Config,
        lane: str,
        port_peer: str | None,
        last_image_id: str | None,
        sleepers: Sleepers = NO_SLEEPERS,
    ) -> list[Finding]:
        """Gather the lane's facts and check them."""
        facts = await self.lane_facts(config, lane, port_peer, last_image_id, sleepers)
        return evaluate(lane, config.lanes[lane], facts)

    async def gpu_gate(
        self, spec: LaneConfig, sleepers: Collection[int] = ()
    ) -> tuple[GateResult | None, str]:
        """Wait until the lane's GPUs are free enough, but for the memory `sleepers` (the
        processes of laned's sleeping lanes) keep; (None, why) where NVML is absent."""
        nvml, why = self.nvml()
        if nvml is None:
            return None, why
        gate = spec.gpu_gate
        result = await wait_released(
            lambda: nvml.read(gpu_indices(spec)),
            gate.max_used_gib * GIB,
            gate.timeout,
            gate.interval,
            sleepers=sleepers,
        )
        return result, ""

    async def gpu_readings(self, spec: LaneConfig) -> list[GpuReading] | None:
        """The lane's GPUs as NVML reads them now; None where NVML is absent."""
        nvml, _why = self.nvml()
        if nvml is None:
            return None
        return await asyncio.to_thread(nvml.read, gpu_indices(spec))

    async def gpu_memory_of(self, spec: LaneConfig, pids: Collection[int]) -> dict[int, int] | None:
        """Bytes the processes `pids` hold on each of the lane's GPUs (by index); None where
        NVML is absent or cannot list processes."""
        nvml, _why = self.nvml()
        if nvml is None or not pids:
            return None
        readings = await asyncio.to_thread(nvml.read, gpu_indices(spec))
        if any(gpu.processes is None for gpu in readings):
            return None
        return {
            gpu.index: sum(used for pid, used in gpu.processes or () if pid in pids)
            for gpu in readings
        }

    async def engine_pids(self, lane: str, spec: LaneConfig, control_group: str) -> set[int]:
        """Every process of the lane's engine: its unit's cgroup, and a container's own
        (podman puts a container in a cgroup of its own, outside the unit's)."""
        pids = await asyncio.to_thread(cgroup_pids, control_group)
        if spec.container is not None:
            try:
                found = await self.podman.container(container_name(lane, spec))
            except PodmanError:
                found = None
            if found is not None and found.pid:
                pids |= await asyncio.to_thread(cgroup_pids, cgroup_of(found.pid))
        return pids

    async def wait_container_gone(self, lane: str, spec: LaneConfig, timeout: float) -> bool:
        """After a stop: poll until the lane's container is gone (removing an exited one)."""
        name = container_name(lane, spec)
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            state = await self.podman.container(name)
            if state is None:
                return True
            if time.monotonic() >= deadline:
                return False
            if state.status in ("exited", "created", "stopped", "configured"):
                await self.podman.remove(name)  # the unit's ExecStopPost would have; be sure
                continue
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


async def run_prepare(
    lane: str, spec: LaneConfig, on_line: Callable[[str], None], cwd: str | None = None
) -> None:
    """Run the lane's `prepare` steps in order (argv, no shell); each line of output goes to
    `on_line`. A step that fails or runs past its timeout raises LaneError and stops the rest."""
    for i, step in enumerate(spec.prepare):
        where = f"lanes.{lane}.prepare[{i}]"
        on_line(f"{where}: running {' '.join(step.command)}")
        try:
            process = await commands.start(step.command, cwd=cwd, stderr=asyncio.subprocess.STDOUT)
        except CommandFailed as exc:
            raise LaneError(f"{where}: {exc.message}", exc.hint) from exc
        assert process.stdout is not None

        async def pump(stream: asyncio.StreamReader, where: str = where) -> None:
            async for raw in stream:
                on_line(f"{where}: {raw.decode('utf-8', errors='replace').rstrip()}")

        try:
            await asyncio.wait_for(pump(process.stdout), step.timeout)
            code = await asyncio.wait_for(process.wait(), 5)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            raise LaneError(
                f"{where}: still running after {step.timeout:g} s; killed",
                f"raise {where}.timeout or make the step faster",
            ) from None
        if code != 0:
            raise LaneError(
                f"{where}: {' '.join(step.command)} exited with status {code}",
                "see its output in the lane's events (`laned events --lane " + lane + "`)",
            )
        on_line(f"{where}: done")
