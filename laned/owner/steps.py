"""The owner's seam over the real host (laned.owner.seam.Seam): systemd over D-Bus, podman,
NVML, the page cache and the engines' HTTP endpoints, through laned.adapters. Each method is
I/O that answers with a value and changes no lane state; the owner (laned.owner.supervisor)
runs them inside an operation, checks after each one that its operation is still current,
and fires the lane machine's events itself.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from laned import engines
from laned.adapters import journal, rendered, weight_cache
from laned.adapters.commands import run_prepare
from laned.adapters.engine_api import EngineClient
from laned.adapters.host import Host
from laned.adapters.kernel import meminfo, port_busy
from laned.adapters.pagecache import (
    prefetch,
    read_checkpoint,
    residency,
    weight_files,
    weights_gib,
)
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
from laned.core import canary, policy
from laned.core.checkpoint import Files
from laned.core.exits import ExitRecord, parse_exit_record
from laned.core.gpu_memory import Asleep, confirm_sleep, gate_verdict
from laned.core.lanes import EventKind, LaneState, Refused
from laned.core.liveness import EngineSample, Unanswered
from laned.core.page_cache import Prefetched, Residency
from laned.core.recorder import Recorder
from laned.core.unit_state import UnitCallback, UnitSnapshot
from laned.errors import Finding, LanedError, NotAContainer, PodmanError
from laned.gates.acceptance import GateResult, run_gates
from laned.owner.seam import ALONE, Beside, Note
from laned.preflight.facts import GIB, NO_SLEEPERS, HostFacts, Sleepers
from laned.preflight.fit import beside_sleepers, sleep_level_for
from laned.preflight.rules import evaluate, model_path, not_held
from laned.render.plan import Action

log = logging.getLogger("laned.supervisor")


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


class HostSeam:
    """The Seam over laned's adapters (`host` None: no podman or NVML, as in the tests that
    run plain exec lanes on a bare user manager)."""

    def __init__(self, systemd: Systemd, probe: Probe, host: Host | None = None) -> None:
        self.systemd, self.probe, self.host = systemd, probe, host

    # --- the user manager ---------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self.systemd.address

    def connected(self) -> bool:
        return self.systemd.bus is not None and self.systemd.bus.connected

    async def connect(self, on_change: UnitCallback, on_restart: Callable[[], None]) -> None:
        self.systemd.on_unit_change, self.systemd.on_manager_restart = on_change, on_restart
        if not self.connected():
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

    async def render(self, config: Config, systemd_version: int) -> list[tuple[Action, str]]:
        return await asyncio.to_thread(rendered.apply, config, systemd_version)

    async def reload(self) -> None:
        await self.systemd.reload()

    async def ref_unit(self, unit: str) -> None:
        await self.systemd.ref_unit(unit)

    async def snapshot(self, unit: str) -> UnitSnapshot:
        return await self.systemd.snapshot(unit)

    # --- units --------------------------------------------------------------------------------

    def exit_record(self, path: str) -> ExitRecord | None:
        return read_exit_record(path)

    async def preflight(
        self,
        config: Config,
        lane: str,
        states: Mapping[str, LaneState],
        image_id: str | None,
        sleepers: Sleepers = NO_SLEEPERS,
    ) -> list[Finding]:
        """The lane's preflight findings as of now ([] without a host adapter)."""
        if self.host is None:
            return []
        peer = policy.port_peer(config, lane, states)
        facts = await self.host.lane_facts(config, lane, peer, image_id, sleepers)
        return evaluate(lane, config.lanes[lane], facts)

    async def still_ending(self, unit: str, seen: UnitSnapshot | None) -> bool:
        """Whether the unit runs or is stopping, by systemd or by what laned has seen.

        systemd may answer "inactive" before its signal of that change reached laned; then the
        stop job that follows ends at once, and systemd sends a unit's pending change before the
        end of a job (bus_job_send_removed_signal), so laned has seen the exit."""
        snap = await self.systemd.snapshot(unit)
        return snap.ending or (seen is not None and seen.ending)

    async def stop(self, unit: str) -> Refused | None:
        """Stop the unit and confirm systemd has it stopped."""
        await self.systemd.stop_unit(unit)
        snap = await self.systemd.snapshot(unit)
        if snap.running:
            return Refused(
                f"{unit} is still {snap.active_state} after its stop job", "see `laned logs`"
            )
        return None

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

    async def clear_for_start(
        self,
        lane: str,
        spec: LaneConfig,
        last_image: str | None,
        note: Note,
        recorder: Recorder,
        waking: bool = False,
        sleepers: Collection[int] = (),
        beside: Beside = ALONE,
    ) -> Refused | None:
        """Before a start: the secrets file systemd will read is the user's own file, not a
        link (whatever `force` said to preflight), `prepare` after an image change, the GPU
        memory released, the port free. Why the lane cannot start, or None. Before a wake
        from sleep only the GPU memory: the engine keeps its image and holds its own port."""
        if spec.secrets_path and not waking:
            key = await asyncio.to_thread(key_file, spec.secrets_path)
            held = not_held(lane, spec, key)
            if held is not None:
                return Refused(held.message, held.hint)
        host = self.host
        if host is not None and spec.container is not None and spec.prepare and not waking:
            try:
                image = await host.image_id(spec)
            except PodmanError:
                image = None  # preflight already warned; podman itself will say at start
            if image and last_image and image != last_image:
                note(EventKind.PREPARE, "image changed: running prepare")
                try:
                    await run_prepare(lane, spec, lambda line: note(EventKind.PREPARE, line))
                except LanedError as exc:
                    return Refused(f"prepare: {exc.message}", exc.hint)
        if host is not None and spec.gpu_gate.enabled:
            result, why = await host.gpu_gate(spec, sleepers, beside.staying, beside.room)
            if result is None:
                note(EventKind.GATE, f"GPU-memory gate skipped: {why}")
            else:
                recorder.gpu_gate(lane, result.released, result.waited)
                said, refused = gate_verdict(result, beside.lanes)
                note(EventKind.GATE, said)
                if refused is not None:
                    return refused
                readings = None if waking or not sleepers else await host.gpu_readings(spec)
                sleeping = beside_sleepers(lane, spec, readings or [], sleepers)
                if sleeping:  # vLLM would refuse to start: say so now, with the flag to lower
                    return Refused(f"gpu-gate: {sleeping[0].message}", sleeping[0].hint)
        deadline = time.monotonic() + 5
        while not waking and await asyncio.to_thread(port_busy, spec.port):
            # A stopped engine's listener is gone at once; give a slow exit a moment.
            if time.monotonic() > deadline:
                return Refused(
                    f"port {spec.port} is still in use after the lanes taken off stopped",
                    f"find it: ss -ltnp 'sport = :{spec.port}'",
                )
            await asyncio.sleep(0.1)
        return None

    async def start_weights(self, lane: str, spec: LaneConfig) -> Refused | None:
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

    async def stop_weights(self, lane: str, spec: LaneConfig, note: Note) -> Refused | None:
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

    def weights_digest(self, path: str) -> str | None:
        return _record_lines(path)[0]

    async def weights_held(self, path: str, pattern: str) -> Mapping[str, object] | None:
        sockets = (await asyncio.to_thread(_record_lines, path))[1]
        if sockets is None:
            return None
        return await asyncio.to_thread(weight_cache.held_said, sockets, pattern)

    async def weights_pids(self, lane: str, spec: LaneConfig, control_group: str) -> set[int]:
        if self.host is None:
            return set()
        return await self.host.engine_pids(
            lane, spec, control_group, weights_container_name(lane, spec)
        )

    async def start(self, unit: str) -> None:
        """Clear a failed state and start the unit (the start job ends when it runs)."""
        await self.systemd.reset_failed_unit(unit)
        result = await self.systemd.start_unit(unit)
        if result not in ("done", "skipped"):
            log.warning("start job of %s ended %s", unit, result)

    def follow_logs(
        self, units: Iterable[str], since: float | None, opened: Callable[[], None] | None
    ) -> AsyncIterator[tuple[str, str, float]]:
        return journal.follow(units, since, opened)

    # --- the engines ------------------------------------------------------------------------

    def api_key(self, spec: LaneConfig) -> str | None:
        return read_api_key(spec.secrets_path, engines.for_lane(spec).api_key_env)

    def _engine(self, spec: LaneConfig, key: str | None = None, timeout: float = 0) -> EngineClient:
        """The lane's engine, as its profile says to reach it, over the probe's pool."""
        profile = engines.for_lane(spec)
        return self.probe.engine(spec.port, spec.served_model_name, key, timeout, profile)

    async def health(self, port: int, path: str = "/health") -> int | None:
        return await self.probe.engine(port).health(path=path)

    async def models(self, port: int, api_key: str | None) -> list[str] | None:
        return await self.probe.engine(port, api_key=api_key).listed()

    async def accepts(self, port: int) -> bool:
        return await self.probe.accepts(port)

    async def sample(self, spec: LaneConfig) -> EngineSample | Unanswered | None:
        # llama-server guards /metrics with its key (vLLM and SGLang do not).
        key = await asyncio.to_thread(self.api_key, spec)
        return await self._engine(spec, key).sample()

    async def sleep_level(self, spec: LaneConfig) -> int | None:
        key = await asyncio.to_thread(self.api_key, spec)
        return await self._engine(spec, key).sleep_level()

    async def sleep(
        self,
        lane: str,
        spec: LaneConfig,
        seen: UnitSnapshot | None,
        note: Note,
        level: int,
    ) -> Refused | Asleep:
        """Put the lane's engine to sleep at `level` (its requests drained first) and confirm
        it: the engine's own word where it has one (vLLM's /is_sleeping), and where NVML
        lists processes, less GPU memory held by the engine's processes than before (what
        stays is its residual, said in a note): laned.core.gpu_memory.confirm_sleep."""
        key = await asyncio.to_thread(self.api_key, spec)
        engine, host = self._engine(spec, key), self.host
        pids = (
            set()
            if host is None or seen is None
            else await host.engine_pids(lane, spec, seen.control_group)
        )
        before = None if host is None else await host.gpu_memory_of(spec, pids)
        try:
            await engine.sleep(level, timeout=spec.stop_timeout)
            asleep = await engine.is_sleeping()
        except LanedError as exc:
            return Refused(f"sleep (level {level}): {exc.message}", exc.hint)
        # No second reading where the engine says it is awake: that is the verdict.
        after = None if host is None or asleep is False else await host.gpu_memory_of(spec, pids)
        slept = confirm_sleep(level, asleep, pids, before, after)
        if isinstance(slept, Asleep) and slept.said:
            note(EventKind.SLEEP, slept.said)
        return slept

    async def canary(self, spec: LaneConfig) -> canary.Answer:
        """The engine's answer to the canary prompt (LanedError when it cannot answer)."""
        key = await asyncio.to_thread(self.api_key, spec)
        return await self._engine(spec, key).canary(120)

    def sleep_level_now(self, spec: LaneConfig, pinned: bool = False) -> tuple[int, str]:
        """The level the lane sleeps at now (laned.preflight.fit.sleep_level_for): its own, or
        2 where host RAM cannot hold its weights at level 1 (`pinned`: its engine holds its
        pinned buffers from an earlier level-1 sleep); and why, when the level is not its own.
        Blocking (it reads the model directory): call it off the loop."""
        weights = weights_gib(model_path(spec))
        return sleep_level_for(spec.sleep_level, weights, meminfo().get("MemAvailable"), pinned)

    async def asleep(self, spec: LaneConfig) -> bool:
        """Whether a running lane that can sleep sleeps now (False when it cannot say)."""
        if not spec.sleep_level:
            return False
        try:
            key = await asyncio.to_thread(self.api_key, spec)
            return await self._engine(spec, key).is_sleeping() is True
        except LanedError:
            return False

    async def wake(self, spec: LaneConfig, level: int) -> Refused | None:
        """Wake the engine asleep at `level`, with what a wake at that level needs (the
        engine's profile: after a vLLM level 2 the weights read again and the prefix cache
        reset, a level-2 wake alone answering wrongly, vLLM #29341)."""
        key = await asyncio.to_thread(self.api_key, spec)
        engine = self._engine(spec, key)
        try:
            awake = await engine.wake_up(level, timeout=spec.start_timeout)
            if not awake or await engine.is_sleeping():
                return Refused("wake: the engine still says it sleeps after the wake")
        except LanedError as exc:
            return Refused(f"wake: {exc.message}", exc.hint)
        return None

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

    async def engine_pids(self, lane: str, spec: LaneConfig, control_group: str) -> set[int]:
        if self.host is None:
            return set()
        return await self.host.engine_pids(lane, spec, control_group)

    def use_podman(self, config: Config) -> None:
        if self.host is not None:
            self.host.podman.use(podman_socket(config, os.environ, os.getuid()))

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

    # --- the host, read ------------------------------------------------------------------------

    def journald_down(self) -> str | None:
        return journal.journald_down()

    async def log_tail(self, unit: str, lines: int) -> list[str]:
        return await journal.tail(unit, lines)

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

    async def facts(self) -> HostFacts:
        if self.host is None:
            total = meminfo().get("MemTotal")
            return HostFacts(None, "not read: laned runs without its host adapter", total)
        return await self.host.facts()

    def weights_gib(self, model: str | None) -> float | None:
        return weights_gib(model)

    async def close(self) -> None:
        await self.probe.close()
        if self.host is not None:
            self.host.close()

    # --- the page cache -----------------------------------------------------------------------

    def weight_files(self, model: str | None) -> list[str]:
        return weight_files(model)

    def checkpoint(self, model: str | None) -> Files:
        return read_checkpoint(model)

    def residency(self, files: Sequence[str]) -> Residency:
        return residency(files)

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
        return prefetch(files, budget_bytes, max_bytes_per_s, stop, memory_left)
