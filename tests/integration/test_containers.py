"""Container lanes end to end: the simulator image under real podman, real systemd units and a
supervisor with its host adapter (podman API, preflight, GPU gate, compile caches)."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest

from laned.api import ApiSettings, create_app
from laned.api.front import Front
from laned.core.lanes import Desired, EventKind, LaneState, Verdict
from laned.errors import ActivationFailed, PodmanUnavailable, PreflightFailed
from laned.owner.supervisor import Supervisor
from laned.validation.load import Config
from tests.helpers import ROOT, free_port, run
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_supervisor import run as run_async
from tests.integration.test_supervisor import saw, until
from tests.integration.test_supervisor import supervising as supervising_on


def supervising(harness: Harness, config: Config) -> AbstractAsyncContextManager[Supervisor]:
    """A supervisor with the host adapter (podman API, NVML where present)."""
    return supervising_on(harness, config, host=True)


def container_lane(units: Units, image: str, lane: str, env: str = "", extra: str = "") -> str:
    """Lane TOML for a container lane running the simulator image (unique container name)."""
    name = units.name(f"ctr-{lane}")
    units.containers.append(name)
    return (
        FAST + extra + f'env = {{ LANED_SIM_STARTUP = "0.5"{env} }}\n'
        f'[lanes.{lane}.container]\nimage = "{image}"\nname = "{name}"\nentrypoint = "vllm"\n'
        f'command = ["serve", "/models/{lane}"]\nnetwork = "host"\n'
    )


def podman_exists(harness: Harness, name: str) -> bool:
    return harness.podman("container", "exists", name, check=False).returncode == 0


def notes(sup: Supervisor, lane: str, kind: EventKind) -> list[str]:
    return [e.reason for e in sup.events if e.lane == lane and e.kind is kind]


def test_container_lanes_swap_both_ways_reusing_their_compile_cache(
    harness: Harness, units: Units, sim_image: str, tmp_path: Path
) -> None:
    port = free_port()
    lanes = {
        "a": container_lane(units, sim_image, "a", ', LANED_SIM_JIT = "2"'),
        "b": container_lane(units, sim_image, "b"),
    }
    config = lane_config(harness, units, tmp_path, lanes, port)
    ctr_a, ctr_b = units.name("ctr-a"), units.name("ctr-b")

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            a = sup.statuses["a"]
            first = a.last_cold_start
            assert first is not None and first > 2, "the first cold start tunes kernels (2 s)"
            # Each startup phase was recorded with its duration, from the container's log
            # (which journald may hand over after the engine answered).
            wanted = {"loading weights", "DeepGEMM JIT", "FlashInfer autotune"}
            await until(lambda: wanted <= set(a.last_phases), 10, "the start's phases")
            assert a.last_phases.get("FlashInfer autotune", 0) > 1
            assert {"loading weights", "DeepGEMM JIT"} <= set(a.last_phases), a.last_phases
            assert a.image_id and a.image_id.startswith(
                harness.podman("image", "inspect", "--format", "{{.Id}}", sim_image).stdout.strip()[
                    :12
                ]
            )
            state = await sup.container("a")
            assert state is not None and state["status"] == "running"
            # No NVML here: the gate says it was skipped, and why.
            assert any("GPU-memory gate skipped" in n for n in notes(sup, "a", EventKind.GATE))

            for new, old, gone in (("b", "a", ctr_a), ("a", "b", ctr_b)):
                await sup.activate(new)
                assert not podman_exists(harness, gone), "the old lane's container is removed"
                assert sup.statuses[old].state is LaneState.INACTIVE
                order = [(e.lane, e.to_state) for e in sup.events if e.kind is EventKind.TRANSITION]
                stopped = order.index((old, LaneState.INACTIVE), len(order) - 6)
                started = order.index((new, LaneState.STARTING), len(order) - 6)
                assert stopped < started
                with httpx.Client() as client:
                    model = client.get(f"http://127.0.0.1:{port}/v1/models").json()
                assert model["data"][0]["id"] == new
            second = sup.statuses["a"].last_cold_start
            assert second is not None and second < first - 1.5, (first, second)
            # The engine said where its compile cache served it, and laned shows it (journald
            # may hand the lines over just after the engine answered: wait for them).
            for said in ("compile cache hit (torch.compile)", "compile cache hit (FlashInfer autotune)"):  # fmt: skip
                await until(lambda said=said: said in notes(sup, "a", EventKind.STARTUP), 5, said)
            cache = Path(config.daemon.cache_dir) / "lanes" / "a" / "vllm"
            assert (cache / "laned-sim-kernels.json").exists()

    run_async(scenario())


@pytest.mark.parametrize(
    ("fault", "code", "sig"),
    [({"kind": "exit", "code": 0}, 0, None), ({"kind": "crash"}, None, 9)],
    ids=["exit-0", "crash"],
)
def test_an_exit_inside_the_container_is_a_failure_and_restarted(
    harness: Harness,
    units: Units,
    sim_image: str,
    tmp_path: Path,
    fault: dict[str, Any],
    code: int | None,
    sig: int | None,
) -> None:
    port = free_port()
    config = lane_config(
        harness, units, tmp_path, {"c": container_lane(units, sim_image, "c")}, port
    )

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("c")
            async with httpx.AsyncClient() as client:
                await client.post(f"http://127.0.0.1:{port}/sim/fault", json=fault)
            # The probes may see the death before the exit arrives (podman's clean-up takes
            # its time): the lane restarts at once, and its exit is recorded when it comes.
            await until(lambda: saw(sup, "c", LaneState.RESTARTING), 20, "the failure")
            await until(lambda: sup.statuses["c"].last_exit is not None, 20, "the exit")
            last = sup.statuses["c"].last_exit
            assert last is not None
            assert (last.code, last.signal, last.verdict) == (code, sig, Verdict.FAILURE)
            assert len(sup.statuses["c"].failures) == 1, "one death, one failure"
            await until(
                lambda: (
                    sup.statuses["c"].state is LaneState.READY and sup.statuses["c"].restarts == 1
                ),
                60,
                "the restart",
            )

    run_async(scenario())


def test_a_stale_container_is_cleaned_and_the_lane_starts(
    harness: Harness, units: Units, sim_image: str, tmp_path: Path
) -> None:
    port = free_port()
    config = lane_config(
        harness, units, tmp_path, {"c": container_lane(units, sim_image, "c")}, port
    )
    name = units.name("ctr-c")
    # What a killed run leaves behind: `podman run --name` would fail with "already in use".
    harness.podman("create", "--name", name, sim_image, "serve", "/stale")

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            assert (await sup.activate("c")).state is LaneState.READY
            state = await sup.container("c")
            assert state is not None and state["status"] == "running"
            lines = await sup.log_lines("c", 50, source="container")
            assert any("Starting vLLM server on" in line for line in lines)

    run_async(scenario())


def test_a_missing_image_is_refused_before_the_running_lane_is_touched(
    harness: Harness, units: Units, sim_image: str, tmp_path: Path
) -> None:
    port = free_port()
    lanes = {
        "a": FAST,
        "b": container_lane(
            units, "localhost/laned-never-built:1", "b", extra="start_limit_burst = 1\n"
        ),
    }
    config = lane_config(harness, units, tmp_path, lanes, port)
    unit_a, unit_b = (f"{units.name(n)}.service" for n in "ab")

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("a")
            invocation = harness.show(unit_a, "InvocationID")["InvocationID"]
            with pytest.raises(PreflightFailed) as refused:
                await sup.activate("b")
            assert "laned-never-built" in refused.value.message
            assert "podman build" in refused.value.hint
            assert [f.where for f in refused.value.findings if f.severity.value == "error"] == [
                "image"
            ]
            # Nothing was disturbed: a still runs (same invocation) and is still the desired lane.
            assert sup.statuses["a"].state is LaneState.READY
            assert sup.statuses["a"].desired is Desired.ACTIVE
            assert sup.statuses["b"].desired is Desired.INACTIVE
            assert harness.show(unit_a, "InvocationID")["InvocationID"] == invocation
            assert harness.show(unit_b, "ActiveState")["ActiveState"] == "inactive"
            assert any("not present locally" in n for n in notes(sup, "b", EventKind.PREFLIGHT))
            # Forced, it goes ahead: a is stopped, and b fails as podman cannot find the image.
            with pytest.raises(ActivationFailed):
                await sup.activate("b", force=True)
            assert sup.statuses["a"].state is LaneState.INACTIVE
            assert sup.statuses["b"].state is LaneState.FAILED

    run_async(scenario())


def test_a_port_taken_by_a_stranger_is_a_preflight_error(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    config = lane_config(harness, units, tmp_path, {"a": FAST}, port)
    stranger = socket.socket()
    stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as vLLM binds
    stranger.bind(("0.0.0.0", port))
    stranger.listen()

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            with pytest.raises(PreflightFailed) as refused:
                await sup.activate("a")
            assert f"port {port} is already in use" in refused.value.message
            assert "SO_REUSEPORT" in refused.value.hint
            assert sup.statuses["a"].state is LaneState.INACTIVE
            stranger.close()
            assert (await sup.activate("a")).state is LaneState.READY

    try:
        run_async(scenario())
    finally:
        stranger.close()


def test_an_oom_kill_in_the_container_is_a_failure(
    harness: Harness, units: Units, sim_image: str, tmp_path: Path
) -> None:
    port = free_port()
    lane = container_lane(units, sim_image, "c").replace(
        'network = "host"\n', 'network = "host"\npodman_args = ["--memory", "96m"]\n'
    )
    config = lane_config(harness, units, tmp_path, {"c": lane}, port)

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("c")
            async with httpx.AsyncClient() as client:
                await client.post(f"http://127.0.0.1:{port}/sim/fault", json={"kind": "oom"})
            await until(lambda: saw(sup, "c", LaneState.RESTARTING), 30, "the OOM kill")
            last = sup.statuses["c"].last_exit
            assert last is not None and last.signal == 9 and last.verdict is Verdict.FAILURE
            # podman 4.3 with runc on cgroups v1 (this host) leaves State.OOMKilled false; the
            # wrapper records whatever podman says (tests/unit/test_render.py covers "true").
            record = (Path(config.daemon.state_dir) / "lanes" / "c" / "last-exit").read_text()
            assert f"oom={int(last.oom_killed)}" in record

    run_async(scenario())


def test_the_podman_socket_going_away_disturbs_nothing(
    harness: Harness, units: Units, sim_image: str, tmp_path: Path
) -> None:
    port = free_port()
    config = lane_config(
        harness, units, tmp_path, {"c": container_lane(units, sim_image, "c")}, port
    )
    pid_file = Path(harness.env["LANED_HARNESS_DIR"]) / "podman.pid"

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("c")
            assert sup.seam.containers.host is not None
            run(["kill", pid_file.read_text().strip()])
            name = units.name("ctr-c")
            deadline = time.monotonic() + 15
            while True:
                try:
                    await sup.seam.containers.host.podman.container(name)
                except PodmanUnavailable as exc:
                    assert "podman.socket" in exc.hint
                    break
                assert time.monotonic() < deadline, "the podman API still answers"
                await asyncio.sleep(0.05)
            # The lane's view says so, with the hint (the API in-process, over ASGI).
            app = create_app(Front(sup), ApiSettings("127.0.0.1", 9000))
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as api:
                view = (await api.get("/lanes/c")).json()
            assert view["state"] == "ready" and view["container"]["status"] == "unknown"
            assert "systemctl --user enable --now podman.socket" in view["container"]["hint"]
            findings = await sup.preflight("c")
            assert [f.where for f in findings if f.where == "image"] == ["image"]
            assert all(f.severity.value != "error" for f in findings)
            assert sup.statuses["c"].state is LaneState.READY  # the lane never noticed
            run([str(ROOT / "scripts" / "harness"), "up"], env=harness.env)
            state = await sup.seam.containers.host.podman.container(name)
            assert state is not None and state.status == "running"

    run_async(scenario())


def test_prepare_runs_once_after_the_image_changed(
    harness: Harness, units: Units, sim_image: str, tmp_path: Path
) -> None:
    port = free_port()
    marker = tmp_path / "prepared"
    step = f"[\"{sys.executable}\", \"-c\", \"print('re-applied patches'); open('{marker}', 'a').write('x')\"]"
    lane = container_lane(units, sim_image, "c", extra=f"prepare = [{step}]\n")
    config = lane_config(harness, units, tmp_path, {"c": lane}, port)
    # The last good start ran another image: the bind-mounted patches must be re-derived.
    state = Path(config.daemon.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    (state / "state.json").write_text(json.dumps({"image_ids": {"c": "sha256:0ld"}}))

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            findings = await sup.preflight("c")
            drift = [f for f in findings if f.where == "image-drift"]
            assert drift and "prepare" in drift[0].hint, findings
            await sup.activate("c")
            lines = notes(sup, "c", EventKind.PREPARE)
            assert any("re-applied patches" in line for line in lines), lines
            assert marker.read_text() == "x"
            image = sup.statuses["c"].image_id
            assert image and image != "sha256:0ld"
            await sup.deactivate("c")
            await sup.activate("c")
            assert marker.read_text() == "x", "prepare runs only after the image changed"

    run_async(scenario())


def test_a_desired_lane_that_fails_preflight_at_start_is_failed_visibly(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    lane = container_lane(units, "localhost/laned-never-built:1", "b")
    config = lane_config(harness, units, tmp_path, {"b": lane}, port)
    state = Path(config.daemon.state_dir)
    state.mkdir(parents=True, exist_ok=True)
    (state / "state.json").write_text(json.dumps({"desired": {"b": "active"}}))

    async def scenario() -> None:
        # laned restores the desired lane at start; nobody waits on that activation, so its
        # refusal must show in the lane itself.
        async with supervising(harness, config) as sup:
            await until(lambda: sup.statuses["b"].state is LaneState.FAILED, 10, "failed")
            assert sup.statuses["b"].reason.startswith("preflight: ")
            assert "not present locally" in sup.statuses["b"].reason
            assert sup.statuses["b"].desired is Desired.ACTIVE

    run_async(scenario())
