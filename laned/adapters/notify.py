"""sd_notify without libsystemd: READY=1, WATCHDOG=1 and STOPPING=1 to $NOTIFY_SOCKET.

WATCHDOG=1 is sent from the asyncio event loop itself, so a wedged loop stops the pings
and systemd restarts laned (WatchdogSec= in units/laned.service).
"""

from __future__ import annotations

import asyncio
import os
import socket


def notify(message: str, env: dict[str, str] | None = None) -> bool:
    """Send one sd_notify message; False when not run by systemd (no $NOTIFY_SOCKET)."""
    path = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path  # abstract namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(message.encode(), address)
        except OSError:
            return False
    return True


def watchdog_interval(env: dict[str, str] | None = None) -> float | None:
    """Half of systemd's watchdog timeout ($WATCHDOG_USEC), or None when there is none."""
    env = env if env is not None else dict(os.environ)
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1e6 / 2
    except ValueError:
        return None


async def keep_watchdog() -> None:
    """Ping systemd's watchdog from the event loop until cancelled."""
    interval = watchdog_interval()
    if interval is None:
        return
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)
