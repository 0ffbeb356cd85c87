"""The connection to the user manager, kept: connect, reconnect when it drops, and catch up
(subscribe again, re-read every lane unit) after a reconnect or a manager re-exec.

It hands what it reads to the owner (`on_resync`, with whether the manager is a new one)
and says while it is out of reach (`trouble`); it changes no lane state itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from laned.core.unit_state import UnitCallback, UnitSnapshot
from laned.errors import LanedError, SystemdError
from laned.owner.seam import Manager, Units

log = logging.getLogger("laned.supervisor")
QUIET = 60.0  # seconds between two log lines about a reconnect that keeps failing
Resync = Callable[[str, dict[str, UnitSnapshot], bool], None]


class BusKeeper:
    """Keeps `systemd` connected for the supervisor's whole life."""

    def __init__(
        self,
        manager: Manager,
        units: Units,
        names: Callable[[], Iterable[str]],
        on_change: UnitCallback,
        on_resync: Resync,
        trouble: Callable[[str | None], None] = lambda why: None,
    ) -> None:
        self.manager, self.units = manager, units
        self.names = names  # the lane units of the config in force
        self.on_change = on_change
        self.on_resync = on_resync  # (why, every lane unit's snapshot, a new manager?)
        self.trouble = trouble  # why the manager is out of reach; None once it is back
        self.started: int | None = None  # the manager's start (µs): a new one differs
        self.reconnecting = False
        self.closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._signals: dict[str, int] = {}  # PropertiesChanged seen, per unit

    async def connect(self) -> None:
        """Connect (unless connected), route signals, and hold a reference on every lane unit."""
        await self.manager.connect(self._changed, self._manager_restarted)
        await self.ref_units()
        if self.started is None:
            with contextlib.suppress(SystemdError):
                self.started = await self.manager.manager_started()

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
            snap = await self.units.snapshot(unit)
            if self._signals.get(unit, 0) == seen:
                break
        return snap

    async def ref_units(self) -> None:
        """Ref() every lane unit, so systemd keeps an exited one (and its status) loaded."""
        for unit in self.names():
            with contextlib.suppress(SystemdError):
                await self.units.ref_unit(unit)

    def _manager_restarted(self) -> None:
        if self.reconnecting:
            return  # the manager taking its name on the new connection: the reconnect resyncs
        task = asyncio.get_running_loop().create_task(
            self.resync("the user manager left the bus and came back")
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def keep(self) -> None:
        """Reconnect when the bus connection drops, and catch up with what changed meanwhile."""
        while not self.closing:
            await self.manager.wait_closed()
            if self.closing:
                return
            lost, where = time.monotonic(), self.manager.address
            self.reconnecting = True
            log.warning("lost the user bus (%s); reconnecting", where)
            self.trouble(
                f"lost the connection to the user manager ({where}); reconnecting: until it is "
                "back no lane can be started, stopped or swapped (is the user manager running? "
                "`systemctl --user status`)"
            )
            delay, said = 0.05, -QUIET
            while not self.closing:
                try:
                    await self.connect()
                    break
                except LanedError as exc:
                    if time.monotonic() - said >= QUIET:
                        log.warning("reconnect failed (trying again every 5 s): %s", exc)
                        said = time.monotonic()
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
            if self.closing:
                return
            self.trouble(None)
            took = time.monotonic() - lost
            try:
                await self.resync(f"reconnected to the user manager after {took:.1f}s")
            finally:
                self.reconnecting = False

    async def resync(self, why: str) -> None:
        """Subscribe again and hand every lane unit's present state to the owner, with whether
        the manager is a new one (started again, not re-executed)."""
        # Right after a re-exec the manager may not have its bus name back yet; until the
        # subscription is renewed it sends no signals, so keep trying (bounded).
        delay, deadline = 0.02, time.monotonic() + 30
        while True:
            try:
                await self.manager.subscribe()
                break
            except SystemdError as exc:
                if time.monotonic() > deadline:
                    log.error("cannot subscribe to the user manager again: %s", exc)
                    break
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        before = self.started
        with contextlib.suppress(SystemdError):
            self.started = await self.manager.manager_started()
        replaced = before is not None and self.started != before
        if replaced:
            why += " (a new manager: the one before is gone, and what it ran with it)"
        else:
            why += " (the same manager: what it runs carries on)"
        log.info("%s: re-reading every lane unit", why)
        snaps = {}
        for unit in list(self.names()):
            try:
                await self.units.ref_unit(unit)  # a re-exec forgets clients' references
                snaps[unit] = await self.snapshot(unit)
            except SystemdError:
                continue
        self.on_resync(why, snaps, replaced)

    async def close(self) -> None:
        """Stop keeping the connection, and close it."""
        self.closing = True
        for task in list(self._tasks):
            task.cancel()
        self.manager.disconnect()
