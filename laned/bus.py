"""The connection to the user manager, kept: connect, reconnect when it drops, and catch up
(subscribe again, re-read every lane unit) after a reconnect or a manager re-exec.

It hands what it reads to the owner (`on_snapshot`); it changes no lane state itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from laned.errors import LanedError, SystemdError
from laned.systemd import Systemd, UnitCallback
from laned.unit_state import UnitSnapshot

log = logging.getLogger("laned.supervisor")


class BusKeeper:
    """Keeps `systemd` connected for the supervisor's whole life."""

    def __init__(
        self,
        systemd: Systemd,
        units: Callable[[], Iterable[str]],
        on_change: UnitCallback,
        on_snapshot: Callable[[str, UnitSnapshot], None],
    ) -> None:
        self.systemd = systemd
        self.units = units  # the lane units of the config in force
        self.on_change = on_change
        self.on_snapshot = on_snapshot
        self.closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._signals: dict[str, int] = {}  # PropertiesChanged seen, per unit

    async def connect(self) -> None:
        """Connect (unless connected), route signals, and hold a reference on every lane unit."""
        self.systemd.on_unit_change = self._changed
        self.systemd.on_manager_restart = self._manager_restarted
        if self.systemd.bus is None or not self.systemd.bus.connected:
            await self.systemd.connect()
        await self.ref_units()

    def _changed(self, unit: str, props: dict[str, Any]) -> None:
        self._signals[unit] = self._signals.get(unit, 0) + 1
        self.on_change(unit, props)

    async def snapshot(self, unit: str) -> UnitSnapshot:
        """The unit's state, read so that it is not older than the signals already applied.

        dbus-fast runs a signal's handler as it reads the message, but resumes the caller of
        GetAll only later: a PropertiesChanged that systemd sent just after its reply is
        applied first, and the reply — older — would then take the unit back in time (a
        phantom exit of a unit that just started). Read again when a signal came between."""
        for _ in range(5):
            seen = self._signals.get(unit, 0)
            snap = await self.systemd.snapshot(unit)
            if self._signals.get(unit, 0) == seen:
                break
        return snap

    async def ref_units(self) -> None:
        """Ref() every lane unit, so systemd keeps an exited one (and its status) loaded."""
        for unit in self.units():
            with contextlib.suppress(SystemdError):
                await self.systemd.ref_unit(unit)

    def _manager_restarted(self) -> None:
        task = asyncio.get_running_loop().create_task(
            self.resync("the user manager was re-executed")
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def keep(self) -> None:
        """Reconnect when the bus connection drops, and catch up with what changed meanwhile."""
        while not self.closing:
            await self.systemd.wait_closed()
            if self.closing:
                return
            log.warning("lost the user bus; reconnecting")
            delay = 0.05
            while not self.closing:
                try:
                    await self.connect()
                    break
                except LanedError as exc:
                    log.warning("reconnect failed: %s", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
            await self.resync("reconnected to the user bus")

    async def resync(self, why: str) -> None:
        """Subscribe again and hand every lane unit's present state to the owner."""
        log.info("%s: re-reading every lane unit", why)
        # Right after a re-exec the manager may not have its bus name back yet; until the
        # subscription is renewed it sends no signals, so keep trying (bounded).
        delay, deadline = 0.02, time.monotonic() + 30
        while True:
            try:
                await self.systemd.subscribe()
                break
            except SystemdError as exc:
                if time.monotonic() > deadline:
                    log.error("cannot subscribe to the user manager again: %s", exc)
                    break
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        for unit in list(self.units()):
            try:
                await self.systemd.ref_unit(unit)  # a re-exec forgets clients' references
                snap = await self.snapshot(unit)
            except SystemdError:
                continue
            self.on_snapshot(unit, snap)

    async def close(self) -> None:
        """Stop keeping the connection, and close it."""
        self.closing = True
        for task in list(self._tasks):
            task.cancel()
        self.systemd.disconnect()
