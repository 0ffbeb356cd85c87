"""`laned serve`: render the lanes, start the supervisor, run until SIGTERM.

The lanes are systemd units of their own: stopping laned never stops them, and a new
laned adopts what runs.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from laned import render
from laned.config import Config
from laned.probes import Probe
from laned.supervisor import Supervisor
from laned.systemd import Systemd

log = logging.getLogger("laned")


async def start_supervisor(config: Config, systemd: Systemd | None = None) -> Supervisor:
    """Render and daemon-reload the lanes, then start a supervisor on them."""
    systemd = systemd or Systemd()
    await systemd.connect()
    version = await systemd.version() or render.DEFAULT_SYSTEMD_VERSION
    changes = render.apply(config, version)
    if any(action is not render.Action.UNCHANGED for action, _ in changes):
        await systemd.reload()
    systemd.disconnect()
    supervisor = Supervisor(config, Systemd(systemd.address), Probe(), systemd_version=version)
    await supervisor.start()
    return supervisor


async def serve(config: Config) -> int:
    """Run laned until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    supervisor = await start_supervisor(config)
    log.info("laned is supervising %d lane(s)", len(config.lanes))
    try:
        await stop.wait()
    finally:
        await supervisor.close()
        await supervisor.probe.close()
    return 0
