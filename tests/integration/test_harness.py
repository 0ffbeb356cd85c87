"""scripts/harness itself: idempotent, recovers from a killed run, and tears down what it started."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.helpers import ROOT, alive, run, wait_until

HARNESS = str(ROOT / "scripts" / "harness")


def test_harness_up_twice_survives_a_killed_manager_and_goes_down(tmp_path: Path) -> None:
    base = Path("/tmp") / f"laned-h-{os.getpid()}"  # short: unix socket paths are limited
    env = {**os.environ, "LANED_HARNESS_DIR": str(base)}
    try:
        run([HARNESS, "up"], env=env)
        first = (base / "systemd.pid").read_text()
        assert Path(f"/proc/{first.strip()}/comm").read_text().strip() == "systemd", (
            "pid file names the manager"
        )
        run([HARNESS, "up"], env=env)  # a second `up` reuses what runs
        assert (base / "systemd.pid").read_text() == first
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in run([HARNESS, "env"], env=env).stdout.splitlines()
        )
        user = {**os.environ, **exports}
        assert exports["HOME"].startswith(str(base)), (
            "the harness must not use the invoking user's HOME"
        )
        assert run(
            ["systemctl", "--user", "is-system-running"], env=user, check=False
        ).stdout.strip() in (
            "running",
            "degraded",
        )
        # A killed run: the manager dies without cleaning up its sockets.
        os.kill(int(first), signal.SIGKILL)
        wait_until(lambda: not alive(first), 10, "the manager to die")
        run([HARNESS, "up"], env=env)
        assert (base / "systemd.pid").read_text() != first
        run(["systemctl", "--user", "show-environment"], env=user)
        status = run([HARNESS, "status"], env=env).stdout
        assert "systemd: running" in status and "podman: running" in status
    finally:
        run([HARNESS, "down"], env=env, check=False)
    status = run([HARNESS, "status"], env=env, check=False).stdout
    assert "systemd: not started" in status and "podman: not started" in status
    leftovers = [p for p in Path("/proc").glob("[0-9]*") if _mentions(p, str(base))]
    assert leftovers == [], "processes of the harness outlived `down`"


def _mentions(proc: Path, text: str) -> bool:
    try:
        return text in (proc / "cmdline").read_bytes().decode(errors="replace") and alive(proc.name)
    except OSError:
        return False
