"""An engine's own death is never taken for a requested stop, and a run fails once (issue 25).

Three ways an engine dies while laned's health probes watch it, each under the real user
manager with the real serve wrapper: a slow teardown (the engine gone, the wrapper's clean-up
still running when laned's stop arrives), vLLM's death sequence (/health 503, then exit 0),
and an engine that closes its port and hangs in shutdown. Each asserts the recorded verdict,
laned_engine_exits_total and laned_lane_failures_total, and the crash loop at
start_limit_burst: a run's failure counts once, whichever path saw it first.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx

from laned.api.metrics import LanedMetrics
from laned.core.lanes import EventKind, LaneState, LastExit, Verdict
from laned.core.unit_state import UnitSnapshot
from laned.owner.supervisor import Supervisor
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_supervisor import run, supervising, until

BURST = 'start_limit_burst = 2\nrestart_max_delay = "1s"\n'

# `podman` as far as the serve wrapper uses it: `run` runs the simulator in place of the
# container (with the container's -e variables); `inspect`, the wrapper's clean-up after the
# engine ended, says it began (GATE.waiting) and blocks until the test opens GATE, which it
# consumes: a teardown as slow as the test needs, with no sleep to hope on.
PODMAN_STAND_IN = r"""#!/bin/bash
gate=GATE
case $1 in
  run)
    shift
    while [[ $# -gt 0 && $1 != serve ]]; do
      if [[ $1 == -e ]]; then export "$2"; shift; fi
      shift
    done
    exec PYTHON -m laned sim "$@" ;;
  inspect)
    touch "$gate.waiting"
    for _ in $(seq 1200); do [[ -e $gate ]] && break; sleep 0.05; done
    rm -f "$gate" "$gate.waiting"
    echo false ;;
esac
exit 0
"""


def exits(metrics: LanedMetrics, lane: str, code: str, verdict: str) -> float:
    value = metrics.registry.get_sample_value(
        "laned_engine_exits_total", {"lane": lane, "code": code, "verdict": verdict}
    )
    return value or 0.0


def failures(metrics: LanedMetrics, lane: str) -> dict[str, float]:
    """laned_lane_failures_total of the lane by the path that saw each failure first."""
    out: dict[str, float] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == "laned_lane_failures_total" and sample.labels["lane"] == lane:
                out[sample.labels["seen_by"]] = sample.value
    return out


def exit_notes(sup: Supervisor, lane: str) -> list[str]:
    return [e.reason for e in sup.events if e.lane == lane and e.kind is EventKind.EXIT]


async def fault(port: int, body: dict[str, Any]) -> None:
    async with httpx.AsyncClient() as client:
        await client.post(f"http://127.0.0.1:{port}/sim/fault", json=body, timeout=5)


async def ends_in_a_crash_loop(sup: Supervisor, lane: str, deaths: int) -> None:
    """After `deaths` deaths with start_limit_burst = 2: failed, one restart, every death a
    failure counted once."""
    await until(
        lambda: sup.statuses[lane].state is LaneState.FAILED and sup.statuses[lane].last_exit,
        30,
        "the crash loop",
    )
    status = sup.statuses[lane]
    assert status.reason.startswith("crash-loop: 2 failures"), status.reason
    assert status.restarts == 1 and len(status.failures) == deaths == 2
    assert not sup.interpreter.restart_waiting(lane), "no restart may be pending after a crash loop"


def test_a_stop_during_a_slow_teardown_leaves_the_exit_a_failure_counted_once(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port, gate = free_port(), tmp_path / "gate"
    podman = tmp_path / "podman"
    podman.write_text(PODMAN_STAND_IN.replace("GATE", str(gate)).replace("PYTHON", sys.executable))
    podman.chmod(0o755)
    (tmp_path / "models" / "c").mkdir(parents=True)
    lane = (
        FAST + BURST + 'env = { LANED_SIM_STARTUP = "0.3" }\n'
        '[lanes.c.container]\nimage = "localhost/stand-in"\nentrypoint = "vllm"\n'
        f'command = ["serve", "{tmp_path}/models/c"]\nnetwork = "host"\n'
    )
    config = lane_config(harness, units, tmp_path, {"c": lane}, port, daemon=f'podman = "{podman}"')

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            sup.recorder = metrics = LanedMetrics()
            await sup.activate("c")
            for death in (1, 2):
                await fault(port, {"kind": "exit", "code": 0})
                # The engine is gone, its wrapper still cleans up; the probes notice first and
                # laned's stop reaches the wrapper during the clean-up.
                await until(lambda: Path(f"{gate}.waiting").exists(), 20, "the clean-up")
                await until(
                    lambda: (
                        (sup.statuses["c"].unit or UnitSnapshot("")).active_state == "deactivating"
                    ),
                    20,
                    "laned's stop after the failed probes",
                )
                gate.touch()
                if death == 1:
                    await until(
                        lambda: (
                            sup.statuses["c"].state is LaneState.READY
                            and sup.statuses["c"].restarts == 1
                        ),
                        30,
                        "the restart",
                    )
                    last = sup.statuses["c"].last_exit
                    assert last is not None
                    assert (last.code, last.verdict) == (0, Verdict.FAILURE)
                    assert "health: 3 consecutive probe failures" in last.reason
                    assert failures(metrics, "c") == {"health": 1.0}
                    assert exits(metrics, "c", "0", "failure") == 1
                    assert exits(metrics, "c", "0", "requested") == 0
            await ends_in_a_crash_loop(sup, "c", 2)
            assert failures(metrics, "c") == {"health": 2.0}
            assert exits(metrics, "c", "0", "failure") == 2
            assert len(exit_notes(sup, "c")) == 2
            assert all("seen first as health" in note for note in exit_notes(sup, "c"))
            record = (tmp_path / "state" / "lanes" / "c" / "last-exit").read_text()
            assert record.startswith("status=0 requested=0 late=1 "), record

    run(scenario())


async def dies_twice(sup: Supervisor, port: int, body: dict[str, Any]) -> LastExit:
    """The engine of lane `a` dies (`body`: the fault) and is restarted, then dies again into
    a crash loop (start_limit_burst = 2). The first death's exit, as laned recorded it."""
    await fault(port, body)
    await until(
        lambda: sup.statuses["a"].state is LaneState.READY and sup.statuses["a"].restarts == 1,
        30,
        "the restart",
    )
    first = sup.statuses["a"].last_exit
    assert first is not None and first.verdict is Verdict.FAILURE, first
    await fault(port, body)
    await ends_in_a_crash_loop(sup, "a", 2)
    return first


def lane_a_dies_twice(
    harness: Harness, units: Units, tmp: Path, body: dict[str, Any]
) -> tuple[LastExit, LanedMetrics]:
    """Lane `a` (a simulator lane, start_limit_burst = 2) dies twice of the fault `body`:
    its first death's exit and laned's metrics after the crash loop."""
    port = free_port()
    config = lane_config(harness, units, tmp, {"a": FAST + BURST}, port)

    async def scenario() -> tuple[LastExit, LanedMetrics]:
        async with supervising(harness, config) as sup:
            sup.recorder = metrics = LanedMetrics()
            await sup.activate("a")
            return await dies_twice(sup, port, body), metrics

    return run(scenario())


def test_vllms_death_sequence_is_one_failure_per_death_and_ends_in_a_crash_loop(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    # /health 503 while the API server waits for its watchdog, then exit 0 (vLLM #48966). The
    # probes (3 x 200 ms) usually see it first and laned's stop then reaches a live engine,
    # which exits on request; the watchdog's exit can come first. Either way: one failure.
    _, metrics = lane_a_dies_twice(harness, units, tmp_path, {"kind": "engine-dead"})
    assert sum(failures(metrics, "a").values()) == 2
    assert exits(metrics, "a", "0", "requested") == 0
    assert exits(metrics, "a", "0", "failure") == 2


def test_an_engine_hung_in_shutdown_after_its_port_closed_fails_once(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    # The port closes, the process hangs (deaf to SIGTERM) for 4 s and then exits 0. laned's
    # stop reaches a live engine, so the wrapper records a requested stop: the failure the
    # probes counted is what the exit is judged by.
    fault_ = {"kind": "exit", "code": 0, "linger": 4}
    first, metrics = lane_a_dies_twice(harness, units, tmp_path, fault_)
    assert "health: 3 consecutive probe failures" in first.reason
    assert failures(metrics, "a") == {"health": 2.0}
    assert exits(metrics, "a", "0", "failure") == 2
    record = (tmp_path / "state" / "lanes" / "a" / "last-exit").read_text()
    assert record.startswith("status=0 requested=1 late=0 "), record
