"""The owner's seam over the real host: each protocol of laned.owner.seam over laned.adapters
(systemd over D-Bus, podman, NVML, the page cache, the engines' HTTP endpoints, journald, the
state files, the peers' laned). The one module of the owner that imports an adapter:
`laned serve` (laned.daemon), the integration tests and the benches build the seam here
(`host_seam`) and hand it to the supervisor.

Each method is I/O that answers with a value and changes no lane state; what the answers
mean is decided by the owner (laned.owner.supervisor and its parts, with laned.core): the
actions of a lane's sequence (laned.owner.actions) call them and answer the lane machine's
step with what they found. `host` None: no
podman or NVML, as in the tests that run plain exec lanes on a bare user manager.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

from laned import engines
from laned.adapters import journal, pagecache, rendered, state, weight_cache
from laned.adapters.commands import run_prepare
from laned.adapters.engine_api import EngineClient
from laned.adapters.host import Host
from laned.adapters.kernel import meminfo, port_busy
from laned.adapters.peers import Peers as PeersApi
from laned.adapters.probes import Probe
from laned.adapters.secret_files import key_file, read_api_key
from laned.adapters.systemd import Systemd
from laned.config.model import Config, LaneConfig
from laned.config.names import (
    container_name,
    podman_socket,
    weights_container_name,
    weights_unit_name,
)
from laned.core import canary
from laned.core.checkpoint import Files
from laned.core.exits import ExitRecord, parse_exit_record
from laned.core.facts import GIB, GpuReading, HostFacts, KeyFile, LaneFacts, Sleepers
from laned.core.lanes import EventKind, Refused
from laned.core.liveness import EngineSample, Unanswered
from laned.core.page_cache import Prefetched, Residency
from laned.core.saved import Saved
from laned.core.unit_state import UnitCallback, UnitSnapshot
from laned.engines.profile import WeightCacheApi
from laned.errors import LanedError, NotAContainer, PodmanError
from laned.gates.acceptance import GateResult, run_gates
from laned.owner.seam import Note, Peers, Seam, Writer
from laned.render.plan import Action

log = logging.getLogger("laned.supervisor")


def host_seam(systemd: Systemd, probe: Probe, host: Host | None = None) -> Seam:
    """The seam over this host: the user manager (`systemd`), the engines (`probe`'s pool),
    podman and NVML (`host`; None: neither)."""

    async def close() -> None:
        await probe.close()
        if host is not None:
            host.close()

    return Seam(
        manager=SystemdManager(systemd),
        units=SystemdUnits(systemd),
        containers=PodmanContainers(host),
        engines=EngineApis(probe),
        gpus=NvmlGpus(host),
        pages=PageCacheFiles(),
        facts=HostReadings(host),
        weight_caches=WeightCacheDaemons(systemd, host),
        journal=Journald(),
        state=StateFiles(),
        close=close,
    )


def peers(token: str | None) -> Peers:
    """The peers' laned, called with the peer token (laned.owner.coordinator)."""
    return PeersApi(token)


def read_exit_record(path: str) -> ExitRecord | None:
    """The serve wrapper's record of the engine's last exit; None when absent or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_exit_record(handle.read())
    except OSError:
        return None


def _record_lines(path: str) -> tuple[str | None, str | None]:
    """A weight-cache daemon's record (its wrapper writes it as it starts): the digest of what
    it loads, and its socket directory; None for what is not there."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = [line.strip() for line in handle.read().splitlines()]
    except OSError:
        return None, None
    lines += ["", ""]
    return lines[0] or None, lines[1] or None


class SystemdManager:
    """The user manager (laned.owner.seam.Manager) over D-Bus."""

    def __init__(self, systemd: Systemd) -> None:
        self.systemd = systemd

    @property
    def address(self) -> str:
        return self.systemd.address

    async def connect(self, on_change: UnitCallback, on_restart: Callable[[], None]) -> None:
        self.systemd.on_unit_change, self.systemd.on_manager_restart = on_change, on_restart
        bus = self.systemd.bus
        if bus is None or not bus.connected:
            await self.systemd.connect()

    async def subscribe(self) -> None:
        await self.systemd.subscribe()

    async def wait_closed(self) -> None:
        await self.systemd.wait_closed()

    def disconnect(self) -> None:
        self.systemd.disconnect()

    async def manager_started(self) -> int:
        return await self.systemd.manager_started()

    async def system_state(self) -> str:
        return await self.systemd.system_state()


class SystemdUnits:
    """The lanes' units (laned.owner.seam.Units): rendered files, systemd's jobs."""

    def __init__(self, systemd: Systemd) -> None:
        self.systemd = systemd

    async def render(self, config: Config, systemd_version: int) -> list[tuple[Action, str]]:
        return await asyncio.to_thread(rendered.apply, config, systemd_version)

    async def reload(self) -> None:
        await self.systemd.reload()

    async def ref_unit(self, unit: str) -> None:
        await self.systemd.ref_unit(unit)

    async def snapshot(self, unit: str) -> UnitSnapshot:
        return await self.systemd.snapshot(unit)

    async def start(self, unit: str) -> None:
        """Clear a failed state and start the unit (the start job ends when it runs)."""
        await self.systemd.reset_failed_unit(unit)
        result = await self.systemd.start_unit(unit)
        if result not in ("done", "skipped"):
            log.warning("start job of %s ended %s", unit, result)

    async def stop(self, unit: str) -> Refused | None:
        """Stop the unit and confirm systemd has it stopped."""
        await self.systemd.stop_unit(unit)
        snap = await self.systemd.snapshot(unit)
        if snap.running:
            return Refused(
                f"{unit} is still {snap.active_state} after its stop job", "see `laned logs`"
            )
        return None

    async def still_ending(self, unit: str, seen: UnitSnapshot | None) -> bool:
        """Whether the unit runs or is stopping, by systemd or by what laned has seen.

        systemd may answer "inactive" before its signal of that change reached laned; then the
        stop job that follows ends at once, and systemd sends a unit's pending change before the
        end of a job (bus_job_send_removed_signal), so laned has seen the exit."""
        snap = await self.systemd.snapshot(unit)
        return snap.ending or (seen is not None and seen.ending)

    def exit_record(self, path: str) -> ExitRecord | None:
        return read_exit_record(path)


class PodmanContainers:
    """Containers (laned.owner.seam.Containers) through podman's API; nothing without it."""

    def __init__(self, host: Host | None) -> None:
        self.host = host

    async def image_id(self, spec: LaneConfig) -> str | None:
        return None if self.host is None else await self.host.image_id(spec)

    async def running_image(self, lane: str, spec: LaneConfig) -> str | None:
        """The image a container lane runs (it may have been rebuilt since it started)."""
        if self.host is None or spec.container is None:
            return None
        try:
            running = await self.host.podman.container(container_name(lane, spec))
            return running.image_id if running else await self.host.image_id(spec)
        except PodmanError as exc:
            log.warning("%s: cannot record the image id: %s", lane, exc.message)
            return None

    async def prepare(self, lane: str, spec: LaneConfig, line: Callable[[str], None]) -> None:
        await run_prepare(lane, spec, line)

    async def container_gone(self, lane: str, spec: LaneConfig, note: Note) -> Refused | None:
        """A stopped container lane's container must be gone before the next lane starts."""
        if self.host is None or spec.container is None:
            return None
        try:
            gone = await self.host.wait_container_gone(lane, spec, spec.stop_timeout)
        except PodmanError as exc:
            note(EventKind.GATE, f"cannot confirm the container is gone: {exc.message}")
            return None
        if gone:
            return None
        return Refused(
            f"its container is still there {spec.stop_timeout:g}s after the stop",
            "see `podman ps -a`; remove it with `podman rm -f` and activate again",
        )

    async def engine_pids(self, lane: str, spec: LaneConfig, control_group: str) -> set[int]:
        if self.host is None:
            return set()
        return await self.host.engine_pids(lane, spec, control_group)

    async def container(self, lane: str, spec: LaneConfig) -> dict[str, Any] | None:
        if spec.container is None or self.host is None:
            return None
        name = container_name(lane, spec)
        try:
            found = await self.host.podman.container(name)
        except LanedError as exc:
            # Only the view suffers: the lane itself runs under systemd, not through the API.
            return {"name": name, "status": "unknown", "error": exc.message, "hint": exc.hint}
        return {"name": name, "status": "absent"} if found is None else found.to_json()

    async def container_logs(self, lane: str, spec: LaneConfig, lines: int) -> list[str]:
        if spec.container is None or self.host is None:
            raise NotAContainer(f"lane {lane} is not a container lane", "use source=journal")
        return await self.host.podman.logs(container_name(lane, spec), lines)

    def use_podman(self, config: Config) -> None:
        if self.host is not None:
            self.host.podman.use(podman_socket(config, os.environ, os.getuid()))


class EngineApis:
    """The engines' HTTP APIs (laned.owner.seam.Engines), over the probe's pool."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def api_key(self, spec: LaneConfig) -> str | None:
        return read_api_key(spec.secrets_path, engines.for_lane(spec).api_key_env)

    def _engine(self, spec: LaneConfig, key: str | None = None, timeout: float = 0) -> EngineClient:
        """The lane's engine, as its profile says to reach it, over the probe's pool."""
        profile = engines.for_lane(spec)
        return self.probe.engine(spec.port, spec.served_model_name, key, timeout, profile)

    async def _keyed(self, spec: LaneConfig) -> EngineClient:
        """The lane's engine with its key (read off the loop)."""
        return self._engine(spec, await asyncio.to_thread(self.api_key, spec))

    async def health(self, port: int, path: str = "/health") -> int | None:
        return await self.probe.engine(port).health(path=path)

    async def models(self, port: int, api_key: str | None) -> list[str] | None:
        return await self.probe.engine(port, api_key=api_key).listed()

    async def accepts(self, port: int) -> bool:
        return await self.probe.accepts(port)

    async def sample(self, spec: LaneConfig) -> EngineSample | Unanswered | None:
        # llama-server guards /metrics with its key (vLLM and SGLang do not).
        return await (await self._keyed(spec)).sample()

    async def sleep(self, spec: LaneConfig, level: int) -> bool | None:
        """Its sleep route at `level` (within its stop_timeout), then its own word on it."""
        engine = await self._keyed(spec)
        await engine.sleep(level, timeout=spec.stop_timeout)
        return await engine.is_sleeping()

    async def wake(self, spec: LaneConfig, level: int) -> bool:
        """Its wake at `level`, with what a wake at that level needs (the engine's profile:
        after a vLLM level 2 the weights read again and the prefix cache reset, a level-2 wake
        alone answering wrongly, vLLM #29341); then its own word that it sleeps no more."""
        engine = await self._keyed(spec)
        awake = await engine.wake_up(level, timeout=spec.start_timeout)
        return awake and not await engine.is_sleeping()

    async def asleep(self, spec: LaneConfig) -> bool:
        if not spec.sleep_level:
            return False
        try:
            return await (await self._keyed(spec)).is_sleeping() is True
        except LanedError:
            return False

    async def sleep_level(self, spec: LaneConfig) -> int | None:
        return await (await self._keyed(spec)).sleep_level()

    async def canary(self, spec: LaneConfig) -> canary.Answer:
        return await (await self._keyed(spec)).canary(120)

    async def run_checks(
        self,
        spec: LaneConfig,
        gates: Sequence[str],
        last_cold_start: float | None,
        on_result: Callable[[GateResult], None],
    ) -> list[GateResult]:
        """Run acceptance gates against the lane's engine, over the probe's connections."""
        client = self._engine(
            spec,
            self.api_key(spec),
            timeout=max(spec.checks.deadline, spec.checks.context_deadline) + 30,
        )
        try:
            return list(
                await run_gates(client, spec.checks, gates, last_cold_start, on_result=on_result)
            )
        finally:
            await client.close()


class NvmlGpus:
    """The GPUs (laned.owner.seam.Gpus) through NVML, opened when first needed."""

    def __init__(self, host: Host | None) -> None:
        self.host = host

    def unread(self) -> str | None:
        if self.host is None:
            return ""  # no host adapter: no GPU is read, and there is nothing to say
        nvml, why = self.host.nvml()
        return None if nvml is not None else why

    def read(self, indices: Sequence[int] | None) -> list[GpuReading]:
        nvml = None if self.host is None else self.host.nvml()[0]
        return [] if nvml is None else nvml.read(indices)


class PageCacheFiles:
    """A model's files and the page cache (laned.owner.seam.PageCache)."""

    def weight_files(self, model: str | None) -> list[str]:
        return pagecache.weight_files(model)

    def checkpoint(self, model: str | None) -> Files:
        return pagecache.read_checkpoint(model)

    def weights_gib(self, model: str | None) -> float | None:
        return pagecache.weights_gib(model)

    def residency(self, files: Sequence[str]) -> Residency:
        return pagecache.residency(files)

    def mem_available(self) -> float | None:
        available = meminfo().get("MemAvailable")
        return None if available is None else available * GIB

    def read_ahead(
        self,
        files: Sequence[str],
        budget_bytes: int,
        max_bytes_per_s: float,
        stop: threading.Event,
        memory_left: Callable[[], float],
    ) -> Prefetched:
        return pagecache.prefetch(files, budget_bytes, max_bytes_per_s, stop, memory_left)


class HostReadings:
    """This host's facts (laned.owner.seam.Facts), through podman, NVML and the kernel."""

    def __init__(self, host: Host | None) -> None:
        self.host = host

    async def host_facts(self) -> HostFacts:
        if self.host is None:
            total = meminfo().get("MemTotal")
            return HostFacts(None, "not read: laned runs without its host adapter", total)
        return await self.host.facts()

    async def lane_facts(
        self,
        config: Config,
        lane: str,
        port_peer: str | None,
        image_id: str | None,
        sleepers: Sleepers,
    ) -> LaneFacts | None:
        if self.host is None:
            return None
        return await self.host.lane_facts(config, lane, port_peer, image_id, sleepers)

    def port_busy(self, port: int) -> bool:
        return port_busy(port)

    def key_file(self, path: str) -> KeyFile:
        return key_file(path)


class WeightCacheDaemons:
    """The weight-cache daemons (laned.owner.seam.WeightCaches): their units, their
    containers, their sockets."""

    def __init__(self, systemd: Systemd, host: Host | None) -> None:
        self.systemd, self.host = systemd, host

    async def start(self, lane: str, spec: LaneConfig) -> Refused | None:
        """Start the daemon's unit: its start job ends when its /health answers 200 (its
        wrapper's `ready`, the unit's ExecStartPost) or when it fails."""
        unit = weights_unit_name(lane, spec)
        await self.systemd.reset_failed_unit(unit)
        result = await self.systemd.start_unit(unit)
        snap = await self.systemd.snapshot(unit)
        if result in ("done", "skipped") and snap.running:
            return None
        return Refused(
            f"its weight-cache daemon did not come up (start job {result}, {snap.active_state})",
            f"journalctl --user -u {unit} says why",
        )

    async def stop(self, lane: str, spec: LaneConfig, note: Note) -> Refused | None:
        unit = weights_unit_name(lane, spec)
        await self.systemd.stop_unit(unit)
        snap = await self.systemd.snapshot(unit)
        if snap.running:
            return Refused(f"{unit} is still {snap.active_state} after its stop job")
        if self.host is None or spec.container is None:
            return None
        name = weights_container_name(lane, spec)
        try:
            gone = await self.host.wait_container_gone(lane, spec, spec.stop_timeout, name)
        except PodmanError as exc:
            note(EventKind.GATE, f"cannot confirm the daemon's container is gone: {exc.message}")
            return None
        return None if gone else Refused(f"container {name} is still there after its stop")

    def digest(self, path: str) -> str | None:
        return _record_lines(path)[0]

    async def held(self, path: str, cache: WeightCacheApi) -> Mapping[str, object] | None:
        """What the daemon's ranks say they hold on the GPUs, by socket, asked over the
        sockets (`cache`: its engine's, their names and wire) in the directory its wrapper's
        record (`path`) names, as said (the owner judges it: laned.engines.footprints.held_of);
        None: no answer."""
        sockets = (await asyncio.to_thread(_record_lines, path))[1]
        if sockets is None:
            return None
        return await asyncio.to_thread(weight_cache.held_said, sockets, cache)

    async def pids(self, lane: str, spec: LaneConfig, control_group: str) -> set[int]:
        if self.host is None:
            return set()
        return await self.host.engine_pids(
            lane, spec, control_group, weights_container_name(lane, spec)
        )


class Journald:
    """The lanes' log lines (laned.owner.seam.Journal) from journald."""

    def follow(
        self, units: Iterable[str], since: float | None, opened: Callable[[], None] | None
    ) -> AsyncIterator[tuple[str, str, float]]:
        return journal.follow(units, since, opened)

    def journald_down(self) -> str | None:
        return journal.journald_down()

    async def tail(self, unit: str, lines: int) -> list[str]:
        return await journal.tail(unit, lines)


class StateFiles:
    """laned's state files (laned.owner.seam.StateStore), written atomically."""

    def load(self, state_dir: str) -> Saved:
        return state.load(state_dir)

    def writer(
        self, state_dir: str, saved: Callable[[], Saved], trouble: Callable[[str | None], None]
    ) -> Writer:
        return state.StateWriter(state_dir, saved, trouble)

    def load_checks(self, state_dir: str, lane: str) -> dict[str, Any] | None:
        return state.load_checks(state_dir, lane)

    def save_checks(self, state_dir: str, lane: str, run: dict[str, Any]) -> None:
        state.save_checks(state_dir, lane, run)

    def load_canary(self, state_dir: str, lane: str) -> dict[str, Any] | None:
        return state.load_kept(state.canary_path(state_dir, lane))

    def save_canary(self, state_dir: str, lane: str, answer: dict[str, Any]) -> None:
        state.save_kept(state.canary_path(state_dir, lane), answer)

    def load_checkpoint(self, state_dir: str, lane: str) -> dict[str, Any] | None:
        return state.load_kept(state.checkpoint_path(state_dir, lane))

    def save_checkpoint(self, state_dir: str, lane: str, kept: dict[str, Any]) -> None:
        state.save_kept(state.checkpoint_path(state_dir, lane), kept)
