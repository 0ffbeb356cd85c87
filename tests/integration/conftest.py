"""Integration fixtures: the real harness (systemd --user, journald, podman) and simulators.

The harness is started by scripts/harness (idempotent); in CI a component that does not
come up is a failure, never a skip.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.helpers import ROOT, free_port, journal, port_open, run, sim_env, wait_until


@dataclass
class Harness:
    """Where the private user manager lives and the environment that reaches it."""

    env: dict[str, str]

    @property
    def unit_dir(self) -> Path:
        return Path(self.env["XDG_CONFIG_HOME"]) / "systemd" / "user"

    @property
    def bus(self) -> str:
        return self.env["DBUS_SESSION_BUS_ADDRESS"]

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(["systemctl", "--user", *args], check=check, env=self.env)

    def podman(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(["podman", *args], check=check, env=self.env)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.systemctl("show", unit, *[f"-p{p}" for p in props]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.fixture(scope="session")
def harness() -> Harness:
    result = subprocess.run(
        [str(ROOT / "scripts" / "harness"), "up"], capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.fail(f"the harness did not come up:\n{result.stderr}")
    lines = run([str(ROOT / "scripts" / "harness"), "env"]).stdout
    env = dict(os.environ)
    for line in lines.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    return Harness(env)


@pytest.fixture(scope="session")
def sim_image(harness: Harness) -> str:
    result = subprocess.run(
        [str(ROOT / "scripts" / "build-sim-image")], capture_output=True, text=True, env=harness.env
    )
    if result.returncode != 0:
        pytest.fail(f"the simulator image did not build:\n{result.stdout}\n{result.stderr}")
    return "localhost/laned-sim:latest"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)


def failed(request: pytest.FixtureRequest) -> bool:
    report = getattr(request.node, "rep_call", None)
    return report is None or report.failed


@dataclass
class Units:
    """Units (and containers) a test creates: unique names, cleaned up, journals on failure."""

    harness: Harness
    names: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    prefix: str = field(default_factory=lambda: f"lt{uuid.uuid4().hex[:6]}")

    def name(self, stem: str) -> str:
        """A unique name for this test run."""
        return f"{self.prefix}-{stem}"

    def track(self, unit: str) -> str:
        self.names.append(unit)
        return unit


@pytest.fixture
def units(harness: Harness, request: pytest.FixtureRequest) -> Iterator[Units]:
    tracked = Units(harness)
    yield tracked
    if failed(request):
        for unit in tracked.names:
            print(f"\n===== journal of {unit} =====\n{journal(unit)}")
    for unit in tracked.names:
        harness.systemctl("stop", unit, check=False)
        harness.systemctl("reset-failed", unit, check=False)
    for container in tracked.containers:
        harness.podman("rm", "--force", "--ignore", container, check=False)
    for path in harness.unit_dir.glob(f"{tracked.prefix}*"):
        path.unlink()
    harness.systemctl("daemon-reload", check=False)


@dataclass
class Sim:
    """A simulator process started by a test."""

    process: subprocess.Popen[str]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        """The engine's output as written: tqdm's `\r` redraws kept (no newline translation)."""
        with self.log_path.open(encoding="utf-8", newline="") as handle:
            return handle.read()

    def wait_ready(self, timeout: float = 30) -> None:
        wait_until(
            lambda: port_open(self.port) or self.process.poll() is not None,
            timeout,
            "the simulator's port",
        )
        assert self.process.poll() is None, f"the simulator exited early:\n{self.log()}"

    def wait_exit(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def client(self, key: str | None = None, timeout: float = 30) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)


@pytest.fixture
def start_sim(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[object]:
    started: list[Sim] = []

    def start(*args: str, ready: bool = True, model: str = "/models/sim", **env: str) -> Sim:
        port = free_port()
        log_path = tmp_path / f"sim-{port}.log"
        argv = [
            sys.executable,
            "-m",
            "laned",
            "sim",
            "serve",
            model,
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            *args,
        ]
        env.setdefault("LANED_SIM_STARTUP", "0.2")
        with log_path.open("w") as handle:  # the child keeps its own descriptor
            process = subprocess.Popen(
                argv, stdout=handle, stderr=subprocess.STDOUT, env=sim_env(**env), text=True
            )
        sim = Sim(process, port, log_path)
        started.append(sim)
        if ready:
            sim.wait_ready()
        return sim

    yield start
    for sim in started:
        if sim.process.poll() is None:
            sim.process.send_signal(signal.SIGKILL)
            sim.process.wait(timeout=10)
        if failed(request):
            print(f"\n===== simulator log (port {sim.port}) =====\n{sim.log()}")
