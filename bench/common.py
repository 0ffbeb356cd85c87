"""What the bench scripts share: the test harness's environment, free ports, a lane table."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def harness_env() -> dict[str, str]:
    """The private systemd user manager's environment (`scripts/harness env`)."""
    out = subprocess.run(
        [str(ROOT / "scripts" / "harness"), "env"], capture_output=True, text=True, check=True
    )
    return dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines())


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def sim_lane(
    name: str, unit: str, port: int, extra: str = "", env: str = "", model: str | None = None
) -> str:
    """A laned.toml lane table that runs the simulated engine as an exec lane (on `model`, a
    directory that must exist when laned's preflight runs)."""
    return (
        f'[lanes.{name}]\nunit = "{unit}"\nport = {port}\nserved_model_name = "{name}"\n{extra}'
        f'[lanes.{name}.exec]\ncommand = ["{sys.executable}", "-m", "laned", "sim", "serve", "{model or f"/m/{name}"}"]\n'
        f'[lanes.{name}.env]\nLANED_SIM_STARTUP = "1"\n{env}'
    )


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0-1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
