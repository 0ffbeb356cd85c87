"""laned install and a reboot: a fresh user manager brings laned back, and laned the desired lane."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import httpx

from tests.helpers import ROOT, free_port, run, wait_until

HARNESS = str(ROOT / "scripts" / "harness")


def answers(url: str) -> dict[str, object] | None:
    try:
        response = httpx.get(url, timeout=2)
        return response.json() if response.status_code == 200 else None  # type: ignore[no-any-return]
    except (httpx.HTTPError, ValueError):
        return None


def test_install_then_reboot_brings_back_laned_and_the_desired_lane(tmp_path: Path) -> None:
    base = Path("/tmp") / f"laned-boot-{os.getpid()}"  # its own manager: this test reboots it
    harness_env = {**os.environ, "LANED_HARNESS_DIR": str(base)}
    port, api = free_port(), free_port()
    try:
        run([HARNESS, "up"], env=harness_env)
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in run([HARNESS, "env"], env=harness_env).stdout.splitlines()
        )
        user = {**os.environ, **exports}
        config = Path(exports["HOME"]) / "laned.toml"
        for n in ("a", "b"):
            (tmp_path / "m" / n).mkdir(parents=True)  # preflight checks the model directory
        lanes = "".join(
            f'[lanes.{n}]\nunit = "boot-{n}.service"\nport = {port}\nserved_model_name = "{n}"\n'
            f'restart_sec = "1s"\nprobe = {{ start_interval_max = "300ms" }}\n'
            f'[lanes.{n}.exec]\ncommand = ["{sys.executable}", "-m", "laned", "sim", "serve", "{tmp_path}/m/{n}"]\n'
            f'[lanes.{n}.env]\nLANED_SIM_STARTUP = "0.3"\n'
            for n in ("a", "b")
        )
        config.write_text(f'[daemon]\nlisten = "127.0.0.1:{api}"\ndefault_lane = "a"\n' + lanes)
        installed = run(
            [sys.executable, "-m", "laned", "--config", str(config), "install"], env=user
        )
        assert "enabled and started laned.service" in installed.stdout
        unit = Path(exports["XDG_CONFIG_HOME"]) / "systemd" / "user" / "laned.service"
        assert "Type=notify" in unit.read_text() and "WatchdogSec=" in unit.read_text()
        assert (
            Path(exports["XDG_CONFIG_HOME"]) / "systemd/user/default.target.wants/laned.service"
        ).exists()
        base_url = f"http://127.0.0.1:{api}"
        wait_until(
            lambda: (answers(f"{base_url}/lanes/a") or {}).get("state") == "ready",
            60,
            "the default lane a",
        )
        shown = run(
            ["systemctl", "--user", "show", "laned.service", "-pActiveState", "-pStatusText"],
            env=user,
        ).stdout
        assert (
            "ActiveState=active" in shown and "StatusText=supervising 2 lane(s)" in shown
        )  # READY=1 was sent
        assert (
            httpx.post(f"{base_url}/lanes/b/activate?wait=true", timeout=60).json()["state"]
            == "ready"
        )
        # A reboot: the manager goes away with everything it ran, a fresh one starts.
        run(["systemctl", "--user", "exit"], env=user)
        wait_until(
            lambda: answers(f"{base_url}/healthz") is None, 30, "laned to go down with the manager"
        )
        run([HARNESS, "up"], env=harness_env)
        wait_until(
            lambda: (answers(f"{base_url}/lanes/b") or {}).get("state") == "ready",
            60,
            "laned and lane b back",
        )
        assert (answers(f"http://127.0.0.1:{port}/v1/models") or {}).get("data", [{}])[0][
            "id"
        ] == "b"  # type: ignore[index]
        assert (answers(f"{base_url}/lanes/a") or {}).get("state") == "inactive"
    finally:
        run([HARNESS, "down"], env=harness_env, check=False)
        shutil.rmtree(base, ignore_errors=True)
