"""Lanes placed by the GPU memory they take (laned.core.placement), on a simulated four-GPU
host (LANED_SIM_GPUS: laned reads it as NVML, the simulator's engines hold their memory
there per process, vLLM's rule and refusal included; docs/simulator.md) and the real user
manager: a big lane on GPUs 0-1 and two small ones on 2-3 run together; a whole-box lane
takes all three off; going back starts the three without taking each other off; a fourth
small lane that does not fit takes off the cheaper of the two small ones, and no other."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from laned.adapters.gpus import SimGpus
from laned.core.lanes import EventKind, LaneState
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_supervisor import run, supervising

GIB = 2**30


def four_gpus(root: Path, gib: int = 96) -> SimGpus:
    root.mkdir(parents=True, exist_ok=True)
    gpus = [{"name": "Simulated 96 GB", "total_bytes": gib * GIB} for _ in range(4)]
    (root / "gpus.json").write_text(json.dumps({"gpus": gpus}))
    return SimGpus(str(root))


def lane(gpus: str, share: float, extra: str = "") -> str:
    where = f"gpus = {gpus}\n" if gpus else ""
    return FAST + where + f'args = ["--gpu-memory-utilization", "{share}"]\n' + extra


def test_lanes_that_fit_run_together_and_an_activation_evicts_only_what_it_must(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    sim = four_gpus(tmp_path / "gpus")
    lanes = {
        "big": lane("[0, 1]", 0.9),
        "s1": lane("[2, 3]", 0.45),
        "s2": lane("[2, 3]", 0.45, "priority = 1\n"),  # dearer to take off than s1
        "whole": lane("", 0.92),  # every GPU
        "s4": lane("[2, 3]", 0.45),
    }
    env = {name: {"LANED_SIM_GPUS": str(tmp_path / "gpus")} for name in lanes}
    ports = {name: free_port() for name in lanes}
    config = lane_config(harness, units, tmp_path, lanes, 0, env=env, ports=ports)

    def held() -> dict[int, int]:
        return {g.index: g.used_bytes for g in sim.read()}

    async def scenario() -> None:
        async with supervising(harness, config, host=True, gpus=sim) as sup:
            s = sup.statuses
            three = ("big", "s1", "s2")
            await asyncio.gather(*(sup.activate(n) for n in three))
            assert all(s[n].state is LaneState.READY for n in three)
            assert held() == {0: int(0.9 * 96 * GIB), 1: int(0.9 * 96 * GIB),
                              2: 2 * int(0.45 * 96 * GIB), 3: 2 * int(0.45 * 96 * GIB)}  # fmt: skip
            beside = [
                e.reason for e in sup.events if e.kind is EventKind.GATE and "beside" in e.reason
            ]
            assert beside, "the second small lane's gate left the first one's memory to it"

            # The whole-box lane takes all three off.
            await sup.activate("whole")
            assert [n for n in three if s[n].state is not LaneState.INACTIVE] == []
            assert held() == {g: int(0.92 * 96 * GIB) for g in range(4)}

            # Back: the three start; only the first takes the whole-box lane off.
            await asyncio.gather(*(sup.activate(n) for n in three))
            assert all(s[n].state is LaneState.READY for n in three)
            assert s["whole"].state is LaneState.INACTIVE

            # A fourth small lane does not fit on GPUs 2-3: the cheaper small lane goes.
            await sup.activate("s4")
            assert s["s1"].state is LaneState.INACTIVE
            assert s["s2"].state is LaneState.READY and s["big"].state is LaneState.READY
            swap = [e.reason for e in sup.events if e.lane == "s1" and "swap to s4" in e.reason]
            assert swap, [e.reason for e in sup.events if e.lane == "s1"]

    run(scenario())
