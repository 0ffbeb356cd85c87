"""`laned install`: laned's own unit, enabled and started, so laned comes up at boot."""

from __future__ import annotations

import os
import pwd
import shutil
import sys

from laned.adapters.rendered import write_atomic
from laned.adapters.systemd import JobMode, Systemd
from laned.config import paths
from laned.config.model import Config
from laned.config.names import DAEMON_UNIT
from laned.render.units import daemon_unit


def laned_executable() -> str:
    """The `laned` that runs now: the one beside this interpreter (a venv's), else PATH's."""
    beside = os.path.join(os.path.dirname(sys.executable), "laned")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("laned")
    return os.path.abspath(found) if found else beside


def linger_state(user: str) -> str:
    """'on', 'off' or 'unknown' (no logind here: read /var/lib/systemd/linger)."""
    if not os.path.isdir("/var/lib/systemd/linger"):
        return "unknown"
    return "on" if os.path.exists(f"/var/lib/systemd/linger/{user}") else "off"


async def install(config: Config, config_path: str) -> list[str]:
    """Write laned.service, reload, enable and (re)start it; return lines to tell the user."""
    unit_path = f"{config.daemon.unit_dir}/{DAEMON_UNIT}"
    home = paths.home(dict(os.environ))
    text = daemon_unit([laned_executable(), "serve"], os.path.abspath(config_path), home)
    write_atomic(unit_path, text, 0o644)
    systemd = Systemd()
    await systemd.connect()
    try:
        await systemd.reload()
        await systemd.enable_unit_files([unit_path])
        result = await systemd.restart_unit(DAEMON_UNIT, JobMode.REPLACE)
    finally:
        systemd.disconnect()
    lines = [f"wrote {unit_path}", f"enabled and started {DAEMON_UNIT} (job {result})"]
    user = pwd.getpwuid(os.getuid()).pw_name
    linger = linger_state(user)
    if linger != "on":
        lines.append(
            f"lingering is {linger}: user units start at boot only with it. Run: sudo loginctl enable-linger {user}"
        )
    return lines
