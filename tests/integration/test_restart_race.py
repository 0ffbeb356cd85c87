"""The restart race (issue 11): a restart after a failure waits at its start gate (here the
GPU-memory gate, whose reading the test controls) while a deactivate, or the activation of a
group peer, arrives. The newer request must win: the restarted lane never starts.

Before restarts were operations, the restart re-checked nothing after the gate's await and
started the lane anyway: desired inactive but running, or two lanes of one group at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import httpx

from laned.gpus import GIB, GpuReading
from laned.lanes import LaneState
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_supervisor import run, supervising, until

GATE = 'gpu_gate = { timeout = "60s", interval = "50ms" }\n'


class HeldGpus:
    """A GPU reader for the gate: GPU 0 holds 40 GiB while `held` is set, nothing otherwise."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self.reads = 0
        self.reads_while_held = 0

    def read(self, indices: Sequence[int] | None = None) -> list[GpuReading]:
        self.reads += 1
        used = 40 * GIB if self.held.is_set() else 0
        if used:
            self.reads_while_held += 1
        return [GpuReading(0, "test GPU", 80 * GIB, used, ((4242, used),) if used else ())]

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


async def _crash_and_hold(sup: object, port: int, gpus: HeldGpus) -> None:
    """a is ready; shut the gate, crash a's engine, and wait until its restart waits at the gate."""
    gpus.held.set()
    before = gpus.reads_while_held
    async with httpx.AsyncClient() as client:
        await client.post(f"http://127.0.0.1:{port}/sim/fault", json={"kind": "crash"})
    await until(lambda: gpus.reads_while_held > before, 15, "the restart held at the GPU gate")


def _started_after(sup: object, lane: str, index: int) -> list[str]:
    events = list(sup.events)[index:]  # type: ignore[attr-defined]
    return [e.reason for e in events if e.lane == lane and e.to_state is LaneState.STARTING]


def test_deactivate_during_a_held_restart_keeps_the_lane_inactive(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST + GATE, "b": FAST + GATE}, port)
    unit_a, unit_b = (f"{units.name(n)}.service" for n in "ab")
    gpus = HeldGpus()

    async def scenario() -> None:
        async with supervising(harness, config, host=True, gpus=gpus) as sup:
            await sup.activate("a")
            await _crash_and_hold(sup, port, gpus)
            assert sup.statuses["a"].state is LaneState.RESTARTING
            await sup.deactivate("a")
            mark = len(sup.events)
            assert sup.statuses["a"].state is LaneState.INACTIVE
            with Sampler(harness, [unit_a, unit_b]) as sampler:
                gpus.held.clear()  # the gate opens: a restart still waiting there would go on
                # A later request that needs the gate too: by the time b is ready, a restart
                # left waiting at the gate (polled every 50 ms) would have started a.
                await sup.activate("b")
            assert _started_after(sup, "a", mark) == [], "the deactivated lane was started"
            assert sup.statuses["a"].state is LaneState.INACTIVE
            assert harness.show(unit_a, "ActiveState")["ActiveState"] in ("inactive", "failed")
            assert sampler.samples and not sampler.overlaps()

    run(scenario())


def test_a_peer_activated_during_a_held_restart_wins(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST + GATE, "b": FAST + GATE}, port)
    unit_a, unit_b = (f"{units.name(n)}.service" for n in "ab")
    gpus = HeldGpus()

    async def scenario() -> None:
        async with supervising(harness, config, host=True, gpus=gpus) as sup:
            await sup.activate("a")
            await _crash_and_hold(sup, port, gpus)
            mark = len(sup.events)
            with Sampler(harness, [unit_a, unit_b]) as sampler:
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
                gpus.held.clear()
                status = await asyncio.wait_for(activation, 30)
                assert status.state is LaneState.READY
                # Give a restart that escaped its supersession the time it would need: b is
                # ready, and a check of b's health proves the engine on the port is b's.
                async with httpx.AsyncClient() as client:
                    models = (await client.get(f"http://127.0.0.1:{port}/v1/models")).json()
                assert models["data"][0]["id"] == "b"
            assert _started_after(sup, "a", mark) == [], "the superseded restart started a"
            assert sup.statuses["a"].state is LaneState.INACTIVE
            assert harness.show(unit_a, "ActiveState")["ActiveState"] in ("inactive", "failed")
            assert sampler.samples and not sampler.overlaps(), sampler.overlaps()[:3]

    run(scenario())
