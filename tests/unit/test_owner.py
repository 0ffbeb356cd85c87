"""The owner (laned.owner.supervisor) driven over fake adapters, fast: a fake user manager
that runs units at once and says so as systemd's signals do, a fake probe that answers for
the units it runs, no journal. What the integration tests show on real systemd, in
milliseconds: a swap, an engine's own exit (status 0 too) restarted as a failure, a crash
loop that ends in `failed`, a deactivate that wins over a restart waiting to happen."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from laned.config.load import parse_config
from laned.config.model import Config
from laned.config.names import unit_name
from laned.core.lanes import Desired, LaneState, Verdict
from laned.core.liveness import EngineSample
from laned.core.unit_state import CLD_EXITED, UnitSnapshot
from laned.owner import watchers
from laned.owner.supervisor import Supervisor


class FakeManager:
    """A systemd user manager in memory: StartUnit runs a unit at once, StopUnit stops it,
    and each change reaches the owner as a PropertiesChanged would."""

    def __init__(self) -> None:
        self.units: dict[str, UnitSnapshot] = {}
        self.bus = SimpleNamespace(connected=True)
        self.address = "fake"
        self.on_unit_change: Callable[[str, dict[str, Any]], None] | None = None
        self.on_manager_restart: Callable[[], None] | None = None
        self.started: list[str] = []
        self._closed = asyncio.Event()

    def _set(self, unit: str, **props: Any) -> None:
        self.units[unit] = self.units.get(unit, UnitSnapshot(unit)).update(props)
        if self.on_unit_change is not None:
            self.on_unit_change(unit, props)

    def running(self, unit: str) -> bool:
        return self.units.get(unit, UnitSnapshot(unit)).active_state == "active"

    def exit(self, unit: str, status: int) -> None:
        """The engine exits on its own with `status` (the unit fails, as Restart=no)."""
        self._set(unit, ActiveState="failed", SubState="failed", Result="exit-code",
                  ExecMainCode=CLD_EXITED, ExecMainStatus=status)  # fmt: skip

    async def start_unit(self, unit: str, mode: object = None) -> str:
        self.started.append(unit)
        self._set(unit, ActiveState="activating", SubState="start", Result="success")
        self._set(unit, ActiveState="active", SubState="running")
        return "done"

    async def stop_unit(self, unit: str, mode: object = None) -> str:
        if self.running(unit):
            self._set(unit, ActiveState="deactivating", SubState="stop-sigterm")
            self._set(unit, ActiveState="inactive", SubState="dead", Result="success",
                      ExecMainCode=CLD_EXITED, ExecMainStatus=0)  # fmt: skip
        return "done"

    async def snapshot(self, unit: str) -> UnitSnapshot:
        return self.units.get(unit, UnitSnapshot(unit))

    async def connect(self) -> None:
        pass

    async def subscribe(self) -> None:
        pass

    async def manager_started(self) -> int:
        return 1

    async def ref_unit(self, unit: str) -> None:
        pass

    async def reset_failed_unit(self, unit: str) -> None:
        pass

    async def reload(self) -> None:
        pass

    async def wait_closed(self) -> None:
        await self._closed.wait()

    def disconnect(self) -> None:
        self._closed.set()


class FakeProbe:
    """An engine answers on a lane's port while the manager runs its unit."""

    def __init__(self, config: Config, manager: FakeManager) -> None:
        self.lanes = {spec.port: (unit_name(n, spec), spec) for n, spec in config.lanes.items()}
        self.manager = manager

    def _up(self, port: int) -> bool:
        return port in self.lanes and self.manager.running(self.lanes[port][0])

    async def health(self, port: int, path: str = "/health") -> bool:
        return self._up(port)

    async def models(self, port: int, api_key: str | None) -> list[str] | None:
        return [self.lanes[port][1].served_model_name] if self._up(port) else None

    async def accepts(self, port: int) -> bool:
        return self._up(port)

    async def sample(self, port: int) -> EngineSample | None:
        return EngineSample(0, 0, 0, 0) if self._up(port) else None

    async def close(self) -> None:
        pass


def config(tmp: Path, extra: str = "") -> Config:
    lanes = ""
    for lane, port in (("a", 18601), ("b", 18602)):
        lanes += (
            f'[lanes.{lane}]\nport = {port}\nserved_model_name = "{lane}"\ngroup = "gpu"\n'
            'restart_sec = "10ms"\nprobe = { interval = "10ms", start_interval_min = "10ms", '
            f'start_interval_max = "10ms" }}\n{extra}\n[lanes.{lane}.exec]\ncommand = ["/bin/true"]\n'
        )
    text = (
        f'[daemon]\nunit_dir = "{tmp}/u"\nbin_dir = "{tmp}/b"\nstate_dir = "{tmp}/s"\n'
        f'default_lane = "a"\n{lanes}'
    )
    return parse_config(text, str(tmp / "laned.toml"), {"HOME": str(tmp)})


@asynccontextmanager
async def owner(cfg: Config) -> AsyncIterator[tuple[Supervisor, FakeManager]]:
    manager = FakeManager()
    sup = Supervisor(cfg, manager, FakeProbe(cfg, manager), systemd_version=255)  # type: ignore[arg-type]
    await sup.start()
    try:
        yield sup, manager
    finally:
        await sup.close()


async def until(check: Callable[[], object], what: str, timeout: float = 5) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 30))


@pytest.fixture(autouse=True)
def no_journal(monkeypatch: pytest.MonkeyPatch) -> None:
    async def quiet(*_: object) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(watchers, "follow_phases", quiet)


def test_the_default_lane_starts_and_a_swap_stops_it_before_the_other_starts(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        cfg = config(tmp_path)
        async with owner(cfg) as (sup, manager):
            await until(lambda: sup.statuses["a"].state is LaneState.READY, "a ready")
            ready = await sup.activate("b")
            assert ready.state is LaneState.READY
            unit_a, unit_b = (unit_name(n, cfg.lanes[n]) for n in ("a", "b"))
            assert not manager.running(unit_a) and manager.running(unit_b)
            assert sup.statuses["a"].state is LaneState.INACTIVE
            assert sup.statuses["a"].desired is Desired.INACTIVE
            assert manager.started == [unit_a, unit_b]

    run(scenario)


def test_an_engines_own_exit_0_is_a_failure_and_restarted(tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg = config(tmp_path)
        async with owner(cfg) as (sup, manager):
            await until(lambda: sup.statuses["a"].state is LaneState.READY, "a ready")
            manager.exit(unit_name("a", cfg.lanes["a"]), 0)
            await until(
                lambda: (
                    sup.statuses["a"].restarts == 1 and sup.statuses["a"].state is LaneState.READY
                ),
                "a restarted and ready",
            )
            last = sup.statuses["a"].last_exit
            assert last is not None and last.verdict is Verdict.FAILURE and last.code == 0
            assert len(sup.statuses["a"].failures) == 1

    run(scenario)


def test_a_crash_loop_ends_in_failed_and_nothing_is_left_pending(tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg = config(tmp_path, 'start_limit_burst = 3\nstart_limit_interval = "1m"')
        async with owner(cfg) as (sup, manager):
            unit = unit_name("a", cfg.lanes["a"])
            for _ in range(3):
                await until(lambda: sup.statuses["a"].state is LaneState.READY, "a ready")
                manager.exit(unit, 1)
                await until(lambda: sup.statuses["a"].state is not LaneState.READY, "a exited")
            await until(lambda: sup.statuses["a"].state is LaneState.FAILED, "a failed")
            assert sup.statuses["a"].reason.startswith("crash-loop")
            assert sup.records.runs["a"].restart is None and sup.records.ops.current == {}
            assert len(manager.started) == 3

    run(scenario)


def test_a_deactivate_wins_over_a_restart_waiting_in_its_backoff(tmp_path: Path) -> None:
    async def scenario() -> None:
        cfg = config(tmp_path).model_copy(deep=True)
        slow = {n: s.model_copy(update={"restart_sec": 60.0}) for n, s in cfg.lanes.items()}
        cfg = cfg.model_copy(update={"lanes": slow})
        async with owner(cfg) as (sup, manager):
            await until(lambda: sup.statuses["a"].state is LaneState.READY, "a ready")
            manager.exit(unit_name("a", cfg.lanes["a"]), 1)
            await until(lambda: sup.records.runs["a"].restart is not None, "a restart waiting")
            await sup.deactivate("a")
            assert sup.records.runs["a"].restart is None
            assert sup.statuses["a"].state is LaneState.INACTIVE
            assert len(manager.started) == 1

    run(scenario)
