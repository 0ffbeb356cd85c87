"""The supervisor against the real user manager, journald and simulator lanes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from laned.adapters.host import Host
from laned.adapters.podman import Podman
from laned.adapters.probes import Probe
from laned.adapters.systemd import Systemd
from laned.core.lanes import Desired, LaneState, Verdict
from laned.errors import ActivationFailed, Superseded
from laned.owner.supervisor import Supervisor
from laned.owner.wiring import host_seam
from laned.validation.load import Config
from tests.helpers import free_port, wait_until
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 120))


async def until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Wait on a condition with a deadline (checked every 20 ms)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def supervise(
    harness: Harness, config: Config, host: bool = False, gpus: Any = None
) -> Supervisor:
    """A started supervisor; with `host`, also its host adapter (podman API, preflight, the
    GPU gate), as `laned serve` has it; `gpus` stands in for NVML's readings there."""
    adapter = Host(Podman(harness.env["LANED_PODMAN_SOCKET"]), gpus) if host else None
    sup = Supervisor(config, host_seam(Systemd(harness.bus), Probe(), adapter), systemd_version=252)
    await sup.start()
    return sup


async def stop(sup: Supervisor) -> None:
    await sup.close()
    await sup.seam.close()


@contextlib.asynccontextmanager
async def supervising(
    harness: Harness, config: Config, host: bool = False, gpus: Any = None
) -> AsyncIterator[Supervisor]:
    """A started supervisor, closed afterwards (the lanes are left to the units fixture)."""
    sup = await supervise(harness, config, host, gpus)
    try:
        yield sup
    finally:
        await stop(sup)


def served_model(port: int) -> str | None:
    try:
        return str(
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).json()["data"][0]["id"]
        )
    except (httpx.HTTPError, KeyError, ValueError):
        return None


def saw(sup: Supervisor, lane: str, state: LaneState) -> bool:
    """Whether the lane passed through `state` (transient states are missed by polling)."""
    return any(e.lane == lane and e.to_state is state for e in sup.events)


def transitions(sup: Supervisor, lane: str) -> list[tuple[str, str]]:
    return [(e.to_state.value, e.reason) for e in sup.events if e.lane == lane]


def test_activate_swap_both_ways_and_idempotent(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    config = lane_config(
        harness,
        units,
        tmp_path,
        {"a": FAST, "b": FAST},
        port,
        env={"a": {"LANED_SIM_STARTUP": "1.5"}},
    )
    unit_a = f"{units.name('a')}.service"

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            future = sup.activate("a")
            # While it starts, the phase follows the engine's own log lines (journald).
            await until(lambda: sup.statuses["a"].phase == "loading weights", 10, "a loading phase")
            assert sup.statuses["a"].state is LaneState.STARTING
            assert (await future).state is LaneState.READY
            assert (
                sup.statuses["a"].last_cold_start is not None
                and sup.statuses["a"].last_cold_start > 1
            )
            invocation = harness.show(unit_a, "InvocationID")["InvocationID"]
            again = sup.activate("a")  # idempotent: nothing is restarted
            assert (await again).state is LaneState.READY
            assert harness.show(unit_a, "InvocationID")["InvocationID"] == invocation
            for new, old in (("b", "a"), ("a", "b")):
                await sup.activate(new)
                assert served_model(port) == new
                assert sup.statuses[old].state is LaneState.INACTIVE
                assert sup.statuses[old].desired is Desired.INACTIVE
                assert sup.statuses[old].last_exit is not None
                assert sup.statuses[old].last_exit.verdict is Verdict.REQUESTED
                order = [(e.lane, e.to_state) for e in sup.events]
                stopped = order.index((old, LaneState.INACTIVE), len(order) - 6)
                started = order.index((new, LaneState.STARTING), len(order) - 6)
                assert stopped < started, "the old lane must be gone before the new one starts"
            assert sup.statuses["b"].restarts == 0 and sup.statuses["a"].restarts == 0
            invocation = harness.show(unit_a, "InvocationID")["InvocationID"]
            assert (await sup.restart("a")).state is LaneState.READY
            assert sup.statuses["a"].restarts == 1
            assert harness.show(unit_a, "InvocationID")["InvocationID"] != invocation
            assert ("restarting", "restart requested") in transitions(sup, "a")

    run(scenario())


@pytest.mark.parametrize(
    ("fault", "code", "sig"),
    [
        ({"kind": "exit", "code": 0}, 0, None),
        ({"kind": "exit", "code": 1}, 1, None),
        ({"kind": "crash"}, None, 9),
    ],
    ids=["exit-0", "exit-1", "signal"],
)
def test_an_engine_exit_is_a_failure_restarted_and_counted(
    harness: Harness,
    units: Units,
    tmp_path: Path,
    fault: dict[str, Any],
    code: int | None,
    sig: int | None,
) -> None:
    port = free_port()
    # vLLM's own death (503, then exit 0 at its watchdog) is laned's failure at its 503:
    # test_a_dead_engines_503_is_its_failure_at_once covers it.
    config = lane_config(harness, units, tmp_path, {"a": FAST}, port)

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            async with httpx.AsyncClient() as client:
                await client.post(f"http://127.0.0.1:{port}/sim/fault", json=fault)
            await until(lambda: saw(sup, "a", LaneState.RESTARTING), 10, "the failure to be seen")
            last = sup.statuses["a"].last_exit
            assert last is not None and (last.code, last.signal, last.verdict) == (
                code,
                sig,
                Verdict.FAILURE,
            )
            await until(
                lambda: (
                    sup.statuses["a"].state is LaneState.READY and sup.statuses["a"].restarts == 1
                ),
                30,
                "a restart",
            )
            assert sup.statuses["a"].desired is Desired.ACTIVE
            assert any("engine exited with" in reason for _, reason in transitions(sup, "a"))

    run(scenario())


def test_a_dead_engines_503_is_its_failure_at_once_seen_by_its_log_line(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    # The engine stays up answering 503 (vLLM's VLLM_KEEP_ALIVE_ON_ENGINE_DEATH), and laned
    # probes every minute: only the engine's own lines about its death, read from journald,
    # can have its health asked before the next probe; the 503 is then its death at once
    # (vLLM's HealthRule), not one probe failure of three.
    keep = {"a": {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}}
    slow = FAST.replace('interval = "200ms"', 'interval = "60s"')
    config = lane_config(harness, units, tmp_path, {"a": slow}, port, env=keep)

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            async with httpx.AsyncClient() as client:
                await client.post(
                    f"http://127.0.0.1:{port}/sim/fault", json={"kind": "engine-dead"}
                )
            await until(
                lambda: saw(sup, "a", LaneState.DEGRADED), 30, "the engine's death to be seen"
            )
            said = dict(transitions(sup, "a"))["degraded"]
            assert said.startswith("health 503: vLLM's engine core is dead"), said
            await until(lambda: sup.statuses["a"].state is LaneState.READY, 30, "the restart")
            assert sup.statuses["a"].restarts == 1
            assert len(sup.statuses["a"].failures) == 1  # the exit on laned's stop: none more

    run(scenario())


def test_a_crash_loop_ends_in_failed_without_further_restarts(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    lanes = {"a": FAST + 'start_limit_burst = 3\nrestart_max_delay = "1s"\n'}
    config = lane_config(
        harness, units, tmp_path, lanes, port, env={"a": {"LANED_SIM_FAIL_AT_START": "3"}}
    )
    unit = f"{units.name('a')}.service"

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            with pytest.raises(ActivationFailed, match="crash-loop"):
                await sup.activate("a")
            status = sup.statuses["a"]
            assert status.state is LaneState.FAILED and status.reason.startswith("crash-loop")
            assert (
                status.restarts == 2 and status.last_exit is not None and status.last_exit.code == 3
            )
            assert not sup.interpreter.restart_waiting("a"), (
                "no restart may be pending after a crash loop"
            )
            assert harness.show(unit, "ActiveState")["ActiveState"] == "failed"
        # A new laned leaves the failed lane alone until it is activated again.
        async with supervising(harness, config) as sup:
            assert sup.statuses["a"].state is LaneState.FAILED
            assert not any(s.op for s in sup.statuses.values()) and not sup.interpreter.restarts
            assert harness.show(unit, "ActiveState")["ActiveState"] == "failed"
            # Deactivating acknowledges the failure.
            await sup.deactivate("a")
            assert sup.statuses["a"].state is LaneState.INACTIVE
            assert sup.statuses["a"].desired is Desired.INACTIVE

    run(scenario())


def test_a_stalled_engine_is_degraded_then_restarted(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    lanes = {
        "a": 'restart_sec = "200ms"\nprobe = { interval = "200ms", stall_after = "1s", start_interval_max = "200ms" }\n'
    }
    config = lane_config(harness, units, tmp_path, lanes, port)

    def hang() -> None:
        with pytest.raises(httpx.HTTPError):
            httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "hi"}]}, timeout=20)  # fmt: skip

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            async with httpx.AsyncClient() as client:
                await client.post(f"http://127.0.0.1:{port}/sim/fault", json={"kind": "stall"})
            thread = threading.Thread(target=hang)
            thread.start()
            await until(lambda: saw(sup, "a", LaneState.DEGRADED), 15, "the stall to be detected")
            # Judged on its window (stall_after, 1 s), as laned's own reason says; how soon
            # after the wedge is the machine's (bench/detection.py measures it).
            assert any(
                s == "degraded" and r.startswith("stalled") and r.endswith("no token for 1s")
                for s, r in transitions(sup, "a")
            ), transitions(sup, "a")
            await until(lambda: sup.statuses["a"].state is LaneState.READY, 30, "the restart")
            assert sup.statuses["a"].restarts == 1
            # laned stopped the wedged engine, which exited on request: the run failed all the
            # same, once, and its exit says what saw the failure first.
            last = sup.statuses["a"].last_exit
            assert last is not None and last.verdict is Verdict.FAILURE
            assert "seen first as stalled" in last.reason
            assert len(sup.statuses["a"].failures) == 1
            await asyncio.get_running_loop().run_in_executor(None, thread.join, 30)

    run(scenario())


def test_memory_guard_stops_the_lane_when_memavailable_stays_low(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    # A floor far above this machine's memory: MemAvailable is always "low".
    guard = 'probe = { interval = "200ms", start_interval_max = "200ms", memory_floor_gib = 100000, memory_floor_for = "600ms" }\n'
    config = lane_config(harness, units, tmp_path, {"a": guard}, port)
    unit = f"{units.name('a')}.service"

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            await until(lambda: sup.statuses["a"].state is LaneState.FAILED, 10, "the memory guard")
            assert sup.statuses["a"].reason.startswith("memory-guard: MemAvailable")
            assert harness.show(unit, "ActiveState")["ActiveState"] == "inactive"
            # laned's stop ended a run that had failed (the guard): a failure, counted once.
            last = sup.statuses["a"].last_exit
            assert last is not None and last.verdict is Verdict.FAILURE
            assert "seen first as memory-guard" in last.reason
            assert len(sup.statuses["a"].failures) == 1
            assert not sup.interpreter.restart_waiting("a")

    run(scenario())


def test_start_timeout_fails_the_lane_and_stops_the_unit(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    lanes = {"a": FAST + 'start_timeout = "1s"\n'}
    config = lane_config(
        harness, units, tmp_path, lanes, port, env={"a": {"LANED_SIM_STARTUP": "60"}}
    )
    unit = f"{units.name('a')}.service"

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            with pytest.raises(ActivationFailed, match="start-timeout"):
                await sup.activate("a")
            assert sup.statuses["a"].state is LaneState.FAILED
            assert harness.show(unit, "ActiveState")["ActiveState"] in ("inactive", "failed")

    run(scenario())


def test_changes_behind_laneds_back_are_seen(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST, "b": FAST}, port)
    unit_b = f"{units.name('b')}.service"

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            await asyncio.to_thread(harness.systemctl, "start", "--no-block", unit_b)
            await until(
                lambda: sup.statuses["b"].desired is Desired.ACTIVE, 15, "the out-of-band start"
            )
            await until(
                lambda: sup.statuses["a"].state is LaneState.INACTIVE, 15, "a stopped by the swap"
            )
            assert sup.statuses["a"].desired is Desired.INACTIVE
            await until(lambda: sup.statuses["b"].state is LaneState.READY, 30, "b ready")
            assert ("starting", "started outside laned") in transitions(sup, "b")
            await asyncio.to_thread(harness.systemctl, "stop", unit_b)
            await until(
                lambda: sup.statuses["b"].state is LaneState.INACTIVE, 5, "the out-of-band stop"
            )
            assert sup.statuses["b"].desired is Desired.INACTIVE
            assert sup.statuses["b"].restarts == 0

    run(scenario())


def test_newest_request_wins_and_storms_leave_one_lane(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    config = lane_config(
        harness,
        units,
        tmp_path,
        {"a": FAST, "b": FAST, "c": FAST},
        port,
        env={"a": {"LANED_SIM_STARTUP": "3"}},
    )

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            first = sup.activate("a")
            await until(lambda: sup.statuses["a"].state is LaneState.STARTING, 5, "a starting")
            second = sup.activate("b")
            with pytest.raises(Superseded):
                await first
            await second
            assert served_model(port) == "b"
            futures, calls = [], []
            for i in range(12):
                lane = "abc"[i % 3]
                kind = "deactivate" if i % 4 == 3 else "activate"
                futures.append(sup.deactivate(lane) if kind == "deactivate" else sup.activate(lane))
                calls.append(f"{kind} {lane}")
                await asyncio.sleep(0.01 * (i % 3))
            last = sup.activate("c")
            await last
            # Every caller hears back: ready, superseded, or failed — none is left hanging.
            _done, pending = await asyncio.wait(futures, timeout=30)
            assert not pending, [calls[futures.index(f)] for f in pending]
            running = [n for n in "abc" if harness.show(f"{units.name(n)}.service", "ActiveState")["ActiveState"]
                       in ("active", "activating", "deactivating")]  # fmt: skip
            assert running == ["c"]
            assert served_model(port) == "c"

    run(scenario())


def test_activate_while_its_own_stop_is_under_way_follows_the_new_run(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    """deactivate, then activate again while the engine still shuts down (2 s after its port
    closed): the old run's exit lands before the new run is followed, so it is never taken
    for the new run's (which left the new run unwatched and its callers waiting forever)."""
    port = free_port()
    config = lane_config(
        harness, units, tmp_path, {"a": FAST}, port, env={"a": {"LANED_SIM_SHUTDOWN": "2"}}
    )
    unit = f"{units.name('a')}.service"

    def active_state() -> str:
        return harness.show(unit, "ActiveState")["ActiveState"]

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            first = harness.show(unit, "InvocationID")["InvocationID"]
            stopping = sup.deactivate("a")
            await until(lambda: active_state() == "deactivating", 10, "a deactivating")
            again = sup.activate("a")
            with pytest.raises(Superseded):
                await stopping
            status = await asyncio.wait_for(again, 30)
            assert status.state is LaneState.READY and active_state() == "active"
            assert harness.show(unit, "InvocationID")["InvocationID"] != first
            assert served_model(port) == "a"
            assert sup.statuses["a"].desired is Desired.ACTIVE
            # The new run is watched: its engine dying is a failure, and it is restarted.
            async with httpx.AsyncClient() as client:
                await client.post(
                    f"http://127.0.0.1:{port}/sim/fault", json={"kind": "engine-dead"}
                )
            await until(lambda: saw(sup, "a", LaneState.RESTARTING), 15, "a restarting")
            await until(lambda: sup.statuses["a"].state is LaneState.READY, 30, "a ready again")

    run(scenario())


def test_a_new_laned_adopts_a_healthy_lane_without_restarting_it(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    config = lane_config(
        harness, units, tmp_path, {"a": FAST, "b": FAST}, port, daemon='default_lane = "b"'
    )
    unit_a = f"{units.name('a')}.service"

    async def scenario() -> None:
        sup = await supervise(harness, config)  # first start: nothing desired -> the default lane
        await until(lambda: sup.statuses["b"].state is LaneState.READY, 30, "the default lane")
        await sup.activate("a")
        invocation = harness.show(unit_a, "InvocationID")["InvocationID"]
        await stop(sup)
        async with supervising(harness, config) as sup:
            await until(lambda: sup.statuses["a"].state is LaneState.READY, 10, "a adopted")
            assert harness.show(unit_a, "InvocationID")["InvocationID"] == invocation
            assert ("starting", "adopted: already running") in transitions(sup, "a")
            assert sup.statuses["b"].state is LaneState.INACTIVE

    run(scenario())


def test_laned_killed_mid_swap_converges_to_the_last_desired_lane(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    lane_config(
        harness, units, tmp_path, {"a": FAST, "b": FAST}, port, daemon='default_lane = "a"',
        env={"b": {"LANED_SIM_STARTUP": "2"}},
    )  # fmt: skip
    config_path = tmp_path / "laned.toml"  # written by lane_config
    env = {**harness.env, "LANED_CONFIG": str(config_path)}
    state_file = tmp_path / "state" / "state.json"

    def events() -> list[dict[str, Any]]:
        try:
            return list(json.loads(state_file.read_text())["events"])
        except (OSError, ValueError, KeyError):
            return []

    logs = tmp_path / "laned.log"

    def start(*argv: str) -> subprocess.Popen[bytes]:
        with logs.open("a") as out:  # the child keeps its own descriptor
            return subprocess.Popen([sys.executable, "-m", *argv], env=env, stdout=out, stderr=out)

    laned = start("laned", "serve")
    try:
        wait_until(lambda: served_model(port) == "a", 30, "the default lane a")
        laned.send_signal(signal.SIGKILL)
        laned.wait(10)
        # Ask for b through a second laned, and kill that one while b is starting.
        driver = start("tests.integration.activate", "b")
        wait_until(
            lambda: any(e["lane"] == "b" and e["to"] == "starting" for e in events()),
            30,
            "b starting",
        )
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
        laned = start("laned", "serve")
        wait_until(lambda: served_model(port) == "b", 30, "convergence to b")
        unit_b = f"{units.name('b')}.service"
        wait_until(
            lambda: any(e["lane"] == "b" and e["to"] == "ready" for e in events()), 30, "b ready"
        )
        invocation = harness.show(unit_b, "InvocationID")["InvocationID"]
        # Killed again with b healthy: the next laned adopts b and does not restart it.
        laned.send_signal(signal.SIGKILL)
        laned.wait(10)
        laned = start("laned", "serve")
        wait_until(
            lambda: events() and events()[-1]["reason"].startswith("health 200"),
            30,
            "b adopted and ready",
        )
        assert harness.show(unit_b, "InvocationID")["InvocationID"] == invocation
        assert harness.show(f"{units.name('a')}.service", "ActiveState")["ActiveState"] != "active"
        # laned's log (the journal, under systemd) has the transitions, not a line per probe.
        text = logs.read_text()
        assert "b: starting -> ready" in text and "HTTP Request:" not in text
    finally:
        laned.send_signal(signal.SIGTERM)
        try:
            laned.wait(20)
        except subprocess.TimeoutExpired:
            laned.kill()
        print(logs.read_text())


@pytest.mark.parametrize("how", ["disconnect", "eof"])
def test_bus_reconnect_keeps_watching(
    harness: Harness, units: Units, tmp_path: Path, how: str
) -> None:
    port = free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST}, port)
    unit = f"{units.name('a')}.service"

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            assert sup.seam.manager.systemd.bus is not None
            # The connection drops under laned's feet: closed, or cut by the other side (EOF,
            # which dbus-fast re-raises from wait_for_disconnect).
            if how == "disconnect":
                sup.seam.manager.systemd.bus.disconnect()
            else:
                sup.seam.manager.systemd.bus._sock.shutdown(socket.SHUT_RDWR)
            await until(
                lambda: (
                    sup.seam.manager.systemd.bus is not None
                    and sup.seam.manager.systemd.bus.connected
                ),
                10,
                "a reconnect",
            )
            await asyncio.to_thread(harness.systemctl, "stop", unit)
            await until(
                lambda: sup.statuses["a"].state is LaneState.INACTIVE,
                5,
                "the stop seen after reconnecting",
            )
            await asyncio.to_thread(harness.systemctl, "daemon-reexec")
            await asyncio.to_thread(harness.systemctl, "start", "--no-block", unit)
            await until(
                lambda: sup.statuses["a"].state is LaneState.READY,
                30,
                "a start seen after a re-exec",
            )

    run(scenario())


@contextlib.contextmanager
def bus_kept_away(sup: Supervisor, tmp_path: Path) -> Iterator[None]:
    """The bus connection drops and every reconnect fails until the block ends."""
    address = sup.seam.manager.systemd.address
    sup.seam.manager.systemd.address = f"unix:path={tmp_path}/no-bus"
    assert sup.seam.manager.systemd.bus is not None
    sup.seam.manager.systemd.bus.disconnect()
    try:
        yield
    finally:
        sup.seam.manager.systemd.address = address


def test_a_restart_broken_by_a_lost_bus_is_caught_up(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    """The bus drops and stays away while a restart is asked for: the restart fails at its
    first call to systemd, leaving the lane in between (restarting, its unit still running).
    Once the same manager is back, laned follows the running engine again instead of leaving
    the lane restarting forever, and says in the events what it found."""
    config = lane_config(harness, units, tmp_path, {"a": FAST}, free_port())
    unit = f"{units.name('a')}.service"

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            engine = harness.show(unit, "MainPID")["MainPID"]
            with bus_kept_away(sup, tmp_path):
                restarted = sup.restart("a")  # resolves when the lane is ready again
                await until(
                    lambda: sup.statuses["a"].op is None, 10, "the restart ended by the bus"
                )
                assert sup.statuses["a"].state is LaneState.RESTARTING
                assert "user manager" in sup.notices
            await asyncio.wait_for(restarted, 30)
            assert harness.show(unit, "MainPID")["MainPID"] == engine  # the same engine
            assert "user manager" not in sup.notices
            reasons = [e.reason for e in sup.events if e.lane == "a"]
            assert any("the same manager" in r and "is active (running)" in r for r in reasons)
            assert any(r.startswith("adopted again after reconnected") for r in reasons), reasons

    run(scenario())


def test_a_swap_broken_by_a_lost_bus_is_carried_out_when_it_is_back(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    """A swap a -> b whose first call to systemd fails (the bus is away): b is desired and
    never started, a runs and is not desired. When the bus is back laned activates b, which
    stops a first: the swap the operator asked for, carried out."""
    port = free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST, "b": FAST}, port)
    unit_a, unit_b = (f"{units.name(n)}.service" for n in ("a", "b"))

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            with bus_kept_away(sup, tmp_path):
                with pytest.raises(ActivationFailed, match="user bus"):
                    await sup.activate("b")
                assert sup.statuses["b"].desired is Desired.ACTIVE
                assert sup.statuses["a"].desired is Desired.INACTIVE
            await until(lambda: sup.statuses["b"].state is LaneState.READY, 30, "b ready")
            await until(lambda: sup.statuses["a"].state is LaneState.INACTIVE, 10, "a stopped")
            assert harness.show(unit_b, "ActiveState")["ActiveState"] == "active"
            assert harness.show(unit_a, "ActiveState")["ActiveState"] != "active"
            reasons = [e.reason for e in sup.events if e.lane == "b"]
            assert any(r.startswith("activated again after reconnected") for r in reasons), reasons

    run(scenario())
