"""The restart race (issue 11): a restart after a failure waits at its start gate (here the
GPU-memory gate, whose reading the test controls) while a deactivate, or the activation of a
group peer, arrives. The newer request must win: the restarted lane never starts.

Before restarts were operations, the restart re-checked nothing after the gate's await and
started the lane anyway: desired inactive but running, or two lanes of one group at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from laned.core.facts import GIB, GpuReading
from laned.core.lanes import LaneState
from laned.owner.supervisor import Supervisor
from laned.validation.load import Config
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_supervisor import run, supervising, until

GATE = 'gpu_gate = { timeout = "60s", interval = "50ms" }\n'


class HeldGpus:
    """A GPU reader for the gate: GPU 0 holds 40 GiB while `held` is set, nothing otherwise."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self.reads_while_held = 0

    def read(self, indices: Sequence[int] | None = None) -> list[GpuReading]:
        used = 40 * GIB if self.held.is_set() else 0
        if used:
            self.reads_while_held += 1
        return [GpuReading(0, "test GPU", 80 * GIB, used, ((4242, used),) if used else ())]

    def survey(self, indices: Sequence[int] | None = None) -> tuple[list[GpuReading], list[str]]:
        return self.read(indices), []  # every GPU read (Nvml.survey: and why any was not)

    def close(self) -> None:
        pass


class Sampler:
    """Reads the group's units from systemd itself every few ms, in a thread: the ground truth
    that two lanes of one group never run at once."""

    def __init__(self, harness: Harness, units: list[str]) -> None:
        self.harness, self.units = harness, units
        self.samples: list[tuple[str, ...]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = self.harness.systemctl("show", "-pActiveState", *self.units, check=False).stdout
            states = tuple(
                line.split("=", 1)[1]
                for line in out.splitlines()
                if line.startswith("ActiveState=")
            )
            self.samples.append(states)
            self._stop.wait(0.01)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def overlaps(self) -> list[tuple[str, ...]]:
        running = ("active", "activating", "reloading")
        return [s for s in self.samples if sum(state in running for state in s) > 1]


@dataclass
class Race:
    """Lanes a and b of one group behind a GPU gate the test holds."""

    harness: Harness
    port: int
    config: Config
    units: list[str]
    gpus: HeldGpus = field(default_factory=HeldGpus)


def race(harness: Harness, units: Units, tmp_path: Path) -> Race:
    port = free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST + GATE, "b": FAST + GATE}, port)
    return Race(harness, port, config, [f"{units.name(n)}.service" for n in "ab"])


@contextlib.asynccontextmanager
async def held_restart(r: Race) -> AsyncIterator[Supervisor]:
    """a is ready; then its engine crashes with the gate shut, and its restart waits there."""
    async with supervising(r.harness, r.config, host=True, gpus=r.gpus) as sup:
        await sup.activate("a")
        r.gpus.held.set()
        before = r.gpus.reads_while_held
        async with httpx.AsyncClient() as client:
            await client.post(f"http://127.0.0.1:{r.port}/sim/fault", json={"kind": "crash"})
        await until(lambda: r.gpus.reads_while_held > before, 15, "the restart held at the gate")
        yield sup


def assert_a_never_started(r: Race, sup: Supervisor, mark: int, sampler: Sampler) -> None:
    """After `mark` (an index into the events) a was never started, and is not running."""
    started = [
        e.reason
        for e in list(sup.events)[mark:]
        if e.lane == "a" and e.to_state is LaneState.STARTING
    ]
    assert started == [], f"a was started after the newer request: {started}"
    assert sup.statuses["a"].state is LaneState.INACTIVE
    assert r.harness.show(r.units[0], "ActiveState")["ActiveState"] in ("inactive", "failed")
    assert sampler.samples and not sampler.overlaps(), sampler.overlaps()[:3]


def test_deactivate_during_a_held_restart_keeps_the_lane_inactive(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    r = race(harness, units, tmp_path)

    async def scenario() -> None:
        async with held_restart(r) as sup:
            assert sup.statuses["a"].state is LaneState.RESTARTING
            await sup.deactivate("a")
            mark = len(sup.events)
            assert sup.statuses["a"].state is LaneState.INACTIVE
            with Sampler(harness, r.units) as sampler:
                r.gpus.held.clear()  # the gate opens: a restart still waiting there would go on
                # A later request that needs the gate too: by the time b is ready, a restart
                # left waiting at the gate (polled every 50 ms) would have started a.
                await sup.activate("b")
            assert_a_never_started(r, sup, mark, sampler)

    run(scenario())


def test_a_peer_activated_during_a_held_restart_wins(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    r = race(harness, units, tmp_path)

    async def scenario() -> None:
        async with held_restart(r) as sup:
            mark = len(sup.events)
            with Sampler(harness, r.units) as sampler:
                activation = sup.activate("b")
                # b's own activation waits at the same gate; then the gate opens for both.
                await until(
                    lambda: any(
                        e.lane == "a" and e.to_state is LaneState.INACTIVE
                        for e in list(sup.events)[mark:]
                    ),
                    10,
                    "a stopped by the swap",
                )
                r.gpus.held.clear()
                status = await asyncio.wait_for(activation, 30)
                assert status.state is LaneState.READY
                # The engine on the shared port is b's.
                async with httpx.AsyncClient() as client:
                    models = (await client.get(f"http://127.0.0.1:{r.port}/v1/models")).json()
                assert models["data"][0]["id"] == "b"
            assert_a_never_started(r, sup, mark, sampler)

    run(scenario())
