"""The steps of a start and a stop, as I/O that answers with values and changes no lane state.

The owner (laned.owner.supervisor) runs them inside an operation, checks after each one that
its operation is still current, and makes the transitions itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from laned.adapters import state
from laned.adapters.host import Host, meminfo, port_busy, run_prepare, weights_gib
from laned.adapters.probes import Probe
from laned.adapters.secret_files import read_api_key
from laned.adapters.systemd import Systemd
from laned.config.model import Config, LaneConfig
from laned.config.names import container_name
from laned.core import canary, policy
from laned.core.exits import ExitRecord, parse_exit_record
from laned.core.lanes import EventKind, LaneState
from laned.core.recorder import Recorder
from laned.core.unit_state import UnitSnapshot
from laned.errors import Finding, LanedError, PodmanError
from laned.gates.acceptance import GateResult, run_gates
from laned.gates.engine_api import EngineClient
from laned.owner.traffic import Traffic
from laned.preflight.facts import GIB, NO_SLEEPERS, Sleepers
from laned.preflight.fit import beside_sleepers, sleep_level_for
from laned.preflight.rules import model_path

log = logging.getLogger("laned.supervisor")

Note = Callable[[EventKind, str], None]


@dataclass(frozen=True)
class Refused:
    """A step that cannot be done: why (for the lane's reason) and what to do."""

    reason: str
    hint: str = ""


def read_exit_record(path: str) -> ExitRecord | None:
    """The serve wrapper's record of the engine's last exit; None when absent or unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_exit_record(handle.read())
    except OSError:
        return None


async def preflight(
    host: Host | None,
    config: Config,
    lane: str,
    states: Mapping[str, LaneState],
    image_id: str | None,
    sleepers: Sleepers = NO_SLEEPERS,
) -> list[Finding]:
    """The lane's preflight findings as of now ([] without a host adapter)."""
    if host is None:
        return []
    peer = policy.port_peer(config, lane, states)
    return await host.preflight(config, lane, peer, image_id, sleepers)


async def still_ending(systemd: Systemd, unit: str, seen: UnitSnapshot | None) -> bool:
    """Whether the unit runs or is stopping, by systemd or by what laned has seen.

    systemd may answer "inactive" before its signal of that change reached laned; then the
    stop job that follows ends at once, and systemd sends a unit's pending change before the
    end of a job (bus_job_send_removed_signal), so laned has seen the exit."""
    snap = await systemd.snapshot(unit)
    return snap.ending or (seen is not None and seen.ending)


async def stop(systemd: Systemd, unit: str) -> Refused | None:
    """Stop the unit and confirm systemd has it stopped."""
    await systemd.stop_unit(unit)
    snap = await systemd.snapshot(unit)
    if snap.running:
        return Refused(
            f"{unit} is still {snap.active_state} after its stop job", "see `laned logs`"
        )
    return None


async def container_gone(
    host: Host | None, lane: str, spec: LaneConfig, note: Note
) -> Refused | None:
    """A stopped container lane's container must be gone before the next lane starts."""
    if host is None or spec.container is None:
        return None
    try:
        gone = await host.wait_container_gone(lane, spec, spec.stop_timeout)
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
    host: Host | None,
    lane: str,
    spec: LaneConfig,
    last_image: str | None,
    note: Note,
    recorder: Recorder,
    waking: bool = False,
    sleepers: Collection[int] = (),
) -> Refused | None:
    """Before a start: `prepare` after an image change, the GPU memory released, the port
    free. Why the lane cannot start, or None. Before a wake from sleep only the GPU memory:
    the engine keeps its image and holds its own port."""
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
        result, why = await host.gpu_gate(spec, sleepers)
        if result is None:
            note(EventKind.GATE, f"GPU-memory gate skipped: {why}")
        else:
            recorder.gpu_gate(lane, result.released, result.waited)
            if not result.released:
                note(EventKind.GATE, "GPU-memory gate timed out")
                return Refused(
                    f"gpu-gate: still held after {result.waited:.1f}s: "
                    + "; ".join(result.still_held),
                    "see `nvidia-smi` for what holds the GPU memory",
                )
            note(
                EventKind.GATE,
                f"GPU memory released after {result.waited:.3f}s ({result.polls} reading(s))",
            )
            readings = None if waking or not sleepers else await host.gpu_readings(spec)
            beside = beside_sleepers(lane, spec, readings or [], sleepers)
            if beside:  # vLLM would refuse to start: say so now, with the flag to lower
                return Refused(f"gpu-gate: {beside[0].message}", beside[0].hint)
    deadline = time.monotonic() + 5
    while not waking and await asyncio.to_thread(port_busy, spec.port):
        # A stopped engine's listener is gone at once; give a slow exit a moment.
        if time.monotonic() > deadline:
            return Refused(
                f"port {spec.port} is still in use after the group's other lanes stopped",
                f"find it: ss -ltnp 'sport = :{spec.port}'",
            )
        await asyncio.sleep(0.1)
    return None


async def start(systemd: Systemd, unit: str) -> None:
    """Clear a failed state and start the unit (the start job ends when it runs)."""
    await systemd.reset_failed_unit(unit)
    result = await systemd.start_unit(unit)
    if result not in ("done", "skipped"):
        log.warning("start job of %s ended %s", unit, result)


@dataclass(frozen=True)
class Asleep:
    """A sleep confirmed: the engine's processes (for the GPU-memory gate) and what they keep
    on each GPU by index (empty where NVML cannot list processes)."""

    pids: frozenset[int]
    residual: dict[int, int]


async def sleep(
    probe: Probe,
    host: Host | None,
    lane: str,
    spec: LaneConfig,
    seen: UnitSnapshot | None,
    note: Note,
    level: int,
) -> Refused | Asleep:
    """Put the lane's engine to sleep at `level` (its requests drained first) and confirm
    it: /is_sleeping, and where NVML lists processes, less GPU memory held by the engine's
    processes than before (what stays is its residual, said in a note)."""
    pids = (
        set()
        if host is None or seen is None
        else await host.engine_pids(lane, spec, seen.control_group)
    )
    before = None if host is None else await host.gpu_memory_of(spec, pids)
    try:
        await probe.sleep(spec.port, level, timeout=spec.stop_timeout)
        asleep = await probe.is_sleeping(spec.port)
    except LanedError as exc:
        return Refused(f"sleep (level {level}): {exc.message}", exc.hint)
    if not asleep:
        return Refused(f"sleep (level {level}): /is_sleeping still says false after /sleep")
    after = None if host is None else await host.gpu_memory_of(spec, pids)
    if before is None or after is None:
        return Asleep(frozenset(pids), {})
    held, kept = sum(before.values()), sum(after.values())
    if held > 0 and kept >= held:
        return Refused(
            f"sleep (level {level}): its processes still hold {kept / GIB:.2f} GiB of GPU "
            "memory, no less than before",
            "is --enable-sleep-mode in its wrapper? (laned render)",
        )
    note(
        EventKind.SLEEP,
        f"asleep: {(held - kept) / GIB:.2f} GiB of GPU memory released, {kept / GIB:.2f} GiB stay",
    )
    return Asleep(frozenset(pids), after)


async def canary_check(
    probe: Probe, config: Config, lane: str, spec: LaneConfig, digest: str
) -> tuple[canary.Outcome | None, str]:
    """Ask the canary and judge the answer against what is kept for `digest` (a first
    answer is kept). (None, why) when it could not be asked."""
    try:
        answer = await probe.canary(
            spec.port, spec.served_model_name, read_api_key(spec.secrets_path), timeout=120
        )
    except LanedError as exc:
        return None, exc.message
    path = state.canary_path(config.daemon.state_dir, lane)
    outcome, detail = canary.judge(await asyncio.to_thread(state.load_kept, path), digest, answer)
    if outcome is canary.Outcome.RECORDED:
        try:
            await asyncio.to_thread(state.save_kept, path, answer.to_json(digest))
        except LanedError as exc:
            return outcome, f"{detail} (not kept: {exc.message})"
    return outcome, detail


def sleep_level_now(spec: LaneConfig, pinned: bool = False) -> tuple[int, str]:
    """The level the lane sleeps at now (laned.preflight.fit.sleep_level_for): its own, or
    2 where host RAM cannot hold its weights at level 1 (`pinned`: its engine holds its
    pinned buffers from an earlier level-1 sleep); and why, when the level is not its own.
    Blocking (it reads the model directory): call it off the loop."""
    weights = weights_gib(model_path(spec))
    return sleep_level_for(spec.sleep_level, weights, meminfo().get("MemAvailable"), pinned)


async def found_asleep(probe: Probe, spec: LaneConfig) -> bool:
    """Whether a running lane that can sleep sleeps now (False when it cannot say)."""
    if not spec.sleep_level:
        return False
    try:
        return await probe.is_sleeping(spec.port)
    except LanedError:
        return False


async def wake(probe: Probe, spec: LaneConfig, level: int) -> Refused | None:
    """Wake the engine asleep at `level`: every tag; after level 2 the weights read again and
    the prefix cache reset (a level-2 wake alone answers wrongly, vLLM #29341)."""
    try:
        awake = await probe.wake_up(spec.port, timeout=spec.start_timeout)
        if level == 2:
            await probe.reload_weights(spec.port, timeout=spec.start_timeout)
            await probe.reset_prefix_cache(spec.port)
        if not awake or await probe.is_sleeping(spec.port):
            return Refused("wake: the engine still says it sleeps after /wake_up")
    except LanedError as exc:
        return Refused(f"wake: {exc.message}", exc.hint)
    return None


async def running_image(host: Host | None, lane: str, spec: LaneConfig) -> str | None:
    """The image a container lane runs (it may have been rebuilt since it started)."""
    if host is None or spec.container is None:
        return None
    try:
        running = await host.podman.container(container_name(lane, spec))
        return running.image_id if running else await host.image_id(spec)
    except PodmanError as exc:
        log.warning("%s: cannot record the image id: %s", lane, exc.message)
        return None


async def run_checks(
    probe: Probe,
    spec: LaneConfig,
    gates: Sequence[str],
    last_cold_start: float | None,
    on_result: Callable[[GateResult], None],
) -> list[GateResult]:
    """Run acceptance gates against the lane's engine, over the probe's connections."""
    client = EngineClient(
        probe.url(spec.port, ""),
        spec.served_model_name,
        read_api_key(spec.secrets_path),
        timeout=max(spec.checks.deadline, spec.checks.context_deadline) + 30,
        pool=probe.client,
    )
    try:
        return list(
            await run_gates(client, spec.checks, gates, last_cold_start, on_result=on_result)
        )
    finally:
        await client.close()


async def drain(
    traffic: Traffic,
    lane: str,
    spec: LaneConfig,
    force: bool,
    note: Callable[[str], None],
    clock: Callable[[], float],
) -> None:
    """Wait for the requests laned's OpenAI endpoint has in flight to the lane (it sends it
    no new ones: the lane is stopping or restarting), up to the lane's drain_timeout;
    `force` cuts them. The notes say which."""
    count = traffic.in_flight(lane)
    if not count:
        return
    if force:
        note(f"force: cutting {count} request(s) in flight, no drain")
        return
    note(f"draining {count} request(s) (drain_timeout {spec.drain_timeout:g} s)")
    began = clock()
    left = await traffic.drain(lane, spec.drain_timeout)
    if left:
        note(
            f"drain_timeout {spec.drain_timeout:g} s passed: cutting {left} request(s) still in flight"
        )
    else:
        note(f"drained {count} request(s) in {clock() - began:.1f} s")
