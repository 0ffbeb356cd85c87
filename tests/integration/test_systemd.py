"""The harness and the rendered lanes under a real systemd user manager, journald and podman."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from dbus_fast import BusType, Message, MessageType
from dbus_fast.aio import MessageBus

from laned.adapters import rendered
from laned.adapters.systemd import Systemd
from laned.validation.load import Config, parse_config
from tests.helpers import ROOT, free_port, journal, run, wait_until
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import lane_config

SYSTEMD = "org.freedesktop.systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def exit_record(config: Config, lane: str) -> dict[str, str]:
    path = Path(config.daemon.state_dir) / "lanes" / lane / "last-exit"
    return dict(part.split("=", 1) for part in path.read_text().split())


# --- the harness itself -------------------------------------------------------------------


async def _dbus_start_stop(bus_address: str, unit: str) -> tuple[str, str, str]:
    bus = await MessageBus(bus_address=bus_address, bus_type=BusType.SESSION).connect()
    try:
        intro = await bus.introspect(SYSTEMD, "/org/freedesktop/systemd1")
        manager = bus.get_proxy_object(SYSTEMD, "/org/freedesktop/systemd1", intro).get_interface(
            MANAGER
        )
        done: dict[str, asyncio.Future[str]] = {}
        loop = asyncio.get_running_loop()

        def on_job_removed(job_id: int, job: str, name: str, result: str) -> None:
            done.setdefault(job, loop.create_future())
            if not done[job].done():
                done[job].set_result(result)

        # Subscribe before dispatching: JobRemoved may arrive before StartUnit returns.
        await manager.call_subscribe()  # type: ignore[attr-defined]
        manager.on_job_removed(on_job_removed)  # type: ignore[attr-defined]
        await manager.call_reload()  # type: ignore[attr-defined]

        async def job(call: Any) -> str:
            path = await call(unit, "replace")
            done.setdefault(path, loop.create_future())
            return await asyncio.wait_for(done[path], 20)

        started = await job(manager.call_start_unit)  # type: ignore[attr-defined]
        unit_path = await manager.call_get_unit(unit)  # type: ignore[attr-defined]
        reply = await bus.call(
            Message(
                destination=SYSTEMD,
                path=unit_path,
                interface="org.freedesktop.DBus.Properties",
                member="Get",
                signature="ss",
                body=["org.freedesktop.systemd1.Unit", "ActiveState"],
            )
        )
        assert reply is not None and reply.message_type == MessageType.METHOD_RETURN
        state = reply.body[0].value
        stopped = await job(manager.call_stop_unit)  # type: ignore[attr-defined]
        return started, state, stopped
    finally:
        bus.disconnect()


def test_throwaway_unit_started_and_stopped_over_the_real_bus(
    harness: Harness, units: Units
) -> None:
    unit = units.track(f"{units.name('throwaway')}.service")
    (harness.unit_dir / unit).write_text("[Service]\nExecStart=/bin/sleep 300\n")
    started, state, stopped = asyncio.run(_dbus_start_stop(harness.bus, unit))
    assert (started, state, stopped) == ("done", "active", "done")
    assert harness.show(unit, "ActiveState")["ActiveState"] == "inactive"


def test_subscribing_again_on_the_same_connection_is_not_an_error(harness: Harness) -> None:
    """After a NameOwnerChanged laned subscribes again; on a connection whose subscription
    stands systemd answers AlreadySubscribed, which must not be retried for 30 s as a failure."""

    async def scenario() -> None:
        systemd = Systemd(harness.bus)
        await systemd.connect()  # subscribes
        try:
            await systemd.subscribe()
            assert await systemd.version() is not None
        finally:
            systemd.disconnect()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_rendered_units_pass_systemd_analyze_verify(harness: Harness, tmp_path: Path) -> None:
    """Every example config's units, as the user manager reads them: not one warning (a
    lane unit once named network-online.target, which no user manager has)."""
    unit_files = []
    for example in sorted((ROOT / "config").glob("*.toml")):
        home = tmp_path / example.stem
        text = example.read_text()
        if "nodes = [" in text:  # a lane over several hosts: its head's unit
            text = text.replace("[daemon]\n", '[daemon]\nhost = "spark-a"\n', 1)
        config = parse_config(text, example.name, {"HOME": str(home)})
        rendered.apply(config)
        unit_files += sorted(str(p) for p in Path(config.daemon.unit_dir).glob("*.service"))
    assert len(unit_files) >= 6
    result = run(["systemd-analyze", "--user", "verify", *unit_files], check=False, env=harness.env)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 0 and problems == [], problems


# --- exec lanes running the simulator ----------------------------------------------------------


def test_sim_lane_runs_as_a_user_unit_and_logs_to_journald(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()
    lane_config(
        harness,
        units,
        tmp_path,
        {"a": 'args = ["--enforce-eager", "--tensor-parallel-size", "2"]'},
        port,
    )
    unit = f"{units.name('a')}.service"
    harness.systemctl("start", unit)
    wait_until(lambda: healthy(port), 30, "the lane's /health")
    log = wait_until(
        lambda: "Application startup complete." in (j := journal(unit)) and j,
        10,
        "the log in journald",
    )
    assert "Loading safetensors checkpoint shards" in log
    assert "accepted vLLM flag --tensor-parallel-size" in log
    models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
    assert models["data"][0]["id"] == "a"


@pytest.mark.parametrize(
    ("fault", "status"),
    [
        ({"kind": "engine-dead"}, "0"),
        ({"kind": "exit", "code": 1}, "1"),
        ({"kind": "crash"}, "137"),
    ],
    ids=["exit-0-engine-dead", "exit-1", "signal"],
)
def test_an_exit_nobody_asked_for_is_a_failure_in_systemd(
    harness: Harness, units: Units, tmp_path: Path, fault: dict[str, Any], status: str
) -> None:
    # systemd 252 has no RestartSteps=: the unit says Restart=no and laned restarts it
    # (tests/integration/test_supervisor.py). Here: systemd itself records a failure.
    port = free_port()
    config = lane_config(harness, units, tmp_path, {"a": ""}, port)
    unit = f"{units.name('a')}.service"
    harness.systemctl("start", unit)
    wait_until(lambda: healthy(port), 30, "the lane's /health")
    httpx.post(f"http://127.0.0.1:{port}/sim/fault", json=fault)
    wait_until(
        lambda: harness.show(unit, "ActiveState")["ActiveState"] == "failed", 30, "the unit to fail"
    )
    assert harness.show(unit, "Result")["Result"] == "exit-code"
    record = exit_record(config, "a")
    assert record["status"] == status and record["requested"] == "0"
    # journald hands the wrapper's last line over up to 250 ms after the unit's state changed.
    wait_until(lambda: "exited on its own with status " + status in journal(unit), 10,
               "the wrapper's verdict in the journal")  # fmt: skip
    harness.systemctl("start", unit)
    wait_until(lambda: healthy(port), 30, "the started-again lane's /health")
    # A stop systemd is asked for ends cleanly: success, and no restart is scheduled.
    harness.systemctl("stop", unit)
    shown = harness.show(unit, "ActiveState", "SubState", "Result")
    assert shown == {"ActiveState": "inactive", "SubState": "dead", "Result": "success"}
    assert exit_record(config, "a")["requested"] == "1"


def test_swap_stops_the_old_lane_before_starting_the_new_one_both_ways(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    port = free_port()  # one group, one port: clients keep their base URL across swaps
    lane_config(harness, units, tmp_path, {"a": "", "b": ""}, port)
    a, b = f"{units.name('a')}.service", f"{units.name('b')}.service"
    harness.systemctl("start", a)
    wait_until(lambda: healthy(port), 30, "lane a")
    for old, new, model in ((a, b, "b"), (b, a, "a")):
        harness.systemctl("start", new)
        old_state = harness.show(old, "ActiveState", "InactiveEnterTimestampMonotonic")
        new_state = harness.show(new, "ActiveState", "ExecMainStartTimestampMonotonic")
        assert old_state["ActiveState"] == "inactive" and new_state["ActiveState"] == "active"
        assert int(old_state["InactiveEnterTimestampMonotonic"]) <= int(
            new_state["ExecMainStartTimestampMonotonic"]
        )
        wait_until(
            lambda m=model: (
                httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"] == m
            ),
            30,
            f"lane {model} to answer",
        )


# --- container lanes: the simulator image under podman -----------------------------------------


def test_sim_image_runs_as_a_container_lane_and_cleans_stale_containers(
    harness: Harness, units: Units, sim_image: str, tmp_path: Path
) -> None:
    assert shutil.which("podman")
    port = free_port()
    name = units.name("ctr")
    units.containers.append(name)
    extra = (
        'restart_sec = "1s"\n'
        f'[lanes.c.container]\nimage = "{sim_image}"\nname = "{name}"\nentrypoint = "vllm"\n'
        'command = ["serve", "/models/c"]\nnetwork = "host"\n'
        '[lanes.c.env]\nLANED_SIM_STARTUP = "0.3"\n'
    )
    lane_config(harness, units, tmp_path, {"c": extra}, port)
    unit = f"{units.name('c')}.service"
    # A container left behind by a killed run would make `podman run --name` fail.
    harness.podman("create", "--name", name, sim_image, "serve", "/stale")
    harness.systemctl("start", unit)
    wait_until(lambda: healthy(port), 60, "the container lane's /health")
    inspect = harness.podman(
        "inspect", name, "--format", "{{.State.Status}} {{.Config.Cmd}}"
    ).stdout
    assert inspect.startswith("running") and "/models/c" in inspect
    httpx.post(f"http://127.0.0.1:{port}/sim/fault", json={"kind": "exit", "code": 0})
    wait_until(
        lambda: harness.show(unit, "Result")["Result"] == "exit-code",
        60,
        "exit 0 recorded as a failure",
    )
    harness.systemctl("start", unit)  # ExecStartPre removes what the last run left
    wait_until(lambda: healthy(port), 60, "the started-again container")
    harness.systemctl("stop", unit)
    assert harness.show(unit, "Result")["Result"] == "success"
    assert harness.podman("container", "exists", name, check=False).returncode == 1
