"""Lanes that sleep instead of stopping (sleep_level, docs/sleep.md), on the real user manager
with simulator lanes whose sleep mode follows vLLM's source (laned/sim/sleep.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from laned.api.metrics import LanedMetrics
from laned.core.facts import GIB, GpuReading
from laned.core.lanes import Desired, EventKind, LaneState
from laned.errors import ActivationFailed, PreflightFailed
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_api import api_server
from tests.integration.test_supervisor import run, supervise, supervising, until

ASK = {"messages": [{"role": "user", "content": "Name three rivers."}], "max_tokens": 12}


def engine(port: int, method: str, path: str) -> httpx.Response:
    return httpx.request(method, f"http://127.0.0.1:{port}{path}", timeout=10)


def answer(port: int, model: str) -> str:
    reply = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions", json={**ASK, "model": model}, timeout=30
    )
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def sleeper_and_peer(
    harness: Harness,
    units: Units,
    tmp_path: Path,
    a: str,
    env: dict[str, dict[str, str]] | None = None,
) -> tuple[dict[str, int], dict[str, str], Any]:
    """Lane `a` (that sleeps: `a` is its extra TOML) and lane `b` of one group, own ports."""
    ports = {"a": free_port(), "b": free_port()}
    lanes = {"a": FAST + a, "b": FAST}
    return ports, lanes, lane_config(harness, units, tmp_path, lanes, 0, env=env, ports=ports)


def beyond_ram(path: Path) -> None:
    """Make `path` a sparse file twice the size of this host's RAM: weights that level 1
    cannot pin here. Sized from MemTotal, not "larger than any host": laned reads each
    file's page-cache residency with mincore, 2 ms a GiB of mapping (4 TiB took 8.5 s)."""
    total_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    with path.open("wb") as handle:
        handle.truncate(2 * total_kib * 1024)


def main_pid(harness: Harness, units: Units, lane: str) -> int:
    return int(harness.show(f"{units.name(lane)}.service", "MainPID")["MainPID"])


def test_swaps_put_lanes_to_sleep_and_wake_them_instead_of_cold_starts(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    ports = {"a": free_port(), "b": free_port(), "c": free_port()}
    lanes = {"a": FAST + "sleep_level = 1\n", "b": FAST + "sleep_level = 2\n", "c": FAST}
    env = {name: {"LANED_SIM_STARTUP": "1", "LANED_SIM_WEIGHTS_GIB": "0.5"} for name in lanes}
    config = lane_config(harness, units, tmp_path, lanes, 0, env=env, ports=ports)

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            pid_a = main_pid(harness, units, "a")
            await sup.activate("b")
            b_before = answer(ports["b"], "b")
            # a sleeps: its unit and its process stay, off the GPUs, not desired.
            a = sup.statuses["a"]
            assert (a.state, a.desired) == (LaneState.SLEEPING, Desired.INACTIVE), a
            assert engine(ports["a"], "GET", "/is_sleeping").json() == {"is_sleeping": True}
            assert main_pid(harness, units, "a") == pid_a

            # Back to a: woken, not started again (the same process), b asleep at level 2.
            woke = await sup.activate("a")
            assert woke.state is LaneState.READY and main_pid(harness, units, "a") == pid_a
            assert woke.last_wake is not None and woke.last_cold_start is not None
            assert sup.statuses["b"].state is LaneState.SLEEPING
            reasons = [e.reason for e in sup.events if e.lane == "a"]
            assert any("waking (level 1)" in r for r in reasons), reasons

            # b wakes from level 2 with its weights reloaded: it answers as before.
            pid_b = main_pid(harness, units, "b")
            await sup.activate("b")
            assert main_pid(harness, units, "b") == pid_b
            assert answer(ports["b"], "b") == b_before

            # A lane that stops (sleep_level 0) takes the GPUs: b sleeps, a sleeps on.
            await sup.activate("c")
            assert sup.statuses["b"].state is LaneState.SLEEPING
            assert sup.statuses["a"].state is LaneState.SLEEPING

            # deactivate stops a sleeping lane for real.
            await sup.deactivate("a")
            assert sup.statuses["a"].state is LaneState.INACTIVE
            assert (
                harness.show(f"{units.name('a')}.service", "ActiveState")["ActiveState"] != "active"
            )

            # A sleeping engine that dies is a failure, never taken for a stop.
            os.kill(main_pid(harness, units, "b"), signal.SIGKILL)
            await until(lambda: sup.statuses["b"].state is LaneState.FAILED, 20, "b failed")
            assert sup.statuses["b"].last_exit is not None
            assert sup.statuses["b"].last_exit.verdict.value == "failure"
            assert sup.statuses["c"].state is LaneState.READY

    run(scenario())


def test_a_sleeping_lane_is_found_asleep_by_the_next_laned(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    ports, _lanes, config = sleeper_and_peer(harness, units, tmp_path, "sleep_level = 1\n")
    # Weights this host's RAM cannot hold: a sleeps at level 2, though its config says 1.
    beyond_ram(tmp_path / "models" / "a" / "model.safetensors")

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            before = answer(ports["a"], "a")
            await sup.activate("b")
            assert sup.statuses["a"].state is LaneState.SLEEPING
        pid = main_pid(harness, units, "a")
        sup = await supervise(harness, config)
        try:
            a = sup.statuses["a"]
            assert (a.state, a.desired, a.reason) == (
                LaneState.SLEEPING,
                Desired.INACTIVE,
                "found asleep",
            )
            await until(lambda: sup.statuses["b"].state is LaneState.READY, 20, "b adopted")
            assert sup.statuses["b"].desired is Desired.ACTIVE
            # Woken at the level the engine says it sleeps at (2: the weights reloaded), not
            # its config's: the same process answers as before, no canary difference.
            assert (await sup.activate("a")).state is LaneState.READY
            assert engine(ports["a"], "GET", "/is_sleeping").json() == {"is_sleeping": False}
            assert main_pid(harness, units, "a") == pid and answer(ports["a"], "a") == before
            assert any("waking (level 2)" in e.reason for e in sup.events if e.lane == "a")
        finally:
            await sup.close()
            await sup.seam.close()

    run(scenario())


def test_a_lane_that_cannot_sleep_is_stopped_instead_and_says_why(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    # Dev mode turned off by the lane's own env: the engine has no sleep routes (404).
    env = {"a": {"LANED_SIM_STARTUP": "0.3", "VLLM_SERVER_DEV_MODE": "0"}}
    _ports, _lanes, config = sleeper_and_peer(harness, units, tmp_path, "sleep_level = 1\n", env)

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            await sup.activate("b")
            assert sup.statuses["a"].state is LaneState.INACTIVE
            notes = [e.reason for e in sup.events if e.lane == "a" and e.kind is EventKind.SLEEP]
            assert len(notes) == 1 and "404" in notes[0] and "stopping it instead" in notes[0]
            assert "VLLM_SERVER_DEV_MODE" in notes[0] or "sleep (level 1)" in notes[0]

    run(scenario())


def test_a_request_wakes_an_on_demand_sleeper_and_no_dev_route_is_reachable_through_laned(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    a = "sleep_level = 2\non_demand = true\n"
    ports, _lanes, config = sleeper_and_peer(harness, units, tmp_path, a)
    api_port = free_port()
    base = f"http://127.0.0.1:{api_port}"

    async def scenario() -> None:
        async with (
            api_server(harness, config, api_port) as sup,
            httpx.AsyncClient(base_url=base, timeout=30) as client,
        ):
            await sup.activate("a")
            before = answer(ports["a"], "a")
            pid = main_pid(harness, units, "a")
            await sup.activate("b")
            assert sup.statuses["a"].state is LaneState.SLEEPING
            # Every way of climbing out of /v1 to the engine's dev routes is refused by laned,
            # for a sleeping lane's model and a serving one's.
            for model in ("a", "b"):
                for path in ("/v1/../sleep", "/v1/%2e%2e/sleep", "/v1/%252E%252E/wake_up", "/v1/./../collective_rpc"):  # fmt: skip
                    url = httpx.URL(base + path)  # as written: httpx would resolve the dots
                    request = client.build_request("POST", url, json={"model": model})
                    request.url = request.url.copy_with(raw_path=path.encode())
                    refused = await client.send(request)
                    assert refused.status_code == 404, (path, refused.text)
            assert engine(ports["a"], "GET", "/is_sleeping").json() == {"is_sleeping": True}
            assert engine(ports["b"], "GET", "/health").status_code == 200
            page = (await client.get("/metrics")).text
            assert 'laned_lane_state{lane="a",state="sleeping"} 1.0' in page
            assert 'laned_sleep_mode_duration_seconds_count{lane="a",operation="sleep"} 1.0' in page
            # A request for the sleeper's model wakes it (on_demand), and is answered after
            # the wake, by the same process, with its weights reloaded.
            reply = await client.post("/v1/chat/completions", json={**ASK, "model": "a"})
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["message"]["content"] == before
            assert sup.statuses["a"].state is LaneState.READY
            assert main_pid(harness, units, "a") == pid
            assert sup.statuses["b"].state is LaneState.INACTIVE
            page = (await client.get("/metrics")).text
            assert 'laned_sleep_mode_duration_seconds_count{lane="a",operation="wake"} 1.0' in page

    run(scenario())


def test_a_wake_whose_canary_differs_is_restarted_cold_before_any_traffic(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    ports, _lanes, config = sleeper_and_peer(harness, units, tmp_path, "sleep_level = 2\n")
    metrics = LanedMetrics()

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            sup.recorder = metrics
            await sup.activate("a")
            before = answer(ports["a"], "a")
            kept = [e.reason for e in sup.events if e.kind is EventKind.CANARY]
            assert len(kept) == 1 and kept[0].startswith("canary kept at this first good start")
            await sup.activate("b")
            # The engine's reload will leave its weights wrong (vLLM #29341's failure).
            httpx.post(f"http://127.0.0.1:{ports['a']}/sim/fault", json={"kind": "bad-reload"})
            pid = main_pid(harness, units, "a")
            woke = await sup.activate("a")
            # Caught by the canary before any request: stopped and started cold.
            assert woke.state is LaneState.READY and main_pid(harness, units, "a") != pid
            assert answer(ports["a"], "a") == before
            notes = [e.reason for e in sup.events if e.lane == "a" and e.kind is not EventKind.TRANSITION]  # fmt: skip
            assert any(n.startswith("the canary differs after a wake") for n in notes), notes
            assert any("stopping it for a cold start" in n for n in notes), notes
            assert metrics.canary_mismatches.labels("a", "wake")._value.get() == 1
            # The cold start that followed answered as the first good start did.
            assert not any("differs after a start" in n for n in notes), notes

    run(scenario())


def test_a_lane_whose_config_changed_while_it_slept_is_started_cold_not_woken(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    ports, lanes, config = sleeper_and_peer(harness, units, tmp_path, "sleep_level = 1\n")

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            await sup.activate("b")
            pid = main_pid(harness, units, "a")
            changed = {**lanes, "a": lanes["a"] + 'description = "now with a new flag"\n'}
            new = lane_config(harness, units, tmp_path, changed, 0, ports=ports)
            applied = await sup.reload(new)
            assert applied["restart_needed"] == ["a"], applied
            await sup.activate("a")
            assert main_pid(harness, units, "a") != pid
            notes = [e.reason for e in sup.events if e.lane == "a" and e.kind is EventKind.SLEEP]
            assert any("its config changed while it slept" in n for n in notes), notes

    run(scenario())


def test_a_level_1_lane_whose_weights_host_ram_cannot_hold_sleeps_at_level_2(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    ports, _lanes, config = sleeper_and_peer(harness, units, tmp_path, "sleep_level = 1\n")
    # Weights larger than this host's RAM (a sparse file: its size, not its blocks).
    beyond_ram(tmp_path / "models" / "a" / "model.safetensors")

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            before = answer(ports["a"], "a")
            await sup.activate("b")
            notes = [e.reason for e in sup.events if e.lane == "a" and e.kind is EventKind.SLEEP]
            assert any(n.startswith("sleeping at level 2, not 1: level 1 would pin") for n in notes), notes  # fmt: skip
            reasons = [e.reason for e in sup.events if e.lane == "a"]
            assert "swap to b: asleep (level 2)" in reasons, reasons
            page = httpx.get(f"http://127.0.0.1:{ports['a']}/metrics", timeout=10).text
            assert 'sleep_state="discard_all"} 1.0' in page
            # Woken as level 2: the weights read again, the same answer.
            await sup.activate("a")
            assert answer(ports["a"], "a") == before
            assert any("waking (level 2)" in r for r in (e.reason for e in sup.events if e.lane == "a"))  # fmt: skip

    run(scenario())


class SleepAwareGpu:
    """GPU 0 (80 GiB) as NVML would list it: each running engine's main process holds 70 GiB
    awake and `residual` GiB asleep (the engine is asked)."""

    def __init__(self, harness: Harness, units: Units, ports: dict[str, int], residual: float):
        self.harness, self.units, self.ports, self.residual = harness, units, ports, residual

    def read(self, indices: Any = None) -> list[GpuReading]:
        processes = []
        for lane, port in self.ports.items():
            pid = main_pid(self.harness, self.units, lane)
            if not pid:
                continue
            try:
                asleep = engine(port, "GET", "/is_sleeping").json()["is_sleeping"] is True
            except (httpx.HTTPError, ValueError, KeyError):
                asleep = False  # loading, or no dev routes: awake
            processes.append((pid, int((self.residual if asleep else 70) * GIB)))
        used = sum(b for _, b in processes)
        return [GpuReading(0, "test GPU", 80 * GIB, used, tuple(processes))]

    def survey(self, indices: Any = None) -> tuple[list[GpuReading], list[str]]:
        return self.read(indices), []  # every GPU read (Nvml.survey)

    def close(self) -> None:
        pass


def test_the_next_lane_starts_beside_a_sleepers_residual_or_stops_it_or_is_told_the_flag(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    ports = {"a": free_port(), "b": free_port(), "c": free_port()}
    lanes = {
        "a": FAST + "sleep_level = 1\n",
        "b": FAST,  # vLLM's default --gpu-memory-utilization, 0.92: 73.6 of 80 GiB
        "c": FAST + 'args = ["--gpu-memory-utilization", "0.85"]\n',
    }
    config = lane_config(harness, units, tmp_path, lanes, 0, ports=ports)
    gpu = SleepAwareGpu(harness, units, ports, residual=8.0)

    async def scenario() -> None:
        async with supervising(harness, config, host=True, gpus=gpu) as sup:
            await sup.activate("a")
            with pytest.raises(ActivationFailed) as refused:
                await sup.activate("b")
            # The gate opened (the sleeper's 8 GiB are left out), then vLLM's own rule: 72
            # GiB free where b wants 73.6. Said before b's engine would have failed on it.
            assert "sleeping lanes keep 8.0 GiB" in refused.value.message, refused.value
            assert "--gpu-memory-utilization to 0.89 or less" in refused.value.hint
            assert sup.statuses["a"].state is LaneState.SLEEPING
            released = [e.reason for e in sup.events if e.lane == "a" and e.kind is EventKind.SLEEP]
            assert "asleep: 62.00 GiB of GPU memory released, 8.00 GiB stay" in released, released
            # c asks for less: it starts beside the sleeper, and a wakes again after it.
            assert (await sup.activate("c")).state is LaneState.READY
            assert (await sup.activate("a")).state is LaneState.READY
            # a has slept once: its 8 GiB are known. b is now refused before anything moves.
            pid = main_pid(harness, units, "a")
            with pytest.raises(PreflightFailed) as refused:
                await sup.activate("b")
            assert "a: 8.0 GiB at its last sleep" in refused.value.message, refused.value
            assert "nothing was stopped" in refused.value.hint
            assert sup.statuses["a"].state is LaneState.READY and main_pid(harness, units, "a") == pid  # fmt: skip
            # c again: a sleeps beside it. b then takes c off and a too, asleep: what a
            # keeps (8 GiB) leaves 72 of the 73.6 b takes. Stopped, not left in b's way.
            assert (await sup.activate("c")).state is LaneState.READY
            assert sup.statuses["a"].state is LaneState.SLEEPING
            assert ("a", 8 * GIB) in sup.placement()[0].lanes  # placed by what it keeps
            assert (await sup.activate("b")).state is LaneState.READY
            assert sup.statuses["a"].state is LaneState.INACTIVE
            assert sup.statuses["c"].state is LaneState.INACTIVE
            said = [e.reason for e in sup.events if e.lane == "a" and e.kind is EventKind.SLEEP]
            assert "swap to b: the GPU memory it keeps asleep leaves no room; stopping it" in said

    run(scenario())


def test_an_engine_that_slept_at_level_1_keeps_its_pinned_buffers_for_the_next_sleep(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    _ports, _lanes, config = sleeper_and_peer(harness, units, tmp_path, "sleep_level = 1\n")
    weights = tmp_path / "models" / "a" / "model.safetensors"
    weights.write_bytes(b"\0" * 2**20)  # 1 MiB: level 1 fits

    def slept_as(sup: Any) -> list[str]:
        return [e.reason for e in sup.events if e.lane == "a" and "asleep (level" in e.reason]

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            await sup.activate("b")
            await sup.activate("a")  # woken: the same engine, its buffers kept by torch
            # Now the weights are larger than this host's RAM: a first level-1 sleep would not
            # fit, but this engine holds its pinned buffers already.
            beyond_ram(weights)
            await sup.activate("b")
            assert slept_as(sup) == ["swap to b: asleep (level 1)"] * 2, slept_as(sup)
            # A new engine has pinned nothing: the same swap sleeps at level 2.
            await sup.deactivate("a")
            await sup.activate("a")
            await sup.activate("b")
            assert slept_as(sup)[-1] == "swap to b: asleep (level 2)", slept_as(sup)

    run(scenario())
