"""A lane on this host, through podman and NVML: its image, its container's end, its engine's
processes, the GPUs (NVML, opened when first needed), and every fact preflight looks
at (with laned.adapters.kernel and laned.adapters.pagecache), gathered for the owner, which
judges them (laned.preflight.rules). Everything that blocks (NVML, podman-py, statvfs) runs
off the event loop.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time

from laned import engines
from laned.adapters import secret_files
from laned.adapters.gpus import Nvml, SimGpus
from laned.adapters.kernel import cgroup_of, cgroup_pids, disk_total_gib, meminfo, port_busy
from laned.adapters.pagecache import (
    read_generation_config,
    read_quantization,
    resident_weights,
    weights_gib,
)
from laned.adapters.podman import Podman
from laned.config.model import Config, LaneConfig
from laned.config.names import container_name
from laned.core.facts import (
    NO_SLEEPERS,
    HostFacts,
    LaneFacts,
    Sleepers,
)
from laned.errors import PodmanError
from laned.preflight.rules import generation_config_path, model_path, paths_to_check


class Host:
    """GPUs (NVML, opened when first needed) and the podman API, for one laned."""

    def __init__(self, podman: Podman, nvml: Nvml | SimGpus | None = None) -> None:
        self.podman = podman
        self._nvml = nvml  # opened when first needed; given, it stands in for NVML (tests)

    def close(self) -> None:
        """Release NVML and the podman session."""
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None
        self.podman.close()

    def nvml(self) -> tuple[Nvml | SimGpus | None, str]:
        """NVML, or None and why (tried again each time: a driver may be installed later)."""
        if self._nvml is None:
            simulated = os.environ.get("LANED_SIM_GPUS")
            if simulated:  # a simulated host's GPUs (laned.adapters.gpus.SimGpus)
                self._nvml = SimGpus(simulated)
                return self._nvml, ""
            self._nvml, why = Nvml.open()
            return self._nvml, why
        return self._nvml, ""

    async def facts(self) -> HostFacts:
        """GPUs and memory (`gpu_note`: why NVML is absent, or the GPUs it cannot read)."""
        nvml, why = self.nvml()
        gpus = None
        if nvml is not None:
            readings, skipped = await asyncio.to_thread(nvml.survey)
            gpus, why = tuple(readings), "; ".join(skipped)
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
        lanes_known: bool = True,
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
            port_busy=await asyncio.to_thread(
                port_busy, spec.port, engines.for_lane(spec).host(spec)
            ),
            port_peer=port_peer,
            lanes_known=lanes_known,
            command_found=command_found,
            image_id=image_id,
            image_error=image_error,
            last_image_id=last_image_id,
            model_generation_config=read_generation_config(model),
            flag_generation_config=read_generation_config(generation_config_path(spec)),
            model_quantization=read_quantization(model) if spec.weight_cache else None,
            weights_gib=await asyncio.to_thread(weights_gib, model) if spec.sleep_level else None,
            weights_resident=await asyncio.to_thread(resident_weights, model),
            sleepers=sleepers,
            runtime_dir=os.environ.get("XDG_RUNTIME_DIR") if spec.weight_cache else None,
        )

    async def engine_pids(
        self, lane: str, spec: LaneConfig, control_group: str, container: str | None = None
    ) -> set[int]:
        """Every process of the lane's engine (or of `container`, its weight-cache daemon's):
        its unit's cgroup, and a container's own (podman puts a container in a cgroup of its
        own, outside the unit's)."""
        pids = await asyncio.to_thread(cgroup_pids, control_group)
        if spec.container is not None:
            try:
                found = await self.podman.container(container or container_name(lane, spec))
            except PodmanError:
                found = None
            if found is not None and found.pid:
                pids |= await asyncio.to_thread(cgroup_pids, cgroup_of(found.pid))
        return pids

    async def wait_container_gone(
        self, lane: str, spec: LaneConfig, timeout: float, name: str | None = None
    ) -> bool:
        """After a stop: poll until the lane's container (or `name`) is gone (removing an
        exited one)."""
        name = name or container_name(lane, spec)
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
