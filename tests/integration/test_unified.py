"""A DGX Spark (GB10) simulated: one GPU whose memory NVML will not read ("Not Supported") and
whose processes it lists, sharing one pool with the host (LANED_SIM_GPUS with `"unified":
true` and a simulated meminfo; docs/placement.md, "Unified memory"). Lanes are placed by the
pool, a swap puts a level-1 lane to sleep at level 2 (level 1 would free nothing there), and
the memory guard stops a lane when the pool runs low, as a failure."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from laned.adapters.gpus import SimGpus
from laned.core.lanes import EventKind, LaneState, Verdict
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_supervisor import run, supervising, until

GIB = 2**30
KIB = 1024
GUARDED = (
    'restart_sec = "200ms"\nprobe = { interval = "200ms", start_interval_min = "50ms", '
    'start_interval_max = "200ms", memory_floor_gib = 5, memory_floor_for = "400ms" }\n'
)


def meminfo(root: Path, total_gib: int, available_gib: int) -> None:
    (root / "meminfo").write_text(
        f"MemTotal: {total_gib * GIB // KIB} kB\nMemAvailable: {available_gib * GIB // KIB} kB\n"
    )


def gb10(root: Path) -> SimGpus:
    root.mkdir(parents=True, exist_ok=True)
    (root / "gpus.json").write_text(json.dumps({"gpus": [{"name": "NVIDIA GB10", "unified": True}]}))  # fmt: skip
    meminfo(root, 120, 110)
    return SimGpus(str(root))


def test_a_gb10_host_places_sleeps_and_guards_by_its_one_pool(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    sim = gb10(tmp_path / "gpus")
    share = 'args = ["--gpu-memory-utilization", "0.4"]\n'  # 48 GiB of the 120 GiB pool each
    lanes = {
        "a": FAST + share + "sleep_level = 1\n",
        "b": FAST + share + "priority = 1\n",  # dearer to take off than a
        "c": GUARDED + share,
    }
    env = {name: {"LANED_SIM_GPUS": str(tmp_path / "gpus")} for name in lanes}
    ports = {name: free_port() for name in lanes}
    config = lane_config(harness, units, tmp_path, lanes, 0, env=env, ports=ports)

    async def scenario() -> None:
        async with supervising(harness, config, host=True, gpus=sim) as sup:
            s = sup.statuses
            (reading,) = (await sup.host_facts()).gpus or ()
            assert reading.unified and reading.total_bytes == 120 * GIB, reading

            # Two lanes fit the pool together; the gate opens beside the first.
            await asyncio.gather(sup.activate("a"), sup.activate("b"))
            assert s["a"].state is LaneState.READY and s["b"].state is LaneState.READY
            (reading,) = sim.read()
            assert reading.compute_bytes == 2 * int(0.4 * 120 * GIB)
            assert reading.total_bytes - reading.used_bytes == 110 * GIB - reading.compute_bytes

            # A third does not: the cheaper lane goes, asleep at level 2, not 1.
            await sup.activate("c")
            assert s["a"].state is LaneState.SLEEPING and s["b"].state is LaneState.READY, (
                "\n".join(f"{e.lane} {e.kind} {e.reason}" for e in sup.events)
            )
            notes = [e.reason for e in sup.events if e.lane == "a" and e.kind is EventKind.SLEEP]
            assert any(n.startswith("sleeping at level 2, not 1: its GPUs have unified memory") for n in notes), notes  # fmt: skip
            assert any("unified memory: released to the pool" in n for n in notes), notes

            # Something else takes the host's memory: the guarded lane is stopped, failed.
            meminfo(tmp_path / "gpus", 120, 100)
            await until(lambda: s["c"].state is LaneState.FAILED, 10, "the memory guard")
            assert "unified memory pool" in s["c"].reason, s["c"].reason
            last = s["c"].last_exit
            assert last is not None and last.verdict is Verdict.FAILURE
            assert len(s["c"].failures) == 1
            assert s["b"].state is LaneState.READY  # no floor: left to serve

    run(scenario())
