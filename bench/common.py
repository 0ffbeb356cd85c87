"""What the bench scripts share: the test harness's environment, free ports, a lane table."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from laned.owner.supervisor import Supervisor

ROOT = Path(__file__).resolve().parent.parent


def harness_env() -> dict[str, str]:
    """The private systemd user manager's environment (`scripts/harness env`)."""
    out = subprocess.run(
        [str(ROOT / "scripts" / "harness"), "env"], capture_output=True, text=True, check=True
    )
    return dict(line.removeprefix("export ").split("=", 1) for line in out.stdout.splitlines())


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port nothing listens on right now, and never one this process handed out before
    (the kernel may give the same free port to two binds in a row: two lanes of one bench got
    one port so, and laned refused their config)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


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


def supervisor_on(text: str, tmp: str, env: dict[str, str]) -> Supervisor:
    """A Supervisor (not started yet) over the config `text`, its units rendered into the
    harness's user manager and daemon-reloaded."""
    from laned.adapters import rendered
    from laned.adapters.probes import Probe
    from laned.adapters.systemd import Systemd
    from laned.owner.supervisor import Supervisor
    from laned.owner.wiring import host_seam
    from laned.validation.load import parse_config

    config = parse_config(text, "bench", {"HOME": tmp})
    rendered.apply(config)
    subprocess.run(["systemctl", "--user", "daemon-reload"], check=True)
    seam = host_seam(Systemd(env["DBUS_SESSION_BUS_ADDRESS"]), Probe())
    return Supervisor(config, seam, systemd_version=252)


def cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0-1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class LanedServe:
    """`laned serve` as its own process on a config file (so that its RSS and CPU can be read
    from /proc); up once `ready` lanes are ready; at exit its `units` are stopped and removed."""

    def __init__(
        self,
        path: Path,
        api: int,
        env: dict[str, str],
        units: list[str],
        ready: int = 0,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.path, self.api, self.env, self.units, self.ready = path, api, env, units, ready
        self.headers = headers or {}
        self.unit_dir = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
        self.url = f"http://127.0.0.1:{api}"

    def __enter__(self) -> LanedServe:
        self.log = (self.path.parent / "laned.log").open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "laned", "--config", str(self.path), "serve"],
            cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                reply = httpx.get(f"{self.url}/lanes", headers=self.headers, timeout=10)
                lanes = reply.json()["lanes"]
                if sum(lane["state"] == "ready" for lane in lanes) >= self.ready:
                    return self
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        self.__exit__()
        log = (self.path.parent / "laned.log").read_text()
        raise TimeoutError(f"laned did not come up:\n{log}")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.log.close()
        subprocess.run(["systemctl", "--user", "stop", *self.units], env=self.env, check=False)
        for unit in self.units:
            (self.unit_dir / unit).unlink(missing_ok=True)
        subprocess.run(["systemctl", "--user", "daemon-reload"], env=self.env, check=False)

    def kill(self) -> None:
        """SIGKILL laned (a crash): its units are left as they are."""
        self.process.kill()
        self.process.wait(30)
        self.log.close()

    def proc(self) -> tuple[float, int, int]:
        """(CPU seconds, RSS bytes, context switches over every thread) of laned."""
        pid = self.process.pid
        cpu = cpu_seconds(pid)
        rss = 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
        switches = 0
        for task in Path(f"/proc/{pid}/task").iterdir():
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches" in line:
                    switches += int(line.split()[1])
        return cpu, rss, switches
